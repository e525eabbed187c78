"""The encoder's token-budget path (its GPU path): batches cut by tokens, packed sequences, overlap.

On a GPU the fixed-count path of :class:`~workers.adapters.encoding.encoder.Encoder` (32 tweets
per batch, padded, tokenised on the calling thread) leaves the device idle most of the
time: a batch of 32 tweets is far too small to fill an H100, padding is computed like
real tokens, and the GPU waits while Python tokenises. This module holds the pieces of
the path that replaces it (``Encoder(token_budget=...)``, the default on CUDA); all of
them run on CPU too, which is where the tests run them.

Batching by tokens. :func:`token_budget_batches` sorts a window of tweets by length
(longest first) and cuts it into batches of at most ``token_budget`` tokens, so a batch
is big enough to fill the device whatever the tweets' lengths; outputs are scattered
back to input order by index (:func:`restore_order`).

No compute on padding. Three layouts (:data:`Packing`), tried in this order:

* ``"varlen"`` (default for standard BERT/RoBERTa encoders, i.e. BERTweet): the batch's
  tweets are packed into one ``(tokens, hidden)`` matrix with no padding at all; the
  per-token layers (the Linear layers, ~95% of the FLOPs at tweet lengths, LayerNorm,
  GELU) run on it as is, by calling the model's own modules (:func:`packed_hidden`,
  the same layer loop as :func:`workers.adapters.encoding.cpu_fast.packed_forward`). Only attention needs
  to know where one tweet ends: variable-length attention over ``cu_seqlens`` (the
  tweets' offsets), see :data:`Attention`. Compute is proportional to the real tokens.
* ``"rows"`` (for other models, through the model's own forward): tweets bin-packed
  into rows of ``max_length`` tokens (best fit, longest first; rows end up ~95-100%
  full), each row's attention restricted to each tweet by a block-diagonal 3-D mask
  ``(rows, width, width)`` and positions restarting at every tweet (``position_ids``).
  transformers 4.57's ``RobertaModel`` / ``BertModel`` take both as public ``forward``
  arguments (a 3-D 0/1 mask becomes an additive 4-D mask in ``get_extended_attention_mask``;
  a 4-D mask is not accepted there). Attention then costs ``width`` keys per token instead
  of the tweet's length (~3% more FLOPs for BERT-base at width 128). Packing everything
  into ONE row instead would make attention quadratic in the whole budget (at 32k tokens,
  more FLOPs in attention than in all the Linear layers), so rows stay ``max_length`` wide.
* ``"padded"``: length-bucketed padded batches through the model's own forward; the
  budget counts padding too (batch x longest), and since a batch holds tweets of similar
  length, padding stays small. The fallback for models that take neither of the above.

Attention for ``"varlen"`` (:data:`Attention`): ``"flash"`` is
``torch.nn.attention.varlen.varlen_attn`` (public since torch 2.10; Flash Attention's
varlen kernel, CUDA, fp16/bf16: attention over each tweet only, no padding, no mask);
``"nested"`` is ``scaled_dot_product_attention`` on jagged nested tensors
(``torch.nested.nested_tensor_from_jagged``; on CUDA it dispatches to the same kernel
family, on CPU to a math kernel); ``"padded"`` scatters q/k/v into a padded
``(tweets, heads, longest, head)`` layout for one masked SDPA call (attention is ~1-5%
of the FLOPs at tweet lengths, so its padding costs little) -- the CPU default.

Overlap (:mod:`workers.adapters.encoding.prefetch`): the host side (tokenising, sorting, building
the batch tensors in pinned memory) runs in a thread that feeds a bounded queue while the
calling thread launches GPU work; host-to-device copies are ``non_blocking`` from pinned
memory, and results come back the same way into pinned buffers, with one synchronisation per
``encode`` call. Tokenisation itself can run in processes (``tokenize_workers``,
:mod:`workers.adapters.encoding.tokenizing_processes`), since the BERTweet normaliser is Python and
holds the GIL.

CUDA graphs are left out: the shapes change from batch to batch (tokens, tweets, longest
tweet), and at the default budget of 32k tokens a batch keeps an H100 busy for ~10 ms
against ~1-2 ms of kernel launches, which the asynchronous launch already hides. Padding
every batch to the budget and to a fixed tweet count would make them possible; not done.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import torch

from workers.adapters.encoding.bert_forward import padded_attention, run_layers

log = logging.getLogger(__name__)

Packing = Literal["varlen", "rows", "padded"]
Attention = Literal["flash", "nested", "padded"]
PACKINGS: tuple[str, ...] = ("varlen", "rows", "padded")
ATTENTIONS: tuple[str, ...] = ("flash", "nested", "padded")

#: Default tokens per batch on CUDA: ~1,000-2,500 feed tweets; a BERT-base forward on it
#: takes ~5-15 ms on an H100, long enough to hide the launches and the host work.
DEFAULT_TOKEN_BUDGET = 32_768


# -- batching (pure) -------------------------------------------------------------


def token_budget_batches(
    lengths: Sequence[int] | np.ndarray, budget: int, *, padded: bool = False
) -> list[np.ndarray]:
    """Indices into ``lengths``, longest first, cut into batches of at most ``budget`` tokens.

    A batch costs the sum of its lengths (packed layouts), or with ``padded`` its size
    times its longest length (every row padded to the longest). The sort is stable
    (equal lengths keep input order); the batches together are a permutation of
    ``range(len(lengths))``. A single item longer than ``budget`` gets a batch of its own.
    """
    if budget < 1:
        raise ValueError("budget must be positive")
    lens = np.asarray(lengths, dtype=np.int64)
    if lens.ndim != 1:
        raise ValueError("lengths must be one-dimensional")
    n = len(lens)
    if n == 0:
        return []
    order = np.argsort(-lens, kind="stable")
    batches: list[np.ndarray] = []
    if padded:
        # Sorted longest first: a batch starting at i is padded to lens[order[i]].
        start = 0
        while start < n:
            width = int(lens[order[start]])
            size = max(1, budget // max(width, 1))
            batches.append(order[start : start + size])
            start += size
        return batches
    sorted_lens = lens[order]
    ends = np.cumsum(sorted_lens)
    start, base = 0, 0
    while start < n:
        # Largest stop with ends[stop - 1] - base <= budget (at least one item).
        stop = int(np.searchsorted(ends, base + budget, side="right"))
        stop = max(stop, start + 1)
        batches.append(order[start:stop])
        base = int(ends[stop - 1])
        start = stop
    return batches


def pack_rows(lengths: Sequence[int] | np.ndarray, width: int) -> list[list[int]]:
    """Bin-pack items into rows of ``width`` tokens: best fit, longest first.

    Returns the rows as lists of indices into ``lengths`` (each row's total at most
    ``width``; items longer than ``width`` are not allowed). Every index appears once.
    """
    lens = np.asarray(lengths, dtype=np.int64)
    if len(lens) and int(lens.max()) > width:
        raise ValueError(f"an item of {int(lens.max())} tokens does not fit a row of {width}")
    rows: list[list[int]] = []
    by_free: list[list[int]] = [[] for _ in range(width + 1)]  # free space -> rows with it
    free: list[int] = []
    for i in np.argsort(-lens, kind="stable").tolist():
        need = int(lens[i])
        for space in range(need, width + 1):  # the tightest row it fits in
            if by_free[space]:
                r = by_free[space].pop()
                break
        else:
            r = len(rows)
            rows.append([])
            free.append(width)
            space = width
        rows[r].append(i)
        free[r] = space - need
        by_free[free[r]].append(r)
    return rows


def restore_order(batches: Sequence[np.ndarray], results: Sequence[np.ndarray], n: int) -> np.ndarray:
    """Rows of ``results`` (one array per batch, in batch order) scattered back to input order."""
    if not results:
        return np.zeros((n, 0), dtype=np.float32)
    out = np.zeros((n, results[0].shape[1]), dtype=results[0].dtype)
    for idx, res in zip(batches, results, strict=True):
        out[idx] = res
    return out


# -- host batches -----------------------------------------------------------------


@dataclass
class Window:
    """Tokenised tweets: ``ids`` concatenated, ``lengths`` per tweet, ``index`` = input position."""

    ids: np.ndarray  # int64 (total,)
    lengths: np.ndarray  # int64 (n,)
    index: np.ndarray  # int64 (n,)

    @classmethod
    def from_lists(cls, rows: Sequence[Sequence[int]], index: np.ndarray) -> Window:
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        ids = np.fromiter((t for r in rows for t in r), dtype=np.int64, count=int(lengths.sum()))
        return cls(ids, lengths, np.asarray(index, dtype=np.int64))

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())

    def __len__(self) -> int:
        return len(self.lengths)

    def offsets(self) -> np.ndarray:
        out = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=out[1:])
        return out

    def take(self, items: np.ndarray) -> Window:
        """The tweets at positions ``items`` (of this window), in that order."""
        starts = self.offsets()[:-1][items]
        lens = self.lengths[items]
        return Window(self.ids[_ranges(starts, lens)], lens, self.index[items])

    @staticmethod
    def concat(windows: Sequence[Window]) -> Window:
        if len(windows) == 1:
            return windows[0]
        return Window(
            np.concatenate([w.ids for w in windows]),
            np.concatenate([w.lengths for w in windows]),
            np.concatenate([w.index for w in windows]),
        )


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])``, vectorised."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    rel = np.arange(total, dtype=np.int64) - np.repeat(ends - lengths, lengths)
    return np.repeat(starts, lengths) + rel


@dataclass
class Batch:
    """One batch in a device's (or the host's) memory, any layout.

    Whatever the layout, the real tokens' hidden states are gathered into one
    ``(tokens, hidden)`` matrix in batch order (tweet after tweet): ``tokens`` says
    where they sit in the flattened model output (None: they are the output),
    ``segment`` which tweet each belongs to, ``cu_seqlens`` each tweet's offset.
    """

    layout: Packing
    index: np.ndarray  # input positions of the batch's tweets, in batch order (host only)
    input_ids: torch.Tensor  # varlen (T,), rows (R, W), padded (B, L)
    position_ids: torch.Tensor | None  # varlen (T,), rows (R, W); padded: the model's own
    row_segment: torch.Tensor | None  # rows: (R, W) tweet of each slot, -1 for padding
    mask: torch.Tensor | None  # padded: (B, L) 0/1
    pad_index: torch.Tensor | None  # varlen: (T,) slot of each token in a (B, longest) layout
    tokens: torch.Tensor | None  # rows / padded: (T,) flat positions of the real tokens
    segment: torch.Tensor  # (T,) int64
    cu_seqlens: torch.Tensor  # (B + 1,) int32
    lengths: torch.Tensor  # (B,) float32
    max_len: int
    n_tokens: int

    def to(self, device: torch.device) -> Batch:
        """The tensors on ``device`` (``non_blocking``: from pinned memory, the copy runs async)."""

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)

        return replace(
            self,
            input_ids=self.input_ids.to(device, non_blocking=True),
            position_ids=move(self.position_ids),
            row_segment=move(self.row_segment),
            mask=move(self.mask),
            pad_index=move(self.pad_index),
            tokens=move(self.tokens),
            segment=self.segment.to(device, non_blocking=True),
            cu_seqlens=self.cu_seqlens.to(device, non_blocking=True),
            lengths=self.lengths.to(device, non_blocking=True),
        )


def build_batch(
    window: Window,
    layout: Packing,
    *,
    pad_id: int,
    position_offset: int,
    width: int = 128,
    pin: bool = False,
) -> Batch:
    """The tensors of one batch (all of ``window``, in its order) for ``layout``.

    ``position_offset``: the first position id (RoBERTa-style models start after the
    padding index: 2 for BERTweet; BERT: 0). ``width``: the rows' length for ``"rows"``.
    ``pin``: put the tensors in pinned memory (for ``non_blocking`` copies to CUDA).
    """
    n = len(window)
    lens = window.lengths
    offsets = window.offsets()
    total = int(offsets[-1])
    segment = np.repeat(np.arange(n, dtype=np.int64), lens)
    within = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1], lens)  # position in its tweet
    max_len = int(lens.max()) if n else 0
    if layout == "varlen":
        arrays = _Layout(window.ids, within + position_offset, pad_index=segment * max_len + within)
    elif layout == "rows":
        arrays = _rows_layout(
            window, segment, within, pad_id=pad_id, position_offset=position_offset, width=width
        )
    elif layout == "padded":
        arrays = _padded_layout(window, segment * max_len + within, (n, max_len), pad_id)
    else:
        raise ValueError(f"layout must be one of {PACKINGS}, got {layout!r}")

    def tensor(a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(a))
        return t.pin_memory() if pin else t

    def optional(a: np.ndarray | None) -> torch.Tensor | None:
        return None if a is None else tensor(a)

    return Batch(
        layout=layout,
        index=window.index,
        input_ids=tensor(arrays.input_ids),
        position_ids=optional(arrays.position_ids),
        row_segment=optional(arrays.row_segment),
        mask=optional(arrays.mask),
        pad_index=optional(arrays.pad_index),
        tokens=optional(arrays.tokens),
        segment=tensor(segment),
        cu_seqlens=tensor(offsets.astype(np.int32)),
        lengths=tensor(lens.astype(np.float32)),
        max_len=max_len,
        n_tokens=total,
    )


@dataclass
class _Layout:
    """The layout-specific arrays of a :class:`Batch`, on the host (None: not in this layout)."""

    input_ids: np.ndarray
    position_ids: np.ndarray | None = None
    row_segment: np.ndarray | None = None
    mask: np.ndarray | None = None
    pad_index: np.ndarray | None = None
    tokens: np.ndarray | None = None


def _rows_layout(
    window: Window, segment: np.ndarray, within: np.ndarray, pad_id: int, position_offset: int, width: int
) -> _Layout:
    """``"rows"``: the tweets bin-packed into rows of ``width`` (:func:`pack_rows`)."""
    lens = window.lengths
    rows = pack_rows(lens, width)
    n_rows = len(rows)
    # Where each tweet starts: its row, and the tokens before it in that row.
    row_of = np.zeros(len(window), dtype=np.int64)
    col_of = np.zeros(len(window), dtype=np.int64)
    for r, items in enumerate(rows):
        used = 0
        for i in items:
            row_of[i], col_of[i] = r, used
            used += int(lens[i])
    flat = np.repeat(row_of * width + col_of, lens) + within
    input_ids = np.full(n_rows * width, pad_id, dtype=np.int64)
    input_ids[flat] = window.ids
    # Padding slots: the padding index's position, as the model gives padding itself.
    position_ids = np.full(n_rows * width, max(position_offset - 1, 0), dtype=np.int64)
    position_ids[flat] = within + position_offset
    row_segment = np.full(n_rows * width, -1, dtype=np.int64)
    row_segment[flat] = segment
    shape = (n_rows, width)
    return _Layout(
        input_ids.reshape(shape),
        position_ids.reshape(shape),
        row_segment=row_segment.reshape(shape),
        tokens=flat,
    )


def _padded_layout(window: Window, flat: np.ndarray, shape: tuple[int, int], pad_id: int) -> _Layout:
    """``"padded"``: one row per tweet, right-padded to the longest; ``flat``: each token's slot."""
    input_ids = np.full(shape[0] * shape[1], pad_id, dtype=np.int64)
    input_ids[flat] = window.ids
    mask = np.zeros(shape[0] * shape[1], dtype=np.int64)
    mask[flat] = 1
    return _Layout(input_ids.reshape(shape), mask=mask.reshape(shape), tokens=flat)


