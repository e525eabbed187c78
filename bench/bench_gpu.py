"""Benchmark the encoder's GPU path (issue 12 §2): tweets/s and MFU, and the embed worker end to end.

Why: on a GPU the embed tier should run near the hardware limit (targets on one H100:
the encoder >= 50,000 tweets/s including tokenisation, the embed worker >= 20,000
tweets/s). This measures, in one run:

(a) the encoder alone, on the feed's tweets cleaned as the embed worker cleans them
    (``bench.bench_pipeline.embeddable_tweets``: English, hashtagged, no repeated
    retweet keys; ``stream.intake.cleaning.prepare``'s text): the token-budget path
    (``Encoder(model, device=..., token_budget=...)``: bf16 on CUDA, packed tweets,
    tokenising processes feeding the GPU; ``workers/adapters/encoding/gpu_batching.py``)
    against a naive transformers baseline (fp32, fixed batches of 32 tweets in arrival
    order, padded, transformers' own slow BertweetTokenizer, one call after the other),
    taking turns round by round (AB BA ...). Rates include tokenisation. MFU: the model's
    FLOPs on the real tokens (per layer and token 2 x (4 d^2 + 2 d f) for the Linear
    layers, plus 4 L d per token for attention over a tweet of L tokens; embeddings,
    LayerNorm, softmax left out) per second, over ``--peak-tflops`` (default 989: H100
    SXM dense bf16; H100 PCIe: 756). Padding the baseline computes does not count.
    Also: tokenisation alone in one process (cold and warm caches), the bound a single
    tokenising process puts on the rate.
(b) the embed worker end to end: one ``reval worker embed`` subprocess on a local
    Tansu broker and the Redis at 127.0.0.1:6379, with ``bench.bench_pipeline``'s
    helpers (``Setting``, ``start_worker``, ``send_and_wait``): time from the first
    produce until ``reval_tweets_embedded_total`` reaches the count. Rounds re-send the
    same tweets, with the retweet claims (``PREFIX:seen:*``) deleted in between so they
    are embedded again. Also: the producer alone (to a topic nobody reads), which bounds
    what this harness can show.
(c) ``--drain N``: the embed worker at full speed, not bounded by this harness's producer:
    N records (the feed's original tweets, cycled) produced to its topic first, then one
    ``reval worker embed`` per ``--prepare-workers`` value started on them; its rate is read
    from its own ``reval_tweets_embedded_total`` over the middle 80% of the drain, and its
    stage times (``reval_embed_admit_seconds``, ``reval_redis_seconds``,
    ``reval_embed_seconds``) say which stage bounds it.

Model: ``--model base`` (default) is a randomly initialised BERTweet-base shape (as
``bench.bench_encoder.build_base_model``: speed depends on the shapes, not the weights),
``--model tiny`` the 2-layer test model (smoke runs), or a saved model directory.

    python -m bench.bench_gpu                         # on a GPU machine: prints a markdown section
    python -m bench.bench_gpu --device cpu --model tiny --tweets 512 --out /tmp/gpu_smoke.md
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Part (a) needs only these (a GPU machine may have no Kafka or Redis client installed);
# part (b)'s imports are in bench_worker.
from bench.bench_encoder import build_base_model, embeddable_tweets, load_texts
from bench.results import bench_command, cpu_model, publish
from stream.intake.records import parse_tweet
from workers.adapters.encoding.bertweet_tokenizer import FastBertweetTokenizer, fast_for
from workers.adapters.encoding.encoder import Encoder
from workers.adapters.encoding.gpu_batching import DEFAULT_TOKEN_BUDGET
from workers.adapters.encoding.model_loading import resolve_device
from workers.dev.tiny_models import build_tiny_bertweet

REDIS_URL = "redis://127.0.0.1:6379/0"


# -- FLOPs --------------------------------------------------------------------------


def forward_flops(config: Any, lengths: list[int] | np.ndarray) -> float:
    """FLOPs of one forward pass over tweets of ``lengths`` tokens, real tokens only.

    Per layer and token: the Linear layers, 2 x (4 d^2 + 2 d f) (Q, K, V, output
    projection; FFN up and down); attention, 4 L d for a tweet of L tokens (QK^T and
    the weighted sum of V). Embedding look-ups, LayerNorm, GELU, softmax and pooling
    are left out (well under 1%).
    """
    d, f, layers = int(config.hidden_size), int(config.intermediate_size), int(config.num_hidden_layers)
    lens = np.asarray(lengths, dtype=np.float64)
    per_token = 2.0 * (4 * d * d + 2 * d * f)
    return float(layers * (lens.sum() * per_token + 4.0 * d * (lens**2).sum()))


# -- the naive baseline -------------------------------------------------------------


@torch.no_grad()
def naive_encode(enc: Encoder, texts: list[str], batch_size: int = 32) -> np.ndarray:
    """What a first transformers script does: fp32, fixed batches in arrival order, padded,
    transformers' tokenizer (slow BertweetTokenizer, normalisation on), one call after another."""
    tok, model, device = enc.tokenizer, enc.model, enc.device
    out = []
    for i in range(0, len(texts), batch_size):
        inputs = tok(
            texts[i : i + batch_size],
            padding=True,
            truncation=True,
            max_length=enc.max_length,
            return_tensors="pt",
        )
        ids, mask = inputs["input_ids"].to(device), inputs["attention_mask"].to(device)
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        weights = mask.unsqueeze(-1).float()
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        out.append(torch.nn.functional.normalize(pooled, dim=1).cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, enc.dim), dtype=np.float32)


