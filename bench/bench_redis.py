"""Benchmark the running-mean store: Redis server CPU per embedded tweet, updates/s, bytes per hashtag.

Why: one Redis core serves every embed worker, so its CPU per (tweet, hashtag)
update bounds the whole embed tier (issue 12 §3: a GPU worker embeds tens of
thousands of tweets/s).  Round 1's script decoded, added and re-encoded the
768-d sum in Lua on every call (~100 µs of server CPU per update); the store
now HSETs each record's float32 vector into a per-hashtag log keyed by its Kafka
coordinates, and the clients fold the log.  A hashtag's folded state must stay <= 3.5 KB so millions fit.

Workload: 768-d float32 BERT-like vectors; batches of 64 tweets from 4 Kafka
partitions; each tweet has 1-3 hashtags drawn Zipf-like (p ~ 1/rank^1.1) from
5,000.  An "update" is one (tweet, distinct hashtag) pair added to a running
mean.  Methods, measured in the same run against the same Redis, alternating
in ABCD DCBA order (the machine is shared and noisy) over equal time slices,
each slice's Redis server CPU (``INFO cpu``) taken around it:

* ``apply``      -- RedisMeans.apply: per batch, the folded watermarks, then one
                    HSET per distinct hashtag of its records into its log (no
                    script); the writer folds a log of ``fold_after`` records.
                    As the embed workers' default settings configure it: with
                    the event-time windows.
* ``apply, windows off`` -- the same without the windows (what they cost).
* ``round-1 script`` -- the same plan through round 1's read-modify-write
                    script (kept in this file as the baseline).
* ``HINCRBYFLOAT`` -- the naive layout: one HINCRBYFLOAT per dimension (768
                    fields of decimal text) + HINCRBY count, pipelined per
                    update (one round trip per update); no exactly-once at all.

    python -m bench.bench_redis                         # prints a markdown section
    python -m bench.bench_redis --out /tmp/redis_bench.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import redis

from bench.results import bench_command, publish, spread
from stream.intake.records import Coordinates
from workers.adapters.redis.redis_means import Contribution, RedisMeans
from workers.service.stores import means_of
from workers.settings import Settings

REPO = Path(__file__).resolve().parents[1]

ROUND1_LUA = """
-- Round 1's script, kept here as the baseline: a read-modify-write of the whole sum in Lua.
-- Add one batch's contributions to ONE hashtag's running mean, exactly once.
-- KEYS[1]: the hashtag's hash.  ARGV: dim, head, ngroups, then per partition group:
--   id ("topic:partition"), k, offsets o_1 < ... < o_k, then k float64 LE suffix sums
--   d_j = v_j + ... + v_k.  Applies the items with offset > the stored watermark.
-- The sum is int32 mantissas q_i with a shared exponent e: sum_i = q_i * 2^-e.
local dim = tonumber(ARGV[1])
local head = tonumber(ARGV[2])
local ngroups = tonumber(ARGV[3])
local ntail = dim - head
local cur = redis.call('HMGET', KEYS[1], 's', 'm')
local s, m = cur[1], cur[2]
local count, e = 0, 0
local marks, names = {}, {}
if m then
  local d, pos
  count, d, e, pos = struct.unpack('<dI4i4', m)
  if d ~= dim or #s ~= 4 * head then
    return redis.error_reply('REVALDIM ' .. KEYS[1] .. ' holds ' .. d ..
      '-d sums, got ' .. dim .. '-d vectors')
  end
  pos = pos + 4 * ntail
  local name, off
  while pos <= #m do
    name, off, pos = struct.unpack('<sd', m, pos)
    marks[name] = off
    names[#names + 1] = name
  end
end
-- Per partition: the suffix sum of the items above the watermark, which moves to o_k.
local picked = {}
local applied, skipped = 0, 0
local i = 4
for g = 1, ngroups do
  local name = ARGV[i]
  local k = tonumber(ARGV[i + 1])
  local mark = marks[name]
  local first = 1
  if mark then
    while first <= k and tonumber(ARGV[i + 1 + first]) <= mark do first = first + 1 end
  end
  if first <= k then
    picked[#picked + 1] = ARGV[i + 1 + k + first]
    if not mark then names[#names + 1] = name end
    marks[name] = tonumber(ARGV[i + 1 + k])
    applied = applied + k - first + 1
  end
  skipped = skipped + first - 1
  i = i + 2 + 2 * k
end
if applied == 0 then return {0, skipped} end
local dfmt = '<' .. string.rep('d', dim)
local sum = {struct.unpack(dfmt, picked[1])}
for p = 2, #picked do
  local d = {struct.unpack(dfmt, picked[p])}
  for j = 1, dim do sum[j] = sum[j] + d[j] end
end
local hfmt = '<' .. string.rep('i4', head)
local tfmt = '<' .. string.rep('i4', ntail)
local mx = 0
if m then
  local q = {struct.unpack(hfmt, s)}
  if ntail > 0 then
    local t = {struct.unpack(tfmt, m, 17)}
    for j = 1, ntail do q[head + j] = t[j] end
  end
  local inv = math.ldexp(1, -e)  -- q * 2^-e, exactly
  for j = 1, dim do
    local x = q[j] * inv + sum[j]
    sum[j] = x
    if x < 0 then x = -x end
    if x > mx then mx = x end
  end
else
  for j = 1, dim do
    local x = sum[j]
    if x < 0 then x = -x end
    if x > mx then mx = x end
  end
end
-- New shared exponent: the largest |component| scaled into [2^30, 2^31) (capped so that
-- 2^e stays a normal double).  Adding and subtracting 1.5 * 2^52 rounds to an integer,
-- half to even.
local RNE = 6755399441055744
e = 0
if mx > 0 then
  local _, x = math.frexp(mx)
  e = math.min(31 - x, 1000)
  if (math.ldexp(mx, e) + RNE) - RNE >= 2147483648 then e = e - 1 end
end
local sc = math.ldexp(1, e)
for j = 1, dim do sum[j] = (sum[j] * sc + RNE) - RNE end
count = count + applied
local parts = {struct.pack('<dI4i4', count, dim, e)}
if ntail > 0 then parts[2] = struct.pack(tfmt, unpack(sum, head + 1, dim)) end
for _, name in ipairs(names) do parts[#parts + 1] = struct.pack('<sd', name, marks[name]) end
redis.call('HSET', KEYS[1], 's', struct.pack(hfmt, unpack(sum, 1, head)), 'm', table.concat(parts))
return {applied, skipped}
"""


def workload(n_tweets: int, n_tags: int, dim: int, partitions: int, seed: int = 0) -> list[Contribution]:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, n_tags + 1) ** 1.1
    weights /= weights.sum()
    mu = rng.normal(size=dim) * 0.5
    vectors = (mu + rng.normal(scale=0.3, size=(n_tweets, dim))).astype(np.float32)
    out = []
    for i in range(n_tweets):
        tags = [f"tag{t}" for t in rng.choice(n_tags, int(rng.integers(1, 4)), p=weights)]
        # one tweet every 10 s of event time: 20,000 tweets span ~9 of the default 6-h windows
        out.append(
            Contribution(
                Coordinates("tweets", i % partitions, i // partitions), tags, vectors[i], time=10.0 * i
            )
        )
    return out


def n_updates(batch: Sequence[Contribution]) -> int:
    return sum(len(set(c.hashtags)) for c in batch)


def store_like_the_workers(client: redis.Redis, prefix: str) -> RedisMeans:
    """The store as the embed workers' default settings configure it (windows included)."""
    return means_of(client, Settings(redis_prefix=prefix))


def round1_calls(store: RedisMeans, batch: list[Contribution]) -> list[tuple[str, list[object]]]:
    """Round 1's plan of a batch: per hashtag, its key and the script's arguments (per
    partition: the offsets and the float64 suffix sums ``d_j = v_j + ... + v_k``)."""
    dim = len(batch[0].vector)
    groups: dict[str, dict[str, dict[int, np.ndarray]]] = {}
    for c in batch:
        for tag in dict.fromkeys(c.hashtags):
            items = groups.setdefault(tag, {}).setdefault(
                f"{c.coordinates.topic}:{c.coordinates.partition}", {}
            )
            items.setdefault(int(c.coordinates.offset), np.asarray(c.vector, dtype=np.float64))
    calls = []
    for tag, partitions in groups.items():
        args: list[object] = [dim, min(dim, 766), len(partitions)]
        for pid, items in partitions.items():
            offsets = sorted(items)
            sums = np.cumsum(np.stack([items[o] for o in offsets])[::-1], axis=0)[::-1].astype("<f8")
            args += [pid, len(offsets), *offsets, *(row.tobytes() for row in sums)]
        calls.append((store.key(tag), args))
    return calls


def run_round1(client: redis.Redis, sha: str, store: RedisMeans, batch: list[Contribution]) -> None:
    pipe = client.pipeline(transaction=False)
    for key, args in round1_calls(store, batch):
        pipe.execute_command("EVALSHA", sha, 1, key, *args)
    pipe.execute()


class Method:
    """Processes the workload's batches in order, resuming where the last slice stopped."""

    def __init__(self, name: str, client: redis.Redis, batches: list[list[Contribution]]) -> None:
        self.name = name
        self.client = client
        self.batches = batches
        self.next = 0
        self.updates = 0
        self.tweets = 0
        self.seconds = 0.0
        self.server_seconds = 0.0
        self.rates: list[float] = []
        self.prefix = f"bench-reval-{uuid.uuid4().hex[:10]}"
        self.store = store_like_the_workers(client, self.prefix)

    def process(self, batch: list[Contribution]) -> None:
        raise NotImplementedError

    def run_slice(self, seconds: float) -> None:
        start = time.perf_counter()
        cpu0 = server_cpu(self.client)
        done = tweets = 0
        while time.perf_counter() - start < seconds:
            batch = self.batches[self.next % len(self.batches)]
            if self.next and self.next % len(self.batches) == 0:
                self.store.clear()  # wrapped around: start over, as a fresh feed
                self.cleanup_extra()
            self.next += 1
            self.process(batch)
            done += n_updates(batch)
            tweets += len(batch)
        elapsed = time.perf_counter() - start
        self.server_seconds += server_cpu(self.client) - cpu0
        self.updates += done
        self.tweets += tweets
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


class ApplyNoWindows(Method):
    """``apply`` with the event-time windows off (``REVAL_MEANS_WINDOW_S=0``): their cost."""

    def __init__(self, name: str, client: redis.Redis, batches: list[list[Contribution]]) -> None:
        super().__init__(name, client, batches)
        self.store = RedisMeans(client, prefix=self.prefix)

    def process(self, batch: list[Contribution]) -> None:
        self.store.apply(batch)


class Round1Script(Method):
    """The same plan (one call per hashtag per batch, pipelined) through round 1's script."""

    def __init__(self, name: str, client: redis.Redis, batches: list[list[Contribution]]) -> None:
        super().__init__(name, client, batches)
        self.sha = client.script_load(ROUND1_LUA)

    def process(self, batch: list[Contribution]) -> None:
        run_round1(self.client, self.sha, self.store, batch)


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


def script_usec(client: redis.Redis) -> float:
    """Microseconds Redis spent inside EVALSHA so far (``INFO commandstats``)."""
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return float(stats.get("usec", 0))


def memory_stats(store: RedisMeans, hashtags: list[str]) -> tuple[list[int], dict[int, list[int]], list[int]]:
    """MEMORY USAGE of every stored hashtag's all-time state, grouped by how many partitions
    fed it, and of all its keys (windows too)."""
    usages: list[int] = []
    by_partitions: dict[int, list[int]] = {}
    totals: list[int] = []
    for tag in hashtags:
        usage = store.client.memory_usage(store.key(tag), samples=0)
        if usage is None:
            continue
        usages.append(int(usage))
        by_partitions.setdefault(len(store.watermarks(tag)), []).append(int(usage))
        totals.append(store.memory_usage(tag) or 0)
    return usages, by_partitions, totals


def feed_through(
    client: redis.Redis, store: RedisMeans, batches: list[list[Contribution]], round1_sha: str | None
) -> dict[str, float]:
    """The whole feed once, timed, with Redis' own CPU and script time around it.

    ``round1_sha``: run the batches through round 1's script instead of ``apply`` (no folds).
    Ends as the index job would: one read of every hashtag (folding the logs, for apply).
    """
    plan_s = exec_s = 0.0
    cpu0, usec0 = server_cpu(client), script_usec(client)
    folded = 0
    for batch in batches:
        t0 = time.perf_counter()
        if round1_sha is None:
            plan = store._plan(batch)
            t1 = time.perf_counter()
            folded += store._execute(plan).folded
        else:
            t1 = t0
            run_round1(client, round1_sha, store, batch)
        t2 = time.perf_counter()
        plan_s += t1 - t0
        exec_s += t2 - t1
    write_cpu = server_cpu(client) - cpu0
    write_usec = script_usec(client) - usec0
    t0 = time.perf_counter()
    cpu1 = server_cpu(client)
    store.read_all(fold=round1_sha is None)
    return {
        "plan_s": plan_s,
        "exec_s": exec_s,
        "write_cpu": write_cpu,
        "script_usec": write_usec,
        "read_cpu": server_cpu(client) - cpu1,
        "read_s": time.perf_counter() - t0,
        "folded": folded,
    }


def workload_parser(
    doc: str | None, *, tweets: int, batch: int, rounds: int, order: str
) -> argparse.ArgumentParser:
    """The options of a Redis write-path bench (this one's and bench_redis_barrier's): the
    Redis, the workload (:func:`workload`, :func:`batched`), the timed slices and rounds."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--tweets", type=int, default=tweets)
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--hashtags", type=int, default=5_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--slice", type=float, default=2.0, help="seconds per timed slice")
    parser.add_argument("--rounds", type=int, default=rounds, help=f"{order} rounds")
    parser.add_argument("--out", type=Path)
    return parser


def batched(args: argparse.Namespace) -> list[list[Contribution]]:
    """The workload the options of :func:`workload_parser` ask for, in batches."""
    tweets = workload(args.tweets, args.hashtags, args.dim, args.partitions)
    return [tweets[i : i + args.batch] for i in range(0, len(tweets), args.batch)]


def main(argv: list[str] | None = None) -> str:
    args = workload_parser(__doc__, tweets=20_000, batch=64, rounds=2, order="ABCD DCBA").parse_args(argv)
    client = redis.Redis.from_url(args.url)
    server = client.info("server")
    mem_info = client.info("memory")
    batches = batched(args)
    total_updates = sum(n_updates(b) for b in batches)

    # 1. The whole feed through each write path, Redis' own CPU around it; for apply, then a
    #    full redelivery of the same feed (all skipped), as after a crash, and the memory.
    rmw_store = RedisMeans(client, prefix=f"bench-reval-{uuid.uuid4().hex[:10]}")
    round1 = feed_through(client, rmw_store, batches, client.script_load(ROUND1_LUA))
    rmw_store.clear()
    main_store = store_like_the_workers(client, f"bench-reval-{uuid.uuid4().hex[:10]}")
    hashtags_before = sorted(set(main_store.hashtags()))
    now = feed_through(client, main_store, batches, None)
    calls = sum(len(main_store._plan(b).calls) for b in batches[:50]) / min(50, len(batches))
    t0 = time.perf_counter()
    skipped = sum(main_store.apply(b).skipped for b in batches)
    redeliver_s = time.perf_counter() - t0
    assert skipped == total_updates and not hashtags_before, (skipped, total_updates)
    hashtags = sorted(set(main_store.hashtags()))
    usages, by_partitions, totals = memory_stats(main_store, hashtags)
    main_store.clear()

    # 2. Ratios against the baselines, alternating ABCD DCBA over equal time slices.
    methods: list[Method] = [
        Apply("apply (HSET to the log, fold on the worker)", client, batches),
        ApplyNoWindows("apply, windows off", client, batches),
        Round1Script("round-1 script (sum in Lua)", client, batches),
        HincrbyfloatPerDim("HINCRBYFLOAT per dimension", client, batches),
    ]
    order: list[Method] = []
    for _ in range(args.rounds):
        order += methods + methods[::-1]
    for m in order:
        m.run_slice(args.slice)
    naive_key = f"{methods[-1].prefix}:naive:{{tag0}}"
    naive_bytes = client.memory_usage(naive_key, samples=0)
    for m in methods:
        m.close()

    apply_rate = statistics.median(methods[0].rates)
    apply_cpu = methods[0].server_seconds / methods[0].updates
    rows = []
    for m in methods:
        rate = statistics.median(m.rates)
        cpu = m.server_seconds / m.updates
        rows.append(
            f"| {m.name} | {rate:,.0f} | {spread(m.rates)} "
            f"| {m.updates:,} | {apply_rate / rate:,.1f}× | {cpu * 1e6:,.1f} "
            f"| {m.server_seconds / m.tweets * 1e6:,.1f} | {cpu / apply_cpu:,.1f}× |"
        )
    mem_rows = [
        f"| {p} | {len(v):,} | {statistics.median(v):,.0f} | {max(v):,} |"
        for p, v in sorted(by_partitions.items())
    ]

    def per(x: float, n: int) -> str:
        return f"{x / n * 1e6:,.1f}"

    command = bench_command("bench_redis", argv)
    e2e = now["plan_s"] + now["exec_s"]
    with_read = (round1["write_cpu"] + round1["read_cpu"]) / (now["write_cpu"] + now["read_cpu"])
    report = "\n".join(
        [
            "## Redis running-mean store (`workers/adapters/redis/redis_means.py`)",
            "",
            f"Command: `{command.strip()}`",
            "",
            f"Redis {server['redis_version']} ({mem_info.get('mem_allocator')}) at {args.url}, "
            f"same machine; Python {platform.python_version()}, redis-py {redis.__version__}, "
            f"{os.cpu_count()} CPU cores shared by client and server (and other work). "
            f"Workload: {args.tweets:,} tweets of {args.dim}-d float32, batches of {args.batch}, "
            f"{args.partitions} partitions, 1–3 hashtags per tweet Zipf(1.1) over "
            f"{args.hashtags:,} → {total_updates:,} updates, {calls:.0f} hashtags "
            "(HSETs, or round-1 script calls) per batch on average.",
            "",
            "### Redis server CPU, whole feed (one worker; ends with the index job's read of every hashtag)",
            "",
            "| write path | server CPU µs / tweet | µs / update | of which in scripts µs / update "
            "| index read µs / hashtag | folds by the worker |",
            "|---|---|---|---|---|---|",
            f"| apply (log + fold) | **{per(now['write_cpu'], args.tweets)}** | "
            f"{per(now['write_cpu'], total_updates)} | {now['script_usec'] / total_updates:,.1f} | "
            f"{per(now['read_cpu'], len(hashtags))} (folds) | {now['folded']:,.0f} |",
            f"| round-1 script | {per(round1['write_cpu'], args.tweets)} | "
            f"{per(round1['write_cpu'], total_updates)} | {round1['script_usec'] / total_updates:,.1f} | "
            f"{per(round1['read_cpu'], len(hashtags))} | — |",
            "",
            f"Server CPU per tweet, round 1 / now: **{round1['write_cpu'] / now['write_cpu']:,.1f}×** "
            f"(writes only; {with_read:,.1f}× with the index read).",
            "",
            "### Whole feed through `apply` (one worker)",
            "",
            "| measure | value |",
            "|---|---|",
            f"| updates/s, end to end | **{total_updates / e2e:,.0f}** (target ≥ 5,000) |",
            f"| tweets/s, end to end | {args.tweets / e2e:,.0f} |",
            f"| client-side plan (validate, group, encode) | {now['plan_s'] / len(batches) * 1e3:.2f}"
            f" ms/batch ({now['plan_s'] / e2e:.0%}) |",
            f"| round trips (watermarks, HSETs, folds) | {now['exec_s'] / len(batches) * 1e3:.2f} ms/batch |",
            f"| index job's read of all {len(hashtags):,} hashtags, folding | {now['read_s']:.2f} s |",
            f"| redelivery of the whole feed (all skipped as duplicates) | "
            f"{total_updates / redeliver_s:,.0f} updates/s |",
            "",
            "### Against baselines (same run, alternating ABCD DCBA slices of "
            f"{args.slice:g} s, {args.rounds} rounds; server CPU from `INFO cpu` around each slice)",
            "",
            "| method | median updates/s | range | updates timed | apply is … faster "
            "| server CPU µs / update | µs / tweet | … more server CPU than apply |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            "### Bytes per hashtag after the index job's folding read "
            "(`MEMORY USAGE key SAMPLES 0` of the all-time state; target ≤ 3.5 KB = 3,584 B)",
            "",
            "| partitions feeding the hashtag | hashtags | median bytes | max bytes |",
            "|---|---|---|---|",
            *mem_rows,
            "",
            f"All {len(usages):,} hashtags: median {statistics.median(usages):,.0f} B, "
            f"max {max(usages):,} B.  With their event-time window means (the default "
            f"{main_store.window_s or 0:,.0f}-s windows, the newest {main_store.window_keep} kept): "
            f"median {statistics.median(totals):,.0f} B, max {max(totals):,} B.  The naive "
            f"HINCRBYFLOAT layout: {naive_bytes:,} B for one hashtag.  Between index rebuilds a "
            f"hashtag written since the last one also holds its log: {args.dim * 4:,} B of "
            f"float32 per record plus the field, fewer than `fold_after` ({main_store.fold_after}) "
            "records plus one batch's.",
            "",
        ]
    )
    publish(report, args.out)
    return report


if __name__ == "__main__":
    main()
