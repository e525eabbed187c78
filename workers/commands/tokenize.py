"""``reval tokenize --model DIR [--slow]``: texts in, token ids out, one per line.

Why: to see and compare the exact ids the embed worker feeds its model (the
fast BERTweet tokenizer against transformers' own, or any model's tokenizer),
and to time tokenisation on its own. Each input line (its trailing newline
stripped, nothing else) becomes one compact JSON array of ids, with the
model's special tokens (BERTweet: ``<s>`` ... ``</s>``), no padding, truncated
at the model's maximum length as the encoder truncates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from transformers import BertweetTokenizer

from workers.adapters.encoding.bertweet_tokenizer import fast_for
from workers.adapters.encoding.tokenizer_loading import (
    is_bertweet,
    load_hf_tokenizer,
    max_tokens,
    resolve_model,
    tokenizer_config,
)

BATCH = 1024  # lines per tokenizer call: amortises per-call costs, keeps memory flat


def _batches(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(lines)
    while batch := list(islice(it, size)):
        yield batch


def _strip_newline(line: str) -> str:
    """The line without its trailing newline ("\\n" or "\\r\\n"), nothing else."""
    if line.endswith("\n"):
        line = line[:-1]
        if line.endswith("\r"):
            line = line[:-1]
    return line


def load_tokenizer(model: str, *, slow: bool = False) -> tuple[Callable[[list[str]], list[list[int]]], int]:
    """``(encode, max_length)`` for ``model``: a function from texts to id lists, and its limit.

    BERTweet models get :class:`FastBertweetTokenizer` unless ``slow``; other
    models their ``AutoTokenizer`` (the fast one where there is one, unless ``slow``).
    Raises ``ValueError`` (one line) when the model cannot be loaded.
    """
    path = resolve_model(model)
    load_kw: dict[str, Any] = {"local_files_only": True} if Path(path).is_dir() else {}
    try:
        config = tokenizer_config(path, **load_kw)
        bertweet = is_bertweet(model, config)
        tok = load_hf_tokenizer(path, bertweet_hint=bertweet, **load_kw)
        if slow and not isinstance(tok, BertweetTokenizer) and tok.is_fast:
            tok = load_hf_tokenizer(path, bertweet_hint=False, use_fast=False, **load_kw)
    except (OSError, ValueError, TypeError) as exc:
        gist = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"cannot load a tokenizer from {model!r}: {gist}") from exc
    max_length = max_tokens(tok, config)
    fast = fast_for(tok, slow=slow)
    if fast is not None:
        return (lambda texts: fast.encode_batch(texts, max_length)), max_length

    def encode(texts: list[str]) -> list[list[int]]:
        out = tok(texts, truncation=True, max_length=max_length, add_special_tokens=True)
        return [list(ids) for ids in out["input_ids"]]

    return encode, max_length


def tokenize_stream(model: str, slow: bool, lines: Iterable[str], write: Callable[[str], object]) -> int:
    """Write one JSON array of token ids per line of ``lines``; return the number of lines.

    ``write`` gets each output line, newline included (``sys.stdout.write`` will do;
    what it returns is ignored). ``slow`` forces
    transformers' own (slow) tokenizer. ``ValueError`` if ``model`` cannot be loaded.
    """
    encode, _ = load_tokenizer(model, slow=slow)
    n = 0
    for batch in _batches(lines, BATCH):
        for ids in encode([_strip_newline(line) for line in batch]):
            write("[" + ",".join(map(str, ids)) + "]\n")
        n += len(batch)
    return n
