"""Feed files: ``.jsonl``, ``.jsonl.gz``, ``.json`` (one object a line) and ``.csv``.

The file adapter: it reads raw records with their line numbers and hands them to
the core parsers (:mod:`stream.intake.records`), so a bad line is reported with where it
was and never stops the run.  Replays of files go through here into the core's
:func:`stream.feeds.replay.replay`.
"""

from __future__ import annotations

import csv
import gzip
import io
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from stream.feeds.replay import (
    Kind,
    ReplaySummary,
    Send,
    detect_kind,
    merge_by_time,
    parser_for,
    replay,
    time_of,
)
from stream.intake.records import Parsed, Recommendation, RecordError, Tweet, parse_tweet

T = TypeVar("T")
SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson", ".csv", ".csv.gz")


def sample_feed() -> Path:
    """The CrisisLexT26 tweets bundled with the package (MIT licence beside it)."""
    return Path(str(resources.files("stream.data") / "crisislex-t26.jsonl.gz"))


def check_paths(paths: Sequence[str | Path]) -> list[Path]:
    """The feed paths, each an existing file of a supported type (else a clear error)."""
    if not paths:
        raise ValueError("no feed files given")
    out = []
    for path in map(Path, paths):
        if not path.exists():
            raise FileNotFoundError(f"feed file not found: {path}")
        if path.is_dir():
            raise ValueError(f"{path} is a directory, not a feed file")
        if not path.name.endswith(SUFFIXES):
            raise ValueError(f"{path}: unsupported feed type (expected one of {', '.join(SUFFIXES)})")
        out.append(path)
    return out


def check_output_path(path: Path) -> Path:
    """A path we may create or write: not a directory, its folder created if missing --
    checked before any work starts, so a run never fails at its end for want of a place."""
    if path.is_dir():
        raise ValueError(f"{path} is a directory; give a file name")
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create the folder {parent} for {path}: {exc.strerror or exc}") from None
    try:  # a probe, not os.access: root passes access checks on read-only and virtual file systems
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        raise ValueError(
            f"cannot write {path}: the folder {parent} is not writable ({exc.strerror or exc})"
        ) from None
    return path


def feed_bytes(paths: Iterable[str | Path]) -> int:
    """About how many bytes the records of ``paths`` hold: the files' sizes, a gzip file's
    uncompressed size from its trailer (ISIZE: exact below 4 GiB, modulo 2**32 above)."""
    total = 0
    for path in map(Path, paths):
        size = path.stat().st_size
        if path.suffix == ".gz" and size >= 18:
            with path.open("rb") as handle:
                handle.seek(-4, io.SEEK_END)
                size = int.from_bytes(handle.read(4), "little")
        total += size
    return total


def _open_text(path: Path) -> io.TextIOBase:
    # surrogateescape: invalid UTF-8 survives reading and surfaces as a record error.
    if path.name.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="surrogateescape")
    return open(path, encoding="utf-8", errors="surrogateescape", newline="")


def iter_raw(path: str | Path, *, start_line: int = 1) -> Iterator[tuple[int, str | dict[str, Any]]]:
    """Yield ``(line_number, record)``: a JSON line as text, or a CSV row as a dict.

    Blank lines are skipped.  ``start_line`` resumes a file part-way (1-based;
    for CSV it counts data rows after the header as lines 2, 3, ...).
    """
    (path,) = check_paths([path])
    if start_line < 1:
        raise ValueError(f"start line is 1-based, not {start_line}")
    with _open_text(path) as handle:
        if ".csv" in path.suffixes:
            reader = csv.DictReader(handle)
            for row in reader:
                line = reader.line_num
                if line >= start_line:
                    yield line, {k: v for k, v in row.items() if k is not None and v not in ("", None)}
            return
        for line, text in enumerate(handle, start=1):
            if line >= start_line and text.strip():
                yield line, text


def _raw_for_parse(raw: str | dict[str, Any]) -> bytes | dict[str, Any]:
    if isinstance(raw, str):
        return raw.encode("utf-8", errors="surrogateescape")
    return raw


def read_file(path: str | Path, parse: Callable[[Any], T], *, start_line: int = 1) -> Iterator[Parsed[T]]:
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


def detect_file_kind(paths: Sequence[str | Path], *, from_line: int = 1, peek: int = 1000) -> Kind | None:
    """What the feed files hold, from the first record that parses (None: no record does)."""
    for i, path in enumerate(check_paths(paths)):
        raws = (raw for _, raw in iter_raw(path, start_line=from_line if i == 0 else 1))
        found = detect_kind(raws, peek=peek)
        if found is not None:
            return found
    return None


def read_feeds(
    paths: Sequence[str | Path], kind: Kind, *, from_line: int = 1
) -> Iterator[Parsed[Tweet | Recommendation]]:
    """The records of several feed files of ``kind``, merged in event-time order.

    ``from_line`` resumes the **first** file part-way (1-based).
    """
    files = check_paths(paths)
    parse = parser_for(kind)
    streams = [read_file(p, parse, start_line=from_line if i == 0 else 1) for i, p in enumerate(files)]
    return streams[0] if len(streams) == 1 else merge_by_time(streams, time_of)


def replay_files(
    paths: Sequence[str | Path],
    send: Send,
    *,
    kind: Kind | str | None = None,
    from_line: int = 1,
    **options: Any,
) -> ReplaySummary:
    """:func:`stream.feeds.replay.replay` over feed files (``kind`` detected when None)."""
    files = check_paths(paths)
    if from_line < 1:
        raise ValueError(f"from_line is 1-based, not {from_line}")
    chosen = Kind(kind) if kind is not None else detect_file_kind(files, from_line=from_line) or Kind.tweets
    return replay(read_feeds(files, chosen, from_line=from_line), send, kind=chosen, **options)
