"""A fast BERTweet tokenizer that gives exactly the ids of transformers' slow one.

Why it exists: ``transformers`` has no fast (Rust) BERTweet tokenizer (issue
9056), and its pure-Python ``BertweetTokenizer`` caps the embed worker's
tokenisation at ~2,700 tweets/s on one core (~1,700 on the 2-core development
machine). The ids must stay *identical*: the thesaurus is built from
embeddings of these ids, live and in replays, so a tokenizer that disagrees on
one word in a thousand tweets silently shifts hashtag means.

How it stays exact and gets fast (``normalization=True`` only, as the encoder
uses it):

* Tweet normalisation (``@USER``, ``HTTPURL``, demojized emoji, the NLTK-style
  tweet regex, contraction splitting) is the reference tokenizer's own code --
  its public ``tweetPreprocessor.tokenize`` and ``normalizeToken`` -- run once
  per distinct *segment* of text and cached. A segment is a whitespace-separated
  chunk, or several of them when the tweet regex could match across the
  whitespace between them: only its phone-number and ellipsis patterns span
  whitespace, and they need a digit or one of ``*-.)(`` on both sides of it
  (HTML entities, which may decode to anything, count as risky too); the scans
  for them run once over the whole batch. New segments whose tokens are known
  without the tweet regex skip it: plain ASCII words, and a URL, ``@user``,
  ``#tag`` or word followed by punctuation, whose rest is a segment of its own
  (``_SHORTCUT`` says why each is exact). The other new segments of a batch go
  through the reference in one call, separated by a NUL token no pattern can
  cross.
* The cross-token steps of the normaliser (``"n't "`` -> ``" n't "``, ``p . m``
  -> ``p.m`` ...) are re-done here on the joined tokens, in the reference's
  order, for texts holding a segment they could touch (``_stands_alone``).
  Every other text's ids are its segments' cached ids, concatenated: a few
  C-level calls per text.
* BPE runs in the Rust ``tokenizers`` library: fastBPE's codes use the same
  ``</w>`` end-of-word marker as a ``tokenizers`` BPE model with
  ``end_of_word_suffix="</w>"``, so its merges load as they are; only the
  vocabulary is rewritten (``x@@`` inside a word is ``x``, a word-final ``x``
  is ``x</w>``). Merge results missing from ``vocab.txt`` get ids of their own
  that map back to ``<unk>``, as the slow tokenizer's vocabulary look-up does.
  Each word's ids are cached.
* Texts the above does not cover go to the slow tokenizer whole: texts holding
  an added token's text (``<s>``, ``<mask>`` ...), ``</w>``, a lone surrogate,
  or an ASCII separator control (``\\x1c``-``\\x1f``: whitespace to ``str.split``
  but not to the tweet regex).

The equivalence rests on BPE codes whose merges come after the merges that
make their parts (true of codes learned by fastBPE or ``tokenizers``): the two
BPE implementations apply merges in a different order within a word otherwise.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate, chain, repeat
from pathlib import Path
from typing import Any

import regex
from tokenizers import Tokenizer, models
from transformers import BertweetTokenizer

_EOW = "</w>"  # fastBPE's (and the tokenizers model's) end-of-word marker
_SENTINEL = "\x00"  # separates cache misses in one reference call; matches as a token of its own
_CACHE_LIMIT = 1 << 18  # entries per cache; a cache that reaches it is emptied (stream workers run for days)

# The reference replaces these before tokenising; "…" becomes "...", a risky edge.
_PUNCTS = (("’", "'"), ("…", "..."))

# Characters that can end (_TAIL) or start (_HEAD) the part of a phone-number or
# ellipsis match on one side of whitespace: digits, the phone pattern's separators,
# "(" before an area code, "…" (-> "..."); ";" and "&" end and start HTML entities,
# which may decode to any of these, to whitespace, or to nothing.
_TAIL = r"\d*\-.)…;"
_HEAD = r"\d*\-.)(…&"
# The `regex` module, as the reference's tweet regex uses: the same Unicode tables for \d and \s.
# One scan finds a risky gap (group 1) or a character that sends the text to the reference:
# an ASCII separator control (whitespace to str.split, not to the tweet regex) or a lone
# surrogate (Rust strings cannot hold one).
_ODD_CHARS = "\x1c-\x1f\ud800-\udfff"
_SCAN = regex.compile(rf"([{_TAIL}]\s+[{_HEAD}])|[{_ODD_CHARS}]")
_ODD = regex.compile(rf"[{_ODD_CHARS}]")
# Whitespace runs a segment may be split at: not between a risky tail and a risky head.
_SAFE_GAP = regex.compile(rf"(?<![{_TAIL}\s])\s++|(?<!\s)\s++(?![{_HEAD}])")

# Segments whose tweet-regex tokens are known without running it (exact shortcuts, checked
# against the reference's patterns in order; tests/test_bertweet_tokenizer.py has each edge).
# A segment is a head the regex provably takes as one token, then optionally a rest that it
# provably tokenises as if it stood alone, so the rest is a segment of its own (cached, and
# normalised by these shortcuts or the reference). Why each head ends where it does:
# * url: a plain http(s) URL (the URL pattern comes first). Its rest holds only characters
#   the pattern may run through but cannot end on, so the longest URL is the head; the
#   normaliser makes any token starting "http" HTTPURL.
# * user: "@" and ASCII word characters (the username pattern). Not "@8", "@o8", "@O8" (an
#   emoticon with "@" as its mouth comes first), nor "@o:" and the like.
# * tag: "#" and 2+ ASCII word characters (the hashtag pattern; it runs on through "'", "-"),
#   without 4 "_" in a row (the reference cuts them to 3 first, and keeps a hashtag as it is).
# * word: ASCII letters. Not "d", "do", "p", "po" in any case (an emoticon mouth and nose
#   before an eye in the rest), nor http.../www... (URLs). Its rest holds no letter, digit,
#   "@" (URLs, naked domains and e-mail addresses need one) and cannot start with "'", "-",
#   "_" (words with apostrophes or dashes run on through them).
# Heads are ASCII and every rest starts with ASCII punctuation other than "&" (an entity may
# decode to a word character that the head's pattern would take), so the reference's entity
# decoding and repeated-character shortening never span the boundary.
_REST_START = r"""!"#$%()*+,./:;<=>?@\[\\\]^`{|}~"""  # ASCII punctuation but & ' - _
_SHORTCUT = re.compile(
    rf"""
    (?P<url>(?i:https?)://[A-Za-z0-9./_\-?=%~+]*[A-Za-z0-9/_\-=%~+])(?P<url_rest>[`!;:'".,?)]*)
    | (?P<user>@(?![oO]?[8:;=])[A-Za-z0-9_]+)(?P<user_rest>[{_REST_START}].*)?
    | (?P<tag>\#(?![A-Za-z0-9_]*____)[A-Za-z0-9_]{{2,}})(?P<tag_rest>[{_REST_START}].*)?
    | (?P<word>(?![dDpP][oO]?(?![A-Za-z]))(?!(?i:http|www))[A-Za-z]+)
      (?P<word_rest>[{_REST_START.replace("@", "")}][{_REST_START.replace("@", "")}'\-_]*)?
    """,
    re.VERBOSE | re.DOTALL,
)
_MAX_REST = 16  # longer rests go to the reference with their head: bounds chains of suffixes

