"""Benchmark the score worker end to end: recommendation events/s from Kafka in to scores
delivered on the scores topic, against the scorer step alone on the same kind of events.

Why: one score worker should keep up with a busy recommender (target: >= 5,000
events/s end to end, <= 200 µs of CPU per event).  The step alone (parse, dedup claim in
Redis, score the (k, r) grid, build and JSON-encode the result, the metrics) shows what
Kafka and the produce/commit path add around it.

Workload: an Annoy thesaurus of ``--vocab`` hashtags (768-d, clustered, as in
``bench/bench_scoring.py``) published as the index job does (directory store and
Redis, where the worker loads it); events with ground truth (no join), 10
recommended hashtags, the worker's default grid (9 k x 3 r) with every signal on (chance
correction, rank-aware score, slices).  A local broker of ``--engine`` (Apache Kafka, one
KRaft node, by default; or Tansu: ``workers.dev.broker.local_broker``) and the Redis at
127.0.0.1:6379, on this machine.

Workers, each with its own topics, consumer groups and Redis prefix, all running throughout:

* ``after, at_least_once`` -- this tree's worker;
* ``after, exactly_once`` -- the same with ``REVAL_PROCESSING_GUARANTEE=exactly_once`` (Kafka
  only: a transaction per input partition and batch);
* ``before, at_least_once`` -- with ``--baseline TREE``: the worker of another source tree
  (``PYTHONPATH=TREE``, e.g. ``git archive`` of the commit before a change), same venv.

Modes, each round on new events, in rotating order (the machine is shared and noisy: compare
within a run):

* ``live``: the events are produced (kafka-python, in this process) while the worker
  consumes them -- the producer's CPU competes with the worker here;
* ``backlog``: the worker is paused (SIGSTOP) while the events are produced, then resumed:
  the time from SIGCONT is the worker catching up on a backlog, with only the broker and
  Redis beside it;
* ``step``: ``Scorer.admit_events`` + ``apply_events`` (with the Redis dedup claims), the
  runtime's JSON encoding of each output and the metrics callbacks, in batches of the
  consumer's size, in this process (this tree's code) -- no Kafka.

A worker round ends when its ``reval_events_total{outcome="scored"}`` (counted once the
score is delivered: acknowledged, or its transaction committed) reaches the round's events,
polled at 10 Hz with ``/metrics?name[]=reval_events_total`` (the worker renders that counter
only, so the polling costs it next to nothing).  CPU seconds of the worker, the broker (every
node's JVM), the Redis server and this process over each round (``/proc``, all threads) say
where the machine's time went.

    python -m bench.bench_score_worker                  # prints a markdown section
    python -m bench.bench_score_worker --engine tansu --events 20000 --out /tmp/score_worker.md
    git archive 35a0dd4 | tar -x -C /tmp/before
    python -m bench.bench_score_worker --baseline /tmp/before --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import redis

from bench.bench_scoring import as_records, clustered_vectors, make_events
from bench.results import bench_command
from stream.monitoring.cusum import Detector
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus
from workers.adapters.prometheus.exporter import Exporter
from workers.adapters.redis.redis_client import clear_prefix
from workers.adapters.redis.redis_detector import RedisDetectors
from workers.dev.broker import ENGINES, local_broker
from workers.dev.kafka_cluster import KafkaCluster
from workers.dev.stack import Stack, Worker, wait_for
from workers.service.runtime import value_bytes
from workers.service.score import Scorer, collect_less_often
from workers.settings import Settings

REDIS_URL = "redis://127.0.0.1:6379/0"


class FixedIncarnations:
    """The step alone reads no broker: every topic is its first incarnation."""

    def current(self, topic: str) -> str:
        return "bench"


def to_kafka(events: list[Any]) -> list[tuple[bytes, bytes]]:
    """Recommendation events as the records a recommender would produce (key: tweet id)."""
    return [
        (
            ev.tweet_id.encode(),
            json.dumps(
                {
                    "tweet_id": ev.tweet_id,
                    "recommender": ev.recommender,
                    "recommended": list(ev.recommended),
                    "ground_truth": list(ev.ground_truth or ()),
                }
            ).encode(),
        )
        for ev in events
    ]


def scored(port: int) -> float:
    """The worker's scored events, from its /metrics restricted to that one counter."""
    url = f"http://127.0.0.1:{port}/metrics?name[]=reval_events_total"
    with urllib.request.urlopen(url, timeout=5) as response:
        body = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith("reval_events_total{") and 'outcome="scored"' in line
    )


