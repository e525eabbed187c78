"""Benchmark the CPU int8 encoder paths: the project's own against public-API int8 alternatives.

Why: the default CPU path (``Encoder(..., dtype="int8")``, workers/adapters/encoding/cpu_fast.py)
multiplies with ``torch._int_mm``, a private torch op. The question is whether a
public, versioned API gets the same speed and the same embeddings: torchao's
int8 dynamic-activation / int8-weight quantisation, ONNX Runtime's dynamic int8
quantisation, or torch.ao's long-standing ``quantize_dynamic``.

Variants (all on the same randomly initialised BERTweet-base-shaped model,
the same tokens, the same padded batches and the same mean pooling):

* ``fp32``: ``Encoder(dtype="float32")`` (the baseline; padding-free forward);
* ``int8 (project)``: ``Encoder(dtype="int8")`` (``torch._int_mm``, per-token
  activation scales, SmoothQuant, fused QKV; padding-free forward);
* ``torchao, HF forward``: ``torchao.quantization.quantize_`` with
  ``Int8DynamicActivationInt8WeightConfig`` on the transformers model, run by
  transformers' own forward over the padded batch;
* ``torchao, packed forward``: the same quantisation inside the Encoder's
  padding-free forward (separates the kernels from the padding);
* ``onnxruntime int8``: ``torch.onnx.export`` (dynamic batch and sequence
  axes), ``onnxruntime.quantization.quantize_dynamic(weight_type=QInt8)``,
  ``InferenceSession`` on the CPUExecutionProvider, pooled as the Encoder pools;
* ``onnxruntime fp32``: the exported model unquantised (ONNX Runtime's own
  fp32 speed, to tell the runtime from the quantisation);
* ``torch.ao quantize_dynamic``: qint8 ``nn.Linear`` (per-tensor activation
  scales, fbgemm/onednn), inside the Encoder's padding-free forward.

Tokenisation is done once up front with the Encoder's tokenizer; batches are
length-sorted as ``Encoder.encode`` sorts them and padded the Encoder's way, so
what is timed is the forward pass plus pooling. The variants take turns over
equal chunks of the tweets (A B C ... then ... C B A), in one process, and the
report gives the median tweets/s over chunks, the ratio to fp32 (median of the
per-chunk ratios, and total), and the cosine of each variant's embeddings with
fp32's on the same tweets. A variant whose package is missing or that fails is
reported with its error. Each variant's warm-up also counts its calls of
``torch._int_mm`` (the private op), so the table says which paths depend on it.

    python -m bench.bench_int8                    # prints a markdown section
    python -m bench.bench_int8 --out /tmp/int8.md
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shlex
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from bench.bench_encoder import build_base_model, load_texts
from bench.results import bench_command, cpu_model, publish
from workers.adapters.encoding.cpu_fast import cpu_supports_int8, int8_available
from workers.adapters.encoding.encoder import Encoder

Batch = list[list[int]]
Embed = Callable[[Batch], np.ndarray]


@dataclass
class Variant:
    name: str
    how: str
    setup: Callable[[], Embed]
    embed: Embed | None = None
    error: str | None = None
    setup_s: float = 0.0
    int_mm_calls: int = 0
    warm_s: float = 0.0
    warm_outs: list[np.ndarray] = field(default_factory=list)
    too_slow: bool = False
    took: list[float] = field(default_factory=list)
    outs: list[np.ndarray] = field(default_factory=list)


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


@contextmanager
def count_int_mm() -> Iterator[list[int]]:
    """Count calls of the private ``torch._int_mm`` while the block runs."""
    calls = [0]
    orig = getattr(torch, "_int_mm", None)
    if orig is None:
        yield calls
        return

    def counted(*args: object, **kw: object) -> torch.Tensor:
        calls[0] += 1
        return orig(*args, **kw)

    torch._int_mm = counted
    try:
        yield calls
    finally:
        torch._int_mm = orig


def mean_pool_unit(hidden: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """The Encoder's pooling: attention-mask-weighted mean of the last hidden state, unit length."""
    hidden = hidden.float()
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
    norms = pooled.norm(dim=1, keepdim=True)
    pooled = torch.where(norms > 0, pooled / norms.clamp(min=1e-12), pooled)
    return np.asarray(pooled.cpu().numpy(), dtype=np.float32)


def encoder_embed(enc: Encoder) -> Embed:
    """The Encoder's own batch step: pad, padding-free forward on CPU, pool."""

    def run(batch: Batch) -> np.ndarray:
        with torch.inference_mode():
            return enc._embed_batch(batch)

    return run


def hf_forward_embed(
    model: torch.nn.Module, pad: Callable[[Batch], tuple[torch.Tensor, torch.Tensor]]
) -> Embed:
    """transformers' forward over the padded batch, then the Encoder's pooling."""

    def run(batch: Batch) -> np.ndarray:
        ids, mask = pad(batch)
        with torch.inference_mode():
            hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        return mean_pool_unit(hidden, mask)

    return run


