"""How cost grows (issue 27 §5): index build time and scoring rate against the vocabulary
size, and the scoring rate against the k grid -- measured and plotted.

For each ``--sizes`` vocabulary (``bench.bench_index.vocabulary``: clustered BERT-like
vectors, Zipf counts, ``--dim``): the index build as the index job runs it
(``AnnoyThesaurus.build``, default hubness method, depth 100, the Annoy index on all cores),
then the scorer's step on ``--events`` events drawn by popularity (``score_batch`` in
batches of 256, the worker's r grid, the default k grid; the null model on): a first pass on
a fresh neighbour cache (cold) and a second (warm); the process's peak resident memory
(``ru_maxrss``, vectors included, so far in the run) after the build and after the scoring.
At ``--grid-size`` hashtags the warm rate is also measured for k grids of growing largest k.

    python -m bench.bench_cost_curves --out docs/bench/cost_curves.md --plots docs/bench
    python -m bench.bench_cost_curves --sizes 500,1000 --dim 64 --events 300 --grid-size 1000  # smoke
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

from bench.bench_index import vocabulary
from bench.results import bench_command, machine, publish
from stream.evaluation.scoring import DEFAULT_KS, DEFAULT_RS, score_batch
from stream.intake.records import Recommendation
from stream.synonyms.hubness import DEFAULT_METHOD
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus, neighbour_cache

DEPTH = 100
GRIDS: tuple[tuple[int, ...], ...] = (
    (0, 5, 10),
    (0, 5, 10, 20, 30),
    DEFAULT_KS,
    (0, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100),
)


def events_for(
    names: list[str], counts: np.ndarray, n: int, seed: int = 1
) -> list[tuple[Recommendation, tuple[str, ...]]]:
    rng = np.random.default_rng(seed)
    p = counts / counts.sum()
    out = []
    for i in range(n):
        drawn = [names[j] for j in rng.choice(len(names), size=12, p=p)]
        out.append(
            (Recommendation(str(i), tuple(dict.fromkeys(drawn[:10]))), tuple(dict.fromkeys(drawn[10:])))
        )
    return out


def peak_rss() -> int:
    """The process's peak resident memory so far, bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rate(events: list[tuple[Recommendation, tuple[str, ...]]], cache: object, ks: tuple[int, ...]) -> float:
    start = time.perf_counter()
    for i in range(0, len(events), 256):
        score_batch(events[i : i + 256], cache, ks=ks, rs=DEFAULT_RS)  # type: ignore[arg-type]
    return len(events) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000,3000,10000,30000", help="vocabulary sizes, comma-separated")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--trees", type=int, default=50)
    p.add_argument("--events", type=int, default=3000)
    p.add_argument("--grid-size", type=int, default=10_000, help="vocabulary for the k-grid curve")
    p.add_argument("--out", type=Path)
    p.add_argument("--plots", type=Path, help="write the PNGs here")
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    load_before = os.getloadavg()[0]
    rows = []
    grid_rates: list[tuple[int, float]] = []
    for n in sizes:
        names, vectors, counts = vocabulary(n, args.dim)
        t0 = time.perf_counter()
        built = AnnoyThesaurus.build(
            names, vectors, counts=list(counts), method=DEFAULT_METHOD, depth=DEPTH,
            n_trees=args.trees, model_id="bench", n_jobs=-1,
        )  # fmt: skip
        build_s = time.perf_counter() - t0
        built_peak = peak_rss()
        events = events_for(names, counts, args.events)
        t0 = time.perf_counter()
        cache = neighbour_cache(built.table, max(DEFAULT_KS))
        setup_s = time.perf_counter() - t0
        cold = rate(events, cache, DEFAULT_KS)
        warm = rate(events, cache, DEFAULT_KS)
        rows.append((n, build_s, setup_s, cold, warm, built_peak, peak_rss()))
        print(f"{n}: build {build_s:.1f} s (peak RSS {built_peak / 1e9:.2f} GB), cold {cold:,.0f}, "
              f"warm {warm:,.0f} events/s", file=sys.stderr, flush=True)  # fmt: skip
        if n == args.grid_size:
            for ks in GRIDS:
                grid_cache = neighbour_cache(built.table, max(ks))
                rate(events, grid_cache, ks)  # cold pass, not counted
                grid_rates.append((max(ks), rate(events, grid_cache, ks)))

    command = bench_command("bench_cost_curves", argv)
    lines = [
        "## How cost grows (bench/bench_cost_curves.py, issue 27 §5)",
        "",
        f"{machine(command, load_before)}; {args.dim}-d clustered vectors, {args.trees} Annoy trees, "
        f"depth {DEPTH}, "
        f"{args.events} events per pass, batches of 256, r grid {DEFAULT_RS}.",
        "",
        "| hashtags | index build s | build s / n² (ns) | scorer set-up s | events/s cold | events/s warm "
        "| peak RSS after the build / the scoring, GB |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {n:,} | {b:.1f} | {b / n**2 * 1e9:.2f} | {s:.2f} | {c:,.0f} | {w:,.0f} "
        f"| {pb / 1e9:.2f} / {ps / 1e9:.2f} |"
        for n, b, s, c, w, pb, ps in rows
    ]
    if grid_rates:
        lines += [
            "",
            f"k grid at {args.grid_size:,} hashtags (warm):",
            "",
            "| largest k | events/s |",
            "|---:|---:|",
        ]
        lines += [f"| {k} | {r:,.0f} |" for k, r in grid_rates]
    text = publish(lines, args.out)
    if args.plots:
        plot(rows, grid_rates, args.plots)
    return text


def plot(
    rows: list[tuple[int, float, float, float, float, int, int]], grid: list[tuple[int, float]], where: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    where.mkdir(parents=True, exist_ok=True)
    n = np.array([r[0] for r in rows], dtype=float)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.loglog(n, [r[1] for r in rows], "o-", label="index build (measured)")
    ax.loglog(n, rows[-1][1] * (n / n[-1]) ** 2, "--", label="∝ n² through the largest")
    ax.set_xlabel("hashtags")
    ax.set_ylabel("seconds")
    ax.set_title("Index build time vs vocabulary (2 cores)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(where / "cost_build_vs_vocabulary.png", dpi=120)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.semilogx(n, [r[3] for r in rows], "o-", label="cold (fresh cache)")
    ax.semilogx(n, [r[4] for r in rows], "s-", label="warm")
    ax.set_xlabel("hashtags in the thesaurus")
    ax.set_ylabel("events/s (scorer step, one process)")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(where / "cost_scoring_vs_vocabulary.png", dpi=120)
    if grid:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot([k for k, _ in grid], [r for _, r in grid], "o-")
        ax.set_xlabel("largest k in the grid")
        ax.set_ylabel("events/s (warm)")
        ax.set_ylim(bottom=0)
        fig.tight_layout()
        fig.savefig(where / "cost_scoring_vs_k.png", dpi=120)
    plt.close("all")


if __name__ == "__main__":
    main()
