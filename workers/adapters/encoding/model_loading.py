r"""Loading a transformers encoder: device, dtype, the model with its config and tokenizer.

The tokenizer's part (names, BERTweet, limits) is :mod:`workers.adapters.encoding.tokenizer_loading`,
which needs no torch.  Load failures come out as one-line :class:`~stream.feeds.batch.ModelLoadError`\ s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedTokenizerBase

from stream.feeds.batch import ModelLoadError
from workers.adapters.encoding.cpu_fast import cpu_supports_bf16, cpu_supports_int8, int8_available
from workers.adapters.encoding.tokenizer_loading import is_bertweet, load_hf_tokenizer

_POOLER_MODELS = frozenset({"bert", "roberta"})  # their __init__ takes add_pooling_layer

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


def load_pretrained(
    model: str, path: str
) -> tuple[PretrainedConfig, PreTrainedTokenizerBase, torch.nn.Module, dict[str, Any]]:
    """The config, tokenizer (:func:`load_hf_tokenizer`) and model at ``path`` (``model``: the
    name as given, for BERTweet hints and errors), and the keyword arguments they were loaded
    with.  Raises :class:`~stream.feeds.batch.ModelLoadError` with transformers' first line."""
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


__all__ = ["load_pretrained", "resolve_device", "resolve_dtype"]
