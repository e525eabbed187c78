"""What a scorer's set-up per thesaurus version costs, against a baseline tree.

The scorer loads each new version once and builds its view of it before scoring
(``neighbour_cache(table, max_k, ks=DEFAULT_KS)``: the popularity bands and the null model
of the chance correction, with the null's tables for the k grid).  For each ``--sizes``
vocabulary, a synthetic neighbour table (``--depth`` neighbours per hashtag, drawn within
clusters of ``--cluster`` ids as a real table's topics are, a few ids left empty, Zipf
counts) is written once; then this tree and, with ``--baseline DIR`` (a source tree, e.g.
main exported by ``git -C /work/main archive main | tar -x -C /tmp/main-src``), that one
build the view in a fresh process each, alternating ABBA.  Per run: wall and CPU seconds of
the set-up alone, the process's memory with the table loaded and its peak (``ru_maxrss``),
and a SHA-256 of the null model's expectations for ``--queries`` random ground truths and
list lengths (the public ``ChanceModel.expected``), so the two trees are shown to give the
same values to the bit or not.

    python -m bench.bench_scorer_setup --sizes 100000,1000000 --baseline /tmp/main-src
    python -m bench.bench_scorer_setup --sizes 20000 --rounds 1  # smoke
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np

from bench import results
from bench.results import Run
from workers.adapters.files.annoy_thesaurus import DEFAULT_DEPTH

# One set-up in a fresh process with the code of the source tree given (sys.argv[1]).
SETUP_ONCE = """
import hashlib, json, os, resource, sys, time
import numpy as np
tree, data, queries = sys.argv[1:4]
sys.path.insert(0, tree)
from stream.synonyms.neighbour_table import NeighbourTable
from stream.evaluation.scoring import DEFAULT_KS
from stream.synonyms.thesaurus import ThesaurusMetadata
from workers.adapters.files.annoy_thesaurus import neighbour_cache
with np.load(data) as stored:
    ids, counts = stored["ids"], stored["counts"]
n, depth = ids.shape
names = [f"tag{i}" for i in range(n)]
meta = ThesaurusMetadata(model_id="bench", dimension=0, count=n, built_at="", version="bench",
                         n_trees=0, metric="angular", min_count=1, depth=depth)
table = NeighbourTable(names, ids, np.zeros(ids.shape, dtype=np.float32), counts, meta)
del ids
rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
load = os.getloadavg()[0]
wall, cpu = time.perf_counter(), time.process_time()
ks = tuple(k for k in DEFAULT_KS if k <= depth)  # the scorer's grid, as deep as the table goes
cache = neighbour_cache(table, max(ks), ks=ks)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
rng = np.random.default_rng(11)
digest = hashlib.sha256()
for _ in range(int(queries)):
    truth = [names[i] for i in dict.fromkeys(rng.integers(0, n, int(rng.integers(1, 4))).tolist())]
    m = int(rng.integers(1, 21))
    digest.update(np.asarray(cache.chance.expected(m, truth, ks)).tobytes())
print(json.dumps({"wall": wall, "cpu": cpu, "load": [load, os.getloadavg()[0]], "rss_before": rss,
                  "peak": peak, "expectations": digest.hexdigest()}))
"""


def synthetic_table(n: int, depth: int, cluster: int, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Neighbour ids (each row's within its cluster of ids, 2% empty) and Zipf counts."""
    rng = np.random.default_rng(seed)
    ids = np.empty((n, depth), dtype=np.int32)
    for lo in range(0, n, 65_536):  # in blocks: no n x depth int64 temporary
        rows = np.arange(lo, min(n, lo + 65_536))
        base = (rows // cluster * cluster)[:, None]
        block = base + rng.integers(0, cluster, (len(rows), depth))
        block[block >= n] -= cluster
        block[rng.random(block.shape) < 0.02] = -1
        ids[lo : lo + len(rows)] = block
    counts = np.maximum(1, (1e6 / np.arange(1, n + 1)) ** 0.8).astype(np.int64)
    return ids, rng.permutation(counts)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="100000,1000000", help="vocabulary sizes, comma-separated")
    p.add_argument("--depth", type=int, default=DEFAULT_DEPTH)
    p.add_argument("--cluster", type=int, default=1000, help="ids a row's neighbours are drawn among")
    p.add_argument("--rounds", type=int, default=2, help="set-ups per tree and size (ABBA)")
    p.add_argument("--queries", type=int, default=2000, help="expectations hashed per run")
    p.add_argument("--baseline", type=Path, help="a source tree whose set-up is compared")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    trees = results.compared_trees(args.baseline)
    load_before = os.getloadavg()[0]
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "table.npz"
            ids, counts = synthetic_table(n, args.depth, args.cluster)
            np.savez(data, ids=ids, counts=counts)
            del ids

            def once(_label: str, tree: Path, _round: int, data: Path = data) -> Run:
                return results.run_fresh(SETUP_ONCE, tree, data, args.queries)

            runs = results.alternate(trees, args.rounds, once, f"{n:,}")
        rows += [
            f"| {n:,} | {label} | {results.run_cells(got)} | {got[0]['expectations']!s:.16} |"
            for label, got in runs.items()
        ]
        if "baseline" in runs:
            ratio = results.baseline_ratios(runs)
            same = {x["expectations"] for got in runs.values() for x in got}
            rows.append(
                f"| {n:,} | baseline / this | median **{ratio['wall']:.2f}x** | {ratio['cpu']:.2f}x | | "
                f"| above the table: {ratio['above']:.2f}x "
                f"| {'identical' if len(same) == 1 else 'DIFFERENT'} |"
            )
    lines = [
        "## The scorer's set-up per thesaurus version (bench/bench_scorer_setup.py)",
        "",
        f"{results.machine(results.bench_command('bench_scorer_setup', argv), load_before)}; synthetic "
        f"tables, depth {args.depth}, neighbours within clusters of {args.cluster} ids; the k grid of "
        "the scorer; the peak is `ru_maxrss` of the set-up's process (table included).",
        "",
        "| hashtags | tree | set-up s (each round) | CPU s | load | RSS with the table, GB | peak RSS, GB "
        f"| SHA-256 of {args.queries} expectations |",
        "|---:|---|---|---|---|---:|---:|---|",
        *rows,
    ]
    return results.publish(lines, args.out)


if __name__ == "__main__":
    main()
