"""What every bench script does with its results: print them (the Markdown that goes into
BENCHMARKS.md) and, with ``--out FILE``, write the same text there."""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: One measured run in a fresh process: ``wall`` and ``cpu`` seconds, ``load`` (the load
#: average before and after), ``rss_before`` and ``peak`` (bytes), and what the bench adds.
Run = dict[str, Any]


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


def machine(command: str, load_before: float) -> str:
    """The sentence a section opens with: its command, the machine and the load around it.

    >>> machine("python -m bench.x", 0.5).startswith("Command: `python -m bench.x`. ")
    True
    """
    return (
        f"Command: `{command}`. {cpu_model()}, {os.cpu_count()} CPU cores (shared), load average "
        f"{load_before:.1f} / {os.getloadavg()[0]:.1f} before / after"
    )


def gb(value: float) -> str:
    return f"{float(value) / 1e9:.2f}"


def alternate(
    trees: Mapping[str, Path], rounds: int, once: Callable[[str, Path, int], Run], what: str
) -> dict[str, list[Run]]:
    """``rounds`` runs of ``once(label, tree, round)`` per tree, alternating ABBA with the
    baseline (the last tree) first, so that a drift of the machine's load falls on both;
    each run's line goes to stderr as it ends (``what``: the size measured)."""
    runs: dict[str, list[Run]] = {label: [] for label in trees}
    for r in range(rounds):
        for label in list(trees) if r % 2 else list(trees)[::-1]:
            run = once(label, trees[label], r)
            runs[label].append(run)
            print(
                f"{what} {label} round {r + 1}: {run['wall']:.1f} s, CPU {run['cpu']:.1f} s, peak RSS "
                f"{gb(run['peak'])} GB ({gb(run['rss_before'])} GB before), "
                f"load {run['load'][0]:.1f}-{run['load'][1]:.1f}",
                file=sys.stderr,
                flush=True,
            )
    return runs


def run_cells(got: Sequence[Run]) -> str:
    """A tree's runs as table cells: wall and CPU seconds and load of each, the memory before
    the measured work and the highest peak.

    >>> run = {"wall": 2.0, "cpu": 1.5, "load": [0.5, 0.7], "rss_before": 1e9, "peak": 3e9}
    >>> run_cells([run, run])
    '2.0, 2.0 | 1.5, 1.5 | 0.5-0.7, 0.5-0.7 | 1.00 | 3.00'
    """
    return " | ".join(
        [
            ", ".join(f"{x['wall']:.1f}" for x in got),
            ", ".join(f"{x['cpu']:.1f}" for x in got),
            ", ".join(f"{x['load'][0]:.1f}-{x['load'][1]:.1f}" for x in got),
            gb(got[0]["rss_before"]),
            gb(max(float(x["peak"]) for x in got)),
        ]
    )


def baseline_ratios(runs: Mapping[str, Sequence[Run]]) -> dict[str, float]:
    """Baseline over this tree, medians of the rounds: ``wall``, ``cpu``, ``peak`` and
    ``above`` (the peak above the memory before the measured work).

    >>> runs = {"this": [{"wall": 1.0, "cpu": 1.0, "peak": 3.0, "rss_before": 1.0}],
    ...         "baseline": [{"wall": 3.0, "cpu": 2.0, "peak": 5.0, "rss_before": 1.0}]}
    >>> baseline_ratios(runs)
    {'wall': 3.0, 'cpu': 2.0, 'peak': 1.6666666666666667, 'above': 2.0}
    """
    med = {
        label: {
            key: statistics.median(float(x[key]) for x in got)
            for key in ("wall", "cpu", "peak", "rss_before")
        }
        for label, got in runs.items()
    }
    base, this = med["baseline"], med["this"]
    out = {key: base[key] / this[key] for key in ("wall", "cpu", "peak")}
    out["above"] = (base["peak"] - base["rss_before"]) / (this["peak"] - this["rss_before"])
    return out


def run_fresh(script: str, *args: object) -> Run:
    """Run ``script`` (Python source) in a fresh interpreter with ``args``; the JSON object
    its last line of output prints."""
    done = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)], check=True, capture_output=True, text=True
    )
    run: Run = json.loads(done.stdout.strip().splitlines()[-1])
    return run


def compared_trees(baseline: Path | None) -> dict[str, Path]:
    """The source trees a bench compares: this repository as ``this`` and, when given, the
    ``baseline`` tree (its runs first, then ABBA: :func:`alternate`)."""
    return {"this": Path(__file__).resolve().parents[1], **({"baseline": baseline} if baseline else {})}
