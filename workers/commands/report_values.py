"""Reading ``detection.json`` and ``series.json`` without trusting them: every value may be
null, missing or of the wrong type, and becomes ``—`` in a table or a gap in a plot.

>>> get_in({"a": {"b": 2}}, "a", "b"), get_in({"a": 3}, "a", "b")
(2, None)
>>> fmt(None), fmt(0.123456), count(12345.0), nums([1, None, "x"], 4)
('—', '0.1235', '12,345', [1.0, nan, nan, nan])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = ["NO_MATCH", "Note", "Table", "count", "day", "fmt", "get_in", "num", "nums", "text", "when"]

#: Exact match's delay at the #REval alert's false-alarm rate when none of its thresholds that
#: quiet fires on the drift (the goal at matched false alarms).
NO_MATCH = "— (no threshold at that rate fires)"


@dataclass(frozen=True)
class Table:
    """A table for the page: cells are plain text (the template escapes them); ``numeric``
    right-aligns columns by position."""

    header: list[str]
    rows: list[list[str]]
    numeric: list[bool] = field(default_factory=list)

    def is_numeric(self, column: int) -> bool:
        return column < len(self.numeric) and self.numeric[column]


@dataclass(frozen=True)
class Note:
    """A sentence in place of what a run does not have (a plot, a table)."""

    text: str


def get_in(data: Any, *keys: str) -> Any:
    """``data[k1][k2]...`` or None when any step is missing or not an object."""
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def num(value: Any) -> float | None:
    # bool is an int in Python; a stray true must not plot as 1.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return None if math.isnan(value) or math.isinf(value) else float(value)


def nums(values: Any, n: int | None = None) -> list[float]:
    """A plottable list: nulls and junk become NaN (a gap), padded or cut to ``n``."""
    items = values if isinstance(values, list) else []
    out = [math.nan if (x := num(v)) is None else x for v in items]
    if n is not None:
        out = (out + [math.nan] * n)[:n]
    return out


def when(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def day(value: Any) -> str:
    """The date part of an ISO time, or — ."""
    at = when(value)
    return "—" if at is None else at.date().isoformat()


def text(value: Any) -> str:
    return "—" if value is None else str(value)


def fmt(value: Any, spec: str = ".4g") -> str:
    x = num(value)
    return "—" if x is None else format(x, spec)


def count(value: Any) -> str:
    x = num(value)
    return "—" if x is None else f"{x:,.0f}"
