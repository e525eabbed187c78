"""Benchmark the score worker end to end: recommendation events/s from Kafka in to scores
acknowledged on the scores topic, against the scorer step alone on the same kind of events.

Why: one score worker should keep up with a busy recommender (target: >= 5,000
events/s end to end).  The step alone (parse, dedup claim in Redis, score the
(k, r) grid, build and JSON-encode the result, the metrics) shows what Kafka, Faust
and the produce/ack path add around it.

Workload: an Annoy thesaurus of ``--vocab`` hashtags (768-d, clustered, as in
``bench/bench_scoring.py``) published as the index job does (directory store and
Redis, where the worker loads it); events with ground truth (no join), 10
recommended hashtags, the worker's default grid (9 k x 3 r).  A local Tansu broker
(``workers.dev.broker.TansuBroker``) and the Redis at 127.0.0.1:6379, on this
machine.  Three modes, each round on new events, in rotating order (the machine is
shared and noisy: compare within a run):

* ``worker, live``: the events are produced (kafka-python, in this process) while
  the worker consumes them -- the producer's CPU competes with the worker here;
* ``worker, backlog``: the worker is paused (SIGSTOP) while the events are produced,
  then resumed: the time from SIGCONT is the worker catching up on a backlog, with
  only the broker and Redis beside it;
* ``step``: ``Scorer.admit_events`` + ``apply_events`` (with the Redis dedup claims),
  the runtime's JSON encoding of each output and the metrics callbacks, in batches
  of the agent's size, in this process -- no Kafka.

A worker round ends when its ``reval_events_total{outcome="scored"}`` (counted once the
score is acknowledged by the broker) reaches the round's events, polled at 10 Hz with
``/metrics?name[]=reval_events_total`` (the worker renders that counter only, so the
polling costs it next to nothing; a whole /metrics page per poll would not).  CPU
seconds of the worker, the broker, the Redis server and this process over each
round (``/proc``, all threads) say where the machine's time went.

    python -m bench.bench_score_worker                  # prints a markdown section
    python -m bench.bench_score_worker --events 20000 --out /tmp/score_worker.md
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import redis

from bench.bench_scoring import as_records, clustered_vectors, make_events
from workers.adapters.annoy_thesaurus import AnnoyThesaurus
from workers.adapters.exporter import Exporter
from workers.adapters.redis_client import clear_prefix
from workers.dev.stack import Stack, wait_for
from workers.dev.tansu import TansuBroker
from workers.service.runtime import encode_json
from workers.service.score import SCORE_BATCH, Scorer, collect_less_often
from workers.settings import Settings

REDIS_URL = "redis://127.0.0.1:6379/0"
MODES = ("worker, live", "worker, backlog", "step")


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, default=5000)
    p.add_argument("--events", type=int, default=10000, help="events per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each mode")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    command = "python -m bench.bench_score_worker " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    load_before = os.getloadavg()
    collect_less_often()  # the step runs as in the worker, with its collector thresholds
    rng = np.random.default_rng(args.seed)
    names = [f"tag{i}" for i in range(args.vocab)]
    vectors, labels = clustered_vectors(args.vocab, 768, 100, rng)
    n_rounds = 2 + len(MODES) * args.rounds  # two warm-up rounds (worker, step), then the timed ones
    rounds_events = [  # distinct ids per round: the event dedup claims never collide
        [
            replace(ev, tweet_id=f"r{i}-{j}")
            for j, ev in enumerate(make_events(names, labels, args.events, rng))
        ]
        for i in range(n_rounds)
    ]

    with tempfile.TemporaryDirectory() as tmp, TansuBroker(log_path=Path(tmp) / "tansu.log") as broker:
        work = Path(tmp)
        stack = Stack(broker.bootstrap, REDIS_URL, work / "no-model", work, partitions=args.partitions)
        # As the index job publishes: the directory store and Redis (where scorers load it).
        stack.publish(AnnoyThesaurus.build(names, vectors, n_trees=50, model_id="bench"))
        worker = stack.start("score")
        stack.wait_ready(worker)
        client = redis.Redis.from_url(REDIS_URL)
        redis_pid = int(client.info("server")["process_id"])
        pids = {"worker": worker.proc.pid, "broker": broker.pid, "redis": redis_pid}

        # The step reads the same version from the directory store; its dedup claims go
        # under a prefix of its own.
        settings = Settings(
            index_dir=stack.index_dir,
            thesaurus_source="dir",
            redis_url=REDIS_URL,
            redis_prefix=f"bench-{uuid.uuid4().hex[:8]}",
        )
        scorer = Scorer(settings, Exporter(), client, FixedIncarnations())  # type: ignore[arg-type]

        def wait_scored(target: float) -> None:
            wait_for("every event scored", lambda: scored(worker.port) >= target, 600, 0.1)

        def run_live(events: list[Any]) -> float:
            target = scored(worker.port) + len(events)
            payload = to_kafka(events)
            t0 = time.perf_counter()
            stack.send("recommendations", payload)
            wait_scored(target)
            return time.perf_counter() - t0

        def run_backlog(events: list[Any]) -> float:
            target = scored(worker.port) + len(events)
            payload = to_kafka(events)
            worker.proc.send_signal(signal.SIGSTOP)
            try:
                stack.send("recommendations", payload)
            finally:
                worker.proc.send_signal(signal.SIGCONT)
            t0 = time.perf_counter()
            wait_scored(target)
            return time.perf_counter() - t0

        def run_step(events: list[Any]) -> float:
            records = as_records(events)
            t0 = time.perf_counter()
            for i in range(0, len(records), SCORE_BATCH):  # the score agent's batch
                items, _ = scorer.admit_events(records[i : i + SCORE_BATCH])
                outcome = scorer.apply_events(items)
                for out in outcome.outputs:  # as the runtime encodes an output
                    encode_json(out.value)
                for after in outcome.after:
                    after()
            return time.perf_counter() - t0

        run: dict[str, Callable[[list[Any]], float]] = {
            "worker, live": run_live,
            "worker, backlog": run_backlog,
            "step": run_step,
        }
        run_live(rounds_events[0])  # warm-up: thesaurus loaded, caches warm, groups joined
        run_step(rounds_events[1])
        took: dict[str, list[float]] = {m: [] for m in MODES}
        cpu: dict[str, dict[str, float]] = {m: dict.fromkeys([*pids, "bench"], 0.0) for m in MODES}
        for r in range(args.rounds):
            order = MODES[r % len(MODES) :] + MODES[: r % len(MODES)]
            for j, mode in enumerate(order if r % 2 == 0 else order[::-1]):
                events = rounds_events[2 + len(MODES) * r + j]
                before = {name: cpu_seconds(pid) for name, pid in pids.items()}
                bench_before = time.process_time()
                took[mode].append(run[mode](events))
                for name, pid in pids.items():
                    cpu[mode][name] += cpu_seconds(pid) - before[name]
                cpu[mode]["bench"] += time.process_time() - bench_before
        worker_rss = _rss_mib(worker.proc.pid)
        stack.close()
        clear_prefix(REDIS_URL, settings.redis_prefix)  # the step's dedup claims: leave no keys behind
        client.close()
    load_after = os.getloadavg()
    n = args.events
    rate = {m: n * len(t) / sum(t) for m, t in took.items()}
    median = {m: n / statistics.median(t) for m, t in took.items()}
    per_event = {m: {k: v / (n * args.rounds) * 1e6 for k, v in c.items()} for m, c in cpu.items()}
    step_cpu = per_event["step"]["bench"]
    text = "\n".join(
        [
            "## Score worker end to end (reval worker score: Kafka in -> scores acknowledged)",
            "",
            f"Command: `{command}`. Thesaurus: Annoy, {args.vocab} hashtags x 768-d, 50 trees, loaded "
            f"by the worker from Redis; {n} events per round with ground truth, 10 recommended, "
            f"default grid; {args.partitions} partitions; batches of {SCORE_BATCH}; Tansu broker and "
            f"Redis on this machine; {args.rounds} rounds of each mode, rotating order.",
            f"Load average (1 min) before / after: {load_before[0]:.1f} / {load_after[0]:.1f} on "
            f"{os.cpu_count()} CPUs.",
            "",
            "| mode | events/s (all rounds) | median round | per round | CPU µs per event: worker "
            "| broker | Redis | this process |",
            "|---|---:|---:|---|---:|---:|---:|---:|",
            *(
                f"| {m} | {rate[m]:,.0f} | {median[m]:,.0f} | "
                + ", ".join(f"{n / t:,.0f}" for t in took[m])
                + f" | {per_event[m]['worker']:.0f} | {per_event[m]['broker']:.0f} "
                f"| {per_event[m]['redis']:.0f} | {per_event[m]['bench']:.0f} |"
                for m in MODES
            ),
            "",
            f"The worker runs at {rate['worker, live'] / rate['step']:.2f}x the step alone (live), "
            f"{rate['worker, backlog'] / rate['step']:.2f}x (backlog); its CPU per event is "
            f"{per_event['worker, backlog']['worker'] / step_cpu:.2f}x the step's "
            f"({per_event['worker, backlog']['worker']:.0f} vs {step_cpu:.0f} µs, backlog). "
            f"Worker resident memory at the end: {worker_rss:,.0f} MiB.",
        ]
    )
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