def batches_from_windows(
    windows: Iterable[Window],
    budget: int,
    *,
    layout: Packing,
    window_tokens: int,
    width: int = 128,
) -> Iterator[Window]:
    """Batches (as windows) of the tweets streaming in: sorted and cut by ``budget`` per
    window of at least ``window_tokens`` tokens.

    Within a window the tweets are sorted longest first and cut by the budget
    (:func:`token_budget_batches`); its last, partial batch is carried over into the
    next window, so every batch but the very last is close to the budget. For
    ``"rows"`` the budget counts whole rows of ``width`` tokens.
    """
    pending: list[Window] = []
    pending_tokens = 0

    def cut(w: Window, final: bool) -> tuple[list[Window], Window | None]:
        if layout == "rows":
            return _cut_rows(w, budget, width, final)
        parts = token_budget_batches(w.lengths, budget, padded=layout == "padded")
        out = [w.take(p) for p in parts]
        if final or len(out) < 2:
            return (out, None) if final else ([], w)
        return out[:-1], out[-1]

    for w in windows:
        if len(w) == 0:
            continue
        pending.append(w)
        pending_tokens += w.tokens
        if pending_tokens < window_tokens:
            continue
        ready, rest = cut(Window.concat(pending), final=False)
        yield from ready
        pending = [rest] if rest is not None else []
        pending_tokens = rest.tokens if rest is not None else 0
    if pending:
        ready, _ = cut(Window.concat(pending), final=True)
        yield from ready