def tokenize_rates(enc: Encoder, texts: list[str]) -> tuple[float, float]:
    """Tweets/s of one process tokenising ``texts``: fresh caches, then warm (a second pass)."""
    fast: FastBertweetTokenizer | None = fast_for(enc.tokenizer)
    rates = []
    for _ in range(2):
        t0 = time.perf_counter()
        if fast is not None:
            fast.encode_batch(texts, enc.max_length)
        else:
            enc.tokenize(texts)
        rates.append(len(texts) / (time.perf_counter() - t0))
    return rates[0], rates[1]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_tflops(device: torch.device, dtype: torch.dtype) -> float:
    """The device's matrix-product ceiling, measured: one square product on random data
    (8192 on CUDA, 1024 on CPU), median of 10 after 3 warm-ups, in TFLOP/s."""
    n = 8192 if device.type == "cuda" else 1024
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    took = []
    for i in range(13):
        synchronize(device)
        t0 = time.perf_counter()
        torch.matmul(a, b)
        synchronize(device)
        if i >= 3:
            took.append(time.perf_counter() - t0)
    return 2 * n**3 / float(np.median(took)) / 1e12


@dataclass
class HalvesResult:
    host_rate: float  # tweets/s of the host half alone (tokenising processes, sorting, layout)
    device_rate: float  # tweets/s of the device half alone, on batches already in host memory
    device_rounds: list[float]
    device_mfu: float
    batches: int
    tokens_per_batch: float
    peak_memory_gib: float


