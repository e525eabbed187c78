"""FastBertweetTokenizer gives exactly the slow BertweetTokenizer's ids (issue 12 §1)."""

from __future__ import annotations

import gzip
import io
import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import BertweetTokenizer

from workers.adapters.encoding.bertweet_tokenizer import _SHORTCUT, FastBertweetTokenizer, is_bertweet_dir
from workers.adapters.encoding.encoder import Encoder
from workers.adapters.files.feeds import sample_feed
from workers.commands.tokenize import tokenize_stream
from workers.dev.tiny_models import write_bertweet_tokenizer_files

MAX = 128

HARD_CASES = [
    "",
    "   ",
    "\t\n \r\n",
    "I love it 😂😂😂 🇺🇸 👍🏽 👨\u200d👩\u200d👧 ❤️ ☺",
    "see https://t.co/AbC123 and http://t.co/x.",
    "HTTP://T.CO/UPPER www.example.com/x?y=1. (http://foo.com/bar_(baz)) example.org!",
    "https://t.co/a…",
    "@user: hi @Some_One, RT @o8user @_ @ me@example.com a.b+c@d-e.co.uk",
    "word " * 300,
    "https://example.com/" + "a" * 2000,
    "😀" * 400,
    "東京で地震が発生しました #地震 Привет мир مرحبا بالعالم नमस्ते 안녕하세요 สวัสดี",
    "Arabic-Indic digits ٠١٢ ٣٤٥٦ and fullwidth １２３ ４５６７",
    "zzqxj ñandú ß∑≈ ǅ K ſ ﬁ",
    "a    b\t\t\tc\n\nd\xa0e\u3000f\u2009g\u200bh",
    "a\x1cb c\x1fd",
    "&amp; &lt;3 &gt; &quot; &#39; &#8230; &#x27; &nbsp; &foo; &#128514; &#32;5 &#150; &#x110000; &#xZZ;",
    "5&#32; 6 &foo; 7 x&#46; .y",
    "call 555 123 4567 or (555) 123-4567 now, +1 800 555 1234; 555 - 1234 ; 12 . 34 1 (800) 555-0000",
    "wait . . . what; wait. .what; a.. ..b; wait… …",
    "I can't, don't, won't cannot ain't I'm you're he's we'll they'd I've, it’s… fine don't",
    "cannot",
    "meet at 5 p . m . today or 6 a . m tomorrow p . m",
    "<s> hi </s> <mask> <pad> <unk>",
    "x</w>y and &lt;s&gt;",
    ":) :-( <3 :P D: @o8 -> <-- <b>bold</b> >:( ;-)",
    "#Boston #PrayForBoston #covid19 ##x #a-b' #'",
    "!!!!!!!! ????? ....... ------ ////// aaaaaaaaa",
    "3.14 1,000 12/25 -5 +3 10:30 1/2/2013",
    "ALL CAPS Mixed-Case hyphen-ated under_score o'clock rock'n'roll",
    "tabs\tand\nnewlines\nin\ttweets",
    "\ufeffbom and \u200d zwj \u2028 line sep \x85 nel",
]


