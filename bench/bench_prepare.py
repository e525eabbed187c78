"""Embed preparation alone: ``stream.intake.cleaning.prepare`` tweets/s in one process, against a
baseline tree in the same run.

Why: the embed worker's admit step (cleaning, language, dedup keys) runs before the
encoder; issue 36 asks for >= 20,000 feed tweets/s per process.  This times exactly that
step over the bundled feed's tweets (parsed first, not timed), one process per tree and
round, alternating (A B B A ...: the machine is shared and noisy), and checks that both
trees prepared the same texts, hashtags and keys.

    git archive 0123abc | tar -x -C /tmp/before     # the tree to compare with
    python -m bench.bench_prepare --baseline /tmp/before --rounds 4

The issue's other route -- "N processes scaling >= 0.8 N" -- is timed by ``--processes``: this
tree's :class:`~workers.service.preparing.Preparer` (what the embed worker runs with
``REVAL_PREPARE_WORKERS``) over the feed's raw records in batches of ``--batch``, the next batch
submitted while the current one is collected (the worker's lookahead), for each process count
in alternating order; the pool's start and a warm-up batch are outside the timing.  The rate
per process count is compared with one process (the scaling), and every count's output with
the role's thread (0 processes).

    python -m bench.bench_prepare --processes 0,1,2 --rounds 3
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import gzip, hashlib, json, sys, time
from stream.intake.cleaning import prepare, Prepared
from stream.intake.records import parse_tweet
tweets = []
with gzip.open(sys.argv[1], "rt", encoding="utf-8") as src:
    for line in src:
        try:
            tweets.append(parse_tweet(line))
        except Exception:
            pass
prepare(tweets[0])  # imports NLTK and py3langid outside the timing
start = time.perf_counter()
out = [prepare(t) for t in tweets]
seconds = time.perf_counter() - start
digest = hashlib.sha256()
for p in out:
    digest.update(repr((p.text, p.hashtags, p.dedup_keys) if isinstance(p, Prepared) else p.reason).encode())
print(json.dumps({"tweets": len(tweets), "seconds": seconds, "digest": digest.hexdigest()}))
"""


def run(tree: Path, feed: Path) -> dict[str, float | str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(feed)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=tree,
    )
    result: dict[str, float | str] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _digest(admitted: Sequence[object]) -> str:
    from stream.intake.cleaning import Prepared

    digest = hashlib.sha256()
    for p in admitted:
        key = (p.text, p.hashtags, p.dedup_keys) if isinstance(p, Prepared) else getattr(p, "reason", p)
        digest.update(repr(key).encode())
    return digest.hexdigest()


def time_processes(values: list[bytes], processes: int, batch: int) -> tuple[float, str]:
    """Prepared records/s of a :class:`Preparer` with ``processes`` over ``values``, and the
    digest of its output."""
    from workers.service.preparing import Preparer

    preparer = Preparer(processes, language_filter=True)
    try:
        preparer(values[: 4 * batch])  # the processes' start and imports, untimed
        chunks = [values[i : i + batch] for i in range(0, len(values), batch)]
        out = []
        start = time.perf_counter()
        pending = preparer.submit(chunks[0])
        for i, chunk in enumerate(chunks):
            current = pending
            pending = preparer.submit(chunks[i + 1]) if i + 1 < len(chunks) else None
            out += preparer.collect(current) if current is not None else preparer(chunk)
        seconds = time.perf_counter() - start
    finally:
        preparer.close()
    return len(values) / seconds, _digest(out)


def scaling(feed: Path, counts: list[int], rounds: int, batch: int, limit: int | None = None) -> None:
    with gzip.open(feed, "rb") as src:
        values = [line.rstrip(b"\n") for line in src if line.strip()][:limit]
    rates: dict[int, list[float]] = {n: [] for n in counts}
    digests: dict[int, set[str]] = {n: set() for n in counts}
    for i in range(rounds):
        for n in counts if i % 2 == 0 else list(reversed(counts)):
            rate, digest = time_processes(values, n, batch)
            rates[n].append(rate)
            digests[n].add(digest)
    reference = digests[counts[0]]
    same = all(d == reference and len(d) == 1 for d in digests.values())
    one = statistics.median(rates[1]) if 1 in rates else None
    print(
        f"feed: {feed.name}, {len(values):,} records, batches of {batch}, {rounds} rounds, "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; same output for every count: {same}"
    )
    print("| preparing processes | prepared records/s (median) | rounds | x one process | per process |")
    print("|---:|---:|---|---:|---:|")
    for n, values_ in rates.items():
        median = statistics.median(values_)
        ratio = f"{median / one:.2f}x" if one and n > 0 else ""
        per = f"{median / n:,.0f}" if n > 0 else ""
        print(f"| {n} | {median:,.0f} | {', '.join(f'{v:,.0f}' for v in values_)} | {ratio} | {per} |")
    if not same:
        raise SystemExit("the process counts prepared different outputs")


def main() -> None:
    from workers.adapters.files.feeds import sample_feed

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", type=Path, help="a tree of the code to compare with")
    p.add_argument("--processes", help="comma-separated process counts to time instead, e.g. 0,1,2")
    p.add_argument("--batch", type=int, default=4096, help="records per batch (--processes)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--limit", type=int, help="the feed's first N records only (--processes)")
    p.add_argument("--feed", type=Path, default=sample_feed())
    args = p.parse_args()
    if args.processes:
        scaling(args.feed, [int(n) for n in args.processes.split(",")], args.rounds, args.batch, args.limit)
        return
    if args.baseline is None:
        p.error("give --baseline TREE or --processes COUNTS")
    trees = {"baseline": args.baseline.resolve(), "this tree": ROOT}
    rates: dict[str, list[float]] = {name: [] for name in trees}
    digests: dict[str, set[str]] = {name: set() for name in trees}
    for i in range(args.rounds):
        order = list(trees) if i % 2 == 0 else list(reversed(trees))
        for name in order:
            r = run(trees[name], args.feed)
            rates[name].append(float(r["tweets"]) / float(r["seconds"]))
            digests[name].add(str(r["digest"]))
    same = digests["baseline"] == digests["this tree"] and len(digests["this tree"]) == 1
    print(f"feed: {args.feed.name}, {args.rounds} rounds, one process each; same output: {same}")
    print("| tree | prepared tweets/s (median) | rounds |")
    print("|---|---|---|")
    for name, values in rates.items():
        print(f"| {name} | {statistics.median(values):,.0f} | {', '.join(f'{v:,.0f}' for v in values)} |")
    ratio = statistics.median(rates["this tree"]) / statistics.median(rates["baseline"])
    print(f"\nratio this tree / baseline: {ratio:.2f}x")
    print(
        "sha256 of the outputs:",
        hashlib.sha256("".join(sorted(digests["this tree"])).encode()).hexdigest()[:16],
    )
    if not same:
        raise SystemExit("the two trees prepared different outputs")


if __name__ == "__main__":
    main()
