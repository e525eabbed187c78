"""What the index build costs in memory and time, against a baseline tree (issue 27 §5).

For each ``--sizes`` vocabulary (``bench.bench_index.vocabulary``: clustered BERT-like
vectors, Zipf counts, ``--dim``), the build as the index job runs it
(``AnnoyThesaurus.build``: the default hubness method, ``--depth``, the Annoy index on all
cores), by this tree and, with ``--baseline DIR`` (a source tree, e.g. main exported by
``git -C /work/main archive main | tar -x -C /tmp/main-src``), by that one: each build in a
fresh process on the same vectors (read from one ``.npz`` file), alternating ABBA. Per build:
wall and CPU seconds, the load average around it, the process's resident memory once the
vectors are loaded and its peak (``ru_maxrss``: the whole process, vectors included), and a
SHA-256 of the table (neighbour ids, distances, the method's per-hashtag statistics), so that
the two trees' tables are shown identical or not; with ``--queries N``, this tree's first table's
recall@10 and @depth on N random hashtags against the same re-ranking over all pairs.

    python -m bench.bench_build_memory --sizes 100000,300000 --baseline /tmp/main-src
    python -m bench.bench_build_memory --sizes 30000 --dim 64 --rounds 1  # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from bench.bench_index import vocabulary
from bench.results import (
    Run,
    alternate,
    baseline_ratios,
    bench_command,
    compared_trees,
    machine,
    publish,
    run_cells,
    run_fresh,
)
from workers.adapters.files.annoy_thesaurus import DEFAULT_DEPTH

# One build in a fresh process with the code of the source tree given (sys.argv[1]).
BUILD_ONCE = """
import hashlib, json, os, resource, sys, time
import numpy as np
tree, data, trees, depth, queries = sys.argv[1:6]
sys.path.insert(0, tree)
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus
with np.load(data) as stored:
    vectors, counts = stored["vectors"], stored["counts"].tolist()
names = [f"tag{i}" for i in range(len(vectors))]
rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
load = os.getloadavg()[0]
wall, cpu = time.perf_counter(), time.process_time()
built = AnnoyThesaurus.build(names, vectors, counts=counts, depth=int(depth), n_trees=int(trees),
                             model_id="bench", n_jobs=-1)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
table = built.table
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
digest = hashlib.sha256()
for array in (table.neighbour_ids, table.distances, *(table.stats[k] for k in sorted(table.stats))):
    digest.update(np.ascontiguousarray(array).tobytes())
recall = {}
if int(queries):  # this tree only: rows other than the build's own sample, against all pairs
    from bench.bench_index import exact_top
    from stream.synonyms.neighbour_table import ranking_space
    from stream.synonyms.thesaurus import kept_unit_rows
    space, _ = ranking_space(kept_unit_rows(names, vectors, counts, 1), True)
    picked = np.random.default_rng(7).choice(len(names), size=int(queries), replace=False)
    shared = {10: 0, int(depth): 0}
    for lo in range(0, len(picked), 20):
        part = picked[lo : lo + 20]
        truth = exact_top(built, space, part, int(depth))
        for k in shared:
            for t, f in zip(truth[:, :k], table.neighbour_ids[part, :k]):
                shared[k] += len(set(t.tolist()) & set(f.tolist()))
    recall = {k: v / (len(picked) * k) for k, v in shared.items()}
print(json.dumps({"wall": wall, "cpu": cpu, "load": [load, os.getloadavg()[0]], "rss_before": rss,
                  "peak": peak, "table": digest.hexdigest(), "search": table.metadata.search,
                  "recall": recall}))
"""


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="100000,300000", help="vocabulary sizes, comma-separated")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--trees", type=int, default=50)
    p.add_argument("--depth", type=int, default=DEFAULT_DEPTH)
    p.add_argument("--rounds", type=int, default=2, help="builds per tree and size (ABBA)")
    p.add_argument("--baseline", type=Path, help="a source tree whose build is compared")
    p.add_argument(
        "--queries",
        type=int,
        default=0,
        help="this tree's first build: recall@10 / @depth of the table on this many random hashtags "
        "against the same re-ranking over all pairs (exact)",
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    trees = compared_trees(args.baseline)
    load_before = os.getloadavg()[0]
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "vocabulary.npz"
            _, vectors, counts = vocabulary(n, args.dim)
            np.savez(data, vectors=vectors, counts=counts)
            del vectors

            def once(label: str, tree: Path, r: int, data: Path = data) -> Run:
                queries = args.queries if label == "this" and r == 0 else 0
                return run_fresh(BUILD_ONCE, tree, data, args.trees, args.depth, queries)

            runs = alternate(trees, args.rounds, once, f"{n:,}")
        for label, got in runs.items():
            rows.append(
                f"| {n:,} | {label} | {run_cells(got)} "
                f"| {got[0]['table']!s:.16} | `{json.dumps(got[0]['search'])}` |"
            )
            if got[0]["recall"]:
                rows.append(
                    f"| {n:,} | {label}: recall@10 / @{args.depth} on {args.queries} random hashtags "
                    f"against the same re-ranking over all pairs | "
                    + " / ".join(f"{v:.4f}" for v in got[0]["recall"].values())
                    + " | | | | | | |"
                )
        if "baseline" in runs:
            ratio = baseline_ratios(runs)
            same = {str(x["table"]) for x in runs["this"] + runs["baseline"]}
            rows.append(
                f"| {n:,} | baseline / this | median {ratio['wall']:.2f}x | "
                f"{ratio['cpu']:.2f}x | | | peak {ratio['peak']:.2f}x; "
                f"above the vectors {ratio['above']:.2f}x "
                f"| tables {'identical' if len(same) == 1 else 'DIFFER'} | |"
            )
    lines = [
        f"{machine(bench_command('bench_build_memory', argv), load_before)}; {args.dim}-d clustered "
        f"vectors, depth {args.depth}, {args.trees} Annoy trees; each build a fresh process.",
        "",
        "| hashtags | tree | build s (each round) | CPU s | load | RSS with the vectors, GB | peak RSS, GB "
        "| table SHA-256 | search |",
        "|---:|---|---|---|---|---:|---:|---|---|",
        *rows,
    ]
    return publish(lines, args.out)


if __name__ == "__main__":
    main()
