"""A reader of a thesaurus store that checks every version it loads is whole: the thread
readers and, run as ``python -m tests.store_reader ROOT SIZES``, the reader in another process
of ``test_thesaurus``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from workers.adapters.files.store import ThesaurusStore


def read_until(
    store: ThesaurusStore, sizes: Mapping[str, int], stopped: Callable[[], bool]
) -> tuple[int, list[str]]:
    """Load the current version over and over until ``stopped()``: the loads, and what was
    wrong (an error, or a version whose size is not ``sizes[version]``)."""
    loads, problems = 0, []
    while not stopped():
        try:
            th = store.load_current()
        except Exception as exc:
            problems.append(repr(exc))
            continue
        if th is None or len(th) != sizes[th.version]:
            problems.append(f"bad load {th!r}")
        loads += 1
    return loads, problems


if __name__ == "__main__":
    root, sizes = Path(sys.argv[1]), json.loads(sys.argv[2])
    (root.parent / "reader-started").touch()
    loads, problems = read_until(ThesaurusStore(root), sizes, (root.parent / "stop").exists)
    print(json.dumps({"loads": loads, "problems": problems[:5]}))
