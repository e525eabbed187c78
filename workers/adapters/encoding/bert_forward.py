"""A standard BERT/RoBERTa encoder's layers run on packed tokens, and the tweet pooling.

Both fast paths of :class:`~workers.adapters.encoding.encoder.Encoder` skip the compute on padding
the same way: the real tokens of a batch are packed into one ``(tokens, hidden)`` matrix and
the model's own modules (``attention.self.{query,key,value}``, ``attention.output``,
``intermediate``, ``output``) are applied to it as the transformers forward applies them in
eval mode (post-LN; dropout is the identity) -- :func:`run_layers`, the one layer loop.  Only
attention needs to know where one tweet ends, so the paths differ in the ``attend`` they pass:
the CPU's padding-free forward (:func:`workers.adapters.encoding.cpu_fast.packed_forward`) and the
token-budget path's ``"padded"`` attention scatter into a padded layout
(:func:`padded_attention`); the token-budget path on CUDA uses variable-length kernels
(:mod:`workers.adapters.encoding.gpu_batching`).  :func:`packable_layers` says whether a model has
this standard layout; the tests check the result against the transformers forward.

:func:`pool_units` turns the packed last hidden states into one unit vector per tweet, for
every path: the mean over the tweet's tokens (``<s>`` and ``</s>`` included) or its first
token, in float32, scaled to unit length (a zero vector stays zero).

>>> h = torch.tensor([[3.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0.0, 2.0]])
>>> segment, lengths = torch.tensor([0, 0, 1, 2]), torch.tensor([2.0, 1.0, 1.0])
>>> pool_units(h, segment, lengths, torch.tensor([0, 2, 3]), "mean").tolist()
[[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

#: Attention over packed tokens: ``q``, ``k``, ``v`` as ``(tokens, heads, head size)``, the
#: context in the same shape (each tweet attending to its own tokens only).
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def packable_layers(model: torch.nn.Module) -> list[Any] | None:
    """The layers of a standard BERT/RoBERTa-style encoder, or None for anything else.

    Standard: an ``embeddings`` module taking ``input_ids``, and post-LN layers
    with ``attention.self.{query,key,value}`` (absolute positions, no decoder
    or cross-attention), ``attention.output.{dense,LayerNorm}``,
    ``intermediate.{dense,intermediate_act_fn}`` and ``output.{dense,LayerNorm}``:
    what :func:`run_layers` re-implements.
    """
    config = getattr(model, "config", None)
    layers = getattr(getattr(model, "encoder", None), "layer", None)
    if (
        config is None
        or not isinstance(layers, torch.nn.ModuleList)
        or len(layers) == 0
        or getattr(model, "embeddings", None) is None
        or getattr(config, "is_decoder", False)
        or getattr(config, "add_cross_attention", False)
        or getattr(config, "position_embedding_type", "absolute") != "absolute"
    ):
        return None
    if not all(_standard_layer(layer) for layer in layers):
        return None
    return list(layers)


def _standard_layer(layer: Any) -> bool:
    att = getattr(layer, "attention", None)
    sa = getattr(att, "self", None)
    ao = getattr(att, "output", None)
    inter = getattr(layer, "intermediate", None)
    out = getattr(layer, "output", None)
    return (
        all(callable(getattr(sa, k, None)) for k in ("query", "key", "value"))
        and isinstance(getattr(sa, "num_attention_heads", None), int)
        and isinstance(getattr(sa, "attention_head_size", None), int)
        and getattr(sa, "position_embedding_type", "absolute") == "absolute"
        and all(callable(getattr(m, k, None)) for m in (ao, out) for k in ("dense", "LayerNorm"))
        and callable(getattr(inter, "dense", None))
        and callable(getattr(inter, "intermediate_act_fn", None))
        and getattr(layer, "crossattention", None) is None
    )


def _is_exact_gelu(fn: object) -> bool:
    """transformers' ``GELUActivation`` with the exact (erf) GELU: safe to apply in place."""
    return getattr(fn, "act", None) is torch.nn.functional.gelu


