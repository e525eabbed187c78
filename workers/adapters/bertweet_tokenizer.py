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
  (HTML entities, which may decode to anything, count as risky too). Cache
  misses of a whole batch go through the reference in one call, separated by a
  NUL token no pattern can cross.
* The cross-token steps of the normaliser (``"n't "`` -> ``" n't "``, ``p . m``
  -> ``p.m`` ...) are re-done here on the joined tokens, in the reference's order.
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
from collections.abc import Sequence
from itertools import chain
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

# Segments the tweet regex provably takes whole: letters only (its word pattern),
# and plain URLs (its first pattern; the normaliser makes any token starting "http" HTTPURL).
_LETTERS = re.compile(r"[A-Za-z]+")
_SIMPLE_URL = re.compile(r"(?i:https?)://[A-Za-z0-9./_\-?=%~+]*[A-Za-z0-9/_\-=%~+]")

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

        # raw segment -> (its normalised tokens joined by " ", the ids of their words)
        self._segments: dict[str, tuple[str, tuple[int, ...]]] = {}
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

    def _norm_token(self, token: str) -> str:
        norm = self._tokens.get(token)
        if norm is None:
            norm = self._tokens[token] = str(self.reference.normalizeToken(token))
        return norm

    def _normalise_segments(self, segments: Sequence[str]) -> dict[str, str]:
        """Each segment's normalised tokens joined by " ": shortcuts, else one reference call."""
        out: dict[str, str] = {}
        rest: list[str] = []
        for seg in segments:
            if _LETTERS.fullmatch(seg):  # the tweet regex's word pattern takes it whole
                out[seg] = self._norm_token(seg)
            elif _SIMPLE_URL.fullmatch(seg):  # its URL pattern (the first) takes it whole
                out[seg] = "HTTPURL"
            else:
                rest.append(seg)
        # Misses go through the reference together, a NUL token between them
        # (segments holding a NUL one at a time).
        batches = [[s for s in rest if _SENTINEL not in s]] + [[s] for s in rest if _SENTINEL in s]
        for batch in batches:
            if not batch:
                continue
            joined = f" {_SENTINEL} ".join(batch)
            for old, new in _PUNCTS:
                joined = joined.replace(old, new)
            tokens: list[list[str]] = [[]]
            for token in self.reference.tweetPreprocessor.tokenize(joined):
                if token == _SENTINEL and len(batch) > 1:
                    tokens.append([])
                else:
                    tokens[-1].append(self._norm_token(token))
            if len(tokens) != len(batch):
                raise AssertionError("a NUL separator was absorbed into a token")  # see the module docstring
            for seg, toks in zip(batch, tokens, strict=True):
                out[seg] = " ".join(toks)
        return out

    def _fill_words(self, new_words: list[str]) -> None:
        """BPE ``new_words`` in Rust, one call, and cache their ids."""
        enc = self._bpe.encode(new_words, is_pretokenized=True, add_special_tokens=False)
        per_word: list[list[int]] = [[] for _ in new_words]
        unk, top = self.unk_token_id, self._max_real_id
        for idx, word_index in zip(enc.ids, enc.word_ids, strict=True):
            if word_index is not None:
                per_word[word_index].append(idx if idx <= top else unk)
        for word, ids in zip(new_words, per_word, strict=True):
            self._words[word] = tuple(ids)

    def _fill_segments(self, segments: Sequence[str]) -> None:
        """Normalise ``segments``, BPE their new words, cache both."""
        norms = self._normalise_segments(segments)
        words = self._words
        new_words = list({w: None for n in norms.values() for w in n.split() if w not in words})
        if new_words:
            self._fill_words(new_words)
        for seg, norm in norms.items():
            self._segments[seg] = (norm, tuple(chain.from_iterable(map(words.__getitem__, norm.split()))))

    def _trim_caches(self) -> None:
        for cache in (self._segments, self._tokens, self._words):
            if len(cache) > _CACHE_LIMIT:
                cache.clear()

    def _ids_or_words(self, segments: list[str]) -> tuple[list[int] | None, list[str]]:
        """The ids of a text's words (no special tokens) from its cached ``segments`` or,
        where the normaliser's cross-token replacements apply, ``None`` and its words."""
        vals = list(map(self._segments.__getitem__, segments))
        joined = " ".join([v[0] for v in vals if v[0]])
        if "'" in joined or "cannot " in joined or " . m" in joined:
            return None, _fix_joined(joined).split()
        return list(chain.from_iterable([v[1] for v in vals])), []

    def _prepare(self, texts: Sequence[str]) -> list[list[str] | None]:
        """Each text's segments (``None``: left to the reference), all of them cached."""
        self._trim_caches()
        split = list(map(self._segment, texts))
        cache = self._segments
        missing = {s: None for segs in split if segs is not None for s in segs if s not in cache}
        if missing:
            self._fill_segments(list(missing))
        return split

    def normalize_batch(self, texts: Sequence[str]) -> list[str | None]:
        """The reference's ``normalizeTweet`` of each text; ``None`` for texts left to the reference."""
        out: list[str | None] = []
        for segs in self._prepare(texts):
            if segs is None:
                out.append(None)
                continue
            joined = " ".join([n for n, _ in map(self._segments.__getitem__, segs) if n])
            out.append(" ".join(_fix_joined(joined).split()))
        return out

    # -- ids -------------------------------------------------------------------

    def encode_batch(self, texts: Sequence[str], max_length: int | None = None) -> list[list[int]]:
        """Ids of each text with ``<s>``/``</s>``, at most ``max_length`` (default: the model's)."""
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings, not a single string")
        limit = self.model_max_length if max_length is None else int(max_length)
        if limit < 2:
            raise ValueError("max_length must be at least 2 (room for <s> and </s>)")
        room = limit - 2
        left = self.truncation_side == "left"
        bos, eos = [self.bos_token_id], [self.eos_token_id]
        rows = [None if segs is None else self._ids_or_words(segs) for segs in self._prepare(texts)]
        # Words made by the cross-token replacements ("n't", "'s" ...) may be new.
        words = self._words
        new_words = {w: None for row in rows if row is not None for w in row[1] if w not in words}
        if new_words:
            self._fill_words(list(new_words))
        out: list[list[int]] = []
        reference_rows: list[int] = []
        for i, row in enumerate(rows):
            if row is None:
                reference_rows.append(i)
                out.append([])
                continue
            ids = row[0] if row[0] is not None else list(chain.from_iterable(map(words.__getitem__, row[1])))
            # transformers cannot truncate to nothing (max_length 2): it logs an error and
            # keeps the whole text. Same ids as the reference, so the same here.
            if len(ids) > room > 0:
                ids = ids[len(ids) - room :] if left else ids[:room]
            out.append(bos + ids + eos)
        if reference_rows:
            ref = self.reference([texts[i] for i in reference_rows], truncation=True, max_length=limit)
            for i, ref_ids in zip(reference_rows, ref["input_ids"], strict=True):
                out[i] = list(ref_ids)
        return out

    def __call__(self, texts: Sequence[str], max_length: int | None = None) -> list[list[int]]:
        return self.encode_batch(texts, max_length)


def fast_for(tokenizer: object, *, slow: bool = False) -> FastBertweetTokenizer | None:
    """The fast tokenizer standing in for ``tokenizer`` when it is a normalising
    ``BertweetTokenizer`` and ``slow`` is not asked for; else None (use ``tokenizer``)."""
    if slow or not isinstance(tokenizer, BertweetTokenizer) or not tokenizer.normalization:
        return None
    return FastBertweetTokenizer(tokenizer)