# Joins a batch's texts for its scans: a NUL token that no scanned pattern crosses.
_JOIN = f" {_SENTINEL} "

# The normaliser's replacements on the joined tokens, in its order.
_JOINED_FIXES = (
    ("cannot ", "can not "),
    ("n't ", " n't "),
    ("n 't ", " n't "),
    ("ca n't", "can't"),
    ("ai n't", "ain't"),
    ("'m ", " 'm "),
    ("'re ", " 're "),
    ("'s ", " 's "),
    ("'ll ", " 'll "),
    ("'d ", " 'd "),
    ("'ve ", " 've "),
    (" p . m .", "  p.m."),
    (" p . m ", " p.m "),
    (" a . m .", " a.m."),
    (" a . m ", " a.m "),
)


def _fix_joined(text: str) -> str:
    """The reference's cross-token replacements, in its order.

    Most tweets need none: a group is skipped only when none of its patterns
    can occur in the text as it is then, so the result is the same.
    """
    if "cannot " in text:
        text = text.replace(*_JOINED_FIXES[0])
    if "'" in text:  # in every pattern of the next group
        for old, new in _JOINED_FIXES[1:11]:
            text = text.replace(old, new)
    if " . m" in text:
        for old, new in _JOINED_FIXES[11:]:
            text = text.replace(old, new)
    return text


