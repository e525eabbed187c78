"""Benchmark the thesaurus path to the scorers at scale (issue 12 §4).

Why: a live vocabulary reaches 100,000 hashtags; the index job must rebuild it within its
period, its neighbours must be right (recall against exact search), and scorers on other
hosts must get it without a shared disk and answer lookups as fast cold as warm.

Measures, on synthetic clustered BERT-like vectors (``--hashtags`` x ``--dim``; Zipf counts):

* this machine's matrix-product rate (one block, now) and what it bounds an exact search
  over all pairs to (2 n² d flops); the exact candidate search the build runs above 20,000
  hashtags, seconds and fraction of that bound;
* the index build (``AnnoyThesaurus.build`` as the index job runs it: the default hubness
  method, depth 70, the Annoy index on all cores), seconds;
* recall@10 and @70 of that table against the same re-ranking over all pairs (numpy,
  ``--queries`` hashtags): what the re-ranking's candidate cut-off costs;
* the scorers' transport: bytes of the neighbour table published to Redis, publish and load
  seconds (``RedisThesauri``), and the same load from the directory store;
* scoring cold vs warm: the scorer's set-up per version (``neighbour_cache``), then
  ``score_event`` over ``--events`` events with a freshly loaded table (every hashtag looked
  up for the first time) and again with the same cache, in rounds (the machine is shared
  and noisy: ratios within one run), the null model's tables computed on first use (as
  before issue 27) and in the set-up (``ks=``), alternating.

* with ``--baseline DIR`` (a source tree of the code to compare with, e.g. main exported by
  ``git -C /work/main archive main | tar -x -C /tmp/main-src``): the same build by both trees,
  each in a fresh process on the same vectors, alternating (ABBA), with wall and CPU seconds and
  the load average around each, and the agreement of the two tables over every hashtag
  (recall@10 / @depth of this tree's table against the baseline's, the largest difference of a
  neighbour's distance).

    python -m bench.bench_index                       # 100,000 x 768: several minutes on 2 cores
    python -m bench.bench_index --hashtags 5000 --dim 64 --queries 100 --events 2000   # smoke
    python -m bench.bench_index --baseline /tmp/main-src --build-rounds 2 --events 20000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import redis

from bench.results import bench_command, cpu_model, publish, spread
from stream.evaluation.neighbours import NeighbourCache
from stream.evaluation.scoring import DEFAULT_KS, score_event
from stream.intake.records import Recommendation
from stream.synonyms.hubness import DEFAULT_METHOD, candidate_count, centred, exact_candidates, scores
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus, neighbour_cache
from workers.adapters.files.store import ThesaurusStore
from workers.adapters.redis.redis_thesaurus import RedisThesauri


def vocabulary(n: int, dim: int, seed: int = 0) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Hashtag means around 500 topics, BERT-like (a shared direction), Zipf(1.1) counts."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(size=dim) * 0.5
    topics = rng.normal(size=(500, dim))
    topic_of = rng.integers(0, 500, n)
    # In blocks of rows: the same draws, in the same order, as one (n, dim) float64 expression,
    # without its n x dim float64 temporaries (18 GB at 1,000,000 x 768).
    vectors = np.empty((n, dim), dtype=np.float32)
    for lo in range(0, n, 65_536):
        hi = min(n, lo + 65_536)
        vectors[lo:hi] = shared + topics[topic_of[lo:hi]] + 0.6 * rng.normal(size=(hi - lo, dim))
    counts = np.maximum(1, (20_000 / np.arange(1, n + 1) ** 1.1)).astype(np.int64)
    return [f"tag{i}" for i in range(n)], vectors, counts


def exact_top(built: AnnoyThesaurus, space: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` best of every other hashtag by the table's method, for ``queries`` (rows of
    ``space``, the table's order), with the table's own per-hashtag statistics."""
    table = built.table
    ids = np.broadcast_to(np.arange(len(space)), (len(queries), len(space)))
    ranked = scores(table.metadata.hubness_method, queries, ids, space[queries] @ space.T, table.stats)
    ranked[np.arange(len(queries)), queries] = -np.inf
    return np.argsort(-ranked, axis=1, kind="stable")[:, :k]


