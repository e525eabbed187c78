"""Benchmark the thesaurus path to the scorers at scale (issue 12 §4).

Why: a live vocabulary reaches 100,000 hashtags; the index job must rebuild it within its
period, its neighbours must be right (recall against exact search), and scorers on other
hosts must get it without a shared disk and answer lookups as fast cold as warm.

Measures, on synthetic clustered BERT-like vectors (``--hashtags`` x ``--dim``; Zipf counts):

* the index build (``AnnoyThesaurus.build``, the index job's path, Annoy candidates) with
  the raw cosine ranking and with the default hubness method, seconds each;
* recall@10 of the raw table against exact cosine search (numpy, ``--queries`` hashtags):
  what Annoy's approximate candidates cost;
* the scorers' transport: bytes of the neighbour table published to Redis, publish and load
  seconds (``RedisThesauri``), and the same load from the directory store;
* scoring cold vs warm: ``score_event`` over ``--events`` events with a freshly loaded
  table (every hashtag looked up for the first time) and again with the same cache, in
  alternating rounds (the machine is shared and noisy: ratios within one run).

    python -m bench.bench_index                       # 100,000 x 768: several minutes on 2 cores
    python -m bench.bench_index --hashtags 5000 --dim 64 --queries 100 --events 2000   # smoke
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import redis

from stream.hubness import DEFAULT_METHOD
from stream.records import Recommendation
from stream.scoring import DEFAULT_KS, score_event
from workers.adapters.redis_thesaurus import RedisThesauri
from workers.adapters.store import AnnoyThesaurus, ThesaurusStore, neighbour_cache


def vocabulary(n: int, dim: int, seed: int = 0) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Hashtag means around 500 topics, BERT-like (a shared direction), Zipf(1.1) counts."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(size=dim) * 0.5
    topics = rng.normal(size=(500, dim))
    vectors = (shared + topics[rng.integers(0, 500, n)] + 0.6 * rng.normal(size=(n, dim))).astype(np.float32)
    counts = np.maximum(1, (20_000 / np.arange(1, n + 1) ** 1.1)).astype(np.int64)
    return [f"tag{i}" for i in range(n)], vectors, counts


def exact_top(vectors: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Exact cosine top-k (the query itself excluded), in chunks of the vocabulary."""
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    sims = unit[queries] @ unit.T
    sims[np.arange(len(queries)), queries] = -np.inf
    return np.argsort(-sims, axis=1)[:, :k]


def timed(call: object, what: str = "") -> tuple[object, float]:
    start = time.perf_counter()
    result = call()  # type: ignore[operator]
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
    args = parser.parse_args(argv)

    names, vectors, counts = vocabulary(args.hashtags, args.dim)
    raw, raw_s = timed(
        lambda: AnnoyThesaurus.build(
            names,
            vectors,
            counts=list(counts),
            method="raw",
            depth=10,
            n_trees=args.trees,
            model_id="bench",
            candidates="annoy",  # Annoy's neighbours, whatever the size: the recall
        ),
        "build, raw",
    )
    depth = max(DEFAULT_KS)
    built, build_s = timed(
        lambda: AnnoyThesaurus.build(
            names, vectors, counts=list(counts), method=DEFAULT_METHOD, depth=depth, n_trees=args.trees,
            model_id="bench",
        ),
        f"build, {DEFAULT_METHOD}",
    )  # fmt: skip
    assert isinstance(raw, AnnoyThesaurus) and isinstance(built, AnnoyThesaurus)

    rng = np.random.default_rng(1)
    queries = rng.choice(args.hashtags, size=min(args.queries, args.hashtags), replace=False)
    truth = exact_top(vectors, queries, 10)
    found = raw.table.neighbour_ids[queries, :10]
    recall = float(np.mean([len(set(t) & set(f)) / 10 for t, f in zip(truth, found, strict=True)]))

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
    cold_rates, warm_rates = [], []
    for _ in range(args.rounds):
        table = thesauri_table = built.table
        cache = neighbour_cache(thesauri_table, depth)
        for rates in (cold_rates, warm_rates):  # the same cache: first cold, then warm
            start = time.perf_counter()
            for event, truth_tags in events:
                score_event(event, truth_tags, cache)
            rates.append(len(events) / (time.perf_counter() - start))
        del table
    client.close()

    cold, warm = statistics.median(cold_rates), statistics.median(warm_rates)
    command = "python -m bench.bench_index " + shlex.join(argv if argv is not None else sys.argv[1:])
    report = "\n".join(
        [
            "## Thesaurus to the scorers at scale (issue 12 §4)",
            "",
            f"Command: `{command.strip()}`",
            "",
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores (shared), "
            f"Python {platform.python_version()}; {args.hashtags:,} hashtags x {args.dim}-d "
            f"(clustered, BERT-like), {args.trees} Annoy trees, Redis at {args.url} on the same machine.",
            "",
            "| measure | value | target |",
            "|---|---|---|",
            f"| index build, raw cosine, depth 10, Annoy candidates | {raw_s:.1f} s | |",
            f"| index build, {DEFAULT_METHOD} (the index job's default), depth {depth} | **{build_s:.1f} s** "
            "| ≤ 60 s |",
            f"| recall@10 of the raw table (Annoy) vs exact ({len(queries)} hashtags) | **{recall:.3f}** "
            "| ≥ 0.95 |",
            f"| neighbour table published to Redis (what scorers load) | {stored / 1e6:.1f} MB "
            f"({stored / args.hashtags:.0f} B per hashtag; the Annoy file, not published: "
            f"{annoy_bytes / 1e6:.1f} MB) | |",
            f"| save to the directory store / publish to Redis | {save_s:.2f} s / {publish_s:.2f} s | |",
            f"| scorer load from Redis / from the directory (checksums checked) | {redis_load_s:.2f} s / "
            f"{dir_load_s:.2f} s | |",
            f"| scoring, first pass over a fresh table (cold) | {cold:,.0f} events/s "
            f"({min(cold_rates):,.0f}–{max(cold_rates):,.0f}) | cold = warm |",
            f"| scoring, same cache again (warm) | {warm:,.0f} events/s "
            f"({min(warm_rates):,.0f}–{max(warm_rates):,.0f}); cold/warm **{cold / warm:.2f}** | |",
            "",
        ]
    )
    print(report)
    if args.out:
        args.out.write_text(report)
    return report


if __name__ == "__main__":
    main()
