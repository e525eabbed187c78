"""What the hubness reduction and the chance correction cost.

1. ``build``: the neighbour table of the sample feed's hashtags (MiniLM BERTag means, exact
   ranking) with each hubness method, against the paper's raw cosine in the same run
   (the order alternates between rounds, best of rounds).
2. ``nearest``: a larger synthetic vocabulary, the exact all-pairs ranking against the
   re-ranking of each hashtag's nearest candidates (what builds above 20,000 hashtags use).
3. ``scoring``: events/s of ``score_event`` with the null model (raw + corrected values)
   against without it (raw only), on the same events and thesaurus, interleaved.

    python bench/bench_hubness.py [--parts build,nearest,scoring] [--hashtags 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from stream.evaluation.chance import ChanceModel
from stream.evaluation.neighbours import NeighbourCache
from stream.evaluation.scoring import DEFAULT_KS, DEFAULT_RS, score_event
from stream.feeds.batch import embed_feed
from stream.intake.records import Recommendation
from stream.synonyms.hubness import METHODS
from stream.synonyms.neighbour_table import build_neighbour_table
from workers.adapters.encoding.encoder import Encoder
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus
from workers.adapters.files.feeds import read_tweets, sample_feed


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - started


def build_section(names: list[str], vectors: np.ndarray, counts: list[int], rounds: int) -> None:
    print(f"\n## index build, sample feed: {len(names):,} hashtags x {vectors.shape[1]}-d, exact, depth 70")
    print("| method | seconds (best of rounds) | vs raw | N_10 skewness |")
    print("|---|---:|---:|---:|")
    best: dict[str, float] = {}
    skew: dict[str, float] = {}
    for i in range(rounds):
        for method in METHODS if i % 2 == 0 else METHODS[::-1]:  # alternate: no warm-up bias
            table, seconds = timed(build_neighbour_table, names, vectors, counts, depth=70, method=method)
            best[method] = min(best.get(method, np.inf), seconds)
            skew[method] = (table.metadata.hubness or {})["skewness"]
    for method in METHODS:
        print(f"| {method} | {best[method]:.2f} | {best[method] / best['raw']:.2f}x | {skew[method]:.2f} |")


def nearest_section(n: int) -> None:
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((n // 20, 384)) + 0.5
    big = centres[rng.integers(0, len(centres), n)] + 0.6 * rng.standard_normal((n, 384))
    names = [f"h{i}" for i in range(n)]
    counts = np.minimum(rng.zipf(1.6, n), 500)
    print(f"\n## index build, synthetic: {n:,} hashtags x 384-d, depth 70 (Annoy 50 trees)")
    print("| build | seconds | recall@10 / @70 vs exact center+csls |")
    print("|---|---:|---|")
    exact, t_exact = timed(build_neighbour_table, names, big, counts, depth=70, method="center+csls")
    print(f"| center+csls, exact ranking (numpy) | {t_exact:.1f} | 1 / 1 |")
    th, seconds = timed(
        AnnoyThesaurus.build, names, big, counts=counts, depth=70, method="center+csls", candidates="nearest"
    )
    sample = rng.choice(n, 500, replace=False)
    recall = [
        np.mean(
            [len(set(exact.neighbours(names[q], k)) & set(th.neighbours(names[q], k))) / k for q in sample]
        )
        for k in (10, 70)
    ]
    print(f"| center+csls, nearest candidates, + Annoy | {seconds:.1f} | {recall[0]:.3f} / {recall[1]:.3f} |")


def scoring_section(
    names: list[str], vectors: np.ndarray, counts: list[int], n_events: int, rounds: int
) -> None:
    rng = np.random.default_rng(0)
    print(
        f"\n## scoring: {n_events:,} events, 9 k x r in (1, 5, 10, all), sample-feed thesaurus (center+csls)"
    )
    table = build_neighbour_table(names, vectors, counts, depth=70, method="center+csls")
    popular = [names[i] for i in np.argsort(-np.asarray(counts))[:200]]
    events = [
        Recommendation(
            str(i),
            tuple(rng.choice(popular, 10, replace=False)),
            tuple(rng.choice(popular, 1 + i % 3, replace=False)),
            "bench",
        )
        for i in range(n_events)
    ]
    rs = (*DEFAULT_RS, None)
    best = {False: np.inf, True: np.inf}
    for _ in range(rounds):
        for with_chance in (False, True):
            # A fresh null model each round: no advantage from its caches of an earlier round.
            cache = NeighbourCache(table, 70, chance=ChanceModel(table) if with_chance else None)
            _, seconds = timed(
                lambda c=cache: [score_event(e, e.ground_truth or (), c, DEFAULT_KS, rs) for e in events]
            )
            best[with_chance] = min(best[with_chance], seconds)
    _, model_seconds = timed(ChanceModel, table)
    print("| scorer step | events/s | µs per event |")
    print("|---|---:|---:|")
    for label, key in (("raw only", False), ("raw + chance-corrected", True)):
        print(f"| {label} | {n_events / best[key]:,.0f} | {1e6 * best[key] / n_events:.0f} |")
    print(f"null model per thesaurus version: {model_seconds * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default="build,nearest,scoring", help="sections to run")
    parser.add_argument("--hashtags", type=int, default=20_000, help="synthetic vocabulary (nearest)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--events", type=int, default=5000)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    print(f"# hubness bench: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    means = embed_feed(read_tweets([sample_feed()]), Encoder("minilm"))
    names, vectors, counts = means.matrix()
    if "build" in parts:
        build_section(names, vectors, counts, args.rounds)
    if "nearest" in parts:
        nearest_section(args.hashtags)
    if "scoring" in parts:
        scoring_section(names, vectors, counts, args.events, args.rounds)
    print(f"\nload after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
