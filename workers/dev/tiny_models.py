"""Tiny, offline stand-ins for BERTweet, for tests and benchmarks.

Nothing here can be downloaded (no model hub), yet the tests must exercise
the real loading path: ``AutoTokenizer`` / ``AutoModel.from_pretrained`` on a
directory, a ``BertweetTokenizer`` with tweet normalisation, RoBERTa's padding
offset in the position ids. So we write a directory with the same layout as
``vinai/bertweet-base``: a randomly initialised ``RobertaModel`` (tiny by
default) and a ``BertweetTokenizer`` whose fastBPE files (``vocab.txt`` in
fairseq "token count" format, ``bpe.codes``) are learned here from a word
list.

The BPE merges are learned with the ``tokenizers`` BPE trainer (already a
dependency of transformers) using fastBPE's ``</w>`` end-of-word convention,
then written in fastBPE's format. Every merge result and every character of
the alphabet is in the vocabulary, in both its word-internal (``x@@``) and its
word-final (``x``) form, so any word made of known characters tokenizes to
in-vocabulary pieces, and every word of the list to one token.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import BertweetTokenizer, RobertaConfig, RobertaModel

# The tokens BERTweet's normaliser produces, and its special tokens.
BERTWEET_SPECIAL_WORDS = ("HTTPURL", "@USER")

# Common English, tweet and crisis words. Each becomes a single token.
_BASE_TEXT = """
the a an and or but if of to in on at by for with from about as into over after
before under between through during without within up down out off again then
once here there when where why how all any both each few more most other some
such no nor not only own same so than too very can will just should now is are
was were be been being have has had having do does did doing would could may
might must shall i me my we our you your he him his she her it its they them
their what which who whom this that these those am get got go going gone went
come came make made take took see saw know knew think thought say said tell told
give gave find found want need needs like love hate feel felt look looking looks
people person man woman men women child children kid kids family friend friends
home house city town country world state government police army fire firefighters
help helping please pray prayers praying thoughts safe safety stay rescue rescued
victims victim dead death deaths died killed kill injured injuries hurt missing
news report reports reported update updates breaking live video photo photos pic
earthquake quake flood floods flooding storm hurricane typhoon tornado wildfire
fires explosion bombing bomb shooting attack crash derailment collapse landslide
rain wind water power damage destroyed emergency disaster relief aid donate
donation donations red cross support victims volunteer volunteers shelter food
covid19 covid coronavirus virus pandemic vaccine mask masks lockdown hospital
doctor doctors nurse nurses health sick cases test tests positive negative
today tonight tomorrow yesterday day days night week weeks year years time now
morning evening hour hours minute minutes first last next new old big small good
bad best worst great terrible sad happy scary crazy real really still never
always every many much one two three four five ten hundred thousand million
area areas road roads bridge building buildings school schools street near far
north south east west central coast river lake mountain island airport train
hashtag tweet tweets retweet rt follow twitter facebook thanks thank lol omg wow
yes ok okay hello hi hey sorry god hope hopes everyone anyone someone nothing
something everything way thing things life lives work job money car cars bus
philippines australia colorado queensland boston texas italy guatemala venezuela
manila sardinia brazil bangladesh spain canada alberta lac megantic calgary
"""
BASE_WORDS: list[str] = _BASE_TEXT.split()

# Punctuation and contractions as BERTweet's normaliser splits them.
_PUNCT_TEXT = """. , ! ? : ; ... ' " - ( ) &amp; 's n't 'm 're 'll 've 'd # @"""
BASE_WORDS += _PUNCT_TEXT.split()

_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789#@_'.,!?:;-&\"()/"


