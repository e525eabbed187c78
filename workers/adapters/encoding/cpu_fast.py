"""The CPU fast path of the encoder: int8 GEMMs and a padding-free forward pass.

Split from :mod:`workers.adapters.encoding.encoder` because it leans on torch and transformers
internals that the plain path does not:

* ``torch._int_mm`` (a private op: the exact int8 x int8 -> int32 product; probed,
  and the int8 path is off when it is missing) and torch's private CPU feature
  probes (with a ``/proc/cpuinfo`` fallback);
* the module tree of BERT/RoBERTa-style encoders from transformers
  (``attention.self.query`` ...), which :func:`packed_forward` runs on the real tokens
  only (through :mod:`workers.adapters.encoding.bert_forward`, the layer loop it shares with the
  token-budget path; checked against the transformers forward in the tests).

The int8 path (``dtype="int8"``) keeps activations in float32 and quantises
only the inputs and weights of the ``nn.Linear`` layers: weights per output
channel, activations per token (row) at run time, both symmetric, multiplied
exactly in int32. Per-token scales keep a tweet's embedding independent of the
other tweets in its batch and of padding, up to float rounding (a per-tensor
scale, as in ``torch.ao`` dynamic quantisation, lets one outlier token coarsen
every other token; with the pretrained MiniLM that gave a cosine to fp32 of only
~0.97). Channels with outlier activations are tamed SmoothQuant-style (Xiao et
al. 2023, alpha 0.5): per input channel, the activation is divided and the
weight multiplied by the same factor, derived from activation maxima recorded
once at load time on a fixed built-in set of tweet-like sentences
(:data:`CALIBRATION_TEXTS`), so the result is the same on every load.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any

import torch

from workers.adapters.encoding.bert_forward import padded_attention, run_layers

# SmoothQuant's migration strength: 0.5 splits the outliers evenly between
# activations and weights (best of 0.3-0.7 on MiniLM here).
SMOOTHQUANT_ALPHA = 0.5

# Fixed calibration set for the int8 path: the per-channel activation maxima that
# set the smoothing factors are recorded on these, so every load of a model gives
# the same quantised weights. Tweet-like, mixed topics; none comes from the feed.
CALIBRATION_TEXTS: tuple[str, ...] = (
    "Breaking: strong earthquake hits the coast, buildings damaged and people missing",
    "Praying for everyone affected by the floods tonight #prayers",
    "RT @user: Police confirm two dead after the explosion downtown http://t.co/abc",
    "Red Cross volunteers are handing out food and water at the shelter",
    "lol this is the best day ever!!! can't stop laughing \U0001f602\U0001f602",
    "Heavy rain expected through the weekend, stay safe and avoid the roads",
    "I can't believe what happened at the concert last night... so sad",
    "Donate now to support the victims of the typhoon #relief",
    "Traffic is a nightmare on the highway this morning, accident near exit 12",
    "New update: the death toll has risen to 45, officials say",
    "Just finished my run, 10k in 50 minutes. Feeling great!",
    "Firefighters are still battling the wildfire north of the city",
    "Who else is watching the game tonight? Let's go team!",
    "Power outage across the whole neighbourhood since 3pm, no news yet",
    "The train derailed near the station; emergency services are on the scene",
    "Thoughts are with the families of those who lost their lives",
    "Hospitals need blood donors urgently, please share",
    "my cat just knocked my coffee off the table again smh",
    "Schools closed tomorrow due to the storm warning #weather",
    "Government announces emergency funds for the affected areas",
    "Video: the moment the bridge collapsed into the river",
    "So proud of the rescue teams working day and night",
    "Is anyone else getting these weird texts from an unknown number?",
    "Happy birthday to my best friend, love you!",
    "Shelter locations: city hall, the high school gym and the central church",
    "Landslide blocks the main road to the village, dozens trapped",
    "heeeelp our street is flooded and the water keeps rising",
    "Officials warn of aftershocks in the coming days, stay outdoors if you can",
    "Watching the news and feeling helpless. What can we do to help?",
    "Great article on climate change and extreme weather events",
    "Bombing suspects identified, manhunt underway #breaking",
    "Thank you to everyone who sent messages, we are all safe",
)


def _cpu_has(probes: tuple[str, ...], flags: set[str]) -> bool:
    """Ask torch's private CPU probes, else /proc/cpuinfo's flags; False when unsure."""
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
                    return bool(flags & set(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return False


def int8_available() -> bool:
    """Whether this torch has the exact int8 GEMM (``torch._int_mm``, private, torch >= 2.2)."""
    return hasattr(torch, "_int_mm")


@lru_cache(maxsize=1)
def cpu_supports_bf16() -> bool:
    """True when the CPU computes bfloat16 natively (x86 AVX-512 BF16 or AMX).

    ``torch.backends.cpu.get_cpu_capability()`` only says "AVX512", which does
    not imply BF16 instructions, so ask torch's feature probes and fall back
    to the kernel's CPU flags. Without native support bf16 is emulated and
    slower than fp32, so the answer is "no" when unsure.
    """
    return _cpu_has(("_is_avx512_bf16_supported", "_is_amx_tile_supported"), {"avx512_bf16", "amx_bf16"})


@lru_cache(maxsize=1)
def cpu_supports_int8() -> bool:
    """True when the CPU has int8 dot-product instructions (AVX-512 VNNI, AVX-VNNI, AMX)
    and torch has the int8 matrix multiply (``torch._int_mm``) the int8 path uses.

    Without VNNI, int8 GEMMs gain little over fp32, so the answer is "no" when unsure.
    """
    if not int8_available():
        return False
    return _cpu_has(("_is_vnni_supported", "_is_amx_tile_supported"), {"avx512_vnni", "avx_vnni", "amx_int8"})


class Int8Linear(torch.nn.Module):
    """A float32-in, float32-out stand-in for ``nn.Linear`` that multiplies in int8.

    Weights: int8, one symmetric scale per output channel. Inputs: quantised
    at run time to int8 with one symmetric scale per row (token), so a row's
    result depends on that row only. The product is exact in int32
    (``torch._int_mm``), then scaled back and the bias added in float32.

    With ``act_absmax`` (the largest ``|x|`` seen per input channel) the layer
    applies SmoothQuant: ``x @ W.T == (x / s) @ (W * s).T`` with
    ``s = act_absmax**alpha / max|W[:, j]|**(1 - alpha)``, which moves the
    spread of outlier channels from the activations into the weights, where
    per-channel scales absorb it.
    """

    weight: torch.Tensor
    weight_scale: torch.Tensor
    bias: torch.Tensor | None
    inv_smooth: torch.Tensor | None

    def __init__(
        self,
        linear: torch.nn.Linear,
        act_absmax: torch.Tensor | None = None,
        *,
        alpha: float = SMOOTHQUANT_ALPHA,
    ) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        with torch.no_grad():
            w = linear.weight.detach().to(device="cpu", dtype=torch.float32)
            inv_smooth = None
            if act_absmax is not None:
                w_max = w.abs().amax(dim=0).clamp(min=1e-5)
                smooth = act_absmax.detach().float().cpu().clamp(min=1e-5).pow(alpha)
                smooth = (smooth / w_max.pow(1.0 - alpha)).clamp(min=1e-5)
                w = w * smooth
                inv_smooth = smooth.reciprocal()
            scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
            q = torch.round(w / scale.unsqueeze(1)).clamp_(-127, 127).to(torch.int8)
            bias = linear.bias
        self.register_buffer("weight", q.contiguous())  # (out, in); used transposed
        self.register_buffer("weight_scale", scale)
        self.register_buffer(
            "bias", None if bias is None else bias.detach().to(device="cpu", dtype=torch.float32)
        )
        self.register_buffer("inv_smooth", inv_smooth)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1]).float()
        if x.shape[0] == 0:
            return x.new_zeros(*shape[:-1], self.out_features)
        # Few passes over the data, each in place where it can be: on 2 cores every
        # extra elementwise op costs about as much as a few % of the GEMM.
        if self.inv_smooth is not None:
            x = x * self.inv_smooth  # a new tensor: free to scale in place below
            own = True
        else:
            own = False
        # Per-row scale; amax/amin beat abs().amax() and vector_norm(inf) on CPU.
        row_scale = torch.maximum(x.amax(dim=1, keepdim=True), x.amin(dim=1, keepdim=True).neg_())
        row_scale = row_scale.clamp_(min=1e-12).div_(127.0)
        inv_row = row_scale.reciprocal()
        scaled = x.mul_(inv_row) if own else x.mul(inv_row)
        xq = scaled.round_().to(torch.int8)  # |values| <= 127 (+ rounding error)
        y = torch._int_mm(xq, self.weight.t()).float().mul_(self.weight_scale)
        if self.bias is None:
            y.mul_(row_scale)
        else:
            torch.addcmul(self.bias, y, row_scale, out=y)  # bias + y * row_scale
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, smoothed={self.inv_smooth is not None}"
        )


class Int8QKVSlice(torch.nn.Module):
    """Stands in for one of an attention block's ``query`` / ``key`` / ``value`` Linears.

    The three share one :class:`Int8Linear` over their concatenated weights
    (registered once, as the attention module's ``qkv``): the first of them
    called with an input runs the fused product for all three and keeps it
    until each has taken its slice, so the input is quantised once and the
    GEMM is 3x wider. Called with a different input (cross-attention), a slice
    simply runs the fused product again; the result is the same either way.
    """

    def __init__(self, shared: _SharedQKV, index: int) -> None:
        super().__init__()
        self._shared = shared  # a plain object: the Int8Linear is registered on the parent
        self.index = index
        self.in_features = shared.fused.in_features
        self.out_features = shared.width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._shared.slice(x, self.index)

    def extra_repr(self) -> str:
        return f"{('query', 'key', 'value')[self.index]} of the fused qkv, out_features={self.out_features}"


class _SharedQKV:
    """The fused product of one attention block, and whose slice has been taken."""

    def __init__(self, fused: Int8Linear, width: int) -> None:
        self.fused = fused
        self.width = width
        self._input: torch.Tensor | None = None
        self._output: torch.Tensor | None = None
        self._taken: set[int] = set()

    def slice(self, x: torch.Tensor, index: int) -> torch.Tensor:
        if self._input is not x or index in self._taken:
            self._input, self._output, self._taken = x, self.fused(x), set()
        assert self._output is not None
        out = self._output[..., index * self.width : (index + 1) * self.width]
        self._taken.add(index)
        if len(self._taken) == 3:  # all served: don't keep the tensors alive
            self._input = self._output = None
        return out


def _fusable_qkv(module: torch.nn.Module) -> bool:
    parts = [getattr(module, k, None) for k in ("query", "key", "value")]
    return (
        all(type(p) is torch.nn.Linear for p in parts)
        and len({(p.in_features, p.out_features, p.bias is None) for p in parts}) == 1  # type: ignore[union-attr]
    )


def quantize_linear_layers(
    model: torch.nn.Module,
    act_absmax: dict[str, torch.Tensor] | None = None,
    *,
    alpha: float = SMOOTHQUANT_ALPHA,
    fuse_qkv: bool = True,
) -> int:
    """Replace every ``nn.Linear`` in ``model`` by int8 stand-ins, in place.

    Each becomes an :class:`Int8Linear`, except that with ``fuse_qkv`` the
    ``query`` / ``key`` / ``value`` Linears of a BERT-style self-attention
    module (same shapes, same input) become :class:`Int8QKVSlice` views of one
    fused :class:`Int8Linear` (smoothed with the channel-wise maximum of the
    three inputs' statistics, which are equal in self-attention).
    ``act_absmax`` maps a Linear's qualified name to its per-input-channel
    activation maxima (see :func:`record_linear_input_absmax`); layers without
    an entry are quantised without smoothing. Returns the number of Linears
    replaced.
    """
    stats = act_absmax or {}
    replaced = 0
    for parent_name, parent in list(model.named_modules()):
        prefix = f"{parent_name}." if parent_name else ""
        if fuse_qkv and _fusable_qkv(parent):
            parts: list[torch.nn.Linear] = [getattr(parent, k) for k in ("query", "key", "value")]
            fused = torch.nn.Linear(parts[0].in_features, 3 * parts[0].out_features, bias=False)
            with torch.no_grad():
                fused.weight = torch.nn.Parameter(torch.cat([p.weight for p in parts]))
                if parts[0].bias is not None:
                    fused.bias = torch.nn.Parameter(torch.cat([p.bias for p in parts]))
            maxima = [stats[prefix + k] for k in ("query", "key", "value") if prefix + k in stats]
            absmax = None
            if maxima:
                absmax = maxima[0]
                for m in maxima[1:]:
                    absmax = torch.maximum(absmax, m)
            shared = _SharedQKV(Int8Linear(fused, absmax, alpha=alpha), parts[0].out_features)
            parent.qkv = shared.fused
            for i, k in enumerate(("query", "key", "value")):
                setattr(parent, k, Int8QKVSlice(shared, i))
            replaced += 3
        for child_name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, child_name, Int8Linear(child, stats.get(prefix + child_name), alpha=alpha))
                replaced += 1
    return replaced


def record_linear_input_absmax(
    model: torch.nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
) -> dict[str, torch.Tensor]:
    """Per-input-channel max ``|x|`` of every ``nn.Linear`` input over ``batches``.

    ``batches`` yields ``(input_ids, attention_mask)`` pairs; the model runs on
    each, and rows of padding (mask 0) are left out of the maxima.
    """
    stats: dict[str, torch.Tensor] = {}
    keep: list[torch.Tensor] = []  # the current batch's flattened mask, as bools

    def hook(name: str) -> Callable[..., None]:
        def record(_mod: torch.nn.Module, inputs: tuple[torch.Tensor, ...], _out: object) -> None:
            x = inputs[0].detach()
            rows = x.reshape(-1, x.shape[-1])
            if keep and rows.shape[0] == keep[0].numel():  # token rows, not e.g. the pooler's
                rows = rows[keep[0]]
            if rows.shape[0] == 0:
                return
            m = rows.abs().amax(dim=0).float().cpu()
            prev = stats.get(name)
            stats[name] = m if prev is None else torch.maximum(prev, m)

        return record

    handles = [
        mod.register_forward_hook(hook(name))
        for name, mod in model.named_modules()
        if type(mod) is torch.nn.Linear
    ]
    try:
        with torch.inference_mode():
            for input_ids, mask in batches:
                keep[:] = [mask.reshape(-1).bool()]
                model(input_ids=input_ids, attention_mask=mask)
    finally:
        for h in handles:
            h.remove()
    return stats


def packed_forward(
    model: Any,
    layers: list[Any],
    input_ids: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """``last_hidden_state`` of a standard encoder, computing nothing for padding.

    Same maths as the transformers forward pass in eval mode, but every per-token step
    runs on the real tokens only (:func:`~workers.adapters.encoding.bert_forward.run_layers`, packed
    into one ``(tokens, hidden)`` matrix); only the attention itself sees the padded
    ``(batch, length)`` layout.  With tweets of mixed lengths a batch is ~25-35% padding.
    Padding rows of the result are zero (pooling ignores them).  Results equal the
    transformers forward pass on the real tokens (checked in the tests).  Inference only.
    """
    batch, length = input_ids.shape
    hidden = model.embeddings(input_ids=input_ids)
    width = hidden.shape[-1]
    rows = batch * length
    flat = mask.reshape(-1)
    keep: torch.Tensor | None = None
    h = hidden.reshape(rows, width)
    if not bool(flat.all()):
        keep = flat.nonzero().squeeze(1)  # rows of the real tokens
        h = h.index_select(0, keep)
    h = run_layers(layers, h, lambda q, k, v: padded_attention(q, k, v, keep, batch, length))
    if keep is not None:
        h = h.new_zeros(rows, width).index_copy_(0, keep, h)
    return h.view(batch, length, width)
