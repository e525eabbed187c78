"""Profile the score worker's step alone: where its CPU per event goes (issue 27 §1).

Why: the worker costs ~1.1x its step alone (BENCHMARKS.md, "Issue 27 §1 and 22 §4"), so the
step is what bounds events/s per process; 5,000 events/s needs <= 200 µs of CPU per event.
This script times the step without a profiler, then runs it under ``cProfile`` and splits the
profiled time into the step's parts (the worker's own functions, so the split follows the
code, not a guess).

Workload: ``bench_score_worker``'s ``step`` mode -- a ``--vocab``-hashtag clustered Annoy
thesaurus (768-d) published in a directory store, events with ground truth and 10
recommended hashtags, the worker's default grid with every signal on, batches of the
consumer's size, the Redis dedup claims on ``--redis-url`` (127.0.0.1:6379 by default; own prefix,
removed after).  cProfile's per-call overhead inflates parts made of many small Python calls (parsing,
redis-py's command packing) more than numpy passes: read the split as a ranking, the
unprofiled µs per event as the cost.

    python -m bench.profile_score_step                 # prints a markdown section
    python -m bench.profile_score_step --events 5000 --rounds 2 --out /tmp/step.md

cProfile's inflation can be checked with a sampling profiler, which adds no cost per call:
``--plain-only`` runs the unprofiled passes alone, and ``--stacks`` splits py-spy's raw
stacks of such a run into the same parts (shares of the step's samples):

    py-spy record -r 200 -f raw -o /tmp/spy.txt -- python -m bench.profile_score_step --plain-only --rounds 5
    python -m bench.profile_score_step --stacks /tmp/spy.txt
"""

from __future__ import annotations

import cProfile
import os
import pstats
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import redis

from bench.bench_score_worker import REDIS_URL, FixedIncarnations, detectors_caught_up
from bench.bench_scoring import as_records, clustered_vectors, make_events, workload_parser
from bench.results import bench_command, cpu_model, publish
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus
from workers.adapters.files.store import ThesaurusStore
from workers.adapters.prometheus.exporter import Exporter
from workers.adapters.redis.redis_client import clear_prefix
from workers.service.runtime import value_bytes
from workers.service.score import Scorer, collect_less_often
from workers.settings import Settings

# The step's parts: (label, the function whose cumulative time is that part).  Together they
# are the step; "other" is what the batch loop itself and the metrics' follow-ups add.
PARTS = [
    ("parse and admit (bytes -> events)", "workers/service/score.py", "admit_events"),
    (
        "dedup claims in Redis (redis-py pipeline + Lua)",
        "workers/adapters/redis/redis_state.py",
        "claim_many",
    ),
    (
        "scoring the grid (stream.evaluation.scoring.score_batch)",
        "stream/evaluation/scoring.py",
        "score_batch",
    ),
    ("  of which: chance expectations", "stream/evaluation/chance.py", "expected_many"),
    ("  of which: rank matrices (the neighbour rows' gather)", "stream/evaluation/neighbours.py", "matrices"),
    (
        "  of which: the signals (stream.evaluation.rank_grid)",
        "stream/evaluation/rank_grid.py",
        "__init__ reval ranked precision reciprocal_rank exact slice_reval",
    ),
    (
        "records' bytes from the columns (workers.service.score.encode_scores, orjson included)",
        "workers/service/score.py",
        "encode_scores",
    ),
    (
        "quality aggregation (stream.evaluation.quality, the metrics' sums)",
        "workers/service/score.py",
        "_observe",
    ),
]