def _cut_rows(w: Window, budget: int, width: int, final: bool) -> tuple[list[Window], Window | None]:
    """``"rows"``: pack the whole window into rows, then group ``budget // width`` rows a batch."""
    rows = pack_rows(w.lengths, width)
    per = max(1, budget // width)
    groups = [rows[i : i + per] for i in range(0, len(rows), per)]
    parts = [np.asarray([i for row in g for i in row], dtype=np.int64) for g in groups]
    out = [w.take(p) for p in parts]
    if final or len(out) < 2:
        return (out, None) if final else ([], w)
    return out[:-1], out[-1]


# -- the forward pass ----------------------------------------------------------------


def flash_varlen_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``torch.nn.attention.varlen.varlen_attn`` (public, torch >= 2.10) can run here."""
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def _attend_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: Batch) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    cu = batch.cu_seqlens
    out = varlen_attn(q.contiguous(), k.contiguous(), v.contiguous(), cu, cu, batch.max_len, batch.max_len)
    assert isinstance(out, torch.Tensor)
    return out


def _attend_nested(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: Batch) -> torch.Tensor:
    """SDPA on jagged nested tensors ``(tweets, heads, ragged, head size)``. Needs no_grad
    rather than inference_mode (nested tensors set version counters)."""
    offsets = batch.cu_seqlens.long()
    lo = 1  # every tweet has <s> and </s>; min_seqlen only helps the kernel choice

    def nest(x: torch.Tensor) -> torch.Tensor:
        nt = torch.nested.nested_tensor_from_jagged(
            x.contiguous(), offsets, min_seqlen=lo, max_seqlen=batch.max_len
        )
        return nt.transpose(1, 2)

    out = torch.nn.functional.scaled_dot_product_attention(nest(q), nest(k), nest(v))
    return out.transpose(1, 2).values()


def _attend_padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Scatter into ``(tweets, heads, longest, head size)``, one masked attention, gather back."""
    assert batch.pad_index is not None
    return padded_attention(q, k, v, batch.pad_index, len(batch.cu_seqlens) - 1, batch.max_len)


_ATTEND: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Batch], torch.Tensor]] = {
    "flash": _attend_flash,
    "nested": _attend_nested,
    "padded": _attend_padded,
}


