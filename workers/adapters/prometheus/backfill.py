"""Backfill into Prometheus: counter series at event time, as TSDB blocks.

An archived feed scored today would land in Prometheus at today's date.  This adapter
writes what the scoring workers would have exported, sampled at *event* time, as an
OpenMetrics file, and turns it into TSDB blocks with ``promtool tsdb
create-blocks-from openmetrics`` (Debian's ``prometheus`` package).  Move the blocks
into a Prometheus data directory (or start one on that directory) and the recording
rules, alerts and Grafana panels show the feed at its true dates.

Prometheus deletes blocks older than its retention (15 days by default) when it
starts: give it ``--storage.tsdb.retention.time`` longer than the feed's age.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
import numpy.typing as npt

__all__ = ["Family", "Series", "counter_at", "create_blocks", "write_openmetrics"]


@dataclass(frozen=True)
class Series:
    """One labelled sample stream: ``values[i]`` at ``times[i]`` (seconds since the epoch)."""

    labels: Mapping[str, str]
    times: npt.NDArray[np.float64]
    values: npt.NDArray[np.float64]
    suffix: str = ""  # "_sum", "_count" or "_total" after the family name


@dataclass(frozen=True)
class Family:
    """A metric family as OpenMetrics declares it (``counter`` or ``summary``)."""

    name: str
    kind: str
    help: str
    series: list[Series]


def counter_at(
    event_times: npt.NDArray[np.float64], increments: npt.NDArray[np.float64], at: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """A counter's value at each instant of ``at``: the sum of the increments of the events
    at or before it (NaN increments count as 0).

    >>> counter_at(np.array([1.0, 2.0, 5.0]), np.array([1.0, np.nan, 2.0]), np.array([0.0, 2.0, 9.0]))
    array([0., 1., 3.])
    """
    totals = np.concatenate([[0.0], np.cumsum(np.nan_to_num(increments, nan=0.0))])
    return totals[np.searchsorted(event_times, at, side="right")]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def write_openmetrics(families: Iterable[Family], out: IO[str]) -> int:
    """Write ``families`` as OpenMetrics text (samples with timestamps, ``# EOF`` last);
    returns the number of samples.  Each family's samples are contiguous, as the format
    requires, and each series' timestamps must grow."""
    written = 0
    for family in families:
        out.write(f"# HELP {family.name} {_escape(family.help)}\n# TYPE {family.name} {family.kind}\n")
        for series in family.series:
            if len(series.times) > 1 and np.any(np.diff(series.times) <= 0):
                raise ValueError(f"{family.name}{series.suffix}: sample times must strictly grow")
            head = f"{family.name}{series.suffix}{_labels(series.labels)} "
            out.writelines(
                f"{head}{value:.17g} {t:.3f}\n"
                for t, value in zip(series.times.tolist(), series.values.tolist(), strict=True)
            )
            written += len(series.times)
    out.write("# EOF\n")
    return written


def create_blocks(
    openmetrics: Path, out_dir: Path, *, promtool: str = "promtool", max_block_duration: str = "744h"
) -> list[Path]:
    """``promtool tsdb create-blocks-from openmetrics``: the TSDB block directories made
    under ``out_dir``.  Raises :class:`RuntimeError` with promtool's own message.

    ``max_block_duration`` (a multiple of 2 h): promtool's default cuts a block every 2 h
    of sample time, i.e. thousands of small blocks for a year-long feed; 31 days is about
    what Prometheus' own compaction would make of them."""
    binary = shutil.which(promtool)
    if binary is None:
        raise RuntimeError(
            f"{promtool} not found: install Debian's prometheus package (apt-get install prometheus)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in out_dir.iterdir()}
    done = subprocess.run(
        [
            binary,
            "tsdb",
            "create-blocks-from",
            "--quiet",
            "openmetrics",
            f"--max-block-duration={max_block_duration}",
            str(openmetrics),
            str(out_dir),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(f"promtool could not build blocks from {openmetrics}: {' '.join(message[-3:])}")
    return sorted(p for p in out_dir.iterdir() if p.is_dir() and p.name not in before)
