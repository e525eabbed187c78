"""Benchmark the embed worker end to end: tweets/s through Kafka and Redis.

Why: the embed worker decides how big a feed one worker keeps up with
(target: >= 100 tweets/s in the default CPU path).  This measures the real
thing: ``reval worker embed`` subprocesses consuming from a local Tansu
Kafka-protocol broker (``workers.broker.LocalBroker``), cleaning, claiming
retweet keys and applying running means in the Redis at 127.0.0.1:6379,
against the encoder alone on the same texts, so the cost of
Kafka + Faust + cleaning + Redis is visible.

Model: randomly initialised, BERTweet-base-sized (12 layers, hidden 768,
vocab 64001; speed depends on the shapes, not the weights), with a
BertweetTokenizer whose BPE codes are learned from the feed, as in
``bench/bench_encoder.py``.  Tweets: English, hashtagged tweets of
``stream/data/crisislex-t26.jsonl.gz`` that ``stream.intake.cleaning.prepare``
keeps and whose retweet keys are new, so every produced tweet is embedded.

One worker per setting (dtype x embed batch size), each with its own topics,
consumer group and Redis prefix, all started first and warmed up; then, per
round, the same ``--tweets`` tweets go to each worker in turn (ABC CBA ...,
the machine is shared and noisy): time from the first produce until the
worker's ``reval_tweets_embedded_total`` reaches the count.  The encoder
alone, in this process, encodes each round's cleaned texts in arrival-order
slices of the batch size (what a worker batch sees), in the same rotation.
CPU seconds per tweet (worker and broker from /proc, the encoder alone from
this process) are reported beside wall time: on a shared machine they are
steadier, though torch's OpenMP threads also burn CPU waiting for a
descheduled partner, so contention inflates them too.  Each round starts on an
idle consumer, whose first fetch waits on the broker's long poll: the seconds
until a round's first tweet is embedded, and the worker's rate from then on,
are reported beside the round's rate (a continuous feed pays that wake-up once).
``--engine kafka`` runs the workers on one Apache Kafka node instead of Tansu.

    python -m bench.bench_pipeline                  # prints a markdown section
    python -m bench.bench_pipeline --engine kafka --settings auto:32 --rounds 2 --tweets 2048
    python -m bench.bench_pipeline --out /tmp/pipeline_bench.md --model DIR
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import redis
from kafka import KafkaProducer

from bench.bench_encoder import build_base_model, embeddable_tweets, load_texts
from workers.adapters.encoding.encoder import Encoder
from workers.adapters.kafka.kafka_client import create_topics
from workers.adapters.redis.redis_means import RedisMeans
from workers.dev.broker import ENGINES, local_broker
from workers.dev.ports import find_free_port
from workers.dev.stack import REVAL, Worker, wait_for

PARTITIONS = 4  # Settings.partitions default


@dataclass
class Setting:
    name: str
    dtype: str
    batch_size: int
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    worker: Worker | None = None
    sent: int = 0
    took: list[float] = field(default_factory=list)
    first: list[float] = field(default_factory=list)  # seconds until the round's first tweet was embedded
    first_count: list[int] = field(default_factory=list)  # tweets of the round embedded by then
    cpu: list[float] = field(default_factory=list)  # worker process CPU seconds per round
    broker_cpu: list[float] = field(default_factory=list)
    encoder_took: list[float] = field(default_factory=list)
    encoder_cpu: list[float] = field(default_factory=list)
    encoder: Encoder | None = None
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. bench_gpu's REVAL_DEVICE

    @property
    def prefix(self) -> str:
        return f"bench-{self.tag}"

    @property
    def topic(self) -> str:
        return f"tweets-bench-{self.tag}"

    def env(self, bootstrap: str, model: Path) -> dict[str, str]:
        return {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "REVAL_BROKER": bootstrap,
            "REVAL_REDIS_URL": "redis://127.0.0.1:6379/0",
            "REVAL_REDIS_PREFIX": self.prefix,
            "REVAL_APP_ID": f"reval-bench-{self.tag}",
            "REVAL_TOPIC_TWEETS": self.topic,
            "REVAL_TOPIC_RECOMMENDATIONS": f"recs-bench-{self.tag}",
            "REVAL_TOPIC_SCORES": f"scores-bench-{self.tag}",
            "REVAL_TOPIC_DEAD_LETTER": f"dlq-bench-{self.tag}",
            "REVAL_PARTITIONS": str(PARTITIONS),
            "REVAL_MODEL": str(model),
            "REVAL_DTYPE": self.dtype,
            "REVAL_EMBED_BATCH_SIZE": str(self.batch_size),
            "REVAL_SESSION_TIMEOUT_S": "6",
            **self.extra_env,
        }


def start_worker(setting: Setting, bootstrap: str, model: Path, workdir: Path) -> Worker:
    import subprocess

    create_topics(
        bootstrap,
        {
            setting.topic: PARTITIONS,
            f"recs-bench-{setting.tag}": PARTITIONS,
            f"scores-bench-{setting.tag}": PARTITIONS,
            f"dlq-bench-{setting.tag}": 1,
        },
    )
    port = find_free_port()
    cwd = workdir / setting.tag
    cwd.mkdir()
    log = cwd / "worker.log"
    proc = subprocess.Popen(
        [REVAL, "worker", "embed", "--metrics-port", str(port), "--loglevel", "info"],
        env=setting.env(bootstrap, model),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        cwd=cwd,
        start_new_session=True,
    )
    return Worker(("embed",), proc, log, port)


def process_cpu(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (all its threads), from /proc."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def send_and_wait(
    setting: Setting,
    producer: KafkaProducer,
    batch: list[tuple[bytes, bytes, str]],
    broker_pid: int | None = None,
) -> float:
    """Produce ``batch``; seconds until the worker has embedded all of it.

    Also records the CPU seconds the worker and the broker spent meanwhile: the
    machine is shared, and CPU time per tweet is far steadier than wall time."""
    worker = setting.worker
    assert worker is not None
    target = setting.sent + len(batch)
    cpu0, broker0 = process_cpu(worker.proc.pid), process_cpu(broker_pid)
    t0 = time.perf_counter()
    for key, value, _ in batch:
        producer.send(setting.topic, key=key, value=value)
    producer.flush()

    def done() -> bool:
        got = worker.metric("reval_tweets_embedded_total")
        if got > setting.sent and len(setting.first) < len(setting.took) + 1:
            setting.first.append(time.perf_counter() - t0)
            setting.first_count.append(int(got) - setting.sent)
        return got >= target

    wait_for(f"{setting.name}: {target} tweets embedded", done, timeout=600, every=0.05)
    took = time.perf_counter() - t0
    setting.cpu.append(process_cpu(worker.proc.pid) - cpu0)
    setting.broker_cpu.append(process_cpu(broker_pid) - broker0)
    setting.sent = target
    got = worker.metric("reval_tweets_embedded_total")
    if got != target:
        raise RuntimeError(f"{setting.name}: embedded {got}, expected {target}")
    return took


_ENCODER_THREAD = ThreadPoolExecutor(1, thread_name_prefix="bench-encoder")


def encode_alone(setting: Setting, texts: list[str]) -> float:
    """Encoder only, on the worker's batches: arrival-order slices of the batch size, run
    in a one-thread pool as ``workers.app`` runs it (on this 2-core machine torch ran
    measurably faster there than on the main thread, so the main thread would not be fair)."""
    encoder = setting.encoder
    assert encoder is not None

    def run() -> tuple[float, float]:
        t0, cpu0 = time.perf_counter(), time.process_time()
        for i in range(0, len(texts), setting.batch_size):
            encoder.encode(texts[i : i + setting.batch_size])
        return time.perf_counter() - t0, time.process_time() - cpu0

    took, cpu = _ENCODER_THREAD.submit(run).result()
    setting.encoder_cpu.append(cpu)
    return took


def worker_summary(worker: Worker) -> dict[str, float]:
    m = worker.metrics()

    def get(name: str, **labels: str) -> float:
        return m.get((name, tuple(sorted(labels.items()))), 0.0)

    return {
        "embedded": get("reval_tweets_embedded_total"),
        "batches": get("reval_embed_batch_size_count"),
        "batch_tweets": get("reval_embed_batch_size_sum"),
        "embed_s": get("reval_embed_seconds_sum"),
        "admit_s": get("reval_embed_admit_seconds_sum"),
        "claim_s": get("reval_redis_seconds_sum", op="claim"),
        "apply_s": get("reval_redis_seconds_sum", op="apply"),
        "dropped": sum(v for (n, _), v in m.items() if n == "reval_tweets_dropped_total"),
        "rejected": sum(v for (n, _), v in m.items() if n == "reval_records_rejected_total"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tweets", type=int, default=256, help="tweets per round and setting")
    p.add_argument("--rounds", type=int, default=4, help="rounds (ABC then CBA, ...)")
    p.add_argument("--warmup", type=int, default=64, help="tweets each worker gets untimed first")
    p.add_argument(
        "--settings",
        default="float32:32,auto:32,auto:64",
        help="comma list of DTYPE:BATCH (REVAL_DTYPE, REVAL_EMBED_BATCH_SIZE)",
    )
    p.add_argument("--model", type=Path, help="a saved BERTweet-like model dir (else built)")
    p.add_argument("--engine", choices=ENGINES, default="tansu", help="the local broker (one node)")
    p.add_argument("--out", type=Path, help="also write the markdown section here")
    args = p.parse_args()
    command = "python " + " ".join(shlex.quote(x) for x in [sys.argv[0], *sys.argv[1:]])
    t_start = time.perf_counter()
    settings = [
        Setting(f"{d}, batch {b}", d, int(b))
        for d, b in (item.split(":") for item in args.settings.split(","))
    ]
    tweets = embeddable_tweets(args.warmup + args.rounds * args.tweets)
    if len(tweets) < args.warmup + args.rounds * args.tweets:
        raise SystemExit(f"only {len(tweets)} embeddable tweets in the feed")
    warmup, timed = tweets[: args.warmup], tweets[args.warmup :]
    client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    load_before = os.getloadavg()
    broker = local_broker(args.engine).start()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        build_s = 0.0
        model = args.model
        if model is None:
            t0 = time.perf_counter()
            model = build_base_model(workdir, load_texts())
            build_s = time.perf_counter() - t0
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
        try:
            t0 = time.perf_counter()
            for s in settings:
                s.worker = start_worker(s, broker.bootstrap, model, workdir)
            wait_for(
                "workers ready",
                lambda: all(s.worker is not None and s.worker.ready() for s in settings),
                timeout=300,
            )
            start_s = time.perf_counter() - t0
            for s in settings:
                send_and_wait(s, producer, warmup)
                s.cpu.clear()
                s.first.clear()
                s.first_count.clear()
                s.broker_cpu.clear()
            encoders: dict[str, Encoder] = {}
            for s in settings:
                if s.dtype not in encoders:
                    encoders[s.dtype] = Encoder(str(model), dtype=s.dtype)
                s.encoder = encoders[s.dtype]
                encode_alone(s, [t for _, _, t in warmup])
                s.encoder_cpu.clear()
            before = {s.name: worker_summary(s.worker) for s in settings if s.worker}
            for r in range(args.rounds):
                batch = timed[r * args.tweets : (r + 1) * args.tweets]
                texts = [t for _, _, t in batch]
                for s in settings if r % 2 == 0 else settings[::-1]:
                    s.took.append(send_and_wait(s, producer, batch, broker.pids[0]))
                    s.encoder_took.append(encode_alone(s, texts))
            summaries = {
                s.name: {key: value - before[s.name][key] for key, value in worker_summary(s.worker).items()}
                for s in settings
                if s.worker
            }
            resolved = {d: str(e.dtype).removeprefix("torch.") for d, e in encoders.items()}
            logs = {s.name: s.worker.text() for s in settings if s.worker}
        finally:
            producer.close()
            for s in settings:
                if s.worker is not None:
                    s.worker.stop()
                RedisMeans(client, prefix=s.prefix).clear()
            broker.stop()
    load_after = os.getloadavg()
    total_s = time.perf_counter() - t_start
    for name, text in logs.items():
        if "Traceback" in text:
            print(f"warning: worker {name} logged a traceback", file=sys.stderr)

    n = args.tweets
    base = settings[0]
    lines = [
        "## Embed worker throughput end to end (reval worker embed: Kafka -> Redis)",
        "",
        f"Command: `{command}` (from the repository root; {total_s:.0f} s in all"
        + (f", model built in {build_s:.0f} s" if build_s else "")
        + f", {len(settings)} workers started and ready in {start_s:.0f} s).",
        "",
        f"Setup: {'Tansu' if args.engine == 'tansu' else 'Apache Kafka (one node)'} broker "
        f"(LocalBroker), Redis 127.0.0.1:6379, {PARTITIONS} partitions, "
        f"one `reval worker embed` subprocess per setting (own topics, group, Redis prefix; "
        f"REVAL_EMBED_MAX_WAIT_S default 1 s). Model: random BERTweet-base shape from "
        f"`{model if args.model else 'bench_encoder.build_base_model'}`. Default "
        f"`REVAL_DTYPE=auto` resolved to "
        f"{resolved.get('auto', '(not measured)')} (`Encoder(model).dtype`). Tweets: English, "
        f"hashtagged, kept by `prepare`, no repeated retweet keys; {args.warmup} untimed "
        f"warm-up tweets per worker, then {args.rounds} rounds x {n} tweets per setting, "
        "settings in ABC CBA order; a round's time runs from the first produce until "
        "`reval_tweets_embedded_total` reaches the count (polled every 50 ms). "
        "Encoder alone: same texts (cleaned), in this process, arrival-order slices of the "
        "batch size, right after each worker round.",
        "",
        f"Load average (1 min) before / after: {load_before[0]:.1f} / {load_after[0]:.1f} on "
        f"{os.cpu_count()} CPUs (shared machine: compare ratios, not absolute rates).",
        "",
        "Wall clock (what a feed sees):",
        "",
        f"| setting | worker tweets/s (best round) | vs {base.name}: total; median of "
        "rounds | per round | encoder alone tweets/s | worker / encoder alone | worker after its "
        "first batch of each round, tweets/s | that / encoder alone |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for s in settings:
        rate = n * len(s.took) / sum(s.took)
        best = max(n / t for t in s.took)
        ratio = sum(base.took) / sum(s.took)
        median = statistics.median(b / t for b, t in zip(base.took, s.took, strict=True))
        enc = n * len(s.encoder_took) / sum(s.encoder_took)
        # From the first embedded tweet on: what the worker does once the round's tweets are in
        # flight (a round starts on an idle consumer, whose first fetch waits on the broker).
        after = sum(n - c for c in s.first_count) / sum(t - f for t, f in zip(s.took, s.first, strict=True))
        lines.append(
            f"| {s.name} ({resolved[s.dtype]}) | {rate:.1f} ({best:.1f}) | {ratio:.2f}x; "
            f"{median:.2f}x | {', '.join(f'{n / t:.1f}' for t in s.took)} | {enc:.1f} | "
            f"{rate / enc:.2f} | {after:.1f} | {after / enc:.2f} |"
        )
    lines += [
        "",
        "CPU time (steadier than wall time on a shared machine) and where the worker's time goes:",
        "",
        "| setting | worker CPU s / 100 tweets | encoder alone CPU s / 100 tweets | "
        "worker CPU beyond the encoder | broker CPU s / 100 tweets | encoder share of "
        "worker wall time | Redis ms per batch (claim + apply) | mean batch | first tweet "
        "embedded after (s, median of rounds) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in settings:
        m = summaries[s.name]
        tweets = n * len(s.took)
        worker_cpu = 100 * sum(s.cpu) / tweets
        encoder_cpu = 100 * sum(s.encoder_cpu) / tweets
        batches = max(m["batches"], 1)
        lines.append(
            f"| {s.name} ({resolved[s.dtype]}) | {worker_cpu:.2f} | {encoder_cpu:.2f} | "
            f"{1 - encoder_cpu / worker_cpu:.0%} | {100 * sum(s.broker_cpu) / tweets:.3f} | "
            f"{m['embed_s'] / sum(s.took):.0%} | "
            f"{(m['claim_s'] + m['apply_s']) / batches * 1000:.1f} | "
            f"{m['batch_tweets'] / batches:.1f} | "
            f"{statistics.median(s.first) if s.first else float('nan'):.2f} |"
        )
    dropped = sum(m["dropped"] for m in summaries.values())
    rejected = sum(m["rejected"] for m in summaries.values())
    lines += [
        "",
        f"Every produced tweet was embedded (dropped: {dropped:.0f}, rejected: "
        f"{rejected:.0f}). Worker and broker CPU: /proc/PID/stat (user + system, all "
        "threads) over each timed round; encoder alone: process CPU time of this process. "
        "In-worker figures are from the workers' /metrics over the timed rounds: "
        "`reval_embed_seconds` (encoder) against the round times, `reval_redis_seconds` "
        "per batch, `reval_embed_batch_size`.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
