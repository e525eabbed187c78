"""Benchmark the extra cost of each drift/quality signal: per scored event and per index build.

Why: every signal this round added (chance-corrected #REval, popularity slices, thesaurus
drift, the backtest's rule evaluation) runs on the scoring path or in the index job; each
must be cheap beside what it sits on.

Per scored event (``score_event`` on the scorer's full grid, k in DEFAULT_KS, r in
DEFAULT_RS, warm cache, the workload of ``bench_scoring.py``), alternating A B C D D C B A
over rounds, in the same process:

* ``A base`` -- #REval, exact match and rank-aware #REval only (a cache without null model
  and without bands);
* ``B + corrected`` -- with the null model (``stream.evaluation.chance``);
* ``C + slices`` -- with the popularity bands (``stream.evaluation.slices``);
* ``D + both`` -- what the worker runs.

Per index build (``--vocab`` hashtags x ``--dim``, center+csls, depth 100): the build
itself (the baseline), then what the index job adds: the null model (``ChanceModel``),
the bands (``Bands``), the drift from the previous version (``thesaurus_drift``) and the
recent shift from the window means (``recent_shift``; their Redis cost per tweet is in
``bench_redis.py``).

Per backtest: ``stream.monitoring.backtest.signals`` (every rule) over a day of evaluation instants.

    python -m bench.bench_signals                     # prints a markdown section
    python -m bench.bench_signals --vocab 20000 --out /tmp/signals.md
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from functools import partial

import numpy as np

from bench.bench_scoring import clustered_vectors, make_events, time_it, workload_parser
from bench.results import bench_command, publish
from stream.evaluation.chance import ChanceModel
from stream.evaluation.neighbours import NeighbourCache
from stream.evaluation.scoring import DEFAULT_KS, DEFAULT_RS, score_event
from stream.evaluation.slices import Bands
from stream.monitoring import backtest as bt
from stream.synonyms.drift import recent_shift
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus, thesaurus_drift


def main() -> None:
    args = workload_parser(__doc__, events=3000, per="variant", rounds=3).parse_args()
    command = bench_command("bench_signals")
    rng = np.random.default_rng(args.seed)
    names = [f"tag{i}" for i in range(args.vocab)]
    vectors, labels = clustered_vectors(args.vocab, args.dim, args.clusters, rng)
    counts = [int(c) for c in rng.zipf(1.6, size=args.vocab).clip(1, 10**6)]

    started = time.perf_counter()
    thesaurus = AnnoyThesaurus.build(names, vectors, counts=counts, model_id="bench", n_trees=50)
    build = {"build (baseline)": time.perf_counter() - started}
    moved = vectors + rng.normal(scale=0.3 / np.sqrt(args.dim), size=vectors.shape).astype(np.float32)
    newer = AnnoyThesaurus.build(names, moved, counts=counts, model_id="bench", n_trees=50)
    table = thesaurus.table
    build["+ null model (ChanceModel)"] = time_it(lambda: ChanceModel(table))
    build["+ bands (Bands)"] = time_it(lambda: Bands(table.hashtags, table.counts))
    build["+ drift from the previous version"] = time_it(lambda: thesaurus_drift(thesaurus, newer))
    # The window means' signal: each hashtag's recent mean (a fifth of its tweets) vs before.
    totals = vectors.astype(np.float64) * np.asarray(counts, dtype=np.float64)[:, None]
    recent_counts = [c // 5 for c in counts]
    recent_totals = moved.astype(np.float64) * np.asarray(recent_counts, dtype=np.float64)[:, None]
    build["+ recent shift (window means)"] = time_it(
        lambda: recent_shift(names, totals, counts, recent_totals, recent_counts)
    )

    events = make_events(names, labels, args.events, rng)
    chance, bands = ChanceModel(table), Bands(table.hashtags, table.counts)
    ks, rs = DEFAULT_KS, DEFAULT_RS
    caches = {
        "A base": NeighbourCache(thesaurus, max(ks)),
        "B + corrected": NeighbourCache(thesaurus, max(ks), chance=chance),
        "C + slices": NeighbourCache(thesaurus, max(ks), bands=bands),
        "D + both (the worker)": NeighbourCache(thesaurus, max(ks), chance=chance, bands=bands),
    }

    def run(cache: NeighbourCache) -> None:
        for event in events:
            score_event(event, event.ground_truth or (), cache, ks, rs)

    for cache in caches.values():
        run(cache)  # warm: the caches hold every hashtag, the null model its masses
    per_event: dict[str, list[float]] = {name: [] for name in caches}
    order = list(caches)
    for _ in range(args.rounds):
        for name in order + order[::-1]:
            per_event[name].append(time_it(partial(run, caches[name])) / len(events))

    t = np.arange(0.0, 30 * 86400.0, 60.0)  # an event a minute for 30 days
    n = len(t)
    series = bt.Series(
        t, rng.random(n), 0.2 * rng.random(n), rng.random(n), np.full(n, 10.0), np.zeros(n), rng.random(n)
    )
    rules = bt.Rules(15.0, 3600.0, tuple(86400.0 * d for d in range(1, 8)), 0.2, 1800.0, 50, 0.5, 4.6,
                     900.0, 0.0, 3600.0, 0.2, 0.05, 3600.0, 3600.0, 86400.0, 0.2, 0.1, 1800.0)  # fmt: skip
    at = np.arange(t[0], t[-1], rules.step)
    rule_s = time_it(lambda: bt.signals(series, at, rules))

    base = statistics.median(per_event["A base"])
    lines = [
        "## Extra cost of each signal (bench/bench_signals.py)",
        "",
        f"Command: `{command}` on {platform.node()} ({os.cpu_count()} cores, load "
        f"{os.getloadavg()[0]:.1f}); {args.vocab:,} hashtags x {args.dim}, {args.events:,} events x "
        f"{args.rounds * 2} alternating rounds per variant, warm caches, k in {','.join(map(str, ks))}, "
        f"r in {','.join('all' if r is None else str(r) for r in rs)}.",
        "",
        "| per scored event | median µs | vs base |",
        "|---|---|---|",
    ]
    for name, values in per_event.items():
        median = statistics.median(values)
        lines.append(f"| {name} | {median * 1e6:,.0f} | {median / base:.2f}x |")
    baseline = build["build (baseline)"]
    lines += ["", "| per index build | s | vs build |", "|---|---|---|"]
    for name, seconds in build.items():
        lines.append(f"| {name} | {seconds:.3f} | {seconds / baseline:.3f}x |")
    lines += [
        "",
        f"Backtest rules (`stream.monitoring.backtest.signals`, every rule): {len(at):,} evaluation instants "
        f"(30 days at 15 s) over {n:,} events in {rule_s:.2f} s = "
        f"{rule_s / len(at) * 1e6:.1f} µs per instant.",
        "",
    ]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