def packed_hidden(model: Any, layers: Sequence[Any], batch: Batch, attention: Attention) -> torch.Tensor:
    """``(tokens, hidden)`` last hidden states of a ``"varlen"`` batch, computing nothing for padding.

    The model's own modules (``embeddings``, and per layer ``attention.self.{query,key,value}``,
    ``attention.output``, ``intermediate``, ``output``: what
    :func:`~workers.adapters.encoding.bert_forward.packable_layers` checks) applied to the packed
    tokens by :func:`~workers.adapters.encoding.bert_forward.run_layers` (the loop the CPU's
    padding-free forward uses too); attention per tweet through ``attention``.  Matches the
    transformers forward on the real tokens (the tests check it against the padded path).
    """
    ids = batch.input_ids.unsqueeze(0)
    assert batch.position_ids is not None
    h = model.embeddings(
        input_ids=ids,
        position_ids=batch.position_ids.unsqueeze(0),
        # Explicit: the embeddings' buffered token types are only max_positions long.
        token_type_ids=torch.zeros_like(ids),
    ).squeeze(0)
    attend = _ATTEND[attention]
    return run_layers(layers, h, lambda q, k, v: attend(q, k, v, batch))


def batch_hidden(
    model: Any, layers: Sequence[Any] | None, batch: Batch, attention: Attention
) -> torch.Tensor:
    """The real tokens' last hidden states ``(tokens, hidden)``, in batch order, any layout."""
    if batch.layout == "varlen":
        if layers is None:
            raise ValueError("the varlen layout needs a standard BERT/RoBERTa encoder (packable_layers)")
        return packed_hidden(model, layers, batch, attention)
    if batch.layout == "rows":
        assert batch.row_segment is not None and batch.position_ids is not None
        seg = batch.row_segment
        # Block-diagonal: a token sees the tokens of its own tweet (padding sees padding).
        mask = seg.unsqueeze(-1) == seg.unsqueeze(-2)
        hidden = model(
            input_ids=batch.input_ids,
            attention_mask=mask,
            position_ids=batch.position_ids,
            token_type_ids=torch.zeros_like(batch.input_ids),
        ).last_hidden_state
    else:
        hidden = model(input_ids=batch.input_ids, attention_mask=batch.mask).last_hidden_state
    assert batch.tokens is not None
    return hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch.tokens)
