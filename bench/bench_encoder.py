"""Benchmark stream.encoder: tweets/s in fp32, bf16 and the default CPU path, and their agreement.

Why: the embed worker's throughput on CPU decides how big a feed one worker
keeps up with, and a faster path (bf16, int8) is only worth it if its
embeddings agree with fp32. No model hub here, so the BERTweet-sized model is
randomly initialised (RoBERTa-base: 12 layers, hidden 768, 12 heads, FFN
3072, vocab 64001, 130 positions); speed depends on the shapes, not the
weights, and the packaged pretrained MiniLM checks agreement with real
weights. The BertweetTokenizer gets fastBPE codes learned from the feed
itself. Texts are real tweets from the bundled CrisisLexT26 feed.

All three settings use the encoder's CPU forward pass over the real tokens
only (no compute for padding); they differ in the dtype of the Linear layers.

The machine is shared and noisy, so the settings run in the same process,
taking turns (order rotated, then reversed) over equal chunks of tweets, and
the report gives ratios (total, and median over chunks) as well as rates.
Tokenisation (slow, pure-Python BertweetTokenizer) is timed on its own too.

    python bench/bench_encoder.py                 # prints a markdown section
    python bench/bench_encoder.py --out /tmp/encoder_bench.md
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from bench.results import publish
from stream.intake.cleaning import Prepared, prepare
from stream.intake.records import RecordError, parse_tweet
from workers.adapters.encoding.cpu_fast import cpu_supports_bf16, cpu_supports_int8
from workers.adapters.encoding.encoder import Encoder
from workers.adapters.encoding.tokenizer_loading import MINILM
from workers.dev.tiny_models import build_bertweet_like, build_tiny_bertweet

REPO = Path(__file__).resolve().parents[1]

FEED = REPO / "stream" / "data" / "crisislex-t26.jsonl.gz"


def embeddable_tweets(limit: int) -> list[tuple[bytes, bytes, str]]:
    """(key, raw line, cleaned text) of feed tweets the embed worker will embed."""
    seen: set[str] = set()
    out = []
    with gzip.open(FEED, "rt", encoding="utf-8") as fh:
        for line in fh:
            try:
                tweet = parse_tweet(line)
            except RecordError:
                continue
            prepared = prepare(tweet)
            if not isinstance(prepared, Prepared) or seen.intersection(prepared.dedup_keys):
                continue
            seen.update(prepared.dedup_keys)
            out.append((tweet.id.encode(), line.strip().encode(), prepared.text))
            if len(out) >= limit:
                break
    return out


def load_texts(limit: int | None = None) -> list[str]:
    texts: list[str] = []
    with gzip.open(FEED, "rt", encoding="utf-8") as f:
        for line in f:
            texts.append(json.loads(line)["text"])
            if limit is not None and len(texts) >= limit:
                break
    return texts


def feed_word_counts(texts: list[str], workdir: Path) -> Counter[str]:
    """Words of the feed after BERTweet's own normalisation (what BPE will see)."""
    tok = Encoder(str(build_tiny_bertweet(workdir / "normaliser")), dtype="float32").tokenizer
    counts: Counter[str] = Counter()
    for t in texts:
        counts.update(tok.normalizeTweet(t).split())
    return counts


def build_base_model(workdir: Path, texts: list[str]) -> Path:
    counts = feed_word_counts(texts, workdir)
    return build_bertweet_like(
        workdir / "bertweet-base-random",
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        vocab_size=64001,
        words=counts,
        bpe_vocab_size=48_000,  # pieces x2 forms stay under 64001
    )


def join_to_length(enc: Encoder, texts: list[str], start: int, n_tokens: int) -> str:
    """Join texts[start], texts[start + 1], ... until they make at least ``n_tokens`` tokens."""
    out = texts[start]
    k = start + 1
    while len(enc.tokenize([out])[0]) < n_tokens and k < len(texts):
        out += " " + texts[k]
        k += 1
    return out


SETTINGS = ("float32", "bfloat16", "auto")


def encoders_for(path: str, **kw: object) -> dict[str, Encoder]:
    """One Encoder per setting; "auto" is the default path (``Encoder(path)``)."""
    return {dt: Encoder(path, dtype=dt, **kw) for dt in SETTINGS}  # type: ignore[arg-type]


