"""Benchmark what the failover guarantee costs on the Redis write path.

An embed worker's Redis work per batch -- the retweet claims, the running means
(``RedisMeans.apply``) and the drift sample, three calls -- timed three ways, in the same
run against the same servers, alternating ABC CBA over equal time slices (the machine is
shared and noisy):

* ``before``     -- no :class:`~workers.adapters.redis.redis_client.Replication`: what the write
                    path cost before the failover work (acknowledged on the master's word);
* ``check``      -- the rollback check alone (``REVAL_REDIS_REPLICAS=0``, the default on a
                    single Redis): after each call, one ``INCR`` + ``PEXPIRE`` of this
                    process' marker on every master, one pipelined round trip per master;
* ``barrier``    -- the check plus ``WAIT 1`` on the same connection (the default on a
                    Redis Cluster): each call returns once every master's replica has it.

Targets: a local Redis Cluster of 3 masters + 3 replicas (``LocalRedisCluster``, started
here), and the single Redis at ``--url`` (``before`` and ``check`` only: it has no
replica).  Server CPU is ``INFO cpu`` summed over every node (masters and replicas) around
each slice.

Workload: 768-d float32 BERT-like vectors, batches of 32 tweets (the embed default) from 4
Kafka partitions, 1-3 hashtags per tweet drawn Zipf(1.1) from 5,000, one claim key per
(tweet, hashtag), a 10% drift sample.

    python -m bench.bench_redis_barrier                  # prints a markdown section
    python -m bench.bench_redis_barrier --out /tmp/barrier.md
"""

from __future__ import annotations

import os
import platform
import statistics
import time
import uuid
from collections.abc import Callable

import redis
from redis.cluster import RedisCluster

from bench.bench_redis import batched, server_cpu, workload_parser
from bench.results import bench_command, publish, spread
from workers.adapters.redis.redis_client import Client, Replication, clear_prefix, connect
from workers.adapters.redis.redis_means import Contribution, RedisMeans
from workers.adapters.redis.redis_state import RedisSamples, RedisSeen
from workers.dev.redis_cluster import LocalRedisCluster


class Method:
    """One way of writing: the three calls of an embed batch, resuming where the last slice
    stopped; a wrap-around starts over on a fresh prefix (a fresh feed)."""

    def __init__(
        self, name: str, client: Client, replicas: int | None, batches: list[list[Contribution]], url: str
    ) -> None:
        self.name, self.client, self.replicas, self.batches, self.url = name, client, replicas, batches, url
        self.cluster = isinstance(client, RedisCluster)
        self.next = 0
        self.tweets = 0
        self.seconds = 0.0
        self.server_seconds = 0.0
        self.rates: list[float] = []
        self.batch_ms: list[float] = []
        self.prefixes: list[str] = []
        self._fresh()

    def _fresh(self) -> None:
        prefix = f"bench-barrier-{uuid.uuid4().hex[:10]}"
        self.prefixes.append(prefix)
        replication = (
            None if self.replicas is None else Replication(self.client, self.replicas, prefix=prefix)
        )
        self.means = RedisMeans(self.client, prefix=prefix, replication=replication)
        self.seen = RedisSeen(self.client, prefix, replication=replication)
        self.samples = RedisSamples(self.client, prefix, rate=0.1, replication=replication)

    def process(self, batch: list[Contribution]) -> None:
        # as the embed role: a retweet claim per (tweet, hashtag), the tweet's id as claimant
        claims = [
            ([f"{c.coordinates}:{tag}" for tag in c.hashtags], c.coordinates.event_id("t")) for c in batch
        ]
        self.seen.claim_many(claims)
        self.means.apply(batch)
        self.samples.add([(c.coordinates.event_id("t"), c.time or 0.0, c.vector) for c in batch])

    def run_slice(self, seconds: float, cpu_now: Callable[[], float]) -> None:
        start = time.perf_counter()
        cpu0 = cpu_now()
        tweets = batches = 0
        while time.perf_counter() - start < seconds:
            if self.next and self.next % len(self.batches) == 0:
                self._fresh()
            batch = self.batches[self.next % len(self.batches)]
            self.next += 1
            self.process(batch)
            tweets += len(batch)
            batches += 1
        elapsed = time.perf_counter() - start
        self.server_seconds += cpu_now() - cpu0
        self.tweets += tweets
        self.seconds += elapsed
        self.rates.append(tweets / elapsed)
        self.batch_ms.append(elapsed / batches * 1e3)

    def close(self) -> None:
        for prefix in self.prefixes:
            clear_prefix(self.url, prefix, cluster=self.cluster)


def cpu_of(ports_or_url: list[int] | str) -> Callable[[], float]:
    """Redis server CPU seconds (user + sys), summed over the nodes."""
    clients = (
        [redis.Redis.from_url(ports_or_url)]
        if isinstance(ports_or_url, str)
        else [redis.Redis(port=p) for p in ports_or_url]
    )

    return lambda: sum(server_cpu(client) for client in clients)