def _feed_texts() -> list[str]:
    with gzip.open(sample_feed(), "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


@pytest.fixture(scope="module")
def feed() -> list[str]:
    return _feed_texts()


@pytest.fixture(scope="module")
def slow(tiny_bertweet: Path) -> BertweetTokenizer:
    return BertweetTokenizer.from_pretrained(str(tiny_bertweet), normalization=True, local_files_only=True)


@pytest.fixture(scope="module")
def fast(slow: BertweetTokenizer) -> FastBertweetTokenizer:
    return FastBertweetTokenizer(slow)


def _slow_ids(tok: BertweetTokenizer, texts: list[str], max_length: int = MAX) -> list[list[int]]:
    return [list(x) for x in tok(texts, truncation=True, max_length=max_length)["input_ids"]]


def _fast_ids(tok: FastBertweetTokenizer, texts: list[str], max_length: int = MAX) -> list[list[int]]:
    out: list[list[int]] = []
    for i in range(0, len(texts), 1024):
        out += tok.encode_batch(texts[i : i + 1024], max_length)
    return out


def _assert_same(expected: list[list[int]], got: list[list[int]], texts: list[str]) -> None:
    assert len(got) == len(expected)
    bad = [i for i, (e, g) in enumerate(zip(expected, got, strict=True)) if e != g]
    assert len(got) == len(expected)
    assert not bad, f"{len(bad)} texts differ, e.g. {texts[bad[0]]!r}"


@pytest.mark.slow
def test_identical_ids_on_every_feed_tweet(
    feed: list[str], slow: BertweetTokenizer, fast: FastBertweetTokenizer
) -> None:
    expected = _slow_ids(slow, feed)
    _assert_same(expected, _fast_ids(fast, feed), feed)
    # Second pass: everything now comes from the caches.
    _assert_same(expected, _fast_ids(fast, feed), feed)


def test_identical_ids_with_codes_learned_on_the_feed(feed: list[str], tmp_path: Path) -> None:
    """Many more merges (and pieces) than the tiny model's: BPE itself is exercised."""
    texts = feed[::3]
    words = Counter(w for t in texts for w in t.split())
    vocab, merges = write_bertweet_tokenizer_files(tmp_path, words, vocab_size=20_000)
    slow = BertweetTokenizer(vocab_file=str(vocab), merges_file=str(merges), normalization=True)
    fast = FastBertweetTokenizer(slow)
    _assert_same(_slow_ids(slow, texts), _fast_ids(fast, texts), texts)


@pytest.mark.parametrize("max_length", [2, 3, 16, MAX, 512])
def test_hard_cases(slow: BertweetTokenizer, fast: FastBertweetTokenizer, max_length: int) -> None:
    expected = _slow_ids(slow, HARD_CASES, max_length)
    got = fast.encode_batch(HARD_CASES, max_length)
    for text, e, g in zip(HARD_CASES, expected, got, strict=True):
        assert g == e, text
        assert g[0] == fast.bos_token_id and g[-1] == fast.eos_token_id
        # max_length 2: transformers logs an error and does not truncate; nor do we.
        assert len(g) <= max_length or max_length == 2


def test_each_hard_case_alone_and_normalised(slow: BertweetTokenizer) -> None:
    fast = FastBertweetTokenizer(slow)  # cold caches, one text per call
    for text in HARD_CASES:
        assert fast.encode_batch([text], MAX) == _slow_ids(slow, [text]), text
        norm = fast.normalize_batch([text])[0]
        assert norm is None or norm == slow.normalizeTweet(text), text


def test_truncation_on_the_feed(
    feed: list[str], slow: BertweetTokenizer, fast: FastBertweetTokenizer
) -> None:
    texts = feed[:2000]
    _assert_same(_slow_ids(slow, texts, 16), fast.encode_batch(texts, 16), texts)


def test_lone_surrogate_goes_to_the_reference(slow: BertweetTokenizer, fast: FastBertweetTokenizer) -> None:
    text = "broken \ud83d half emoji"
    assert fast.encode_batch([text, "fine"], MAX) == _slow_ids(slow, [text, "fine"])


def test_attributes_and_errors(
    tiny_bertweet: Path, fast: FastBertweetTokenizer, slow: BertweetTokenizer
) -> None:
    loaded = FastBertweetTokenizer.from_pretrained(tiny_bertweet)
    assert loaded.encode_batch(["hello world"]) == fast.encode_batch(["hello world"], MAX)
    assert (fast.pad_token_id, fast.bos_token_id, fast.eos_token_id) == (
        slow.pad_token_id,
        slow.cls_token_id,
        slow.sep_token_id,
    )
    assert fast.model_max_length == MAX
    assert is_bertweet_dir(tiny_bertweet)
    with pytest.raises(TypeError):
        fast.encode_batch("a string", MAX)
    with pytest.raises(ValueError):
        fast.encode_batch(["x"], 1)
    plain = BertweetTokenizer.from_pretrained(str(tiny_bertweet), local_files_only=True)  # normalization off
    with pytest.raises(ValueError, match="normalization"):
        FastBertweetTokenizer(plain)


def test_tokenize_stream_fast_equals_slow(tiny_bertweet: Path, feed: list[str]) -> None:
    texts = feed[:1500] + [t.replace("\n", " ").replace("\r", " ") for t in HARD_CASES]
    lines = [t + "\n" for t in texts]
    outputs = {}
    for slow in (False, True):
        buf = io.StringIO()
        assert tokenize_stream(str(tiny_bertweet), slow, iter(lines), buf.write) == len(lines)
        outputs[slow] = buf.getvalue()
    assert outputs[False] == outputs[True]
    rows = [json.loads(x) for x in outputs[False].splitlines()]
    assert len(rows) == len(lines)
    assert all(r[0] == 0 and r[-1] == 2 and len(r) <= MAX for r in rows)


def test_tokenize_stream_other_models_and_errors(tmp_path: Path) -> None:
    lines = ["Hello world\n", "Flooding in Queensland\r\n", "no newline"]
    outputs = {}
    for slow in (False, True):
        buf = io.StringIO()
        assert tokenize_stream("minilm", slow, lines, buf.write) == 3
        outputs[slow] = buf.getvalue()
    assert outputs[False] == outputs[True]
    assert all(json.loads(x)[0] == 101 for x in outputs[False].splitlines())  # [CLS]
    with pytest.raises(ValueError, match="cannot load"):
        tokenize_stream(str(tmp_path / "missing"), False, [], lambda s: None)
    with pytest.raises(ValueError, match="cannot load"):
        tokenize_stream(str(tmp_path), False, [], lambda s: None)  # exists, holds no model


def test_encoder_fast_and_slow_tokenizers_agree(tiny_bertweet: Path, feed: list[str]) -> None:
    texts = feed[:500] + HARD_CASES
    fast_enc = Encoder(str(tiny_bertweet), device="cpu", dtype="float32")
    slow_enc = Encoder(str(tiny_bertweet), device="cpu", dtype="float32", slow_tokenizer=True)
    assert fast_enc.tokenize(texts) == slow_enc.tokenize(texts)
    assert (fast_enc.encode(texts[:64]) == slow_enc.encode(texts[:64])).all()


@pytest.mark.slow
def test_reval_tokenize_command(tiny_bertweet: Path, feed: list[str]) -> None:
    """The command other tools use: the real console script, fast and --slow, same output."""
    import os
    import subprocess
    import sys

    texts = "".join(text.replace("\n", " ").replace("\r", " ") + "\n" for text in feed[:200])
    reval = str(Path(sys.executable).with_name("reval"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    outputs = []
    for flags in ([], ["--slow"]):
        done = subprocess.run(
            [reval, "tokenize", "--model", str(tiny_bertweet), *flags],
            input=texts,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]
    rows = [json.loads(line) for line in outputs[0].splitlines()]
    assert len(rows) == 200 and all(row[0] == 0 and row[-1] == 2 for row in rows)  # <s> ... </s>


def test_the_tokenize_command_never_imports_torch(tiny_bertweet: Path) -> None:
    """``reval tokenize`` needs only the tokenizer: torch (seconds of imports) stays out."""
    import os
    import subprocess
    import sys

    code = (
        "import io, sys\n"
        "from typer.testing import CliRunner\n"
        "from workers.commands.cli import app\n"
        f"done = CliRunner().invoke(app, ['tokenize', '--model', {str(tiny_bertweet)!r}], "
        "input='flooding in #boston\\n')\n"
        "print(done.stdout.strip(), 'torch' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("USE_TORCH", "TRANSFORMERS_VERBOSITY")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    ids, imported = done.stdout.split()
    assert ids.startswith("[0,") and ids.endswith(",2]")
    assert imported == "False"
    assert done.stderr == ""  # transformers' "no PyTorch" warning is not shown


# -- The exact shortcuts past the tweet regex (issue 12 §1): each edge against the reference. --

SHORTCUT_CASES = [
    # URLs, then characters the URL pattern may run through but not end on
    "see http://t.co/AbC123. http://t.co/x, http://t.co/y... https://t.co/z?! http://t.co/q) http://t.co/r:",
    "http://t.co/a'b http://t.co/a' http://t.co/a\" (http://t.co/b) http://t.co/c… HTTPS://T.CO/D.",
    "http://t.co/a.b.c. http://t.co/x?y=1&z=2 http://t.co/x/ http://t.co/x-_~+%. http://t.co/x;",
    # mentions: trailing punctuation, emoticon-like starts, what the username pattern runs on through
    "@user: @user, @user. @user! @user) @user... @user's @user’s @user- @user_ @a@b @user:) @user:D",
    "@o8 @o8user @8ball @O8 @o: @o; @oa @Oscar: @do: @_ @_: @x&amp; @x&#97;b @abcé @abc😂 @user…",
    '@user:https://t.co/x @user.@other: @user!!!! @user"quoted" @user:' + "!" * 40,
    # hashtags
    "#a____b #a___b. #ab____ @a____b: @____ http://t.co/a____b//// http://t.co/////a. word____",
    "#Boston. #Boston's #Boston’s #a-b #ab- #ab_ #a. #ab: #2013! #ab&amp; #abé #ab😂 ##ab. #ab#cd",
    # ASCII words, then punctuation
    "Design. flood, help! really?? wow!!!! what... Word.com word.@x word.x word._ word.- word:) word:(",
    "D: Do: d8 DO: p; Po: Dog: pop: dope. http: https:/// www. HTTP. ab:/ x.. y...z a. I.",
    # contractions and the normaliser's cross-token replacements next to shortcut segments
    "I can't. don't, won't! cannot. Cannot cannot, ain't? I'm. you're, he's! we'll. they'd? I've...",
    "don't don’t don't… it's. it’s, rock'n'roll! o'clock. 'quoted' 'x. x'. cannot' #cannot",
    # a.m. / p.m. across segments
    "at 5 p. m. or 6 a. m today p . m . a . m x p. m y a.m. p.m. P. M. p .m",
    "p. m p . m a. m. a . m. p.m p . a .",
    "x,p. m today (a. m. now x,a. m y (p. m. z .p. m",
    "at 5 p. m today",  # each a.m./p.m. form in a text of its own: no other segment sends it
    "6 a. m. ok",  # to the joined path
    "x,p. m today",
    "x . m. y",
    "it .p. m",
    "ok p.m now",
    "5 p .m today",
    "5 p . m today",
    "we cannot stop",
    # entities, emoji and non-ASCII next to otherwise plain segments
    "word&amp; &amp;word word;&amp; x&#46; Fish&amp;chips 😂. 😂word word😂 é. café. naïve!",
]


def test_shortcut_cases(slow: BertweetTokenizer) -> None:
    together = FastBertweetTokenizer(slow)
    assert together.encode_batch(SHORTCUT_CASES, MAX) == _slow_ids(slow, SHORTCUT_CASES)
    for text in SHORTCUT_CASES:
        alone = FastBertweetTokenizer(slow)  # cold caches: every segment new
        assert alone.encode_batch([text], MAX) == _slow_ids(slow, [text]), text
        assert alone.normalize_batch([text]) == [slow.normalizeTweet(text)], text
        for segment in text.split():
            assert alone.normalize_batch([segment]) == [slow.normalizeTweet(segment)], segment


def _assert_shortcut_is_the_reference(slow: BertweetTokenizer, segment: str) -> None:
    """Where a shortcut applies, the reference's normalised tokens are its head's, then the
    rest's own (the tokens themselves may differ: 4+ repeated "/" or "_" are cut to 3)."""
    text = segment.replace("’", "'").replace("…", "...")
    found = _SHORTCUT.fullmatch(text)
    if found is None:
        return
    head = next(found[g] for g in ("url", "user", "tag", "word") if found[g] is not None)
    rest = text[len(head) :]

    def normalised(tokens: list[str]) -> list[str]:
        return [slow.normalizeToken(t) for t in tokens]

    tokenize = slow.tweetPreprocessor.tokenize
    assert normalised(tokenize(text)) == normalised([head, *tokenize(rest)]), segment


def test_each_shortcut_segment_is_tokenised_as_the_reference_does(slow: BertweetTokenizer) -> None:
    segments = {s for text in SHORTCUT_CASES for s in text.split()}
    assert sum(_SHORTCUT.fullmatch(s) is not None for s in segments) > 40  # the cases do exercise them
    for segment in segments:
        _assert_shortcut_is_the_reference(slow, segment)


# Pieces glued into segments (or not) by the property test: shortcut heads, the characters
# that end them or run them on, emoticon parts, entities, contractions, a.m./p.m. parts.
_PIECES = [
    *"ap.mPdDoO8:;=@#_-'’…&)(!?,\"<>/5é😂",
    "http://t.co/Ab1",
    "https://x.co/a.b",
    "www.x.com",
    "user",
    "Boston",
    "cannot",
    "n't",
    "do",
    "&amp;",
    "&#97;",
    "...",
    "555",
    "1234",
    "____",
    "////",
    "----",
]


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.tuples(st.sampled_from(_PIECES), st.sampled_from(["", "", "", " "])), max_size=14))
def test_random_glued_pieces_match_the_reference(
    slow: BertweetTokenizer, fast: FastBertweetTokenizer, pieces: list[tuple[str, str]]
) -> None:
    text = "".join(piece + gap for piece, gap in pieces)
    assert fast.encode_batch([text], MAX) == _slow_ids(slow, [text]), text
    assert fast.normalize_batch([text]) == [slow.normalizeTweet(text)], text
    for segment in text.split():
        _assert_shortcut_is_the_reference(slow, segment)


def test_batch_scan_equals_one_text_at_a_time(feed: list[str], fast: FastBertweetTokenizer) -> None:
    texts = feed[:3000] + HARD_CASES + SHORTCUT_CASES + ["a\x00b 5 6", "x"]
    for i in range(0, len(texts), 1024):
        batch = texts[i : i + 1024]
        assert fast._segment_batch(batch) == [fast._segment(t) for t in batch]
    with_nul = ["5 6 \x00 7", "1 2"]  # a NUL in a text: classified one by one
    assert fast._segment_batch(with_nul) == [fast._segment(t) for t in with_nul]