def compare(
    name: str, encs: dict[str, Encoder], texts: list[str], rounds: int, batch_size: int
) -> dict[str, object]:
    """Time every encoder on the same equal chunks of ``texts``, taking turns.

    The order of turns is rotated from chunk to chunk and reversed every other
    chunk, so no setting always runs first or last. Rates: over all chunks
    (what a noisy shared machine gave) and of the best chunk (closest to an
    idle machine). Ratios against fp32 and bf16: totals, and the median of
    per-chunk ratios (settings ran back to back on the same chunk).
    Agreement: cosine of each setting's embeddings with fp32's, mean / min.
    """
    keys = list(encs)
    warm = texts[: 2 * batch_size]
    for enc in encs.values():
        enc.encode(warm, batch_size=batch_size)
    chunks = np.array_split(np.arange(len(texts)), rounds)
    took: dict[str, list[float]] = {k: [] for k in keys}
    outs: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    for r, idx in enumerate(chunks):
        chunk = [texts[i] for i in idx]
        order = keys[r % len(keys) :] + keys[: r % len(keys)]
        if r % 2:
            order.reverse()
        for key in order:
            t0 = time.perf_counter()
            outs[key].append(encs[key].encode(chunk, batch_size=batch_size))
            took[key].append(time.perf_counter() - t0)
    vecs = {k: np.concatenate(v) for k, v in outs.items()}
    sizes = [len(c) for c in chunks]
    res: dict[str, object] = {"model": name}
    for k in keys:
        cos = (vecs[k] * vecs["float32"]).sum(axis=1)  # rows are unit length
        res[k] = {
            "dtype": str(encs[k].dtype).removeprefix("torch."),
            "rate": len(texts) / sum(took[k]),
            "best": max(n / t for n, t in zip(sizes, took[k], strict=True)),
            "cos_mean": float(cos.mean()),
            "cos_min": float(cos.min()),
            **{
                f"vs_{base}": (
                    sum(took[base]) / sum(took[k]),
                    statistics.median(x / y for x, y in zip(took[base], took[k], strict=True)),
                )
                for base in ("float32", "bfloat16")
            },
        }
    return res


