"""Benchmark workers.redis_store: running-mean updates/s per worker and bytes per hashtag.

Why: each embed worker must push its (tweet, hashtag) updates into Redis faster
than it embeds (BERTweet on CPU: ~30-110 tweets/s; target here: >= 5,000
updates/s, so Redis is never the bottleneck and one Redis serves many
workers), and a hashtag's state must stay <= 3.5 KB so millions fit.

Workload: 768-d float32 BERT-like vectors; batches of 64 tweets from 4 Kafka
partitions; each tweet has 1-3 hashtags drawn Zipf-like (p ~ 1/rank^1.1) from
5,000.  An "update" is one (tweet, distinct hashtag) pair added to a running
mean.  Methods, measured in the same run against the same Redis, alternating
in ABC CBA order (the machine is shared and noisy) over equal time slices:

* ``apply``      -- RedisMeans.apply: one pipeline per batch, one atomic script
                    call per distinct hashtag (exactly-once watermarks).
* ``script/upd`` -- the same script, one call (and round trip) per update:
                    what batching + pipelining buys.
* ``HINCRBYFLOAT`` -- the naive layout: one HINCRBYFLOAT per dimension (768
                    fields of decimal text) + HINCRBY count, pipelined per
                    update (one round trip per update); no exactly-once at all.

    python bench/bench_redis.py                         # prints a markdown section
    python bench/bench_redis.py --out /tmp/redis_bench.md
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import redis

from workers.adapters.redis_means import Contribution, RedisMeans

REPO = Path(__file__).resolve().parents[1]


def workload(n_tweets: int, n_tags: int, dim: int, partitions: int, seed: int = 0) -> list[Contribution]:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, n_tags + 1) ** 1.1
    weights /= weights.sum()
    mu = rng.normal(size=dim) * 0.5
    vectors = (mu + rng.normal(scale=0.3, size=(n_tweets, dim))).astype(np.float32)
    out = []
    for i in range(n_tweets):
        tags = [f"tag{t}" for t in rng.choice(n_tags, int(rng.integers(1, 4)), p=weights)]
        out.append(Contribution("tweets", i % partitions, i // partitions, tags, vectors[i]))
    return out


def n_updates(batch: Sequence[Contribution]) -> int:
    return sum(len(set(c.hashtags)) for c in batch)


class Method:
    """Processes the workload's batches in order, resuming where the last slice stopped."""

    def __init__(self, name: str, client: redis.Redis, batches: list[list[Contribution]]) -> None:
        self.name = name
        self.client = client
        self.batches = batches
        self.next = 0
        self.updates = 0
        self.seconds = 0.0
        self.rates: list[float] = []
        self.prefix = f"bench-reval-{uuid.uuid4().hex[:10]}"
        self.store = RedisMeans(client, prefix=self.prefix)

    def process(self, batch: list[Contribution]) -> None:
        raise NotImplementedError

    def run_slice(self, seconds: float) -> None:
        start = time.perf_counter()
        done = 0
        while time.perf_counter() - start < seconds:
            batch = self.batches[self.next % len(self.batches)]
            if self.next and self.next % len(self.batches) == 0:
                self.store.clear()  # wrapped around: start over, as a fresh feed
                self.cleanup_extra()
            self.next += 1
            self.process(batch)
            done += n_updates(batch)
        elapsed = time.perf_counter() - start
        self.updates += done
        self.seconds += elapsed
        self.rates.append(done / elapsed)

    def cleanup_extra(self) -> None:
        pass

    def close(self) -> None:
        self.store.clear()
        self.cleanup_extra()


class Apply(Method):
    def process(self, batch: list[Contribution]) -> None:
        self.store.apply(batch)


class ScriptPerUpdate(Method):
    def process(self, batch: list[Contribution]) -> None:
        for c in batch:
            for tag in dict.fromkeys(c.hashtags):
                single = Contribution(c.topic, c.partition, c.offset, [tag], c.vector)
                self.store._execute(self.store._plan([single]), changed=False)


class HincrbyfloatPerDim(Method):
    def process(self, batch: list[Contribution]) -> None:
        for c in batch:
            values = [repr(float(x)) for x in c.vector]
            for tag in dict.fromkeys(c.hashtags):
                key = f"{self.prefix}:naive:{{{tag}}}"
                pipe = self.client.pipeline(transaction=False)
                for i, x in enumerate(values):
                    pipe.hincrbyfloat(key, str(i), x)  # type: ignore[arg-type]
                pipe.hincrby(key, "n", 1)
                pipe.execute()

    def cleanup_extra(self) -> None:
        keys = list(self.client.scan_iter(match=f"{self.prefix}:naive:*", count=1000))
        for start in range(0, len(keys), 500):
            self.client.unlink(*keys[start : start + 500])


