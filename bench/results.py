"""What every bench script does with its results: print them (the Markdown that goes into
BENCHMARKS.md) and, with ``--out FILE``, write the same text there."""

from __future__ import annotations

import platform
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s), else the platform's word for it: what a
    section names as its machine."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bench_command(module: str, argv: Sequence[str] | None = None) -> str:
    """The command line a section quotes: ``python -m bench.MODULE`` and its arguments
    (``argv``, or the process's own), shell-quoted.

    >>> bench_command("bench_redis", ["--out", "my results.md"])
    "python -m bench.bench_redis --out 'my results.md'"
    """
    return f"python -m bench.{module} {shlex.join(sys.argv[1:] if argv is None else argv)}".strip()


def spread(values: Sequence[float]) -> str:
    """The range of a measurement's rounds, as a table cell shows it.

    >>> spread([1200.4, 980.0, 1500.2])
    '980–1,500'
    """
    return f"{min(values):,.0f}–{max(values):,.0f}"


def publish(lines: Sequence[str] | str, out: Path | None) -> str:
    """Print the results (``lines`` joined, one per line) and write them to ``out`` when
    given; return the text.

    >>> text = publish(["| a | b |", "|---|---|"], None)
    | a | b |
    |---|---|
    <BLANKLINE>
    """
    text = lines if isinstance(lines, str) else "\n".join(lines) + "\n"
    print(text)
    if out:
        out.write_text(text, encoding="utf-8")
    return text