def tokenize_rate(enc: Encoder, texts: list[str], reps: int = 3) -> float:
    """Tweets/s of tokenisation alone (best of ``reps``): the Python-side cost per call."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        enc.tokenize(texts)
        best = min(best, time.perf_counter() - t0)
    return len(texts) / best


def gemm_gflops(dtype: torch.dtype, reps: int = 20) -> float:
    """Peak-ish GEMM rate for BERT-base's FFN shape (1280 tokens x 768 -> 3072): the bound.

    ``torch.int8``: the int8 x int8 -> int32 product the int8 path uses (``torch._int_mm``),
    without its quantise / rescale steps.
    """
    if dtype == torch.int8:
        xq = torch.randint(-127, 128, (1280, 768), dtype=torch.int8)
        wq = torch.randint(-127, 128, (3072, 768), dtype=torch.int8)

        def run() -> None:
            torch._int_mm(xq, wq.t())
    else:
        x = torch.randn(1280, 768).to(dtype)
        w = torch.randn(3072, 768).to(dtype)

        def run() -> None:
            torch.nn.functional.linear(x, w)

    run()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return 2 * 1280 * 768 * 3072 / best / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tweets", type=int, default=512, help="tweets per setting (after warm-up)")
    p.add_argument("--rounds", type=int, default=8, help="alternating chunks (ABBA order)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--skip-minilm", action="store_true")
    p.add_argument("--out", type=Path, help="also write the markdown section here")
    args = p.parse_args()
    command = "python " + " ".join(shlex.quote(x) for x in [sys.argv[0], *sys.argv[1:]])

    t_start = time.perf_counter()
    texts_all = load_texts()
    # Tweets to time: spread over the whole feed (it is time-ordered by event).
    step = max(1, len(texts_all) // args.tweets)
    texts = texts_all[::step][: args.tweets]

    load_before = os.getloadavg()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        path = build_base_model(Path(tmp), texts_all)
        build_s = time.perf_counter() - t0
        encs, load_s = {}, {}
        for k in SETTINGS:  # load times too (the int8 path calibrates)
            t0 = time.perf_counter()
            encs[k] = Encoder(str(path), dtype=k)
            load_s[k] = time.perf_counter() - t0
        n_params = sum(p.numel() for p in encs["float32"].model.parameters())
        tokens = [len(x) for x in encs["float32"].tokenize(texts)]
        tok_rate = tokenize_rate(encs["float32"], texts)
        results.append(compare("BERTweet-base size, feed tweets", encs, texts, args.rounds, args.batch_size))
        del encs
        encs = encoders_for(str(path), max_length=40)
        # SPEC's reference shape: exactly 40 tokens per tweet. Consecutive feed
        # tweets joined until long enough, cut to 40 by the encoder's truncation.
        fp32 = encs["float32"]
        joined = [join_to_length(fp32, texts_all, i * step, 40) for i in range(len(texts))]
        assert {len(x) for x in fp32.tokenize(joined)} == {40}
        results.append(
            compare("BERTweet-base size, 40 tokens each", encs, joined, args.rounds, args.batch_size)
        )
        del encs, fp32
    minilm_tokens: list[int] = []
    if not args.skip_minilm:
        encs = encoders_for(MINILM)
        minilm_tokens = [len(x) for x in encs["float32"].tokenize(texts)]
        results.append(
            compare(
                "MiniLM-L6 (packaged, pretrained), feed tweets", encs, texts, args.rounds, args.batch_size
            )
        )
        del encs
    gemm = {
        str(dt).removeprefix("torch."): gemm_gflops(dt) for dt in (torch.float32, torch.bfloat16, torch.int8)
    }
    first = results[0]["auto"]
    assert isinstance(first, dict)
    default_dtype, default_rate = first["dtype"], first["rate"]
    load_after = os.getloadavg()
    total_s = time.perf_counter() - t_start

    cpu_name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    lines = [
        "## Encoder throughput (stream/encoder.py)",
        "",
        f"Command: `{command}` (from the repository root; {total_s:.0f} s in all).",
        "",
        f"Machine: {cpu_name}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}, native bf16: "
        f"{cpu_supports_bf16()}, int8 VNNI: {cpu_supports_int8()} (so the default CPU path, "
        f'`Encoder(model)` with `dtype="auto"`, is {default_dtype}).',
        "",
        f"Model: randomly initialised BERTweet-base shape ({n_params / 1e6:.0f} M parameters; "
        f"built and saved in {build_s:.0f} s), BertweetTokenizer with normalisation and fastBPE "
        f"codes learned from the feed. Texts: {len(texts)} tweets spread over "
        f"`stream/data/crisislex-t26.jsonl.gz`, {np.mean(tokens):.1f} tokens on average "
        f"(median {np.median(tokens):.0f}, max {max(tokens)}, incl. `<s>`/`</s>`), batch "
        f"{args.batch_size}, batches sorted by length. Each setting encodes the same tweets "
        f"after a warm-up of {2 * args.batch_size}, in {args.rounds} chunks, taking turns "
        "(order rotated and reversed from chunk to chunk), same process."
        + (
            f" MiniLM's WordPiece gives {np.mean(minilm_tokens):.1f} tokens on average for the same tweets."
            if minilm_tokens
            else ""
        ),
        "",
        "Load time of the BERTweet-sized model from disk: "
        + ", ".join(f"{k} {v:.1f} s" for k, v in load_s.items())
        + " (the int8 path records activation maxima on 32 built-in sentences in fp32, then "
        "quantises the weights).",
        "",
        f"Tokenisation alone (BertweetTokenizer with normalisation, pure Python; best of 3): "
        f"{tok_rate:.0f} tweets/s, i.e. {100 * default_rate / tok_rate:.1f}% of the default "
        f"path's time per feed tweet ({default_rate:.1f} tweets/s end to end, tokenisation "
        "included).",
        "",
        f"GEMM bound (1280x768 by 768x3072, best of 20): fp32 {gemm['float32']:.0f} "
        f"GFLOP/s, bf16 {gemm['bfloat16']:.0f} GFLOP/s "
        f"({gemm['bfloat16'] / gemm['float32']:.2f}x), int8 (`torch._int_mm`) "
        f"{gemm['int8']:.0f} GOP/s ({gemm['int8'] / gemm['bfloat16']:.2f}x bf16).",
        "",
        f"Load average (1 min) before / after: {load_before[0]:.1f} / {load_after[0]:.1f} "
        f"on {os.cpu_count()} CPUs (the machine is shared; compare ratios, not absolute rates).",
        "",
        "Rates in tweets/s over all chunks (best chunk); speed-ups as total; median of "
        "per-chunk ratios; cosine with fp32 embeddings as mean / min over the tweets.",
        "",
        "| model | fp32 | bf16 | default | default vs bf16 | default vs fp32 | bf16 vs fp32 "
        "| cosine bf16 | cosine default |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        f32, b16, d = (r[k] for k in SETTINGS)
        assert isinstance(f32, dict) and isinstance(b16, dict) and isinstance(d, dict)
        lines.append(
            f"| {r['model']} | {f32['rate']:.1f} ({f32['best']:.1f}) | "
            f"{b16['rate']:.1f} ({b16['best']:.1f}) | "
            f"{d['rate']:.1f} ({d['best']:.1f}) {d['dtype']} | "
            f"{d['vs_bfloat16'][0]:.2f}x; {d['vs_bfloat16'][1]:.2f}x | "
            f"{d['vs_float32'][0]:.2f}x; {d['vs_float32'][1]:.2f}x | "
            f"{b16['vs_float32'][0]:.2f}x; {b16['vs_float32'][1]:.2f}x | "
            f"{b16['cos_mean']:.5f} / {b16['cos_min']:.5f} | "
            f"{d['cos_mean']:.5f} / {d['cos_min']:.5f} |"
        )
    publish(lines, args.out)


if __name__ == "__main__":
    main()
