"""Benchmark the workers on the engines: Apache Kafka (1 and 3 nodes) beside Tansu, in one run.

Why: the guarantees are proven on Apache Kafka (issue 22), the demo runs on Tansu; a user
sizing a deployment needs the workers' rates and CPU on the engine production runs, and what
replication costs. Measured in one run, rounds rotating over the engines (ABC CBA ...; the
machine is shared and noisy: compare within a run):

* **score worker end to end**: ``reval worker score`` on each engine; events with ground truth
  (no join), produced while it consumes; time from the first produce until its
  ``reval_events_total{outcome="scored"}`` reaches the round's events;
* **embed worker end to end**: ``reval worker embed`` with the tiny BERTweet-architecture test
  model (so that the encoder does not hide what the engine costs); tweets every one of which is
  embedded (``bench.bench_encoder.embeddable_tweets``); time until
  ``reval_tweets_embedded_total`` reaches the round's tweets;
* **scale-out** (on one engine, ``--scale-engine``): 1, 2, 3 score workers in one consumer group
  on 6 partitions, rounds 1-2-3-3-2-1.

CPU seconds per event of the workers, every broker process (each Kafka node's JVM) and the Redis
server are read from /proc over each round. Three nodes replicate every topic three times
(``min.insync.replicas=2``, ``acks=all``): the broker's CPU per event says what that costs.

    python -m bench.bench_engines                                # prints a markdown section
    python -m bench.bench_engines --events 3000 --tweets 400 --rounds 2 --out /tmp/engines.md
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import redis

from bench.bench_encoder import embeddable_tweets
from bench.bench_score_worker import cpu_seconds, scored, time_scoring, to_kafka
from bench.bench_scoring import clustered_vectors, make_events
from bench.results import bench_command
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus
from workers.adapters.redis.redis_client import clear_prefix
from workers.dev.broker import LocalBroker, local_broker
from workers.dev.stack import Stack, Worker, wait_for
from workers.dev.tiny_models import build_tiny_bertweet

REDIS_URL = "redis://127.0.0.1:6379/0"
PARTITIONS = 6


@dataclass
class Engine:
    """One engine under test: its broker, a stack on it, and the workers measured there."""

    name: str
    broker: LocalBroker
    stack: Stack
    score: Worker
    embed: Worker
    took: dict[str, list[float]] = field(default_factory=lambda: {"score": [], "embed": []})
    cpu: dict[str, dict[str, float]] = field(
        default_factory=lambda: {
            kind: {"worker": 0.0, "broker": 0.0, "redis": 0.0} for kind in ("score", "embed")
        }
    )


def parse_engine(spec: str) -> tuple[str, int]:
    """``tansu``, ``kafka1``, ``kafka3`` -> (engine, nodes)."""
    if spec == "tansu":
        return "tansu", 1
    if spec in ("kafka1", "kafka3"):
        return "kafka", int(spec[-1])
    raise SystemExit(f"--engines: {spec!r} is not one of tansu, kafka1, kafka3")


def measured(pids: dict[str, list[int]], run: Callable[[], float]) -> tuple[float, dict[str, float]]:
    """Seconds ``run`` took, and the CPU seconds each group of processes spent meanwhile."""
    before = {name: sum(cpu_seconds(p) for p in group) for name, group in pids.items()}
    took = run()
    return took, {name: sum(cpu_seconds(p) for p in group) - before[name] for name, group in pids.items()}


def fresh(events: list[Any], tag: str) -> list[Any]:
    """The events with ids of their own (the dedup claims never see one twice)."""
    return [replace(ev, tweet_id=f"{tag}-{j}") for j, ev in enumerate(events)]


def embedded(worker: Worker) -> float:
    return worker.metric("reval_tweets_embedded_total")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engines", default="tansu,kafka1,kafka3")
    p.add_argument("--vocab", type=int, default=2000)
    p.add_argument("--events", type=int, default=4000, help="score events per round")
    p.add_argument("--tweets", type=int, default=500, help="tweets per embed round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--scale-engine", default="kafka1", help="engine of the scale-out section ('' skips it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    command = bench_command("bench_engines")
    specs = [s for s in args.engines.split(",") if s]
    load_before = os.getloadavg()
    rng = np.random.default_rng(args.seed)
    names = [f"tag{i}" for i in range(args.vocab)]
    vectors, labels = clustered_vectors(args.vocab, 768, 100, rng)
    thesaurus = AnnoyThesaurus.build(names, vectors, n_trees=20, model_id="bench")
    score_rounds = 1 + args.rounds * len(specs)
    events = [
        [
            replace(ev, tweet_id=f"r{i}-{j}")
            for j, ev in enumerate(make_events(names, labels, args.events, rng))
        ]
        for i in range(score_rounds * len(specs))
    ]
    tweets = embeddable_tweets((1 + args.rounds) * len(specs) * args.tweets)
    redis_pid = int(redis.Redis.from_url(REDIS_URL).info("server")["process_id"])

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = build_tiny_bertweet(work / "tiny-bertweet")
        engines: list[Engine] = []
        try:
            for spec in specs:
                engine, nodes = parse_engine(spec)
                broker = local_broker(engine, nodes=nodes).start()  # type: ignore[arg-type]
                stack = Stack(
                    broker.bootstrap, REDIS_URL, model, work / spec, partitions=PARTITIONS, replication=nodes
                )
                stack.publish(thesaurus)
                engines.append(Engine(spec, broker, stack, stack.start("score"), stack.start("embed")))
            for e in engines:
                e.stack.wait_ready(e.score, e.embed, timeout=300)
            used_events, used_tweets = iter(events), iter(range(0, len(tweets), args.tweets))

            def score_round(e: Engine) -> float:
                batch = next(used_events)
                target = scored(e.score.port) + len(batch)
                t0 = time.perf_counter()
                e.stack.send("recommendations", to_kafka(batch))
                wait_for("every event scored", lambda: scored(e.score.port) >= target, 900, 0.1)
                return time.perf_counter() - t0

            def embed_round(e: Engine) -> float:
                start = next(used_tweets)
                batch = tweets[start : start + args.tweets]
                target = embedded(e.embed) + len(batch)
                t0 = time.perf_counter()
                e.stack.send("tweets", [(key, value) for key, value, _ in batch])
                wait_for("every tweet embedded", lambda: embedded(e.embed) >= target, 900, 0.1)
                return time.perf_counter() - t0

            for e in engines:  # warm-up: groups joined, thesaurus and model loaded
                score_round(e)
                embed_round(e)
            for r in range(args.rounds):
                for e in engines if r % 2 == 0 else engines[::-1]:
                    for kind, run in (("score", score_round), ("embed", embed_round)):
                        worker = e.score if kind == "score" else e.embed
                        pids = {"worker": [worker.proc.pid], "broker": e.broker.pids, "redis": [redis_pid]}
                        took, cpu = measured(pids, functools.partial(run, e))
                        e.took[kind].append(took)
                        for name, seconds in cpu.items():
                            e.cpu[kind][name] += seconds
            scale = scale_out(args, work, model, thesaurus, redis_pid) if args.scale_engine else None
        finally:
            for e in engines:
                e.stack.close()
                clear_prefix(REDIS_URL, e.stack.prefix)
                e.broker.stop()
    load_after = os.getloadavg()
    print_report(args, command, engines, scale, load_before, load_after)


def scale_out(
    args: argparse.Namespace, work: Path, model: Path, thesaurus: AnnoyThesaurus, redis_pid: int
) -> dict[int, tuple[list[float], dict[str, float]]]:
    """1, 2, 3 score workers in one group on 6 partitions: events/s and CPU per event."""
    engine, nodes = parse_engine(args.scale_engine)
    rng = np.random.default_rng(args.seed + 1)
    names = [f"tag{i}" for i in range(args.vocab)]
    _, labels = clustered_vectors(args.vocab, 768, 100, rng)
    plan = [1, 2, 3, 3, 2, 1]
    out: dict[int, tuple[list[float], dict[str, float]]] = {n: ([], {}) for n in (1, 2, 3)}
    broker = local_broker(engine, nodes=nodes).start()  # type: ignore[arg-type]
    stack = Stack(
        broker.bootstrap, REDIS_URL, model, work / "scale", partitions=PARTITIONS, replication=nodes
    )
    try:
        stack.publish(thesaurus)
        workers = [stack.start("score")]
        stack.wait_ready(*workers, timeout=300)

        run = functools.partial(time_scoring, stack, workers)

        def events(n: int, tag: str) -> list[Any]:
            return fresh(make_events(names, labels, n, rng), tag)

        run(events(args.events, "warm"))
        for i, n in enumerate(plan):
            while len(workers) < n:
                workers.append(stack.start("score"))
                stack.wait_ready(workers[-1], timeout=300)
            while len(workers) > n:
                workers.pop().stop()
            run(events(8 * PARTITIONS, f"settle{i}"))  # wait through the rebalance before timing
            pids = {"workers": [w.proc.pid for w in workers], "broker": broker.pids, "redis": [redis_pid]}
            took, cpu = measured(pids, functools.partial(run, events(args.events, f"s{i}")))
            out[n][0].append(took)
            for name, seconds in cpu.items():
                out[n][1][name] = out[n][1].get(name, 0.0) + seconds
    finally:
        stack.close()
        clear_prefix(REDIS_URL, stack.prefix)
        broker.stop()
    return out


def print_report(
    args: argparse.Namespace,
    command: str,
    engines: list[Engine],
    scale: dict[int, tuple[list[float], dict[str, float]]] | None,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> None:
    size = {"score": args.events, "embed": args.tweets}
    unit = {"score": "events", "embed": "tweets"}
    lines = [
        "## The workers on the engines: Apache Kafka (1 and 3 nodes) beside Tansu",
        "",
        f"Command: `{command.strip()}`. {PARTITIONS} partitions (replication factor = nodes); score: "
        f"{args.events} events per round with ground truth, thesaurus of {args.vocab} hashtags x 768-d; "
        f"embed: {args.tweets} tweets per round, the tiny BERTweet-architecture model; {args.rounds} rounds "
        f"per engine, rotating. Broker, Redis and workers on this machine ({os.cpu_count()} CPUs); load "
        f"average (1 min) before / after: {load_before[0]:.1f} / {load_after[0]:.1f}.",
        "",
        "| worker | engine | per second (all rounds) | rounds | CPU µs per record: worker | broker | Redis |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    for kind in ("score", "embed"):
        base = None
        for e in engines:
            took = e.took[kind]
            rate = size[kind] * len(took) / sum(took)
            base = base or rate
            per = {k: v / (size[kind] * len(took)) * 1e6 for k, v in e.cpu[kind].items()}
            lines.append(
                f"| {kind} | {e.name} | {rate:,.0f} {unit[kind]}/s ({rate / base:.2f}x) | "
                + ", ".join(f"{size[kind] / t:,.0f}" for t in took)
                + f" | {per['worker']:.0f} | {per['broker']:.0f} | {per['redis']:.0f} |"
            )
    if scale:
        one = args.events * len(scale[1][0]) / sum(scale[1][0])
        lines += [
            "",
            f"Scale-out on {args.scale_engine}: score workers in one group on {PARTITIONS} partitions, "
            "rounds 1-2-3-3-2-1.",
            "",
            "| score workers | events/s (median round) | vs one "
            "| CPU µs per event: workers | broker | Redis |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for n, (took, cpu) in sorted(scale.items()):
            rate = args.events / statistics.median(took)
            per = {k: v / (args.events * len(took)) * 1e6 for k, v in cpu.items()}
            lines.append(
                f"| {n} | {rate:,.0f} | {rate / one:.2f}x | {per['workers']:.0f} | {per['broker']:.0f} "
                f"| {per['redis']:.0f} |"
            )
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