def run_layers(layers: Sequence[Any], h: torch.Tensor, attend: Attend) -> torch.Tensor:
    """The last hidden states ``(tokens, hidden)`` of the packed embeddings ``h``.

    Every per-token step (the Linear layers, ~90% of the time, LayerNorm, the activation)
    runs on the real tokens only; ``attend`` keeps each tweet to its own tokens.  Inference
    only (no autograd through it): it works in place on intermediate tensors.  The query,
    key and value Linears are called one by one on the same input: the int8 path's fused
    stand-ins (:class:`~workers.adapters.encoding.cpu_fast.Int8QKVSlice`) compute the three at once.
    """
    tokens = h.shape[0]
    for layer in layers:
        sa = layer.attention.self
        heads, size = sa.num_attention_heads, sa.attention_head_size
        q, k, v = (proj(h).reshape(tokens, heads, size) for proj in (sa.query, sa.key, sa.value))
        ctx = attend(q, k, v).reshape(tokens, heads * size)
        ao = layer.attention.output
        a = ao.LayerNorm(ao.dense(ctx).add_(h))
        x = layer.intermediate.dense(a)
        act = layer.intermediate.intermediate_act_fn
        x = torch.ops.aten.gelu_(x) if _is_exact_gelu(act) else act(x)
        out = layer.output
        h = out.LayerNorm(out.dense(x).add_(a))
    return h


def padded_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pad_index: torch.Tensor | None,
    n: int,
    longest: int,
) -> torch.Tensor:
    """Attention of packed tokens through a padded ``(n, heads, longest, head size)`` layout.

    ``pad_index``: each token's slot in the flattened ``(n, longest)`` layout (None: the
    tokens fill it, no padding and no mask).  Padding keys are masked; padding queries are
    computed (attention is ~1-5% of the FLOPs at tweet lengths) and dropped.  float32:
    plain batched matmuls, ~1.5x faster on CPU than SDPA's kernel at tweet lengths (its
    flash kernel is built for long sequences); other dtypes: SDPA, which keeps the softmax
    in float32.
    """
    heads, size = q.shape[1], q.shape[2]

    def pad(x: torch.Tensor) -> torch.Tensor:
        if pad_index is not None:
            x = x.new_zeros(n * longest, heads, size).index_copy_(0, pad_index, x)
        return x.reshape(n, longest, heads, size).transpose(1, 2)

    attend: torch.Tensor | None = None
    if pad_index is not None:
        real = torch.zeros(n * longest, dtype=torch.bool, device=q.device)
        real[pad_index] = True
        attend = real.view(n, 1, 1, longest)
    qq, kk, vv = pad(q), pad(k), pad(v)
    if q.dtype == torch.float32:
        scores = torch.matmul(qq, kk.transpose(-1, -2)).mul_(size**-0.5)
        if attend is not None:
            scores.masked_fill_(~attend, float("-inf"))
        ctx = torch.matmul(scores.softmax(dim=-1), vv)
    else:
        ctx = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=attend)
    flat = ctx.transpose(1, 2).reshape(n * longest, heads, size)
    return flat if pad_index is None else flat.index_select(0, pad_index)


def pool_units(
    hidden: torch.Tensor,
    segment: torch.Tensor,
    lengths: torch.Tensor,
    starts: torch.Tensor,
    pooling: str,
) -> torch.Tensor:
    """Unit-length float32 ``(tweets, hidden)`` from packed last hidden states ``(tokens, hidden)``.

    ``segment``: the tweet of each token; ``lengths``: tokens per tweet (float32);
    ``starts``: each tweet's first token (int64).  ``pooling``: ``"mean"`` over the tweet's
    tokens or ``"cls"``, its first token's state.
    """
    if pooling == "cls":
        pooled = hidden.index_select(0, starts).float()
    else:
        sums = torch.zeros(len(lengths), hidden.shape[-1], dtype=torch.float32, device=hidden.device)
        sums.index_add_(0, segment, hidden.float())
        pooled = sums / lengths.clamp(min=1.0).unsqueeze(1)
    norms = pooled.norm(dim=1, keepdim=True)
    return torch.where(norms > 0, pooled / norms.clamp(min=1e-12), pooled)


__all__ = ["Attend", "packable_layers", "padded_attention", "pool_units", "run_layers"]