def time_scoring(stack: Stack, workers: list[Worker], events: list[Any]) -> float:
    """Seconds from sending ``events`` to the recommendations topic until the live ones of
    ``workers`` (a list the caller may grow and shrink) have scored as many more."""

    def total() -> float:
        return sum(scored(w.port) for w in workers if w.proc.poll() is None)

    target = total() + len(events)
    t0 = time.perf_counter()
    stack.send("recommendations", to_kafka(events))
    wait_for("every event scored", lambda: total() >= target, 900, 0.25)
    return time.perf_counter() - t0


def detectors_caught_up(
    client: redis.Redis,
    prefixes: list[str],
    events: int,
    *,
    required: Collection[str] = (),
    timeout: float = 600,
    grace: float = 10.0,
) -> float:
    """Wait until the change detector of the bench's recommender (its state in Redis under
    each of ``prefixes``) has taken ``events`` events and calibrated (if they complete its
    reference); seconds waited.  Under a prefix in ``required`` (this tree's workers) the state
    must appear; under another, no state after ``grace`` seconds is a tree without the detector.
    (No state is also what a detector shows while its first update runs: a first batch that
    completes the reference calibrates before anything is written.)

    Why: a recommender's detector calibrates once in its lifetime, when its first reference
    events are in -- a simulation of seconds of CPU in the worker's detector thread (its state
    then lives in Redis for every worker after).  Timed rounds that overlap it would charge a
    one-time cost to the events of the moment; the warm-up waits it out, as a running
    deployment has, and what is timed is the steady state (the detector's work per batch
    included)."""
    keys = [(RedisDetectors(client, p, Detector).key("bench"), p in required) for p in prefixes]
    t0 = time.perf_counter()

    def caught_up(key: str, needed: bool) -> bool:
        raw = client.hget(key, "s")
        if raw is None:
            return not needed and time.perf_counter() - t0 > grace
        state = json.loads(raw)  # calibrated, unless too few events came to need it yet
        calibrated = state["p0"] is not None or state["events"] < state["reference"]
        return calibrated and state["events"] >= events

    def done() -> bool:
        return all(caught_up(key, needed) for key, needed in keys)

    wait_for("the change detector calibrated and caught up", done, timeout, 0.5)
    return time.perf_counter() - t0


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process, all its threads (0 when there is none)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Variant:
    """One worker under test: its code (``tree``: None for this one) and its guarantee."""

    name: str
    guarantee: str
    tree: Path | None = None
    stack: Stack | None = None
    worker: Any = None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", choices=ENGINES, default="kafka")
    p.add_argument("--vocab", type=int, default=5000)
    p.add_argument("--events", type=int, default=10000, help="events per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each mode")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--baseline", type=Path, help="another source tree's worker to compare with")
    p.add_argument("--no-eos", action="store_true", help="leave out the exactly-once worker")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    command = bench_command("bench_score_worker")
    load_before = os.getloadavg()
    collect_less_often()  # the step runs as in the worker, with its collector thresholds
    rng = np.random.default_rng(args.seed)
    names = [f"tag{i}" for i in range(args.vocab)]
    vectors, labels = clustered_vectors(args.vocab, 768, 100, rng)
    variants = [Variant("after", "at_least_once")]
    if args.engine == "kafka" and not args.no_eos:
        variants.append(Variant("after", "exactly_once"))
    if args.baseline is not None:
        variants.insert(0, Variant("before", "at_least_once", args.baseline.resolve()))
    modes: list[tuple[Variant | None, str]] = [(v, m) for v in variants for m in ("live", "backlog")]
    modes.append((None, "step"))
    label = {id(v): f"{v.name}, {v.guarantee}" for v in variants}
    n_rounds = 1 + len(variants) + len(modes) * args.rounds  # warm-ups (each worker, step), then timed
    rounds_events = [  # distinct ids per round: the event dedup claims never collide
        [
            replace(ev, tweet_id=f"r{i}-{j}")
            for j, ev in enumerate(make_events(names, labels, args.events, rng))
        ]
        for i in range(n_rounds)
    ]
    thesaurus = AnnoyThesaurus.build(names, vectors, n_trees=50, model_id="bench")

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        broker = local_broker(args.engine, log_path=work / "broker.log")
        broker.start()
        try:
            client = redis.Redis.from_url(REDIS_URL)
            redis_pid = int(client.info("server")["process_id"])
            brokers = broker_pids(broker)
            for i, v in enumerate(variants):
                env = {"REVAL_PROCESSING_GUARANTEE": v.guarantee}
                if v.tree is not None:
                    env["PYTHONPATH"] = str(v.tree)
                v.stack = Stack(
                    broker.bootstrap,
                    REDIS_URL,
                    work / "no-model",
                    work / f"stack{i}",
                    partitions=args.partitions,
                    extra_env=env,
                )
                # As the index job publishes: the directory store and Redis (where scorers load it).
                v.stack.publish(thesaurus)
                v.worker = v.stack.start("score")
            for v in variants:
                assert v.stack is not None
                v.stack.wait_ready(v.worker)

            # The step reads the same version from a directory store; its dedup claims go
            # under a prefix of its own.
            first = variants[-1].stack
            assert first is not None
            settings = Settings(
                index_dir=first.index_dir,
                thesaurus_source="dir",
                redis_url=REDIS_URL,
                redis_prefix=f"bench-{uuid.uuid4().hex[:8]}",
            )
            scorer = Scorer(settings, Exporter(), client, FixedIncarnations())  # type: ignore[arg-type]
            size = max(settings.embed_batch_size, settings.score_batch_size)

            def wait_scored(v: Variant, target: float) -> None:
                wait_for("every event scored", lambda: scored(v.worker.port) >= target, 600, 0.1)

            def run_live(v: Variant, events: list[Any]) -> float:
                assert v.stack is not None
                target = scored(v.worker.port) + len(events)
                payload = to_kafka(events)
                t0 = time.perf_counter()
                v.stack.send("recommendations", payload)
                wait_scored(v, target)
                return time.perf_counter() - t0

            def run_backlog(v: Variant, events: list[Any]) -> float:
                assert v.stack is not None
                target = scored(v.worker.port) + len(events)
                payload = to_kafka(events)
                v.worker.proc.send_signal(signal.SIGSTOP)
                try:
                    v.stack.send("recommendations", payload)
                finally:
                    v.worker.proc.send_signal(signal.SIGCONT)
                t0 = time.perf_counter()
                wait_scored(v, target)
                return time.perf_counter() - t0

            def run_step(events: list[Any]) -> float:
                records = as_records(events)
                t0 = time.perf_counter()
                for i in range(0, len(records), size):  # the consumer's batch
                    items, _ = scorer.admit_events(records[i : i + size])
                    outcome = scorer.apply_events(items)
                    for out in outcome.outputs:  # as the runtime encodes an output
                        value_bytes(out.value)
                    for after in outcome.after:
                        after()
                return time.perf_counter() - t0

            def run(variant: Variant | None, mode: str, events: list[Any]) -> float:
                if variant is None:
                    return run_step(events)
                return (run_live if mode == "live" else run_backlog)(variant, events)

            used = iter(rounds_events)
            for v in variants:  # warm-up: thesaurus loaded, caches warm, groups joined
                run_live(v, next(used))
            run_step(next(used))
            # ... and each change detector calibrated (once per recommender)
            prefixes = [settings.redis_prefix, *(v.stack.prefix for v in variants if v.stack)]
            mine = [settings.redis_prefix, *(v.stack.prefix for v in variants if v.stack and v.tree is None)]
            detectors_caught_up(client, prefixes, args.events, required=mine)
            keys = [(label[id(v)] if v is not None else "after", m) for v, m in modes]
            took: dict[tuple[str, str], list[float]] = {k: [] for k in keys}
            cpu: dict[tuple[str, str], dict[str, float]] = {
                k: dict.fromkeys(["worker", "broker", "redis", "bench"], 0.0) for k in keys
            }
            for r in range(args.rounds):
                order = modes[r % len(modes) :] + modes[: r % len(modes)]
                for chosen, mode in order if r % 2 == 0 else order[::-1]:
                    key = (label[id(chosen)] if chosen is not None else "after", mode)
                    events = next(used)
                    pids = {
                        "worker": [chosen.worker.proc.pid] if chosen is not None else [],
                        "broker": brokers,
                        "redis": [redis_pid],
                    }
                    before = {name: sum(map(cpu_seconds, ps)) for name, ps in pids.items()}
                    bench_before = time.process_time()
                    took[key].append(run(chosen, mode, events))
                    for name, ps in pids.items():
                        cpu[key][name] += sum(map(cpu_seconds, ps)) - before[name]
                    cpu[key]["bench"] += time.process_time() - bench_before
            rss = {label[id(v)]: _rss_mib(v.worker.proc.pid) for v in variants}
            for v in variants:
                assert v.stack is not None
                v.stack.close()
            clear_prefix(REDIS_URL, settings.redis_prefix)  # the step's dedup claims: no keys left behind
            client.close()
        finally:
            broker.stop()
    load_after = os.getloadavg()
    print(report(args, command, keys, took, cpu, rss, load_before, load_after))