def server_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def memory_stats(store: RedisMeans, hashtags: list[str]) -> tuple[list[int], dict[int, list[int]]]:
    """MEMORY USAGE of every stored hashtag, and grouped by how many partitions fed it."""
    usages: list[int] = []
    by_partitions: dict[int, list[int]] = {}
    for tag in hashtags:
        usage = store.memory_usage(tag)
        if usage is None:
            continue
        usages.append(usage)
        by_partitions.setdefault(len(store.watermarks(tag)), []).append(usage)
    return usages, by_partitions


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--tweets", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hashtags", type=int, default=5_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--slice", type=float, default=2.0, help="seconds per timed slice")
    parser.add_argument("--rounds", type=int, default=2, help="ABC CBA rounds")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    client = redis.Redis.from_url(args.url)
    server = client.info("server")
    mem_info = client.info("memory")
    tweets = workload(args.tweets, args.hashtags, args.dim, args.partitions)
    batches = [tweets[i : i + args.batch] for i in range(0, len(tweets), args.batch)]
    total_updates = sum(n_updates(b) for b in batches)

    # 1. End-to-end: the whole feed through apply(), timed, with the plan/execute split and
    #    Redis' own CPU; then a full redelivery of the same feed (all skipped), as after a crash.
    main_store = RedisMeans(client, prefix=f"bench-reval-{uuid.uuid4().hex[:10]}")
    plan_s = exec_s = 0.0
    cpu0 = server_cpu(client)
    for batch in batches:
        t0 = time.perf_counter()
        plan = main_store._plan(batch)
        t1 = time.perf_counter()
        main_store._execute(plan)
        t2 = time.perf_counter()
        plan_s += t1 - t0
        exec_s += t2 - t1
    cpu_s = server_cpu(client) - cpu0
    calls = sum(len(main_store._plan(b).calls) for b in batches[:50]) / min(50, len(batches))
    t0 = time.perf_counter()
    skipped = sum(main_store.apply(b).skipped for b in batches)
    redeliver_s = time.perf_counter() - t0
    assert skipped == total_updates, (skipped, total_updates)
    hashtags = sorted(set(main_store.hashtags()))
    usages, by_partitions = memory_stats(main_store, hashtags)
    main_store.clear()

    # 2. Ratios against the baselines, alternating ABC CBA over equal time slices.
    methods: list[Method] = [
        Apply("apply (pipelined batch)", client, batches),
        ScriptPerUpdate("script call per update", client, batches),
        HincrbyfloatPerDim("HINCRBYFLOAT per dimension", client, batches),
    ]
    order: list[Method] = []
    for _ in range(args.rounds):
        order += methods + methods[::-1]
    for m in order:
        m.run_slice(args.slice)
    naive_key = f"{methods[2].prefix}:naive:{{tag0}}"
    naive_bytes = client.memory_usage(naive_key, samples=0)
    for m in methods:
        m.close()

    apply_rate = statistics.median(methods[0].rates)
    rows = []
    for m in methods:
        rate = statistics.median(m.rates)
        rows.append(
            f"| {m.name} | {rate:,.0f} | {min(m.rates):,.0f}–{max(m.rates):,.0f} "
            f"| {m.updates:,} | {apply_rate / rate:,.1f}× |"
        )
    mem_rows = [
        f"| {p} | {len(v):,} | {statistics.median(v):,.0f} | {max(v):,} |"
        for p, v in sorted(by_partitions.items())
    ]
    command = "python " + shlex.join(["bench/bench_redis.py", *(argv or sys.argv[1:])])
    e2e_rate = total_updates / (plan_s + exec_s)
    report = "\n".join(
        [
            "## Redis running-mean store (`workers/redis_store.py`)",
            "",
            f"Command: `{command}`",
            "",
            f"Redis {server['redis_version']} ({mem_info.get('mem_allocator')}) at {args.url}, "
            f"same machine; Python {platform.python_version()}, redis-py {redis.__version__}, "
            f"{os.cpu_count()} CPU cores shared by client and server (and other work). "
            f"Workload: {args.tweets:,} tweets of {args.dim}-d float32, batches of {args.batch}, "
            f"{args.partitions} partitions, 1–3 hashtags per tweet Zipf(1.1) over "
            f"{args.hashtags:,} → {total_updates:,} updates, {calls:.0f} script calls "
            "(distinct hashtags) per batch on average.",
            "",
            "### Whole feed through `apply` (one worker)",
            "",
            "| measure | value |",
            "|---|---|",
            f"| updates/s, end to end | **{e2e_rate:,.0f}** (target ≥ 5,000) |",
            f"| tweets/s, end to end | {args.tweets / (plan_s + exec_s):,.0f} |",
            f"| client-side plan (validate, group, suffix sums) | {plan_s / len(batches) * 1e3:.2f}"
            f" ms/batch ({plan_s / (plan_s + exec_s):.0%}) |",
            f"| pipeline round trip (scripts run) | {exec_s / len(batches) * 1e3:.2f} ms/batch |",
            f"| Redis server CPU | {cpu_s / total_updates * 1e6:.1f} µs/update "
            f"(≈ {total_updates / cpu_s:,.0f} updates/s per Redis core) |",
            f"| redelivery of the whole feed (all skipped as duplicates) | "
            f"{total_updates / redeliver_s:,.0f} updates/s |",
            "",
            "### Against baselines (same run, alternating ABC CBA slices of "
            f"{args.slice:g} s, {args.rounds} rounds)",
            "",
            "| method | median updates/s | range | updates timed | apply is … faster |",
            "|---|---|---|---|---|",
            *rows,
            "",
            "### Bytes per hashtag (`MEMORY USAGE key SAMPLES 0`, target ≤ 3.5 KB = 3,584 B)",
            "",
            "| partitions feeding the hashtag | hashtags | median bytes | max bytes |",
            "|---|---|---|---|",
            *mem_rows,
            "",
            f"All {len(usages):,} hashtags: median {statistics.median(usages):,.0f} B, "
            f"max {max(usages):,} B.  The naive HINCRBYFLOAT layout: "
            f"{naive_bytes:,} B for one hashtag.",
            "",
        ]
    )
    print(report)
    if args.out:
        args.out.write_text(report)
    return report


if __name__ == "__main__":
    main()
