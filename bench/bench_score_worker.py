"""Benchmark the score worker end to end: recommendation events/s from Kafka in to scores
acknowledged on the scores topic, against the scorer step alone on the same events.

Why: one score worker should keep up with a busy recommender (target: >= 5,000
events/s end to end).  The step alone (parse, dedup claim in Redis, score the
(k, r) grid, build the result) shows what Kafka, Faust and the produce/ack path
add around it.

Workload: an Annoy thesaurus of ``--vocab`` hashtags (768-d, clustered, as in
``bench/bench_scoring.py``) published into the worker's index directory; events
with ground truth (no join), 10 recommended hashtags, 9 k x 4 r (the worker's
defaults).  A local Tansu broker (``workers.dev.broker.LocalBroker``) and the
Redis at 127.0.0.1:6379, on this machine.  Rounds alternate worker / step alone
(the machine is shared and noisy: compare the ratio within a run).  A round of the
worker runs from the first produce until its ``reval_events_total{outcome="scored"}``
(counted once the score is acknowledged by the broker) reaches the round's events.

    python -m bench.bench_score_worker                  # prints a markdown section
    python -m bench.bench_score_worker --events 20000 --out /tmp/score_worker.md
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

import numpy as np
import redis

from bench.bench_scoring import as_records, clustered_vectors, make_events
from workers.adapters.exporter import Exporter
from workers.adapters.redis_client import clear_prefix
from workers.adapters.store import AnnoyThesaurus
from workers.dev.broker import LocalBroker
from workers.dev.stack import Stack, wait_for
from workers.service.score import Scorer
from workers.settings import Settings

REDIS_URL = "redis://127.0.0.1:6379/0"


class FixedIncarnations:
    """The step alone reads no broker: every topic is its first incarnation."""

    def current(self, topic: str) -> str:
        return "bench"


def scored(worker: object) -> float:
    metrics = worker.metrics()  # type: ignore[attr-defined]
    return sum(
        v
        for (name, labels), v in metrics.items()
        if name == "reval_events_total" and ("outcome", "scored") in labels
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, default=5000)
    p.add_argument("--events", type=int, default=10000, help="events per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    command = "python " + " ".join(shlex.quote(x) for x in [sys.argv[0], *sys.argv[1:]])
    load_before = os.getloadavg()
    rng = np.random.default_rng(args.seed)
    names = [f"tag{i}" for i in range(args.vocab)]
    vectors, labels = clustered_vectors(args.vocab, 768, 100, rng)
    rounds_events = [  # distinct ids per round: the event dedup claims never collide
        [
            replace(ev, tweet_id=f"r{i}-{j}")
            for j, ev in enumerate(make_events(names, labels, args.events, rng))
        ]
        for i in range(2 * args.rounds + 1)
    ]

    with tempfile.TemporaryDirectory() as tmp, LocalBroker(log_path=Path(tmp) / "tansu.log") as broker:
        work = Path(tmp)
        stack = Stack(broker.bootstrap, REDIS_URL, work / "no-model", work, partitions=args.partitions)
        # As the index job publishes: the directory store and Redis (where scorers load it).
        stack.publish(AnnoyThesaurus.build(names, vectors, n_trees=50, model_id="bench"))
        worker = stack.start("score")
        stack.wait_ready(worker)

        settings = Settings(
            index_dir=stack.index_dir, redis_url=REDIS_URL, redis_prefix=f"bench-{uuid.uuid4().hex[:8]}"
        )
        client = redis.Redis.from_url(REDIS_URL)
        scorer = Scorer(settings, Exporter(), client, FixedIncarnations())  # type: ignore[arg-type]

        def to_kafka(events: list) -> list[tuple[bytes, bytes]]:
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

        def run_worker(events: list) -> float:
            target = scored(worker) + len(events)
            payload = to_kafka(events)
            t0 = time.perf_counter()
            stack.send("recommendations", payload)
            # polled at 4 Hz: a /metrics page costs the worker CPU (Prometheus scrapes every 15 s)
            wait_for("every event scored", lambda: scored(worker) >= target, 600, 0.25)
            return time.perf_counter() - t0

        def run_step(events: list) -> float:
            records = as_records(events)
            t0 = time.perf_counter()
            for i in range(0, len(records), 256):  # the score agent's batch
                items, _ = scorer.admit_events(records[i : i + 256])
                outcome = scorer.apply_events(items)
                for out in outcome.outputs:
                    json.dumps(out.value).encode()
                for after in outcome.after:
                    after()
            return time.perf_counter() - t0

        run_worker(rounds_events[0])  # warm-up: thesaurus loaded, caches warm, groups joined
        took: dict[str, list[float]] = {"worker": [], "step": []}
        for r in range(args.rounds):
            order = ("worker", "step") if r % 2 == 0 else ("step", "worker")
            for j, mode in enumerate(order):
                events = rounds_events[1 + 2 * r + j]
                took[mode].append((run_worker if mode == "worker" else run_step)(events))
        stack.close()
        clear_prefix(REDIS_URL, settings.redis_prefix)  # the step's dedup claims: leave no keys behind
        client.close()
    load_after = os.getloadavg()
    rate = {m: args.events * len(t) / sum(t) for m, t in took.items()}
    best = {m: args.events / min(t) for m, t in took.items()}
    text = "\n".join(
        [
            "## Score worker end to end (reval worker score: Kafka in -> scores acknowledged)",
            "",
            f"Command: `{command}`. Thesaurus: Annoy, {args.vocab} hashtags x 768-d, 50 trees; "
            f"{args.events} events per round with ground truth, 10 recommended, default grid; "
            f"{args.partitions} partitions; Tansu broker and Redis on this machine; "
            f"{args.rounds} rounds, worker and step alone alternating.",
            f"Load average (1 min) before / after: {load_before[0]:.1f} / {load_after[0]:.1f} on "
            f"{os.cpu_count()} CPUs.",
            "",
            "| mode | events/s (all rounds) | best round | median round |",
            "|---|---:|---:|---:|",
            *(
                f"| {m} | {rate[m]:,.0f} | {best[m]:,.0f} | {args.events / statistics.median(took[m]):,.0f} |"
                for m in took
            ),
            "",
            f"The worker runs at {rate['worker'] / rate['step']:.2f}x the step alone.",
        ]
    )
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