def bench_halves(
    enc: Encoder, texts: list[str], rounds: int, peak: float, profile: Path | None = None
) -> HalvesResult:
    """The token-budget path's two halves apart (``Encoder.host_batches``, ``forward_batch``):
    which of them bounds the whole. With ``profile``, torch.profiler's table of the device
    half's operators (20 batches) is written there."""
    config: Any = getattr(enc.model, "config", None)
    device = enc.device
    t0 = time.perf_counter()
    batches = list(enc.host_batches(texts))
    host_s = time.perf_counter() - t0
    lengths = np.concatenate([b.lengths.numpy() for b in batches]).astype(np.int64)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    enc.forward_batch(batches[0])  # warm-up
    took = []
    for _ in range(rounds):
        synchronize(device)
        t0 = time.perf_counter()
        outs = [enc.forward_batch(b) for b in batches]
        synchronize(device)
        took.append(time.perf_counter() - t0)
        del outs
    if profile is not None:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as profiler

        cuda = device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profiler(activities=activities) as prof:
            outs = [enc.forward_batch(b) for b in batches[:20]]
            synchronize(device)
        del outs
        key = "self_device_time_total" if cuda else "self_cpu_time_total"
        profile.write_text(prof.key_averages().table(sort_by=key, row_limit=40), encoding="utf-8")
    flops = forward_flops(config, lengths) if config is not None else 0.0
    return HalvesResult(
        host_rate=len(texts) / host_s,
        device_rate=len(texts) * rounds / sum(took),
        device_rounds=[len(texts) / t for t in took],
        device_mfu=flops * rounds / sum(took) / peak,
        batches=len(batches),
        tokens_per_batch=float(lengths.sum()) / len(batches),
        peak_memory_gib=torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0,
    )


# -- (a) the encoder alone ------------------------------------------------------------


@dataclass
class EncoderResult:
    new_rate: float
    new_best: float
    naive_rate: float
    naive_best: float
    new_mfu: float
    naive_mfu: float
    new_tweets: int
    naive_tweets: int
    cos_mean: float
    cos_min: float
    new_rounds: list[float]
    naive_rounds: list[float]


def bench_encoder(
    new: Encoder, naive: Encoder, texts: list[str], rounds: int, naive_per_round: int, peak: float
) -> EncoderResult:
    """Both paths on the same chunks, taking turns (AB, BA, ...); rates include tokenisation."""
    config: Any = getattr(new.model, "config", None)
    warm = texts[: min(len(texts), 256)]
    new.encode(warm)
    naive_encode(naive, warm[:64])
    chunks = np.array_split(np.arange(len(texts)), rounds)
    took: dict[str, list[float]] = {"new": [], "naive": []}
    sizes: dict[str, list[int]] = {"new": [], "naive": []}
    flops = {"new": 0.0, "naive": 0.0}
    cosines = []
    for r, idx in enumerate(chunks):
        chunk = [texts[i] for i in idx]
        sub = chunk[:naive_per_round]
        lengths = {"new": [len(x) for x in new.tokenize(chunk)], "naive": [len(x) for x in new.tokenize(sub)]}
        outs: dict[str, np.ndarray] = {}
        for which in ("new", "naive") if r % 2 == 0 else ("naive", "new"):
            t0 = time.perf_counter()
            outs[which] = new.encode(chunk) if which == "new" else naive_encode(naive, sub)
            took[which].append(time.perf_counter() - t0)
            sizes[which].append(len(chunk) if which == "new" else len(sub))
            if config is not None:
                flops[which] += forward_flops(config, lengths[which])
        cosines.append((outs["new"][: len(sub)] * outs["naive"]).sum(axis=1))
    cos = np.concatenate(cosines)

    def rate(which: str) -> float:
        return sum(sizes[which]) / sum(took[which])

    def best(which: str) -> float:
        return max(n / t for n, t in zip(sizes[which], took[which], strict=True))

    return EncoderResult(
        new_rate=rate("new"),
        new_best=best("new"),
        naive_rate=rate("naive"),
        naive_best=best("naive"),
        new_mfu=flops["new"] / sum(took["new"]) / peak,
        naive_mfu=flops["naive"] / sum(took["naive"]) / peak,
        new_tweets=sum(sizes["new"]),
        naive_tweets=sum(sizes["naive"]),
        cos_mean=float(cos.mean()),
        cos_min=float(cos.min()),
        new_rounds=[n / t for n, t in zip(sizes["new"], took["new"], strict=True)],
        naive_rounds=[n / t for n, t in zip(sizes["naive"], took["naive"], strict=True)],
    )


# -- (b) the embed worker end to end ---------------------------------------------------


@dataclass
class WorkerResult:
    rate: float
    best: float
    rounds: list[float]
    producer_rate: float
    tweets: int
    start_s: float
    summary: dict[str, float]
    log_has_traceback: bool