class LastHidden(torch.nn.Module):
    """Exports only ``last_hidden_state`` (no pooler output)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def export_onnx(path: str, out: Path, sample: tuple[torch.Tensor, torch.Tensor]) -> str:
    """Export the fp32 model to ONNX with dynamic batch and sequence axes; returns the exporter used.

    The TorchScript exporter (``dynamo=False``, ``dynamic_axes``) first: one
    self-contained file, which ``quantize_dynamic`` reads directly; the dynamo
    exporter (``dynamic_shapes``) if that one is gone or fails.
    """
    from transformers import AutoModel

    model = AutoModel.from_pretrained(path, local_files_only=True, attn_implementation="eager").eval()
    wrapped = LastHidden(model).eval()
    names = ["input_ids", "attention_mask"]
    try:
        with torch.no_grad():
            torch.onnx.export(
                wrapped,
                sample,
                str(out),
                input_names=names,
                output_names=["last_hidden_state"],
                dynamic_axes={
                    "input_ids": {0: "batch", 1: "seq"},
                    "attention_mask": {0: "batch", 1: "seq"},
                    "last_hidden_state": {0: "batch", 1: "seq"},
                },
                opset_version=17,
                do_constant_folding=True,
                dynamo=False,
            )
        return "torch.onnx.export(dynamo=False, dynamic_axes), opset 17"
    except Exception as exc:  # the legacy exporter may be deprecated / removed
        legacy_error = one_line(exc)
    batch, seq = torch.export.Dim("batch", min=1, max=1024), torch.export.Dim("seq", min=2, max=128)
    with torch.no_grad():
        program = torch.onnx.export(
            wrapped,
            sample,
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
            dynamo=True,
        )
    assert program is not None
    program.save(str(out), external_data=False)
    return f"torch.onnx.export(dynamo=True, dynamic_shapes) (legacy exporter failed: {legacy_error})"


def ort_embed(model_file: Path, pad: Callable[[Batch], tuple[torch.Tensor, torch.Tensor]]) -> Embed:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(model_file), opts, providers=["CPUExecutionProvider"])
    inputs = {i.name for i in sess.get_inputs()}

    def run(batch: Batch) -> np.ndarray:
        ids, mask = pad(batch)
        feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
        (hidden,) = sess.run(["last_hidden_state"], {k: v for k, v in feed.items() if k in inputs})
        return mean_pool_unit(torch.from_numpy(hidden), mask)

    return run


def build_variants(path: str, fp32: Encoder, workdir: Path, notes: list[str]) -> list[Variant]:
    pad = fp32._pad
    onnx_dir = workdir / "onnx"
    sample = pad(fp32.tokenize(["a first tweet to trace", "and a second, somewhat longer, one to trace"]))

    def onnx_fp32_file() -> Path:
        f32 = onnx_dir / "model.onnx"
        if not f32.exists():
            onnx_dir.mkdir(exist_ok=True)
            t0 = time.perf_counter()
            how = export_onnx(path, f32, sample)
            notes.append(f"ONNX export: {how}, {time.perf_counter() - t0:.0f} s.")
        return f32

    def project_int8() -> Embed:
        if not int8_available():
            raise RuntimeError("this torch has no torch._int_mm: the project's int8 path is off")
        return encoder_embed(Encoder(path, dtype="int8"))

    def torchao_cfg() -> tuple[Callable[..., object], object]:
        from torchao.quantization import quantize_

        try:
            from torchao.quantization import Int8DynamicActivationInt8WeightConfig as Cfg
        except ImportError:  # older torchao: the function-style name
            from torchao.quantization import int8_dynamic_activation_int8_weight as Cfg
        return quantize_, Cfg()

    def torchao_hf() -> Embed:
        quantize_, cfg = torchao_cfg()
        enc = Encoder(path, dtype="float32")
        quantize_(enc.model, cfg)
        return hf_forward_embed(enc.model, pad)

    def torchao_packed() -> Embed:
        quantize_, cfg = torchao_cfg()
        enc = Encoder(path, dtype="float32")
        quantize_(enc.model, cfg)
        return encoder_embed(enc)

    def ort_int8() -> Embed:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        q8 = onnx_dir / "model.int8.onnx"
        src = onnx_fp32_file()
        t0 = time.perf_counter()
        quantize_dynamic(str(src), str(q8), weight_type=QuantType.QInt8)
        notes.append(
            f"ONNX Runtime `quantize_dynamic(weight_type=QInt8)`: {time.perf_counter() - t0:.0f} s, "
            f"{src.stat().st_size / 1e6:.0f} MB -> {q8.stat().st_size / 1e6:.0f} MB."
        )
        return ort_embed(q8, pad)

    def ort_fp32() -> Embed:
        return ort_embed(onnx_fp32_file(), pad)

    def torch_ao_dynamic() -> Embed:
        enc = Encoder(path, dtype="float32")
        enc.model = torch.ao.quantization.quantize_dynamic(enc.model, {torch.nn.Linear}, dtype=torch.qint8)
        notes.append(f"torch.ao quantized engine: {torch.backends.quantized.engine}.")
        return encoder_embed(enc)

    return [
        Variant("fp32", '`Encoder(dtype="float32")`, padding-free forward', lambda: encoder_embed(fp32)),
        Variant(
            "int8 (project)",
            '`Encoder(dtype="int8")`: `torch._int_mm`, per-token scales, SmoothQuant, fused QKV, '
            "padding-free",
            project_int8,
        ),
        Variant(
            "torchao, HF forward",
            "`quantize_(model, Int8DynamicActivationInt8WeightConfig())`, transformers forward (padded)",
            torchao_hf,
        ),
        Variant(
            "torchao, packed forward",
            "same torchao model inside the Encoder's padding-free forward",
            torchao_packed,
        ),
        Variant(
            "onnxruntime int8",
            "ONNX export + `quantize_dynamic(weight_type=QInt8)`, CPUExecutionProvider (padded)",
            ort_int8,
        ),
        Variant("onnxruntime fp32", "the exported ONNX model unquantised (padded)", ort_fp32),
        Variant(
            "torch.ao quantize_dynamic",
            "`torch.ao.quantization.quantize_dynamic` qint8 Linear, padding-free forward",
            torch_ao_dynamic,
        ),
    ]


def make_chunks(ids: list[list[int]], rounds: int, batch_size: int) -> list[list[Batch]]:
    """Equal chunks of the tweets, each cut into length-sorted batches as ``Encoder.encode`` does."""
    chunks = []
    for idx in np.array_split(np.arange(len(ids)), rounds):
        order = sorted(idx.tolist(), key=lambda i: len(ids[i]), reverse=True)
        chunks.append([[ids[i] for i in order[s : s + batch_size]] for s in range(0, len(order), batch_size)])
    return chunks


def run_rounds(variants: list[Variant], chunks: list[list[Batch]]) -> None:
    """A B C ... in even rounds, ... C B A in odd ones; a variant failing mid-run is dropped."""
    for r, chunk in enumerate(chunks):
        live = [v for v in variants if v.embed is not None and not v.too_slow]
        for v in live if r % 2 == 0 else live[::-1]:
            assert v.embed is not None
            try:
                t0 = time.perf_counter()
                out = [v.embed(b) for b in chunk]
                v.took.append(time.perf_counter() - t0)
            except Exception as exc:
                v.error, v.embed = f"failed in round {r}: {one_line(exc)}", None
                continue
            v.outs.append(np.concatenate(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tweets", type=int, default=512, help="tweets timed per variant (after warm-up)")
    p.add_argument("--rounds", type=int, default=8, help="chunks the variants take turns on (ABC..CBA)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument(
        "--slow-factor",
        type=float,
        default=10.0,
        help="leave a variant out of the timed rounds when its warm-up is this many times slower "
        "than fp32's (reported with its warm-up rate; e.g. torch._int_mm without VNNI)",
    )
    p.add_argument("--out", type=Path, help="also write the markdown section here")
    args = p.parse_args()
    if args.tweets < args.rounds or args.rounds < 1:
        p.error("need --rounds >= 1 and --tweets >= --rounds")
    command = "python " + " ".join(shlex.quote(x) for x in [sys.argv[0], *sys.argv[1:]])
    if Path(sys.argv[0]).resolve() == Path(__file__).resolve():
        command = bench_command("bench_int8")

    t_start = time.perf_counter()
    load_before = os.getloadavg()
    texts_all = load_texts()
    step = max(1, len(texts_all) // args.tweets)  # spread over the whole (event-ordered) feed
    texts = texts_all[::step][: args.tweets]
    notes: list[str] = []

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        path = str(build_base_model(Path(tmp), texts_all))
        build_s = time.perf_counter() - t0
        fp32 = Encoder(path, dtype="float32")
        n_params = sum(q.numel() for q in fp32.model.parameters())
        ids = fp32.tokenize(texts)  # once, for every variant
        chunks = make_chunks(ids, args.rounds, args.batch_size)
        warm = make_chunks(ids[: 2 * args.batch_size], 1, args.batch_size)[0]

        variants = build_variants(path, fp32, Path(tmp), notes)
        for v in variants:
            t0 = time.perf_counter()
            try:
                embed = v.setup()
                with count_int_mm() as calls:
                    t1 = time.perf_counter()
                    v.warm_outs = [embed(b) for b in warm]
                    v.warm_s = time.perf_counter() - t1
                v.embed, v.int_mm_calls = embed, calls[0] // len(warm)
                v.too_slow = v is not variants[0] and v.warm_s > args.slow_factor * variants[0].warm_s
            except Exception as exc:
                v.error = one_line(exc)
                print(f"[{v.name}] not run:\n{traceback.format_exc()}", file=sys.stderr)
            v.setup_s = time.perf_counter() - t0
            print(
                f"[{v.name}] ready in {v.setup_s:.0f} s" + (f" ({v.error})" if v.error else ""),
                file=sys.stderr,
            )
        t_timed = time.perf_counter()
        run_rounds(variants, chunks)
        timed_s = time.perf_counter() - t_timed

    base = variants[0]
    if base.error:
        raise SystemExit(f"fp32 baseline failed: {base.error}")
    ref = np.concatenate(base.outs)
    sizes = [sum(len(b) for b in c) for c in chunks]
    tokens = [len(x) for x in ids]
    load_after = os.getloadavg()
    total_s = time.perf_counter() - t_start

    lines = [
        "## int8 encoder paths on CPU: the project's vs public APIs (bench/bench_int8.py)",
        "",
        f"Command: `{command}` (from the repository root; {total_s:.0f} s in all, "
        f"{timed_s:.0f} s of timed rounds).",
        "",
        f"Machine: {cpu_model()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads, "
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}, int8 VNNI: {cpu_supports_int8()}. "
        f"Versions: torch {torch.__version__}, torchao {version('torchao')}, onnxruntime "
        f"{version('onnxruntime')}, onnx {version('onnx')}, transformers {version('transformers')}, "
        f"Python {sys.version.split()[0]}.",
        "",
        f"Load average (1 min) before / after: {load_before[0]:.2f} / {load_after[0]:.2f} "
        "(the machine is shared; compare ratios, not absolute rates).",
        "",
        f"Model: randomly initialised BERTweet-base shape ({n_params / 1e6:.0f} M parameters, built "
        f"in {build_s:.0f} s). Texts: {len(texts)} tweets spread over the sample feed, "
        f"{np.mean(tokens):.1f} tokens on average (max {max(tokens)}), tokenised once with the "
        f"Encoder's tokenizer; batch {args.batch_size}, length-sorted, padded the Encoder's way; "
        f"mean pooling over the attention mask, unit length, for all. Warm-up: "
        f"{sum(len(b) for b in warm)} tweets per variant. Timed: {args.rounds} chunks of "
        f"~{len(texts) // args.rounds} tweets, the variants taking turns (A B C ... then ... C B A).",
        "",
        "Rates: median over chunks of tweets/s (min-max). vs fp32: median of per-chunk ratios "
        "(total). Cosine with the fp32 embeddings of the same tweets: mean / min. "
        "`_int_mm`/batch: calls of the private `torch._int_mm` per batch in the warm-up. "
        "setup s: load, quantise / export and warm-up.",
        "",
        "| variant | tweets/s | vs fp32 | cosine mean / min | `_int_mm`/batch | setup s | how |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    n_warm = sum(len(b) for b in warm)
    ref_warm = np.concatenate(base.warm_outs)
    for v in variants:
        if v.too_slow and v.embed is not None:
            cos = (np.concatenate(v.warm_outs) * ref_warm).sum(axis=1)
            lines.append(
                f"| {v.name} | {n_warm / v.warm_s:.1f} (warm-up only; > {args.slow_factor:g}x slower "
                f"than fp32, left out of the rounds) | {base.warm_s / v.warm_s:.2f}x (warm-up) | "
                f"{cos.mean():.5f} / {cos.min():.5f} (warm-up) | {v.int_mm_calls} | {v.setup_s:.0f} | "
                f"{v.how} |"
            )
            continue
        if v.error and not v.took:
            lines.append(f"| {v.name} | not run | | | | {v.setup_s:.0f} | {v.how}; **error**: {v.error} |")
            continue
        n = len(v.took)
        rates = [s / t for s, t in zip(sizes, v.took, strict=False)]
        ratios = [b / t for b, t in zip(base.took, v.took, strict=False)]
        total = sum(base.took[:n]) / sum(v.took)
        cos = (np.concatenate(v.outs) * ref[: sum(sizes[:n])]).sum(axis=1)  # unit rows
        err = f"; **error**: {v.error}" if v.error else ""
        lines.append(
            f"| {v.name} | {statistics.median(rates):.1f} ({min(rates):.1f}-{max(rates):.1f}) | "
            f"{statistics.median(ratios):.2f}x ({total:.2f}x) | "
            f"{cos.mean():.5f} / {cos.min():.5f} | {v.int_mm_calls} | {v.setup_s:.0f} | {v.how}{err} |"
        )
    if notes:
        lines += ["", *(f"- {n}" for n in notes)]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
