"""Embed preparation alone: ``stream.cleaning.prepare`` tweets/s in one process, against a
baseline tree in the same run.

Why: the embed worker's admit step (cleaning, language, dedup keys) runs before the
encoder; issue 36 asks for >= 20,000 feed tweets/s per process.  This times exactly that
step over the bundled feed's tweets (parsed first, not timed), one process per tree and
round, alternating (A B B A ...: the machine is shared and noisy), and checks that both
trees prepared the same texts, hashtags and keys.

    git archive 0123abc | tar -x -C /tmp/before     # the tree to compare with
    python -m bench.bench_prepare --baseline /tmp/before --rounds 4
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import gzip, hashlib, json, sys, time
from stream.cleaning import prepare, Prepared
from stream.records import parse_tweet
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


def main() -> None:
    from workers.adapters.feeds import sample_feed

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", type=Path, required=True, help="a tree of the code to compare with")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--feed", type=Path, default=sample_feed())
    args = p.parse_args()
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