def clear_claims(client: Any, prefix: str) -> None:
    """Forget the retweet claims, so the same tweets are embedded again next round."""
    keys = list(client.scan_iter(match=f"{prefix}:seen:*", count=1000))
    for start in range(0, len(keys), 1000):
        client.unlink(*keys[start : start + 1000])


def bench_worker(
    model: Path,
    device: str,
    batch_size: int,
    tweets: list[tuple[bytes, bytes, str]],
    rounds: int,
    workdir: Path,
    max_wait_s: float = 0.05,
) -> WorkerResult:
    import redis
    from kafka import KafkaProducer

    from bench.bench_pipeline import Setting, send_and_wait, start_worker, worker_summary
    from workers.adapters.kafka.kafka_client import create_topics
    from workers.adapters.redis.redis_means import RedisMeans
    from workers.dev.stack import wait_for
    from workers.dev.tansu import TansuBroker

    client = redis.Redis.from_url(REDIS_URL)
    setting = Setting(
        f"{device}, batch {batch_size}",
        "auto",
        batch_size,
        extra_env={"REVAL_DEVICE": device, "REVAL_EMBED_MAX_WAIT_S": str(max_wait_s)},
    )
    warmup = tweets[: min(len(tweets), 4 * batch_size, 2048)]
    with TansuBroker() as broker:
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5, batch_size=1 << 20)
        try:
            t0 = time.perf_counter()
            setting.worker = start_worker(setting, broker.bootstrap, model, workdir)
            worker = setting.worker
            wait_for("embed worker ready", worker.ready, timeout=600)
            start_s = time.perf_counter() - t0
            send_and_wait(setting, producer, warmup)
            clear_claims(client, setting.prefix)
            before = worker_summary(worker)
            took = []
            for _ in range(rounds):
                took.append(send_and_wait(setting, producer, tweets, broker.pid))
                clear_claims(client, setting.prefix)
            after = worker_summary(worker)
            # The producer alone, to a topic no one reads: what this harness can feed.
            idle = f"idle-bench-{setting.tag}"
            create_topics(broker.bootstrap, {idle: 4})
            t1 = time.perf_counter()
            for key, value, _ in tweets:
                producer.send(idle, key=key, value=value)
            producer.flush()
            producer_rate = len(tweets) / (time.perf_counter() - t1)
            traceback = "Traceback" in worker.text()
        finally:
            producer.close()
            if setting.worker is not None:
                setting.worker.stop()
            RedisMeans(client, prefix=setting.prefix).clear()
    n = len(tweets)
    return WorkerResult(
        rate=n * len(took) / sum(took),
        best=max(n / t for t in took),
        rounds=[n / t for t in took],
        producer_rate=producer_rate,
        tweets=n,
        start_s=start_s,
        summary={k: after[k] - before[k] for k in after},
        log_has_traceback=traceback,
    )


@dataclass
class DrainResult:
    prepare_workers: int
    backlog: int
    rate: float  # tweets/s embedded between 10% and 90% of the backlog (or the time limit)
    window: tuple[int, int]  # tweets embedded at the window's ends
    finished: bool
    start_s: float
    worker_cpu_s: float
    summary: dict[str, float]
    log_has_traceback: bool


def backlog_tweets(feed: list[tuple[bytes, bytes, str]], n: int) -> list[tuple[bytes, bytes]]:
    """``n`` records cycling through the feed's original tweets (a retweet's second copy would
    be dropped by the claims, which would make the worker's job easier than a real feed's)."""
    originals = [(k, v) for k, v, _ in feed if not parse_tweet(v).is_retweet]
    return [
        (f"{k.decode()}-{i}".encode(), v)
        for i, (k, v) in enumerate(itertools.islice(itertools.cycle(originals), n))
    ]


