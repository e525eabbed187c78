"""Benchmark how the score role scales out: events/s end to end with 1 and 2 worker processes.

Why: each role scales by adding worker processes to its consumer group, up to one per
partition of its input topic (deploy/README.md, "Scaling out").  This measures it: the
same events through one score worker and through two (separate processes, one consumer
group, ``--partitions`` partitions), rounds alternating 1, 2, 2, 1 (the machine is shared
and noisy: compare within a run).  A round runs from the first produce until the workers'
``reval_events_total{outcome="scored"}`` (counted once the score is acknowledged by the
broker) add up to the round's events.  Thesaurus, events and broker as in
``bench/bench_score_worker.py``.

On a machine with fewer cores than processes (broker, Redis, the workers, this script),
the workers compete for CPU: the ratio then says what the core count allows, not what
the design allows.

    python -m bench.bench_scale                        # prints a markdown section
    python -m bench.bench_scale --events 20000 --out /tmp/scale.md
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.bench_score_worker import REDIS_URL, time_scoring
from bench.bench_scoring import clustered_vectors, make_events
from bench.results import bench_command, publish
from stream.intake.records import Recommendation
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus
from workers.adapters.redis.redis_client import clear_prefix
from workers.dev.stack import Stack, Worker
from workers.dev.tansu import TansuBroker


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, default=5000)
    p.add_argument("--events", type=int, default=10000, help="events per round")
    p.add_argument("--rounds", type=int, default=2, help="1-2-2-1 rounds")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    command = bench_command("bench_scale")
    load_before = os.getloadavg()
    rng = np.random.default_rng(args.seed)
    names = [f"tag{i}" for i in range(args.vocab)]
    vectors, labels = clustered_vectors(args.vocab, 768, 100, rng)
    plan = [n for _ in range(args.rounds) for n in (1, 2, 2, 1)]
    batches = [make_events(names, labels, args.events, rng) for _ in range(len(plan) + 1)]
    for i, events in enumerate(batches):  # distinct tweet ids: no event is a duplicate of another
        batches[i] = [
            Recommendation(f"{i}-{e.tweet_id}", e.recommended, e.ground_truth, e.recommender) for e in events
        ]

    took: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp, TansuBroker(log_path=Path(tmp) / "tansu.log") as broker:
        stack = Stack(
            broker.bootstrap, REDIS_URL, Path(tmp) / "no-model", Path(tmp), partitions=args.partitions
        )
        stack.publish(AnnoyThesaurus.build(names, vectors, n_trees=50, model_id="bench"))
        workers: list[Worker] = [stack.start("score"), stack.start("score")]
        stack.wait_ready(*workers)
        second = workers[1]

        run = functools.partial(time_scoring, stack, workers)

        run(batches[0])  # warm-up: both workers joined, thesaurus loaded
        running = 2
        for n, events in zip(plan, batches[1:], strict=True):
            if n != running:
                if n == 1:
                    second.stop()  # the group rebalances onto the first worker
                    workers.remove(second)
                else:
                    second = stack.start("score")
                    stack.wait_ready(second)
                    workers.append(second)
                running = n
                run(make_probe(stack, n))  # settle the rebalance before timing
            took[n].append(run(events))
        stack.close()
        clear_prefix(REDIS_URL, stack.prefix)
    load_after = os.getloadavg()
    rate = {n: args.events / statistics.median(t) for n, t in took.items()}
    text = "\n".join(
        [
            "## Score role scale-out: 1 vs 2 worker processes",
            "",
            f"Command: `{command.strip()}`. {args.partitions} partitions; {args.events} events per round "
            f"with ground truth; thesaurus of {args.vocab} hashtags x 768-d; Tansu broker and Redis "
            f"on this machine; rounds 1-2-2-1 x {args.rounds}. Load average (1 min) before / after: "
            f"{load_before[0]:.1f} / {load_after[0]:.1f} on {os.cpu_count()} CPUs.",
            "",
            "| score workers | events/s (median round) | rounds |",
            "|---|---:|---|",
            *(
                f"| {n} | {rate[n]:,.0f} | {', '.join(f'{args.events / t:,.0f}' for t in took[n])} |"
                for n in (1, 2)
            ),
            "",
            f"Two workers run at {rate[2] / rate[1]:.2f}x one.",
        ]
    )
    publish(text + "\n", args.out)


def make_probe(stack: Stack, n: int) -> list[Recommendation]:
    """A few events (fresh ids) to wait through a rebalance before a timed round."""
    stamp = time.time_ns()
    return [
        Recommendation(f"probe-{n}-{stamp}-{i}", ("a",), ("a",), "probe") for i in range(4 * stack.partitions)
    ]


if __name__ == "__main__":
    main()