# One build in a fresh process with the code of the source tree given (sys.argv[1]): the
# baseline and this tree alike, so that neither pays for the other's imports or memory.
BUILD_ONCE = """
import json, os, sys, time
import numpy as np
tree, data, out, trees, depth, method = sys.argv[1:7]
sys.path.insert(0, tree)
try:  # the module the Annoy thesaurus lives in moved (issue 25); a baseline tree may be older
    from workers.adapters.files import annoy_thesaurus as store
except ImportError:
    from workers.adapters.files import store
d = np.load(data)
names = [f"tag{i}" for i in range(len(d["vectors"]))]
load = os.getloadavg()[0]
wall, cpu = time.perf_counter(), time.process_time()
built = store.AnnoyThesaurus.build(
    names, d["vectors"], counts=d["counts"].tolist(), method=method, depth=int(depth),
    n_trees=int(trees), model_id="bench", n_jobs=-1,
)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
np.savez(out, ids=built.table.neighbour_ids, distances=built.table.distances)
search = getattr(built.table.metadata, "search", None)
print(json.dumps({"wall": wall, "cpu": cpu, "module": store.__file__, "search": search,
                  "load": [load, os.getloadavg()[0]]}))
"""


def compare_builds(
    baseline: Path, data: Path, tmp: Path, *, rounds: int, trees: int, depth: int
) -> tuple[list[str], dict[str, list[dict[str, object]]]]:
    """The same build by the baseline tree and this one, alternating ABBA, each in a fresh
    process; report lines and the runs."""
    here = Path(__file__).resolve().parents[1]
    runs: dict[str, list[dict[str, object]]] = {"baseline": [], "this": []}
    for r in range(rounds):
        for label in ("baseline", "this") if r % 2 == 0 else ("this", "baseline"):
            tree = baseline if label == "baseline" else here
            out = tmp / f"{label}-{r}.npz"
            done = subprocess.run(
                [sys.executable, "-c", BUILD_ONCE, str(tree), str(data), str(out), str(trees), str(depth),
                 DEFAULT_METHOD],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            run = json.loads(done.stdout.strip().splitlines()[-1])
            run["out"] = str(out)
            runs[label].append(run)
            print(f"build ({label}, round {r + 1}): {run['wall']:.1f} s, CPU {run['cpu']:.1f} s, "
                  f"load {run['load'][0]:.1f}-{run['load'][1]:.1f}", file=sys.stderr, flush=True)  # fmt: skip
    old = np.load(runs["baseline"][0]["out"])  # type: ignore[arg-type]
    new = np.load(runs["this"][0]["out"])  # type: ignore[arg-type]
    agree = {}
    for k in (10, depth):
        a, b = old["ids"][:, :k], new["ids"][:, :k]
        same = sum(len(set(x) & set(y)) for x, y in zip(a.tolist(), b.tolist(), strict=True))
        agree[k] = same / a.size
    shared = old["ids"] == new["ids"]
    distance_gap = float(np.abs(old["distances"][shared] - new["distances"][shared]).max())
    identical = bool(
        np.array_equal(old["ids"], new["ids"]) and np.array_equal(old["distances"], new["distances"])
    )
    wall = {label: statistics.median(float(x["wall"]) for x in got) for label, got in runs.items()}  # type: ignore[arg-type]
    cpu = {label: statistics.median(float(x["cpu"]) for x in got) for label, got in runs.items()}  # type: ignore[arg-type]

    def each(label: str) -> str:
        return ", ".join(
            f"{x['wall']:.1f} s (CPU {x['cpu']:.1f}, load {x['load'][0]:.1f}-{x['load'][1]:.1f})"  # type: ignore[index]
            for x in runs[label]
        )

    lines = [
        f"| index build, baseline tree (`{baseline}`), each round | {each('baseline')} | |",
        f"| index build, this tree, each round | {each('this')} | |",
        f"| this tree vs baseline, median wall / CPU | **{wall['baseline'] / wall['this']:.2f}x** faster / "
        f"{cpu['baseline'] / cpu['this']:.2f}x less CPU | |",
        f"| this tree's table vs the baseline's, every hashtag: neighbours shared at 10 / {depth}; "
        f"largest distance difference of a shared neighbour; identical | {agree[10]:.6f} / "
        f"{agree[depth]:.6f}; {distance_gap:.1e}; {identical} | |",
        f"| how this tree searched | `{json.dumps(runs['this'][0]['search'])}` | |",
    ]
    return lines, runs


T = TypeVar("T")


def timed(call: Callable[[], T], what: str = "") -> tuple[T, float]:
    start = time.perf_counter()
    result = call()
    seconds = time.perf_counter() - start
    if what:  # progress on long runs, on stderr: the report goes to stdout at the end
        print(f"{what}: {seconds:.1f} s", file=sys.stderr, flush=True)
    return result, seconds


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hashtags", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--trees", type=int, default=50)
    parser.add_argument("--queries", type=int, default=500, help="hashtags whose recall@10 is measured")
    parser.add_argument("--events", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3, help="cold/warm scoring rounds")
    parser.add_argument("--url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--baseline", type=Path, help="a source tree whose build is compared (ABBA)")
    parser.add_argument("--build-rounds", type=int, default=2, help="builds per tree with --baseline")
    parser.add_argument(
        "--exact-search",
        action="store_true",
        help="also time the exact candidate search alone (the old path)",
    )
    args = parser.parse_args(argv)

    load_before = os.getloadavg()[0]
    names, vectors, counts = vocabulary(args.hashtags, args.dim)
    depth = max(DEFAULT_KS)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    space = centred(unit)  # the default method ranks in the centred space
    # The hardware bound of an exact search: 2 n^2 d flops at this machine's matrix-product rate,
    # measured on one block now (the machine is shared: the same moment as the build).
    block = space[:1024]
    block_s = min(timed(lambda: block @ space.T)[1] for _ in range(3))
    gflops = 2 * len(block) * space.size / block_s / 1e9
    bound_s = 2 * args.hashtags * space.size / (gflops * 1e9)
    c = candidate_count(depth, DEFAULT_METHOD)
    search_s = (
        timed(lambda: exact_candidates(space, c), f"exact search, {c} candidates")[1]
        if args.exact_search
        else 0.0
    )
    compared: list[str] = []
    if args.baseline is not None:
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "vocabulary.npz"
            np.savez(data, vectors=vectors, counts=counts)
            compared, _ = compare_builds(
                args.baseline, data, Path(tmp), rounds=args.build_rounds, trees=args.trees, depth=depth
            )
    built, build_s = timed(
        lambda: AnnoyThesaurus.build(
            names, vectors, counts=list(counts), method=DEFAULT_METHOD, depth=depth, n_trees=args.trees,
            model_id="bench", n_jobs=-1,  # as the index job (build_from_means)
        ),
        f"build, {DEFAULT_METHOD}",
    )  # fmt: skip
    assert isinstance(built, AnnoyThesaurus)

    # Recall of the table against the same re-ranking over all pairs (no candidate cut-off).
    rng = np.random.default_rng(1)
    queries = rng.choice(args.hashtags, size=min(args.queries, args.hashtags), replace=False)
    truth = exact_top(built, space, queries, depth)
    found = built.table.neighbour_ids[queries]
    recall = {
        k: float(np.mean([len(set(t[:k]) & set(f[:k])) / k for t, f in zip(truth, found, strict=True)]))
        for k in (10, depth)
    }

    client = redis.Redis.from_url(args.url)
    prefix = f"bench-index-{uuid.uuid4().hex[:8]}"
    thesauri = RedisThesauri(client, prefix)
    with tempfile.TemporaryDirectory() as tmp:
        store = ThesaurusStore(Path(tmp))
        version, save_s = timed(lambda: store.publish(built))
        assert isinstance(version, str)
        stored, publish_s = timed(lambda: thesauri.publish(store.root / version, version))
        _, redis_load_s = timed(lambda: thesauri.load(version))
        _, dir_load_s = timed(lambda: store.load(version, index=False))
        annoy_bytes = (store.root / version / "index.ann").stat().st_size
    for key in client.scan_iter(match=f"{prefix}:*"):
        client.delete(key)

    # Scoring cold vs warm: events whose recommended and true hashtags are drawn by popularity.
    p = counts / counts.sum()
    events = []
    for i in range(args.events):
        drawn = [names[j] for j in rng.choice(args.hashtags, size=12, p=p)]
        events.append(
            (Recommendation(str(i), tuple(dict.fromkeys(drawn[:10]))), tuple(dict.fromkeys(drawn[10:])))
        )
    # Per set-up: "lazy" is the null model as before issue 27 (its tables computed by the first
    # events that need them), "prepared" is neighbour_cache(..., ks=grid) (computed in the
    # set-up); alternating within each round. Rates in events per CPU second of this process
    # (steadier than wall time on a shared machine) and per wall second.
    modes = ("lazy", "prepared")
    rates: dict[str, dict[str, list[float]]] = {
        mode: {pass_: [] for pass_ in ("cold", "warm", "cold_wall", "warm_wall")} for mode in modes
    }
    setup_s: dict[str, list[float]] = {mode: [] for mode in modes}
    for r in range(args.rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            # What a scorer does once per version before its first event (null model, bands, the
            # table's row search), then the same events twice: first cold, then warm.
            grid = DEFAULT_KS if mode == "prepared" else None
            cache, seconds = timed(lambda: neighbour_cache(built.table, depth, ks=grid))  # noqa: B023
            assert isinstance(cache, NeighbourCache)
            setup_s[mode].append(seconds)
            for pass_ in ("cold", "warm"):
                start, cpu = time.perf_counter(), time.process_time()
                for event, truth_tags in events:
                    score_event(event, truth_tags, cache)
                rates[mode][pass_].append(len(events) / (time.process_time() - cpu))
                rates[mode][f"{pass_}_wall"].append(len(events) / (time.perf_counter() - start))
    client.close()

    def scoring_rows(mode: str, what: str) -> list[str]:
        got = rates[mode]
        ratio = statistics.median(c / w for c, w in zip(got["cold"], got["warm"], strict=True))
        wall = statistics.median(c / w for c, w in zip(got["cold_wall"], got["warm_wall"], strict=True))
        return [
            f"| scorer set-up per version, {what} | {statistics.median(setup_s[mode]):.2f} s | |",
            f"| scoring, {what}: first pass over a fresh table (cold) / the same cache again (warm), "
            f"events per CPU second, median (range) | {statistics.median(got['cold']):,.0f} "
            f"({spread(got['cold'])}) / {statistics.median(got['warm']):,.0f} "
            f"({spread(got['warm'])}) | |",
            f"| cold/warm, {what}: median of the rounds' ratios, CPU (wall) | **{ratio:.2f}** ({wall:.2f}) "
            f"| ≥ 0.9 |",
        ]

    command = bench_command("bench_index", argv)
    report = "\n".join(
        [
            "## Thesaurus to the scorers at scale (issue 12 §4)",
            "",
            f"Command: `{command.strip()}`",
            "",
            f"{cpu_model()}, {os.cpu_count()} CPU cores (shared), load average {load_before:.1f} / "
            f"{os.getloadavg()[0]:.1f} before / after, "
            f"Python {platform.python_version()}; {args.hashtags:,} hashtags x {args.dim}-d "
            f"(clustered, BERT-like), {args.trees} Annoy trees, Redis at {args.url} on the same machine.",
            "",
            "| measure | value | target |",
            "|---|---|---|",
            f"| matrix-product rate measured now (one 1,024-row block) | {gflops:.0f} GFLOP/s | |",
            f"| exact search's arithmetic (2 n² d flops) at that rate: the bound | {bound_s:.1f} s | |",
            *(
                [
                    f"| exact search for the re-ranking's {c} candidates per hashtag | {search_s:.1f} s "
                    f"({bound_s / search_s:.0%} of the bound's speed) | |"
                ]
                if search_s
                else []
            ),
            f"| index build, {DEFAULT_METHOD} (the index job's default), depth {depth}, with the Annoy "
            f"index (all cores), in this process | **{build_s:.1f} s** | ≤ 60 s |",
            f"| how it searched | `{json.dumps(built.table.metadata.search)}` | |",
            *compared,
            f"| recall@10 / @{depth} of the table vs the same re-ranking over all pairs "
            f"({len(queries)} hashtags) | **{recall[10]:.3f}** / {recall[depth]:.3f} | ≥ 0.95 |",
            f"| neighbour table published to Redis (what scorers load) | {stored / 1e6:.1f} MB "
            f"({stored / args.hashtags:.0f} B per hashtag; the Annoy file, not published: "
            f"{annoy_bytes / 1e6:.1f} MB) | |",
            f"| save to the directory store / publish to Redis | {save_s:.2f} s / {publish_s:.2f} s | |",
            f"| scorer load from Redis / from the directory (checksums checked) | {redis_load_s:.2f} s / "
            f"{dir_load_s:.2f} s | |",
            *scoring_rows("lazy", "null model's tables on first use (as before)"),
            *scoring_rows("prepared", "`neighbour_cache(..., ks=grid)`: the tables in the set-up"),
            "",
        ]
    )
    publish(report, args.out)
    return report


if __name__ == "__main__":
    main()