def measure(
    target: str, methods: list[Method], cpu_now: Callable[[], float], slice_s: float, rounds: int
) -> list[str]:
    order: list[Method] = []
    for _ in range(rounds):
        order += methods + methods[::-1]
    for m in order:
        m.run_slice(slice_s, cpu_now)
    base = methods[0]
    base_ms = statistics.median(base.batch_ms)
    base_cpu = base.server_seconds / base.tweets
    rows = []
    for m in methods:
        ms = statistics.median(m.batch_ms)
        cpu = m.server_seconds / m.tweets
        rows.append(
            f"| {target} | {m.name} | {statistics.median(m.rates):,.0f} | "
            f"{spread(m.rates)} | {ms:.2f} | {ms - base_ms:+.2f} | "
            f"{ms / base_ms:.2f}× | {cpu * 1e6:,.1f} | {cpu / base_cpu:.2f}× |"
        )
        m.close()
    return rows


def barrier_alone(client: Client, replicas: int, n: int, target: str, name: str) -> str:
    """One call's barrier in isolation: a write, then :meth:`Replication.wait` timed alone
    (median and 90th percentile over ``n`` calls) -- the time a batch adds per barriered call,
    without the noise of the whole write path."""
    prefix = f"bench-barrier-{uuid.uuid4().hex[:10]}"
    replication = Replication(client, replicas, prefix=prefix)
    times = []
    for i in range(n):
        client.set(f"{prefix}:k{i % 50}", i)
        start = time.perf_counter()
        replication.wait()
        times.append((time.perf_counter() - start) * 1e3)
    clear_prefix_of(client, prefix)
    times.sort()
    masters = max(1, len(replication.masters()))
    return (
        f"| {target} | {name} | {masters} | {statistics.median(times):.3f} | "
        f"{times[int(0.9 * len(times))]:.3f} | {3 * statistics.median(times):.2f} |"
    )


def clear_prefix_of(client: Client, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{prefix}:*"))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.unlink(key)
    pipe.execute()


def main(argv: list[str] | None = None) -> str:
    parser = workload_parser(__doc__, tweets=4_000, batch=32, rounds=4, order="ABC CBA")
    parser.add_argument("--calls", type=int, default=500, help="barrier calls timed alone")
    args = parser.parse_args(argv)
    batches = batched(args)
    rows, alone = [], []
    with LocalRedisCluster() as local:
        client = connect(local.url, cluster=True)
        alone.append(barrier_alone(client, 0, args.calls, "cluster 3+3", "check only"))
        alone.append(barrier_alone(client, 1, args.calls, "cluster 3+3", "barrier: WAIT 1"))
        version = redis.Redis(port=local.nodes[0].port).info("server")["redis_version"]
        methods = [
            Method("before: no barrier, no check", client, None, batches, local.url),
            Method("check only (REVAL_REDIS_REPLICAS=0)", client, 0, batches, local.url),
            Method("barrier: WAIT 1 (cluster default)", client, 1, batches, local.url),
        ]
        rows += measure(
            "cluster 3+3", methods, cpu_of([n.port for n in local.nodes]), args.slice, args.rounds
        )
        client.close()
    single = connect(args.url)
    alone.append(barrier_alone(single, 0, args.calls, "single Redis", "check only"))
    single_version = redis.Redis.from_url(args.url).info("server")["redis_version"]
    methods = [
        Method("before: no check", single, None, batches, args.url),
        Method("check only (single-Redis default)", single, 0, batches, args.url),
    ]
    rows += measure("single Redis", methods, cpu_of(args.url), args.slice, args.rounds)
    single.close()

    command = bench_command("bench_redis_barrier", argv)
    report = "\n".join(
        [
            "## What the failover guarantee costs on the write path (`bench/bench_redis_barrier.py`)",
            "",
            f"Command: `{command.strip()}`",
            "",
            f"A local Redis Cluster (Redis {version}, 3 masters + 3 replicas, `LocalRedisCluster`) and "
            f"the single Redis {single_version} at {args.url}, same machine; Python "
            f"{platform.python_version()}, redis-py {redis.__version__}, {os.cpu_count()} CPU cores "
            f"shared by client, servers and other work.  Per batch of {args.batch} tweets "
            f"({args.dim}-d, {args.partitions} partitions, 1–3 hashtags of {args.hashtags:,}): the "
            "embed worker's three Redis calls (claims, running means, drift sample).  Alternating "
            f"ABC CBA slices of {args.slice:g} s, {args.rounds} rounds; server CPU from `INFO cpu` "
            "of every node around each slice.",
            "",
            "| target | write path | median tweets/s | range | ms / batch | added ms / batch "
            "| × time | server CPU µs / tweet (all nodes) | × server CPU |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"The barrier alone (a write, then `Replication.wait()` timed by itself, {args.calls} "
            "calls; an embed batch makes three barriered calls):",
            "",
            "| target | barrier | masters | median ms / call | p90 ms / call | ms / embed batch (3 calls) |",
            "|---|---|---|---|---|---|",
            *alone,
            "",
        ]
    )
    publish(report, args.out)
    return report


if __name__ == "__main__":
    main()