def _stands_alone(norm: str) -> bool:
    """True if no cross-token replacement of the normaliser can touch a segment with these
    normalised tokens, whatever its neighbours: its ids are then those of its own words.

    Every replacement but the a.m./p.m. ones needs "'" or "cannot" within one token. Those
    need " p . m" or " a . m": a "." token with a space on each side, from the segment's own
    tokens or from the whitespace between segments; a segment holding that "." then has one
    of the forms tested below (" . m" inside; ". m" at its start; "." alone; "p ." at its end).
    """
    if "'" in norm or "cannot" in norm:
        return False
    if "." not in norm:
        return True
    return not (
        " . m" in norm
        or norm.startswith(". m")
        or norm == "."
        or norm.endswith((" p .", " a ."))
        or norm in ("p .", "a .")
    )


def is_bertweet_dir(path: str | Path) -> bool:
    """True if ``path`` is a local model directory whose tokenizer is a BertweetTokenizer."""
    directory = Path(path)
    for name in ("tokenizer_config.json", "config.json"):
        try:
            data = json.loads((directory / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if str(data.get("tokenizer_class") or "").lower().startswith("bertweet"):
            return True
    return False


class FastBertweetTokenizer:
    """BERTweet token ids as the slow ``BertweetTokenizer(normalization=True)`` gives them, faster.

    ``encode_batch(texts, max_length)`` equals ``[list(x) for x in
    reference(texts, truncation=True, max_length=max_length)["input_ids"]]``:
    ``<s>`` ... ``</s>``, no padding, truncated on the reference's
    ``truncation_side``. Not thread-safe (its caches); use one per thread.
    """

    def __init__(self, reference: BertweetTokenizer) -> None:
        if not reference.normalization:
            raise ValueError("FastBertweetTokenizer needs a BertweetTokenizer with normalization=True")
        if getattr(reference, "do_lower_case", False):
            raise ValueError("FastBertweetTokenizer does not support do_lower_case")
        self.reference = reference
        self.model_max_length: int = int(reference.model_max_length)
        self.truncation_side: str = reference.truncation_side
        self.bos_token_id: int = int(reference.cls_token_id)  # what build_inputs_with_special_tokens adds
        self.eos_token_id: int = int(reference.sep_token_id)
        self.pad_token_id: int = int(reference.pad_token_id)
        self.unk_token_id: int = int(reference.unk_token_id)

        vocab = reference.get_vocab()  # pieces and added tokens -> ids, as the reference looks them up
        self._bpe, self._max_real_id = self._build_bpe(vocab, reference.bpe_ranks)
        # Texts the segment cache does not cover go to the reference whole (module docstring).
        added = sorted((t for t in reference.get_added_vocab() if t), key=len, reverse=True)
        self._added = re.compile("|".join([*map(re.escape, added), re.escape(_EOW)]))
        self._added_firsts = frozenset(t[0] for t in [*added, _EOW])
        # A batch's texts are scanned joined by _JOIN: right unless an added token could span it.
        self._scan_joined = not any(c.isspace() or c == _SENTINEL for t in added for c in t)

        self._norms: dict[str, str] = {}  # raw segment -> its normalised tokens joined by " "
        self._ids: dict[str, tuple[int, ...]] = {}  # segment -> the ids of its words, if it stands alone
        self._tokens: dict[str, str] = {}  # a tweet-regex token -> normalizeToken(token)
        self._words: dict[str, tuple[int, ...]] = {}  # a normalised word -> its BPE ids

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, **kwargs: Any) -> FastBertweetTokenizer:
        """Load the reference BertweetTokenizer from ``model_dir`` (``vocab.txt``, ``bpe.codes``)."""
        local = Path(model_dir).is_dir()
        load_kw: dict[str, Any] = {"local_files_only": True} if local else {}
        load_kw.update(kwargs)
        load_kw["normalization"] = True
        return cls(BertweetTokenizer.from_pretrained(str(model_dir), **load_kw))

    @staticmethod
    def _build_bpe(vocab: dict[str, int], ranks: dict[Any, int]) -> tuple[Tokenizer, int]:
        """A ``tokenizers`` BPE model over fastBPE's codes, in the ``</w>`` suffix convention."""
        internal: dict[str, int] = {}
        # "x@@" first: should "x</w>@@" exist, the word-final "x" must win the key "x</w>",
        # the only one BPE produces for it (texts with a literal "</w>" go to the reference).
        for piece, idx in sorted(vocab.items(), key=lambda kv: not kv[0].endswith("@@")):
            internal[piece[:-2] if piece.endswith("@@") else piece + _EOW] = idx
        max_real = max(vocab.values())
        next_id = max_real + 1
        # The reference's ranks: its codes' lines as tuples, the last of duplicates winning;
        # only pairs can ever merge.
        merges = [pair for pair, _ in sorted(ranks.items(), key=lambda kv: kv[1]) if len(pair) == 2]
        for a, b in merges:
            # tokenizers wants every merge's parts and result in its vocabulary; those
            # vocab.txt lacks get ids past the real ones, mapped back to <unk> later.
            for sym in (a, b, a + b):
                if sym not in internal:
                    internal[sym] = next_id
                    next_id += 1
        unk_key = "<unk>" + _EOW
        if unk_key not in internal:
            internal[unk_key] = next_id
        model = models.BPE(internal, merges, unk_token=unk_key, end_of_word_suffix=_EOW, fuse_unk=False)
        return Tokenizer(model), max_real

    # -- normalisation ------------------------------------------------------

    def _segment(self, text: str) -> list[str] | None:
        """Pieces of ``text`` the tweet regex tokenises independently (module docstring);
        ``None`` for a text left to the reference whole."""
        if any(c in text for c in self._added_firsts) and self._added.search(text) is not None:
            return None
        found = _SCAN.search(text)
        if found is None:
            return text.split()
        if found.group(1) is None or _ODD.search(text) is not None:
            return None
        return [s for s in _SAFE_GAP.split(text) if s]

    def _segment_batch(self, texts: Sequence[str]) -> list[list[str] | None]:
        """``_segment`` of each text, its scans run once over the whole batch.

        Most texts are split at every whitespace run; the scans find the few that are
        not (a risky gap, an odd character, an added token's text) and where they are.
        """
        joined = _JOIN.join(texts)
        if not self._scan_joined or joined.count(_SENTINEL) != max(len(texts) - 1, 0):
            return list(map(self._segment, texts))  # a text holds a NUL: the joined scans could not place it
        # (position, whole): a text holding a match goes to the reference (whole) or is split at safe gaps.
        hits = [(m.start(), m.group(1) is None) for m in _SCAN.finditer(joined)]
        if any(c in joined for c in self._added_firsts):
            hits += [(m.start(), True) for m in self._added.finditer(joined)]
        split: list[list[str] | None] = list(map(str.split, texts))
        if hits:
            ends = list(accumulate(len(t) + len(_JOIN) for t in texts))  # text i ends before ends[i]
            whole: dict[int, bool] = {}
            for pos, to_reference in hits:
                i = bisect_right(ends, pos)
                whole[i] = whole.get(i, False) or to_reference
            for i, to_reference in whole.items():
                split[i] = None if to_reference else [s for s in _SAFE_GAP.split(texts[i]) if s]
        return split

    def _norm_token(self, token: str) -> str:
        norm = self._tokens.get(token)
        if norm is None:
            norm = self._tokens[token] = str(self.reference.normalizeToken(token))
        return norm

    def _normalise_segments(self, segments: Sequence[str]) -> tuple[list[str], list[str]]:
        """Cache each segment's normalised tokens joined by " ": shortcuts, else one reference call.
        Returns the segments normalised (these and the new rests of shortcut ones): the plain
        words, each its own single normalised word, and the others."""
        norms = self._norms
        # Shortcut segments: their head's normalised token, and their rest. Two dicts of strings
        # rather than one of tuples: no container per segment for the garbage collector to walk.
        heads: dict[str, str] = {}
        rests: dict[str, str] = {}
        rest_of_batch: list[str] = []
        # Most new segments are plain ASCII words: the tweet regex takes them whole and the
        # normaliser keeps them, unless one letter (a demojizer call) or http.../www... (HTTPURL).
        plain = [
            s
            for s in segments
            if s.isalpha() and s.isascii() and len(s) > 1 and not s.lower().startswith(("http", "www"))
        ]
        norms.update(zip(plain, plain, strict=True))
        todo = [s for s in segments if s not in norms]
        seen = set(segments)
        while todo:  # rests are segments too, and may be new
            more: list[str] = []
            for seg in todo:
                text = seg
                if "’" in text or "…" in text:  # the reference replaces these first
                    for old, new in _PUNCTS:
                        text = text.replace(old, new)
                found = _SHORTCUT.fullmatch(text)
                if found is None:
                    rest_of_batch.append(seg)
                    continue
                if (head := found["url"]) is not None:
                    head_norm = "HTTPURL"
                elif (head := found["user"]) is not None:
                    head_norm = "@USER"
                else:
                    head = found["tag"] or found["word"]
                    head_norm = self._norm_token(head)
                rest = text[len(head) :]
                if len(rest) > _MAX_REST:
                    rest_of_batch.append(seg)
                    continue
                heads[seg] = head_norm
                rests[seg] = rest
                if rest and rest not in seen and rest not in norms:
                    seen.add(rest)
                    more.append(rest)
            todo = more
        self._normalise_by_reference(rest_of_batch)
        for seg in sorted(heads, key=len):  # a rest is shorter than its segment: known by then
            head_norm, rest = heads[seg], rests[seg]
            rest_norm = norms[rest] if rest else ""
            norms[seg] = f"{head_norm} {rest_norm}" if rest_norm else head_norm
        return plain, [*rest_of_batch, *heads]

    def _normalise_by_reference(self, segments: Sequence[str]) -> None:
        """The reference's tokens of ``segments``, normalised: one call, a NUL token between
        them (segments holding a NUL one at a time)."""
        batches = [[s for s in segments if _SENTINEL not in s]] + [[s] for s in segments if _SENTINEL in s]
        for batch in batches:
            if not batch:
                continue
            joined = _JOIN.join(batch)
            for old, new in _PUNCTS:
                joined = joined.replace(old, new)
            norms: list[str] = []
            current: list[str] = []  # the tokens of one segment, joined as soon as it ends
            for token in self.reference.tweetPreprocessor.tokenize(joined):
                if token == _SENTINEL and len(batch) > 1:
                    norms.append(" ".join(current))
                    current = []
                else:
                    current.append(self._norm_token(token))
            norms.append(" ".join(current))
            if len(norms) != len(batch):
                raise AssertionError("a NUL separator was absorbed into a token")  # see the module docstring
            self._norms.update(zip(batch, norms, strict=True))

    def _fill_words(self, new_words: list[str]) -> None:
        """BPE ``new_words`` in Rust, one call, and cache their ids."""
        enc = self._bpe.encode(new_words, is_pretokenized=True, add_special_tokens=False)
        ids, word_index = enc.ids, enc.word_ids  # no special tokens: every token has its word's index
        unk, top = self.unk_token_id, self._max_real_id
        if max(ids, default=0) > top:
            ids = [i if i <= top else unk for i in ids]
        # Tokens come word after word: word j's start where the indices first reach j (C-level
        # calls rather than a Python step per token).
        starts = list(map(bisect_left, repeat(word_index), range(len(new_words) + 1)))
        pieces = map(tuple, map(ids.__getitem__, map(slice, starts, starts[1:])))
        self._words.update(zip(new_words, pieces, strict=True))

    def _fill_segments(self, segments: Sequence[str]) -> None:
        """Normalise ``segments``, BPE their new words, cache the ids of those that stand alone."""
        plain, new = self._normalise_segments(segments)
        norms, words = self._norms, self._words
        # One string, one split: a list per segment would cost more in garbage collection than here.
        new_words = set(" ".join(map(norms.__getitem__, new)).split())
        new_words.update(plain)
        new_words.difference_update(words)
        if new_words:
            self._fill_words(list(new_words))
        ids = self._ids
        # A plain word is its own normalised word: its ids as they are, in C-level calls (most
        # new segments). It stands alone unless "cannot" is in it (_stands_alone).
        alone = [w for w in plain if "cannot" not in w]
        ids.update(zip(alone, map(words.__getitem__, alone), strict=True))
        for seg in new:
            norm = norms[seg]
            if _stands_alone(norm):
                # Most are one word: its ids as they are.
                ids[seg] = (
                    words[norm]
                    if norm and " " not in norm
                    else tuple(chain.from_iterable(map(words.__getitem__, norm.split())))
                )

    def _trim_caches(self) -> None:
        if len(self._norms) > _CACHE_LIMIT:  # these two stay consistent: _ids is a subset of _norms
            self._norms.clear()
            self._ids.clear()
        for cache in (self._tokens, self._words):
            if len(cache) > _CACHE_LIMIT:
                cache.clear()

    def _prepare(self, texts: Sequence[str]) -> list[list[str] | None]:
        """Each text's segments (``None``: left to the reference), all of them normalised."""
        self._trim_caches()
        split = self._segment_batch(texts)
        missing = set().union(*[segs for segs in split if segs is not None]).difference(self._norms)
        if missing:
            self._fill_segments(list(missing))
        return split

    def _joined_words(self, segments: list[str]) -> list[str]:
        """A text's normalised words, the reference's cross-token replacements done."""
        joined = " ".join([n for n in map(self._norms.__getitem__, segments) if n])
        return _fix_joined(joined).split()

    def normalize_batch(self, texts: Sequence[str]) -> list[str | None]:
        """The reference's ``normalizeTweet`` of each text; ``None`` for texts left to the reference."""
        return [None if segs is None else " ".join(self._joined_words(segs)) for segs in self._prepare(texts)]

    # -- ids -------------------------------------------------------------------

    def encode_batch(self, texts: Sequence[str], max_length: int | None = None) -> list[list[int]]:
        """Ids of each text with ``<s>``/``</s>``, at most ``max_length`` (default: the model's)."""
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings, not a single string")
        limit = self.model_max_length if max_length is None else int(max_length)
        if limit < 2:
            raise ValueError("max_length must be at least 2 (room for <s> and </s>)")
        bos, eos = self.bos_token_id, self.eos_token_id
        self._trim_caches()
        split = self._segment_batch(texts)
        segment_ids = self._ids.__getitem__
        out: list[list[int]] = []
        joined_rows: list[int] = []  # texts the cross-token replacements may touch
        reference_rows: list[int] = []
        known = self._norms.__contains__
        # The hot loop: a few C-level calls per text, nothing else (warm, most texts). A text
        # with a segment not in _ids: if all its segments are normalised, one does not stand
        # alone; else every new segment of the rest of the batch is normalised at once (after
        # that, only the first case remains).
        for i, segs in enumerate(split):
            if segs is None:
                reference_rows.append(i)
                out.append([])
                continue
            try:
                out.append([bos, *chain.from_iterable(map(segment_ids, segs)), eos])
                continue
            except KeyError:
                if all(map(known, segs)):
                    joined_rows.append(i)
                    out.append([])
                    continue
            rest = [s for s in split[i:] if s is not None]
            self._fill_segments(list(set().union(*rest).difference(self._norms)))
            try:
                out.append([bos, *chain.from_iterable(map(segment_ids, segs)), eos])
            except KeyError:
                joined_rows.append(i)
                out.append([])
        if joined_rows:
            self._encode_joined(split, joined_rows, out)
        if reference_rows:
            ref = self.reference([texts[i] for i in reference_rows], truncation=True, max_length=limit)
            for i, ref_ids in zip(reference_rows, ref["input_ids"], strict=True):
                out[i] = list(ref_ids)
        room = limit - 2
        # transformers cannot truncate to nothing (max_length 2): it logs an error and
        # keeps the whole text. Same ids as the reference, so the same here.
        if room > 0 and max(map(len, out), default=0) > limit:
            left = self.truncation_side == "left"
            for i, row in enumerate(out):
                if len(row) > limit:  # the reference's rows are already truncated
                    out[i] = [bos, *(row[len(row) - 1 - room : -1] if left else row[1 : room + 1]), eos]
        return out

    def _encode_joined(self, split: list[list[str] | None], rows: list[int], out: list[list[int]]) -> None:
        """``out[i]`` (untruncated) for texts whose words come from the joined normalisation."""
        words_of = [self._joined_words(split[i] or []) for i in rows]
        words = self._words
        new_words = {w: None for ws in words_of for w in ws if w not in words}
        if new_words:  # words made by the replacements ("n't", "'s" ...) may be new
            self._fill_words(list(new_words))
        bos, eos = self.bos_token_id, self.eos_token_id
        for i, ws in zip(rows, words_of, strict=True):
            out[i] = [bos, *chain.from_iterable(map(words.__getitem__, ws)), eos]

    def __call__(self, texts: Sequence[str], max_length: int | None = None) -> list[list[int]]:
        return self.encode_batch(texts, max_length)


def fast_for(tokenizer: object, *, slow: bool = False) -> FastBertweetTokenizer | None:
    """The fast tokenizer standing in for ``tokenizer`` when it is a normalising
    ``BertweetTokenizer`` and ``slow`` is not asked for; else None (use ``tokenizer``)."""
    if slow or not isinstance(tokenizer, BertweetTokenizer) or not tokenizer.normalization:
        return None
    return FastBertweetTokenizer(tokenizer)