def bench_drain(
    model: Path,
    device: str,
    batch_size: int,
    backlog: list[tuple[bytes, bytes]],
    prepare_workers: int,
    workdir: Path,
    limit_s: float,
) -> DrainResult:
    """The embed worker draining a backlog: ``backlog`` produced to its topic first, then one
    ``reval worker embed`` started; its rate is read from its own ``reval_tweets_embedded_total``
    while it drains (the producer is not in the timing, so it measures the worker at full
    speed -- what it can keep up with)."""
    import redis
    from kafka import KafkaProducer

    from bench.bench_pipeline import Setting, process_cpu, start_worker, worker_summary
    from workers.adapters.kafka.kafka_client import create_topics
    from workers.adapters.redis.redis_means import RedisMeans
    from workers.dev.stack import wait_for
    from workers.dev.tansu import TansuBroker

    client = redis.Redis.from_url(REDIS_URL)
    setting = Setting(
        f"{device}, batch {batch_size}, {prepare_workers} preparing",
        "auto",
        batch_size,
        extra_env={
            "REVAL_DEVICE": device,
            "REVAL_EMBED_MAX_WAIT_S": "0.05",
            # only when set: a tree from before the setting can be measured (PYTHONPATH)
            **({"REVAL_PREPARE_WORKERS": str(prepare_workers)} if prepare_workers else {}),
        },
    )
    n = len(backlog)
    with TansuBroker() as broker:
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=20, batch_size=1 << 20)
        worker = None
        try:
            create_topics(broker.bootstrap, {setting.topic: 4})  # start_worker creates the rest
            for key, value in backlog:
                producer.send(setting.topic, key=key, value=value)
            producer.flush()
            t0 = time.perf_counter()
            worker = setting.worker = start_worker(setting, broker.bootstrap, model, workdir)
            wait_for("embed worker ready", worker.ready, timeout=600)
            start_s = time.perf_counter() - t0
            cpu0 = process_cpu(worker.proc.pid)
            samples: list[tuple[float, float]] = []
            deadline = time.perf_counter() + limit_s
            while time.perf_counter() < deadline:
                got = worker.metric("reval_tweets_embedded_total")
                samples.append((time.perf_counter(), got))
                if got >= n:
                    break
                time.sleep(0.2)
            worker_cpu = process_cpu(worker.proc.pid) - cpu0
            summary = worker_summary(worker)
            traceback = "Traceback" in worker.text()
        finally:
            producer.close()
            if worker is not None:
                worker.stop()
            RedisMeans(client, prefix=setting.prefix).clear()
    reached = samples[-1][1]
    lo, hi = 0.1 * n, min(0.9 * n, reached)
    first = next((s for s in samples if s[1] >= lo), samples[0])
    last = next((s for s in reversed(samples) if s[1] <= hi), samples[-1])
    rate = (last[1] - first[1]) / (last[0] - first[0]) if last[0] > first[0] else float("nan")
    return DrainResult(
        prepare_workers,
        n,
        rate,
        (int(first[1]), int(last[1])),
        reached >= n,
        start_s,
        worker_cpu,
        summary,
        traceback,
    )