def broker_pids(broker: Any) -> list[int]:
    """Every process of the broker: each Kafka node's JVM, or Tansu's one process."""
    if isinstance(broker, KafkaCluster):
        return [pid for pid in (broker.pid(i) for i in broker.node_ids) if pid is not None]
    return [broker.pid] if broker.pid is not None else []


def report(
    args: argparse.Namespace,
    command: str,
    keys: list[tuple[str, str]],
    took: dict[tuple[str, str], list[float]],
    cpu: dict[tuple[str, str], dict[str, float]],
    rss: dict[str, float],
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> str:
    n = args.events
    rate = {k: n * len(t) / sum(t) for k, t in took.items()}
    per_event = {k: {name: v / (n * args.rounds) * 1e6 for name, v in c.items()} for k, c in cpu.items()}
    worker_cpu = {k: per_event[k]["worker" if k[1] != "step" else "bench"] for k in keys}
    engine = "Apache Kafka (1 KRaft node)" if args.engine == "kafka" else "Tansu"
    lines = [
        f"## Score worker end to end ({engine}: Kafka in -> scores delivered)",
        "",
        f"Command: `{command}`. Thesaurus: Annoy, {args.vocab} hashtags x 768-d, 50 trees, loaded "
        f"by the worker from Redis; {n} events per round with ground truth, 10 recommended, "
        f"default grid, every signal on; {args.partitions} partitions; {engine} and Redis on this "
        f"machine; {args.rounds} rounds of each mode, rotating order.",
        f"Load average (1 min) before / after: {load_before[0]:.1f} / {load_after[0]:.1f} on "
        f"{os.cpu_count()} CPUs.",
        "",
        "| worker | mode | events/s (all rounds) | per round | CPU µs per event: worker "
        "| broker | Redis | this process |",
        "|---|---|---:|---|---:|---:|---:|---:|",
        *(
            f"| {k[0]} | {k[1]} | {rate[k]:,.0f} | "
            + ", ".join(f"{n / t:,.0f}" for t in took[k])
            + f" | {per_event[k]['worker']:.0f} | {per_event[k]['broker']:.0f} "
            f"| {per_event[k]['redis']:.0f} | {per_event[k]['bench']:.0f} |"
            for k in keys
        ),
        "",
        "Worker resident memory at the end: "
        + ", ".join(f"{name} {mib:,.0f} MiB" for name, mib in rss.items())
        + ".",
    ]
    after = ("after, at_least_once", "backlog")
    eos = ("after, exactly_once", "backlog")
    before = ("before, at_least_once", "backlog")
    if before in rate:
        lines.append(
            f"After / before (backlog): {rate[after] / rate[before]:.2f}x the events/s, "
            f"{worker_cpu[before] / worker_cpu[after]:.2f}x less worker CPU per event "
            f"({worker_cpu[before]:.0f} -> {worker_cpu[after]:.0f} µs)."
        )
    if eos in rate:
        lines.append(
            f"Exactly once / at least once (backlog): {rate[eos] / rate[after]:.2f}x the events/s, "
            f"{worker_cpu[eos] / worker_cpu[after]:.2f}x the worker CPU per event, "
            f"{per_event[eos]['broker'] / max(per_event[after]['broker'], 1e-9):.2f}x the broker's."
        )
    step = ("after", "step")
    lines.append(
        f"The worker's CPU per event is {worker_cpu[after] / worker_cpu[step]:.2f}x the step's "
        f"({worker_cpu[after]:.0f} vs {worker_cpu[step]:.0f} µs, backlog)."
    )
    text = "\n".join(lines)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return text


if __name__ == "__main__":
    main()