def main() -> None:
    p = workload_parser(__doc__, events=5000, per="profiled pass", rounds=2)
    p.add_argument("--redis-url", default=REDIS_URL, help="the Redis of the dedup claims")
    p.add_argument("--top", type=int, default=0, help="also print the N functions with the most own time")
    p.add_argument("--plain-only", action="store_true", help="the unprofiled passes only (for a sampler)")
    p.add_argument("--batch", type=int, default=0, help="events per batch (default: the score role's)")
    p.add_argument("--stacks", type=Path, help="split py-spy's raw stacks of a --plain-only run instead")
    args = p.parse_args()
    if args.stacks is not None:
        publish(sampled(args.stacks), args.out)
        return
    command = bench_command("profile_score_step")
    load_before = os.getloadavg()
    collect_less_often()  # as in the worker
    rng = np.random.default_rng(args.seed)
    names = [f"tag{i}" for i in range(args.vocab)]
    vectors, labels = clustered_vectors(args.vocab, args.dim, args.clusters, rng)
    thesaurus = AnnoyThesaurus.build(names, vectors, n_trees=50, model_id="bench")
    rounds = [
        [
            replace(ev, tweet_id=f"r{i}-{j}")
            for j, ev in enumerate(make_events(names, labels, args.events, rng))
        ]
        for i in range(1 + 2 * args.rounds)  # distinct ids: the dedup claims never collide
    ]
    with tempfile.TemporaryDirectory() as tmp:
        ThesaurusStore(Path(tmp)).publish(thesaurus)
        settings = Settings(
            index_dir=Path(tmp),
            thesaurus_source="dir",
            redis_url=args.redis_url,
            redis_prefix=f"bench-{uuid.uuid4().hex[:8]}",
        )
        client = redis.Redis.from_url(args.redis_url)
        scorer = Scorer(settings, Exporter(), client, FixedIncarnations())  # type: ignore[arg-type]
        size = args.batch or max(settings.embed_batch_size, settings.score_batch_size)

        def step(events: list, profiler: cProfile.Profile | None = None) -> float:
            records = as_records(events)
            t0 = time.process_time()
            if profiler is not None:
                profiler.enable()
            for i in range(0, len(records), size):
                items, _ = scorer.admit_events(records[i : i + size])
                outcome = scorer.apply_events(items)
                for out in outcome.outputs:
                    value_bytes(out.value)
                for after in outcome.after:
                    after()
            if profiler is not None:
                profiler.disable()
            return time.process_time() - t0

        step(rounds[0])  # warm: thesaurus loaded, neighbour cache filled
        if scorer.detection is not None:  # calibrated once
            mine = [settings.redis_prefix]
            detectors_caught_up(client, mine, len(rounds[0]), required=mine)
        plain = [step(r) / len(r) * 1e6 for r in rounds[1 : 1 + args.rounds]]
        if args.plain_only:
            clear_prefix(args.redis_url, settings.redis_prefix)
            print(f"step CPU without the profiler: {', '.join(f'{v:.0f}' for v in plain)} µs per event")
            return
        profiler = cProfile.Profile()
        profiled_events = 0
        for r in rounds[1 + args.rounds :]:
            step(r, profiler)
            profiled_events += len(r)
        clear_prefix(args.redis_url, settings.redis_prefix)
        client.close()
    stats = pstats.Stats(profiler)
    total = stats.total_tt  # type: ignore[attr-defined]
    lines = table(lambda path, name: cumulative(stats, path, name), total, profiled_events)
    load_after = os.getloadavg()
    section = [
        "### The score step's CPU, part by part (bench/profile_score_step.py)",
        "",
        f"Command: `{command}`. Machine: {cpu_model()}, {os.cpu_count()} cores, load "
        f"{load_before[0]:.1f} / {load_after[0]:.1f} before / after. Batches of {size}, "
        f"{args.vocab:,} hashtags, {args.events:,} events per pass.",
        "",
        f"Step CPU without the profiler: {', '.join(f'{v:.0f}' for v in plain)} µs per event "
        f"({args.rounds} passes); under cProfile {total / profiled_events * 1e6:.0f} µs.",
        "",
        *lines,
    ]
    publish(section, args.out)
    if args.top:
        stats.sort_stats("tottime").print_stats(args.top)


def sampled(path: Path) -> list[str]:
    """The parts of the step as shares of py-spy's samples in the step (``-f raw``: one line
    per distinct stack, ``frame;frame;... count``; a frame is ``function (file:line)``)."""
    stacks: list[tuple[list[tuple[str, str]], int]] = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [
            (f.split(" (", 1)[0], f.split(" (", 1)[1].rsplit(":", 1)[0])
            for f in stack.split(";")
            if " (" in f
        ]
        at = [
            i
            for i, (name, file) in enumerate(frames)
            if name.endswith("step") and "profile_score_step" in file
        ]
        if at:
            stacks.append((frames[at[0] + 1 :], int(count)))
    total = sum(n for _, n in stacks)

    def share(file: str, names: str) -> float:
        wanted = set(names.split())
        return float(
            sum(
                n
                for frames, n in stacks
                if any(f.endswith(file) and name.split(".")[-1] in wanted for name, f in frames)
            )
        )

    rows = [
        f"### The score step's CPU from py-spy's samples ({total:,} samples in the step, `{path.name}`)",
        "",
        "| part of the step | share of the step's samples |",
        "|---|---:|",
    ]
    top = 0.0
    for label, file, names in PARTS:
        n = share(file, names)
        if not label.startswith(" "):
            top += n
        rows.append(f"| {label} | {n / max(total, 1):.0%} |")
    rows.append(f"| other (batch loop, follow-ups) | {(total - top) / max(total, 1):.0%} |")
    return rows


def cumulative(stats: pstats.Stats, path: str, names: str) -> float:
    """The cumulative seconds of the functions ``names`` (space-separated, not nested in each
    other) of the file ending ``path``; NaN where none ran."""
    wanted = set(names.split())
    found = [
        ct
        for (file, _, name), (_, _, _, ct, _) in stats.stats.items()  # type: ignore[attr-defined]
        if name in wanted and file.endswith(path)
    ]
    return sum(found) if found else float("nan")


def table(cum: Callable[[str, str], float], total: float, events: int) -> list[str]:
    rows = ["| part of the step | share of profiled time | µs per event (profiled) |", "|---|---:|---:|"]
    top = 0.0
    for label, path, name in PARTS:
        seconds = cum(path, name)
        if not label.startswith(" ") and seconds == seconds:  # a NaN part adds nothing
            top += seconds
        rows.append(f"| {label} | {seconds / total:.0%} | {seconds / events * 1e6:.0f} |")
    rest = total - top
    rows.append(f"| other (batch loop, follow-ups) | {rest / total:.0%} | {rest / events * 1e6:.0f} |")
    return rows


if __name__ == "__main__":
    main()