def drain_lines(results: list[DrainResult], encoder_rate: float) -> list[str]:
    """The markdown of part (c)."""
    lines = [
        "",
        "### (c) Embed worker draining a backlog (Kafka -> prepare -> claim -> embed -> Redis means)",
        "",
        f"The backlog produced first, then one `reval worker embed`; rate over the middle of the drain "
        f"from the worker's own counter. Encoder alone in this run: {encoder_rate:,.0f} tweets/s.",
        "",
        "| REVAL_PREPARE_WORKERS | backlog | embedded tweets/s | / encoder alone | worker CPU s | "
        "admit s | claim s | encode s | means s | sample s | reservoir s | batches | ready in |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        s = r.summary
        lines.append(
            f"| {r.prepare_workers} | {r.backlog:,}{'' if r.finished else ' (not all)'} | {r.rate:,.0f} | "
            f"{r.rate / encoder_rate:.2f} | {r.worker_cpu_s:.1f} | {s.get('admit_s', 0):.1f} | "
            f"{s.get('claim_s', 0):.1f} | {s.get('embed_s', 0):.1f} | {s.get('apply_s', 0):.1f} | "
            f"{s.get('sample_s', 0):.1f} | {s.get('reservoir_s', 0):.1f} | {s.get('batches', 0):.0f} | "
            f"{r.start_s:.0f} s |"
        )
    if any(r.log_has_traceback for r in results):
        lines.append("")
        lines.append("A worker's log has a Traceback.")
    return lines


# -- main -----------------------------------------------------------------------------


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    return cpu_model()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="auto", help="auto (CUDA if present), cuda, cuda:N, cpu")
    p.add_argument("--model", default="base", help="base (random BERTweet-base shape), tiny, or a model dir")
    p.add_argument("--tweets", type=int, default=200_000, help="tweets for the new path, all rounds")
    p.add_argument("--rounds", type=int, default=4, help="rounds, paths taking turns (AB BA ...)")
    p.add_argument("--naive-tweets", type=int, default=2048, help="tweets per round for the baseline")
    p.add_argument("--token-budget", type=int, default=DEFAULT_TOKEN_BUDGET, help="tokens per batch")
    p.add_argument("--tokenize-workers", type=int, help="tokenising processes (default: the Encoder's)")
    p.add_argument("--dtype", default="auto", help="the new path's dtype (auto: bf16 on CUDA)")
    p.add_argument("--attention", default="auto", help="auto, flash, nested, padded")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="peak dense bf16 TFLOP/s for MFU")
    p.add_argument("--worker-batch", type=int, default=4096, help="REVAL_EMBED_BATCH_SIZE of the worker")
    p.add_argument("--worker-tweets", type=int, default=10_000, help="tweets per worker round (<= feed)")
    p.add_argument("--worker-rounds", type=int, default=3)
    p.add_argument("--no-worker", action="store_true", help="skip (b), the embed worker")
    p.add_argument("--drain", type=int, default=0, help="(c): backlog of tweets the worker drains (0: skip)")
    p.add_argument(
        "--prepare-workers", default="0,8", help="(c): REVAL_PREPARE_WORKERS values, one drain each"
    )
    p.add_argument("--drain-limit-s", type=float, default=120.0, help="(c): longest one drain is watched")
    p.add_argument("--out", type=Path, help="also write the markdown section here")
    p.add_argument("--profile", type=Path, help="torch.profiler table of the device half")
    args = p.parse_args()
    command = bench_command("bench_gpu")
    t_start = time.perf_counter()
    device = resolve_device(args.device)
    peak = args.peak_tflops * 1e12

    # The feed, cleaned as the embed worker cleans it; (a) cycles through it when asked for more.
    feed = embeddable_tweets(max(0 if args.no_worker else args.worker_tweets, args.tweets, args.drain))
    cleaned = [t for _, _, t in feed]
    texts = list(itertools.islice(itertools.cycle(cleaned), args.tweets))
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        t0 = time.perf_counter()
        if args.model == "base":
            model = build_base_model(workdir, load_texts())
        elif args.model == "tiny":
            model = build_tiny_bertweet(workdir / "tiny")
        else:
            model = Path(args.model)
        build_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        new = Encoder(
            str(model),
            device=str(device),
            dtype=args.dtype,
            token_budget=args.token_budget,
            tokenize_workers=args.tokenize_workers,
            attention=args.attention,
        )
        load_s = time.perf_counter() - t0
        naive = Encoder(str(model), device=str(device), dtype="float32", token_budget=0)
        config: Any = getattr(new.model, "config", None)
        n_params = sum(x.numel() for x in new.model.parameters())
        lengths = [len(x) for x in new.tokenize(cleaned)]
        tok_cold, tok_warm = tokenize_rates(new, cleaned[:20_000])
        enc = bench_encoder(new, naive, texts, args.rounds, args.naive_tweets, peak)
        halves = bench_halves(new, texts, 3, peak, args.profile) if new.token_budget else None
        ceiling = matmul_tflops(device, torch.bfloat16 if device.type == "cuda" else torch.float32)
        new_repr, new_workers = repr(new), new.tokenize_workers
        new_desc = f"{str(new.dtype).removeprefix('torch.')}, {new.packing}"
        new.close()
        del new, naive
        if device.type == "cuda":
            torch.cuda.empty_cache()
        worker: WorkerResult | None = None
        if not args.no_worker:
            worker_tweets = feed[: args.worker_tweets]
            worker = bench_worker(
                model, str(device), args.worker_batch, worker_tweets, args.worker_rounds, workdir
            )
        drains: list[DrainResult] = []
        if args.drain:
            backlog = backlog_tweets(feed, args.drain)
            for workers in [int(w) for w in args.prepare_workers.split(",")]:
                drains.append(
                    bench_drain(
                        model, str(device), args.worker_batch, backlog, workers, workdir, args.drain_limit_s
                    )
                )
    load_after = os.getloadavg()
    total_s = time.perf_counter() - t_start

    gpu = device.type == "cuda"
    kind = "GPU" if gpu else "CPU SMOKE RUN (not a GPU result)"
    flops_per_tweet = forward_flops(config, lengths) / len(lengths) if config is not None else float("nan")
    lines = [
        f"## GPU path benchmark (bench/bench_gpu.py) -- {kind}",
        "",
        f"Command: `{command}` (from the repository root; {total_s:.0f} s in all"
        + (f", model built in {build_s:.0f} s" if build_s > 0.5 else "")
        + ").",
        "",
        f"Device: {device_name(device)}; torch {torch.__version__}, {os.cpu_count()} CPUs, "
        f"load average (1 min) before / after {load_before[0]:.1f} / {load_after[0]:.1f}.",
        "",
        f"Model: `{args.model}` ({n_params / 1e6:.1f} M parameters"
        + (
            f"; hidden {config.hidden_size}, {config.num_hidden_layers} layers, "
            f"FFN {config.intermediate_size}"
            if config is not None
            else ""
        )
        + f"). Tweets: {len(feed)} feed tweets cleaned as the embed worker cleans them, "
        f"{np.mean(lengths):.1f} tokens on average (median {np.median(lengths):.0f}, max {max(lengths)}); "
        f"{flops_per_tweet / 1e9:.2f} GFLOP per tweet on average."
        + (
            f" The new path's {args.tweets} tweets cycle through them, so after the first pass "
            "the tokenizers' caches are warm (a live feed's hit rate is lower)."
            if args.tweets > len(cleaned)
            else ""
        ),
        "",
        f"New path: `{new_repr}`, loaded in {load_s:.1f} s (the load-time packing check "
        f"included), tokenising processes: {new_workers}.",
    ]
    lines += [
        "",
        "### (a) Encoder alone (tokenisation included)",
        "",
        f"{args.rounds} rounds, paths taking turns (AB BA ...): per round the new path encodes "
        f"{args.tweets // args.rounds} tweets, the baseline the first {args.naive_tweets} of them. "
        f"MFU against {args.peak_tflops:.0f} TFLOP/s (model FLOPs on real tokens only).",
        "",
        "| path | tweets | tweets/s (best round) | per round | model TFLOP/s | MFU |",
        "|---|---:|---:|---|---:|---:|",
        f"| new: token budget {args.token_budget}, {new_desc} | {enc.new_tweets} | "
        f"{enc.new_rate:,.0f} ({enc.new_best:,.0f}) | {', '.join(f'{x:,.0f}' for x in enc.new_rounds)} | "
        f"{enc.new_mfu * peak / 1e12:.3g} | {enc.new_mfu:.3%} |",
        f"| naive HF: fp32, batch 32 padded, slow tokenizer | {enc.naive_tweets} | "
        f"{enc.naive_rate:,.0f} ({enc.naive_best:,.0f}) | "
        f"{', '.join(f'{x:,.0f}' for x in enc.naive_rounds)} | {enc.naive_mfu * peak / 1e12:.3g} | "
        f"{enc.naive_mfu:.3%} |",
        "",
        f"Speed-up: {enc.new_rate / enc.naive_rate:.1f}x. Agreement of the new path with the fp32 "
        f"padded baseline on the same tweets (cosine): mean {enc.cos_mean:.6f}, min {enc.cos_min:.6f} "
        "(required >= 0.999).",
        "",
        f"Tokenisation alone, one process (FastBertweetTokenizer, up to 20,000 tweets): "
        f"{tok_cold:,.0f} tweets/s with fresh caches, {tok_warm:,.0f} warm.",
        "",
        f"Matrix-product ceiling measured now ({'bf16 8192^3' if gpu else 'fp32 1024^3'}, median of "
        f"10): {ceiling:.0f} TFLOP/s ({ceiling * 1e12 / peak:.0%} of the {args.peak_tflops:.0f} "
        "used for MFU).",
    ]
    if halves is not None:
        lines += [
            "",
            "The new path's two halves apart, on the same tweets (`Encoder.host_batches`, "
            "`Encoder.forward_batch`): which one bounds it.",
            "",
            "| half | tweets/s | per round | MFU |",
            "|---|---:|---|---:|",
            f"| host: tokenising processes ({new_workers}), sort, layout in pinned memory | "
            f"{halves.host_rate:,.0f} | | |",
            f"| device: copy in, forward, pool, on {halves.batches} batches already built "
            f"({halves.tokens_per_batch:,.0f} tokens each on average; peak memory "
            f"{halves.peak_memory_gib:.1f} GiB) | {halves.device_rate:,.0f} | "
            f"{', '.join(f'{x:,.0f}' for x in halves.device_rounds)} | {halves.device_mfu:.1%} |",
        ]
    if worker is not None:
        s = worker.summary
        batches = max(s["batches"], 1.0)
        lines += [
            "",
            "### (b) Embed worker end to end (Kafka -> clean -> claim -> embed -> Redis means)",
            "",
            f"One `reval worker embed` (REVAL_DEVICE={device}, REVAL_DTYPE=auto, "
            f"REVAL_EMBED_BATCH_SIZE={args.worker_batch}, REVAL_EMBED_MAX_WAIT_S=0.05) on a "
            f"local Tansu broker (4 partitions) and Redis 127.0.0.1:6379; ready in "
            f"{worker.start_s:.0f} s; {args.worker_rounds} rounds of the same {worker.tweets} tweets "
            "(claims deleted between rounds), each timed from the first produce until "
            "`reval_tweets_embedded_total` reaches the count (polled every 50 ms)."
            + (
                " On CPU the worker takes the Encoder's fixed-count path: the token budget is "
                "not wired into the settings yet."
                if not gpu
                else ""
            ),
            "",
            "| worker tweets/s (best round) | per round | producer alone tweets/s | mean batch "
            "| encoder share of wall time | Redis ms per batch (claim + apply) |",
            "|---:|---|---:|---:|---:|---:|",
            f"| {worker.rate:,.0f} ({worker.best:,.0f}) | {', '.join(f'{x:,.0f}' for x in worker.rounds)} "
            f"| {worker.producer_rate:,.0f} | {s['batch_tweets'] / batches:.0f} | "
            f"{s['embed_s'] / (worker.tweets * len(worker.rounds) / worker.rate):.0%} | "
            f"{(s['claim_s'] + s['apply_s']) / batches * 1000:.1f} |",
            "",
            f"Every tweet embedded (dropped {s['dropped']:.0f}, rejected {s['rejected']:.0f})"
            + ("; WARNING: the worker logged a traceback." if worker.log_has_traceback else "."),
        ]
    if drains:
        lines += drain_lines(drains, enc.new_rate)
    publish(lines, args.out)


if __name__ == "__main__":
    main()
