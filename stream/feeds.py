"""Reading feed files: ``.jsonl``, ``.jsonl.gz``, ``.json`` (one object a line) and ``.csv``.

A file adapter only: it yields raw records with their line numbers and leaves
parsing to :mod:`stream.records`, so a bad line is reported with where it was
and never stops the run.
"""

from __future__ import annotations

import csv
import gzip
import heapq
import io
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any, Generic, TypeVar

from stream.records import RecordError, Tweet, parse_tweet

T = TypeVar("T")
SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson", ".csv", ".csv.gz")


def sample_feed() -> Path:
    """The CrisisLexT26 tweets bundled with the package (MIT licence beside it)."""
    return Path(str(resources.files("stream.data") / "crisislex-t26.jsonl.gz"))


def _open_text(path: Path) -> io.TextIOBase:
    if path.name.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="surrogateescape")
    return open(path, encoding="utf-8", errors="surrogateescape", newline="")


def iter_raw(
    path: str | Path, *, start_line: int = 1
) -> Iterator[tuple[int, str | dict[str, Any]]]:
    """Yield ``(line_number, record)``: a JSON line as text, or a CSV row as a dict.

    Blank lines are skipped.  ``start_line`` resumes a file part-way (1-based;
    for CSV it counts data rows after the header as lines 2, 3, ...).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"feed file not found: {path}")
    if not path.name.endswith(SUFFIXES):
        raise ValueError(f"{path}: unsupported feed type (expected one of {', '.join(SUFFIXES)})")
    with _open_text(path) as handle:
        if ".csv" in path.suffixes:
            reader = csv.DictReader(handle)
            for row in reader:
                line = reader.line_num
                if line >= start_line:
                    yield (
                        line,
                        {k: v for k, v in row.items() if k is not None and v not in ("", None)},
                    )
            return
        for line, text in enumerate(handle, start=1):
            if line >= start_line and text.strip():
                yield line, text


@dataclass(frozen=True)
class Parsed(Generic[T]):
    """One line's outcome: ``value`` or ``error`` (never both)."""

    path: Path
    line: int
    value: T | None = None
    error: RecordError | None = None
    raw: str | dict[str, Any] | None = None


def _raw_for_parse(raw: str | dict[str, Any]) -> bytes | dict[str, Any]:
    # Lines were read with surrogateescape, so invalid UTF-8 surfaces as a record error.
    if isinstance(raw, str):
        return raw.encode("utf-8", errors="surrogateescape")
    return raw


def read_file(
    path: str | Path,
    parse: Callable[[Any], T],
    *,
    start_line: int = 1,
) -> Iterator[Parsed[T]]:
    """Parse every record of one file with ``parse``; errors are yielded, not raised."""
    path = Path(path)
    for line, raw in iter_raw(path, start_line=start_line):
        try:
            yield Parsed(path, line, value=parse(_raw_for_parse(raw)), raw=raw)
        except RecordError as exc:
            yield Parsed(path, line, error=exc, raw=raw)


def read_tweets(paths: Iterable[str | Path], *, start_line: int = 1) -> Iterator[Parsed[Tweet]]:
    """Tweets of several files, one file after the other."""
    for path in paths:
        yield from read_file(path, parse_tweet, start_line=start_line)


def merge_by_time(
    streams: Iterable[Iterator[Parsed[T]]], time_of: Callable[[T], datetime | None]
) -> Iterator[Parsed[T]]:
    """Merge per-file streams (each already in time order) into one event-time order.

    Errors and records without a time are passed on at their position in their file.
    """

    def keyed(
        index: int, items: Iterator[Parsed[T]]
    ) -> Iterator[tuple[float, int, int, Parsed[T]]]:
        last = float("-inf")
        for n, item in enumerate(items):
            when = time_of(item.value) if item.value is not None else None
            if when is not None:
                last = max(last, when.timestamp())
            yield last, index, n, item

    for *_, item in heapq.merge(*(keyed(i, s) for i, s in enumerate(streams))):
        yield item


@dataclass
class ErrorLog:
    """Counts bad lines by reason and keeps the first few locations for the summary."""

    keep: int = 10

    def __post_init__(self) -> None:
        self.by_reason: dict[str, int] = {}
        self.first: list[str] = []

    def add(self, item: Parsed[Any]) -> None:
        assert item.error is not None
        self.by_reason[item.error.reason] = self.by_reason.get(item.error.reason, 0) + 1
        if len(self.first) < self.keep:
            self.first.append(f"{item.path}:{item.line}: {item.error}")

    @property
    def total(self) -> int:
        return sum(self.by_reason.values())
