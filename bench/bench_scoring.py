"""Benchmark the scoring path: recommendation events/s per scoring worker.

Why: one scoring worker should keep up with a busy recommender (target:
>= 5,000 events/s), scoring every event for the full grid the worker
exports by default (k in 0,5,10,20,...,70: ``stream.evaluation.scoring.DEFAULT_KS``,
r in 1,5,10) and feeding the Prometheus metrics.

Workload: an Annoy thesaurus (``AnnoyThesaurus.build``, 50 trees, published
into a ``ThesaurusStore`` and memory-mapped back, as the index job and the
scorer do) over ``--vocab`` hashtags with 768-d vectors in ``--clusters``
Gaussian clusters (cosine ~0.6 inside a cluster, ~0 across).  Events carry
10 ranked, distinct recommended hashtags drawn Zipf-like (p ~ 1/rank^1.1)
over the vocabulary, each replaced with probability 0.1 by a hashtag the
thesaurus has never seen, and 1-3 ground-truth hashtags (Zipf-like, half of
the events with one from the cluster of the top recommendation, so some
synonym hits happen).

Measured, in the same process, alternating ABCDE EDCBA over rounds (the
machine is shared and noisy; compare the ratios):

* ``core, cold cache`` -- ``score_event`` with a fresh ``NeighbourCache`` each
  round (what follows every thesaurus reload);
* ``core, warm cache`` -- the same with a cache that already holds the events'
  hashtags (steady state);
* ``core + metrics`` -- warm ``score_event`` then ``QualityMetrics.observe_many``
  once per batch of 256 into an ``Exporter()`` (summaries + rolling windows), as the
  worker does;
* ``Scorer, bytes -> JSON`` -- ``workers.service.score.Scorer`` ``admit_events`` +
  ``apply_events`` on Kafka-like records in batches of 256 (parse, score, the result's
  bytes, then the metrics callbacks) plus the runtime's encoding of each output (its bytes
  as they are; a dict through orjson); everything
  but the Kafka I/O and the Redis dedup claims (``bench_score_worker.py`` has both);
* ``naive`` -- the baseline: per event, ``thesaurus.neighbours(h, k)`` asked of
  Annoy for every (recommended hashtag, k) -- no prefix reuse, no cache; on
  the first ``--naive-events`` events only (it is slow).

    python bench/bench_scoring.py                    # prints a markdown section
    python bench/bench_scoring.py --out /tmp/scoring_bench.md
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.results import publish
from stream.evaluation.metrics import exact_scores, reval_hit_ratio
from stream.evaluation.neighbours import NeighbourCache
from stream.evaluation.scoring import DEFAULT_KS, DEFAULT_RS, r_label, score_event
from stream.intake.records import Recommendation
from stream.synonyms.thesaurus import Thesaurus
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus
from workers.adapters.files.store import ThesaurusStore
from workers.adapters.prometheus.exporter import Exporter, LabelGuard
from workers.adapters.prometheus.quality_metrics import QualityMetrics
from workers.service.kafka_records import Record
from workers.service.runtime import value_bytes
from workers.service.score import Scorer, collect_less_often
from workers.settings import Settings, window_label

REPO = Path(__file__).resolve().parents[1]

KS: tuple[int, ...] = DEFAULT_KS
RS: tuple[int | None, ...] = DEFAULT_RS


# --------------------------------------------------------------------------- workload


def clustered_vectors(
    n: int, dim: int, clusters: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` unit vectors in ``clusters`` Gaussian clusters; returns (vectors, cluster ids)."""
    centres = rng.normal(size=(clusters, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    labels = rng.integers(0, clusters, size=n)
    # noise of norm ~0.8 around a unit centre: cosine ~0.6 inside a cluster
    noise = rng.normal(scale=0.8 / np.sqrt(dim), size=(n, dim))
    vectors = centres[labels] + noise
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors.astype(np.float32), labels


def make_events(
    names: Sequence[str],
    labels: np.ndarray,
    n_events: int,
    rng: np.random.Generator,
    *,
    n_recommended: int = 10,
    unknown_rate: float = 0.1,
) -> list[Recommendation]:
    n = len(names)
    # popularity rank independent of the cluster
    popularity = rng.permutation(n)
    weights = 1.0 / np.arange(1, n + 1) ** 1.1
    weights /= weights.sum()
    by_cluster: dict[int, list[int]] = {}
    for i, c in enumerate(labels):
        by_cluster.setdefault(int(c), []).append(i)
    events = []
    for e in range(n_events):
        picks = popularity[rng.choice(n, n_recommended, replace=False, p=weights)]
        recommended = [
            f"new{rng.integers(10**9)}" if rng.random() < unknown_rate else names[i] for i in picks
        ]
        n_truth = int(rng.integers(1, 4))
        truth_ids = list(popularity[rng.choice(n, n_truth, replace=False, p=weights)])
        if rng.random() < 0.5:  # one ground-truth hashtag near the top recommendation
            truth_ids[0] = int(rng.choice(by_cluster[int(labels[picks[0]])]))
        truth = list(dict.fromkeys(names[i] for i in truth_ids))
        events.append(
            Recommendation(
                tweet_id=str(e),
                recommended=tuple(dict.fromkeys(recommended)),
                ground_truth=tuple(truth),
                recommender="bench",
            )
        )
    return events


def as_records(events: Sequence[Recommendation], topic: str = "recommendations") -> list[Record]:
    out = []
    for i, ev in enumerate(events):
        value = json.dumps(
            {
                "tweet_id": ev.tweet_id,
                "recommender": ev.recommender,
                "recommended": list(ev.recommended),
                "ground_truth": list(ev.ground_truth or ()),
            }
        ).encode()
        out.append(Record(topic, i % 4, i // 4, 1_700_000_000_000 + i, ev.tweet_id.encode(), value))
    return out


# --------------------------------------------------------------------------- baseline


def naive_score(
    event: Recommendation, truth: Sequence[str], thesaurus: Thesaurus
) -> dict[str, dict[int, float]]:
    """The #REval grid without prefix reuse or cache: Annoy asked per (hashtag, k)."""
    syn: dict[tuple[str, int], list[str]] = {}
    for h in event.recommended:
        for k in KS:
            syn[h, k] = [h, *thesaurus.neighbours(h, k)] if k else [h]
    out: dict[str, dict[int, float]] = {}
    for r in RS:
        top = list(event.recommended[:r]) if r is not None else list(event.recommended)
        by_k: dict[int, float] = {}
        for k in KS:

            def synonyms(h: str, k: int = k) -> list[str]:
                return syn[h, k]

            by_k[k] = reval_hit_ratio(top, truth, synonyms) or 0.0
        out[r_label(r)] = by_k
        exact_scores(top, truth)  # computed by the real path too
    return out


# --------------------------------------------------------------------------- suggested fix


def time_it(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def workload_parser(doc: str | None, *, events: int, per: str, rounds: int) -> argparse.ArgumentParser:
    """The options of a scoring bench on a synthetic clustered thesaurus (this one's and
    bench_signals'): vocabulary, dimension, clusters, events per round, rounds, seed, --out."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    p.add_argument("--vocab", type=int, default=5000, help="hashtags in the thesaurus")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--clusters", type=int, default=100)
    p.add_argument("--events", type=int, default=events, help=f"events per round and {per}")
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="also write the markdown section here")
    return p


def main() -> None:
    p = workload_parser(__doc__, events=5000, per="mode", rounds=4)
    p.add_argument("--n-trees", type=int, default=50, help="Annoy trees (workers' default: 50)")
    p.add_argument("--naive-events", type=int, default=40, help="events per round, naive")
    args = p.parse_args()
    command = "python " + " ".join(shlex.quote(x) for x in [sys.argv[0], *sys.argv[1:]])
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    collect_less_often()  # the score worker's collector thresholds
    rng = np.random.default_rng(args.seed)
    names = [f"tag{i}" for i in range(args.vocab)]
    vectors, labels = clustered_vectors(args.vocab, args.dim, args.clusters, rng)

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        built = AnnoyThesaurus.build(names, vectors, n_trees=args.n_trees, model_id="bench")
        store = ThesaurusStore(Path(tmp) / "index")
        version = store.publish(built)
        build_s = time.perf_counter() - t0
        thesaurus = store.load(version)  # memory-mapped, as the scorer loads it
        max_k = max(KS)

        events = make_events(names, labels, args.events, rng)
        truths = [ev.ground_truth or () for ev in events]
        records = as_records(events)
        naive_events = events[: args.naive_events]

        # Warm state for the warm modes.
        warm = NeighbourCache(thesaurus, max_k=max_k, table=thesaurus.table)  # as the scorer: rows searched
        reference = [score_event(ev, t, warm, KS, RS) for ev, t in zip(events, truths, strict=True)]
        metrics = QualityMetrics(Exporter(), KS, RS, (300, 3600, 86400), LabelGuard(), window_label)
        settings = Settings(
            index_dir=Path(tmp) / "index",
            thesaurus_source="dir",  # the version published above
            redis_prefix=f"bench-{uuid.uuid4().hex[:8]}",  # no Redis call: events carry truth
            event_dedup_window_s=0,  # and no dedup claims (bench_score_worker measures those)
            detector_arl0=0,  # nor the change detector's shared state (it is in Redis)
            ks=",".join(map(str, KS)),
            rs=",".join(r_label(r) for r in RS),
        )
        scorer = Scorer(settings, Exporter(), _NoRedis(), _FixedIncarnations())  # type: ignore[arg-type]
        size = settings.score_batch_size  # the score role's batches

        def scorer_step() -> None:
            for i in range(0, len(records), size):
                items, _ = scorer.admit_events(records[i : i + size])
                outcome = scorer.apply_events(items)
                for out in outcome.outputs:  # as the runtime encodes an output
                    value_bytes(out.value)
                for after in outcome.after:
                    after()

        scorer_step()

        known_distinct = len({h for ev in events for h in ev.recommended if h in thesaurus})

        def core_cold() -> None:
            cache = NeighbourCache(thesaurus, max_k=max_k, table=thesaurus.table)
            for ev, t in zip(events, truths, strict=True):
                score_event(ev, t, cache, KS, RS)

        def core_warm() -> None:
            for ev, t in zip(events, truths, strict=True):
                score_event(ev, t, warm, KS, RS)

        def with_metrics() -> None:  # as the worker feeds them: once per batch
            for i in range(0, len(events), size):
                scored = [
                    score_event(ev, t, warm, KS, RS)
                    for ev, t in zip(events[i : i + size], truths[i : i + size], strict=True)
                ]
                metrics.observe_many(scored, [1_700_000_000.0] * len(scored))

        def naive() -> None:
            for ev in naive_events:
                naive_score(ev, ev.ground_truth or (), thesaurus)

        modes: dict[str, tuple[Callable[[], None], int]] = {
            "core, cold cache (fresh NeighbourCache)": (core_cold, len(events)),
            "core, warm cache": (core_warm, len(events)),
            "core + QualityMetrics.observe_many": (with_metrics, len(events)),
            "Scorer admit + apply + encoding": (scorer_step, len(events)),
            "naive: Annoy per (hashtag, k), no cache": (naive, len(naive_events)),
        }
        took: dict[str, list[float]] = {m: [] for m in modes}
        order = list(modes)
        for r in range(args.rounds):
            for mode in order if r % 2 == 0 else order[::-1]:
                fn, _ = modes[mode]
                took[mode].append(time_it(fn))

        # Agreement of the naive baseline with the cached path (Annoy is approximate and
        # the cache asks once at max_k with a larger search_k, so they may differ a little).
        same = total = 0
        for ev, ref in zip(naive_events, reference[: len(naive_events)], strict=True):
            got = naive_score(ev, ev.ground_truth or (), thesaurus)
            for label, by_k in got.items():
                for k, v in by_k.items():
                    total += 1
                    same += abs(v - ref.reval[label][k]) < 1e-12
        per_query = _annoy_query_us(thesaurus, names, max_k)
        thesaurus.close()
        built.close()
    load_after = os.getloadavg()
    total_s = time.perf_counter() - t_start

    rates = {m: [n / t for t in took[m]] for m, (_, n) in modes.items()}
    total_rate = {m: modes[m][1] * len(took[m]) / sum(took[m]) for m in modes}
    naive_key = order[-1]
    n_unknown = sum(s.unknown_recommended for s in reference)
    n_rec = sum(s.n_recommended for s in reference)
    lines = [
        "## Scoring throughput (stream/evaluation/scoring.py, workers/service/score.py Scorer)",
        "",
        f"Command: `{command}` (from the repository root; {total_s:.0f} s in all).",
        "",
        f"Thesaurus: Annoy, {args.vocab} hashtags x {args.dim}-d in {args.clusters} clusters, "
        f"{args.n_trees} trees, default search_k (10 x n_trees x (k+1); {per_query[0]:.0f} us "
        f"per query at k={max_k}, {per_query[1]:.0f} us at k=5); built + published in "
        f"{build_s:.1f} s, loaded memory-mapped. Events: {len(events)} per round, 10 ranked "
        f"recommended hashtags (Zipf over the vocabulary, {n_unknown / n_rec:.1%} unknown to "
        f"the thesaurus), 1-3 ground-truth; grid k = {','.join(map(str, KS))} "
        f"({len(KS)} values) x r = {','.join(r_label(r) for r in RS)}. "
        f"{args.rounds} rounds, modes alternating ABCDE EDCBA; the naive baseline runs on the "
        f"first {len(naive_events)} events of each round. Cold cache: a fresh cache per round, "
        f"{known_distinct} distinct known recommended hashtags, their ranks searched in the "
        "neighbour table's rows as the scorer does.",
        "",
        f"Load average (1 min) before / after: {load_before[0]:.1f} / {load_after[0]:.1f} on "
        f"{os.cpu_count()} CPUs (shared machine: compare ratios, not absolute rates).",
        "",
        "| mode | events/s (all rounds) | best round | vs naive (total; median of rounds) |",
        "|---|---:|---:|---:|",
    ]
    for m in modes:
        ratio_total = total_rate[m] / total_rate[naive_key]
        ratio_med = statistics.median(a / b for a, b in zip(rates[m], rates[naive_key], strict=True))
        lines.append(
            f"| {m} | {total_rate[m]:,.0f} | {max(rates[m]):,.0f} | {ratio_total:,.1f}x; {ratio_med:,.1f}x |"
        )
    lines += [
        "",
        f"Relative to `core, warm cache`: metrics cost "
        f"{total_rate[order[1]] / total_rate[order[2]]:.2f}x, the whole Scorer step "
        f"{total_rate[order[1]] / total_rate[order[3]]:.2f}x, a cold cache "
        f"{total_rate[order[1]] / total_rate[order[0]]:.2f}x.",
        f"Naive vs cached #REval values: {same}/{total} (event, r, k) cells equal "
        "(Annoy is approximate; the cache's single query at max k searches more nodes).",
    ]
    publish(lines, args.out)


def _annoy_query_us(thesaurus: AnnoyThesaurus, names: Sequence[str], max_k: int) -> tuple[float, float]:
    sample = names[:: max(1, len(names) // 200)][:200]
    out = []
    for k in (max_k, 5):
        t0 = time.perf_counter()
        for h in sample:
            thesaurus.neighbours(h, k)
        out.append((time.perf_counter() - t0) / len(sample) * 1e6)
    return out[0], out[1]


class _FixedIncarnations:
    """No broker here: every topic is in its first incarnation."""

    def current(self, topic: str) -> str:
        return "bench"


class _NoRedis:
    """Stands in for the Redis client: the Scorer only registers scripts with it here
    (every event carries its ground truth, so the join is never used)."""

    def register_script(self, script: str) -> Callable[..., Any]:
        def fail(*_: Any, **__: Any) -> Any:
            raise AssertionError("the benchmark should not reach Redis")

        return fail


if __name__ == "__main__":
    main()