def write_bertweet_tokenizer_files(
    directory: Path,
    words: Iterable[str] | Counter[str] | None = None,
    *,
    vocab_size: int = 64_000,
) -> tuple[Path, Path]:
    """Learn fastBPE merges from ``words`` and write ``vocab.txt`` and ``bpe.codes``.

    ``words`` may be a ``Counter`` (frequencies steer which merges come first
    when ``vocab_size`` caps them) or any iterable of words; the base word list
    and BERTweet's ``HTTPURL`` / ``@USER`` are always included.
    """
    directory.mkdir(parents=True, exist_ok=True)
    counts: Counter[str] = Counter()
    # The base list gets a high count so a capped vocabulary still covers it.
    for w in (*BASE_WORDS, *BERTWEET_SPECIAL_WORDS):
        counts[w] += 1_000_000
    if words is not None:
        counts.update(words)  # a Counter adds its counts, an iterable 1 per occurrence
    counts = Counter({w: c for w, c in counts.items() if w and not any(ch.isspace() for ch in w)})

    bpe = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
    bpe.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=0,
        end_of_word_suffix="</w>",
        initial_alphabet=list(_ALPHABET),
        show_progress=False,
    )

    # The trainer counts words itself: feed each word as often as it occurs,
    # capped so huge counts stay cheap (only the order of merges depends on it).
    def corpus() -> Iterable[str]:
        for w, c in counts.items():
            yield " ".join([w] * min(c, 50))

    bpe.train_from_iterator(corpus(), trainer=trainer)
    model = json.loads(bpe.to_str())["model"]
    # tokenizers >= 0.20 stores merges as pairs, older versions as "a b" strings.
    merges: list[tuple[str, str]] = []
    for m in model["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        merges.append((a, b))

    # Vocabulary: fastBPE pieces are "x@@" inside a word and "x" at its end.
    pieces: list[str] = []
    seen: set[str] = set()

    def add(piece: str) -> None:
        if piece not in seen:
            seen.add(piece)
            pieces.append(piece)

    for w in BERTWEET_SPECIAL_WORDS:
        add(w)
    for ch in sorted({ch for w in counts for ch in w} | set(_ALPHABET)):
        add(ch)
        add(ch + "@@")
    for a, b in merges:
        sym = a + b
        add(sym[: -len("</w>")] if sym.endswith("</w>") else sym + "@@")

    vocab_file = directory / "vocab.txt"
    merges_file = directory / "bpe.codes"
    # fairseq dictionary format: "<token> <count>"; the count is not used by the tokenizer.
    vocab_file.write_text("".join(f"{p} {len(pieces) - i}\n" for i, p in enumerate(pieces)), encoding="utf-8")
    # fastBPE codes: "<left> <right> <count>", rank = line order; the file must end in "\n".
    merges_file.write_text(
        "".join(f"{a} {b} {len(merges) - i}\n" for i, (a, b) in enumerate(merges)), encoding="utf-8"
    )
    return vocab_file, merges_file


def build_bertweet_like(
    directory: Path,
    *,
    hidden_size: int = 32,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 2,
    intermediate_size: int = 64,
    vocab_size: int | None = None,
    words: Iterable[str] | Counter[str] | None = None,
    bpe_vocab_size: int = 64_000,
    seed: int = 0,
) -> Path:
    """Write a randomly initialised BERTweet-architecture model and tokenizer to ``directory``.

    ``vocab_size`` sets the model's embedding rows (at least the tokenizer's
    size); BERTweet-base has 64001. ``max_position_embeddings`` is 130, as in
    BERTweet: 128 tokens plus RoBERTa's padding offset of 2.
    """
    directory = Path(directory)
    vocab_file, merges_file = write_bertweet_tokenizer_files(directory, words, vocab_size=bpe_vocab_size)
    # Saved with normalization off, like vinai/bertweet-base's own tokenizer
    # config: turning it on is the loader's job (stream.encoder does).
    tokenizer = BertweetTokenizer(
        vocab_file=str(vocab_file),
        merges_file=str(merges_file),
        normalization=False,
        model_max_length=128,
    )
    written = {path: path.read_bytes() for path in (vocab_file, merges_file)}
    tokenizer.save_pretrained(str(directory))
    # transformers 5's save_vocabulary rewrites bpe.codes without fastBPE's counts, which its
    # own loader then misreads (it drops each line's last field: merges lose their second
    # half, and words fall apart into characters). Keep the files as written, as 4.x does.
    for path, data in written.items():
        path.write_bytes(data)

    config = RobertaConfig(
        vocab_size=max(vocab_size or 0, len(tokenizer)),
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=130,
        type_vocab_size=1,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tokenizer_class="BertweetTokenizer",
    )
    # Seeded without disturbing the caller's global RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = RobertaModel(config)
    model.save_pretrained(str(directory))
    return directory


def build_tiny_bertweet(directory: Path, *, seed: int = 0) -> Path:
    """Write a tiny (hidden 32, 2 layers) BERTweet-like model to ``directory``; return it.

    Load it with ``Encoder(str(path))`` or ``AutoTokenizer`` / ``AutoModel``.
    Deterministic for a given ``seed``; takes well under a second.
    """
    return build_bertweet_like(Path(directory), seed=seed)
