"""Replaying archived feeds into Kafka: backtests that see what the live system saw.

:func:`replay` is the whole logic -- reading (via :mod:`stream.feeds`, several files
merged in event-time order), validation with the core parsers, filtering by event time,
pacing and the summary -- and hands every record to a ``send`` callable, so it runs
and is tested without Kafka.  :class:`KafkaSink` is the thin Kafka adapter
(kafka-python ``KafkaProducer``, ``acks="all"``, idempotent, bounded buffer).

What goes to Kafka for each good record:

* value: the record's **original line** from the file (its bytes, without the line
  terminator), never re-serialised; a CSV row has no JSON line, so it goes as the
  compact JSON object of its non-empty columns;
* key: the tweet id (recommendation events: their ``tweet_id``), UTF-8;
* Kafka timestamp: the tweet's ``created_at`` (recommendation events: their ``ts``),
  else the wall-clock time of sending.

Pacing (``speed``): the gaps between consecutive event times are kept, divided by
``speed``, against a monotonic clock anchored at the first produced record, so
oversleeping or a slow broker never accumulates into drift (a late record is sent
at once and the schedule catches up).  ``speed=None`` sends as fast as the
producer accepts.  Events that go back in time (files not quite sorted) are sent
without a pause.

Note for Apache Kafka: records keep their original (2012-2013 for the sample feed)
timestamps, and time-based retention deletes a closed segment whose newest
timestamp is older than ``retention.ms``: give a replay topic ``retention.ms=-1``
(or a large value) if it must keep the records.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

from stream.feeds import SUFFIXES, ErrorLog, Parsed, iter_raw, merge_by_time, read_file
from stream.records import (
    Recommendation,
    RecordError,
    Tweet,
    parse_recommendation,
    parse_time,
    parse_tweet,
)

__all__ = [
    "BadLineError",
    "KafkaSink",
    "Kind",
    "Outgoing",
    "ProduceError",
    "ReplayError",
    "ReplaySummary",
    "detect_kind",
    "ensure_topic",
    "kind_from_topic",
    "parse_bound",
    "parse_speed",
    "replay",
    "summary_rows",
    "timestamp_ms",
]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)

#: Twitter API v1.1 streaming control messages found in stream archives: skipped, not bad.
CONTROL_MESSAGES = frozenset(
    {"delete", "scrub_geo", "limit", "status_withheld", "user_withheld", "disconnect", "warning"}
)


class Kind(StrEnum):
    """What a feed holds (and which parser validates it)."""

    tweets = "tweets"
    recommendations = "recommendations"


@dataclass(frozen=True)
class Outgoing:
    """One record to produce; ``where`` is ``path:line`` for error messages."""

    key: bytes | None
    value: bytes
    timestamp_ms: int
    where: str


Send = Callable[[Outgoing], None]


class ReplayError(Exception):
    """A replay stopped early; ``where`` is ``path:line`` (or a stage) and ``summary``
    what had happened until then (set by :func:`replay`)."""

    exit_code = 1

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message
        self.summary: ReplaySummary | None = None


class BadLineError(ReplayError):
    """A bad line under ``strict``: ``reason`` is the :class:`RecordError` code."""

    exit_code = 2

    def __init__(self, where: str, error: RecordError) -> None:
        super().__init__(where, str(error))
        self.reason = error.reason


class ProduceError(ReplayError):
    """The broker/producer failed a record: the run stops rather than drop it."""

    exit_code = 1


@dataclass
class ReplaySummary:
    """Counts and times of one replay.  ``produced`` counts records handed to ``send``
    (with :class:`KafkaSink` and a flush at the end: acknowledged by the broker)."""

    kind: Kind
    produced: int = 0
    lines_read: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    errors: ErrorLog = field(default_factory=ErrorLog)
    first_event: datetime | None = None
    last_event: datetime | None = None
    position: datetime | None = None  # the latest event time read so far (progress)
    wall_s: float = 0.0
    slept_s: float = 0.0
    stopped: str = "running"  # end | limit | error | strict | interrupted
    error: str | None = None

    @property
    def bad_lines(self) -> int:
        return self.errors.total

    @property
    def rate(self) -> float:
        """Produced records per wall-clock second."""
        return self.produced / self.wall_s if self.wall_s > 0 else 0.0

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        def iso(value: datetime | None) -> str | None:
            return value.isoformat() if value else None

        return {
            "kind": str(self.kind),
            "produced": self.produced,
            "lines_read": self.lines_read,
            "skipped": dict(self.skipped),
            "bad_lines": self.bad_lines,
            "bad_by_reason": dict(self.errors.by_reason),
            "first_bad_lines": list(self.errors.first),
            "first_event": iso(self.first_event),
            "last_event": iso(self.last_event),
            "wall_s": round(self.wall_s, 3),
            "records_per_s": round(self.rate, 1),
            "slept_s": round(self.slept_s, 3),
            "stopped": self.stopped,
            "error": self.error,
        }


def parse_speed(text: str | float | None) -> float | None:
    """``"max"`` (or None) → None (no pauses); else a positive factor.

    >>> parse_speed("10"), parse_speed("max"), parse_speed("0.5")
    (10.0, None, 0.5)
    """
    if text is None or (isinstance(text, str) and text.strip().lower() in ("max", "inf", "")):
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"speed must be a positive number or 'max', not {text!r}") from None
    if not value > 0:
        raise ValueError(f"speed must be a positive number or 'max', not {text!r}")
    return None if value == float("inf") else value


def parse_bound(text: str) -> datetime:
    """An ISO time for ``start``/``end`` (no zone = UTC); ValueError when unparseable.

    >>> parse_bound("2013-01-01").isoformat()
    '2013-01-01T00:00:00+00:00'
    """
    try:
        return parse_time(text)
    except RecordError as exc:
        raise ValueError(f"{text!r} is not an ISO time (like 2013-01-01T12:00:00Z)") from exc


def timestamp_ms(when: datetime) -> int:
    """Epoch milliseconds, exactly (no float rounding).

    >>> timestamp_ms(parse_time("2012-05-18T11:04:31.662Z"))
    1337339071662
    """
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - EPOCH) // _MS


def _time_of(value: Tweet | Recommendation) -> datetime | None:
    return value.created_at if isinstance(value, Tweet) else value.ts


def _key_of(value: Tweet | Recommendation) -> bytes:
    return (value.id if isinstance(value, Tweet) else value.tweet_id).encode("utf-8")


def _value_bytes(raw: str | dict[str, Any] | None) -> bytes:
    if isinstance(raw, str):
        # iter_raw reads with surrogateescape: this gives back the file's own bytes.
        return raw.rstrip("\r\n").encode("utf-8", errors="surrogateescape")
    return json.dumps(raw, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _control_message(raw: str | dict[str, Any] | None) -> str | None:
    """The type of a v1.1 streaming control message (``{"delete": ...}``), else None."""
    if not isinstance(raw, str):
        return None
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    if isinstance(obj, dict) and len(obj) == 1:
        (name,) = obj
        if name in CONTROL_MESSAGES:
            return str(name)
    return None


def _check_paths(paths: Sequence[str | Path]) -> list[Path]:
    if not paths:
        raise ValueError("no feed files given")
    out = []
    for path in map(Path, paths):
        if not path.exists():
            raise FileNotFoundError(f"feed file not found: {path}")
        if not path.name.endswith(SUFFIXES):
            raise ValueError(
                f"{path}: unsupported feed type (expected one of {', '.join(SUFFIXES)})"
            )
        out.append(path)
    return out


def _raw_bytes(raw: str | dict[str, Any]) -> bytes | dict[str, Any]:
    return raw.encode("utf-8", errors="surrogateescape") if isinstance(raw, str) else raw


def detect_kind(paths: Sequence[str | Path], *, from_line: int = 1, peek: int = 1000) -> Kind | None:
    """The kind of the first record (of the first ``peek`` per file) that parses as
    a recommendation event or a tweet; None when none does."""
    for i, path in enumerate(_check_paths(paths)):
        lines: Iterator[tuple[int, str | dict[str, Any]]] = iter_raw(
            path, start_line=from_line if i == 0 else 1
        )
        for n, (_, raw) in enumerate(lines):
            if n >= peek:
                break
            record = _raw_bytes(raw)
            for kind, parse in ((Kind.recommendations, parse_recommendation), (Kind.tweets, parse_tweet)):
                try:
                    parse(record)
                except RecordError:
                    continue
                return kind
    return None


def kind_from_topic(
    topic: str, *, tweets_topic: str = "tweets", recommendations_topic: str = "recommendations"
) -> Kind | None:
    """Guess the kind from a topic name; None when it says nothing (or both).

    >>> kind_from_topic("recs-backtest"), kind_from_topic("tweets.2013"), kind_from_topic("x")
    (<Kind.recommendations: 'recommendations'>, <Kind.tweets: 'tweets'>, None)
    """
    if topic == tweets_topic:
        return Kind.tweets
    if topic == recommendations_topic:
        return Kind.recommendations
    name = topic.lower()
    recs, tweets = "rec" in name, "tweet" in name
    if recs != tweets:
        return Kind.recommendations if recs else Kind.tweets
    return None


def replay(
    paths: Sequence[str | Path],
    send: Send,
    *,
    kind: Kind | str | None = None,
    speed: float | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    limit: int | None = None,
    from_line: int = 1,
    strict: bool = False,
    flush: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], float] = time.time,
    on_progress: Callable[[ReplaySummary], None] | None = None,
    progress_every: float = 0.2,
) -> ReplaySummary:
    """Replay feed files through ``send``, in event-time order; returns the summary.

    ``kind``: ``"tweets"`` / ``"recommendations"``, or None to detect it from the first
    good record.  ``speed``: None = no pauses, else gaps between event times / speed.
    ``start``/``end``: only records with event time in ``[start, end)`` (others, and
    records without a time when a bound is given, are counted in ``skipped``).
    ``limit``: stop after that many produced.  ``from_line``: 1-based line to resume
    from, in the **first** file only.  Bad lines are counted (``summary.errors``) and
    skipped; with ``strict`` the first raises :class:`BadLineError`.  A
    :class:`ProduceError` from ``send`` or ``flush`` stops the run and is re-raised
    with ``summary`` attached.  ``flush`` is called once at the end (also after
    ``limit``).  ``on_progress`` gets the live summary at the start, about every
    ``progress_every`` clock seconds, and at the end.
    """
    files = _check_paths(paths)
    if from_line < 1:
        raise ValueError(f"from_line is 1-based, not {from_line}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, not {limit}")
    if start is not None and end is not None and end <= start:
        raise ValueError(f"end ({end.isoformat()}) must be after start ({start.isoformat()})")
    if kind is None:
        kind = detect_kind(files, from_line=from_line) or Kind.tweets
    kind = Kind(kind)
    parse: Callable[[Any], Tweet | Recommendation] = (
        parse_tweet if kind is Kind.tweets else parse_recommendation
    )
    streams: list[Iterator[Parsed[Tweet | Recommendation]]] = [
        read_file(path, parse, start_line=from_line if i == 0 else 1) for i, path in enumerate(files)
    ]
    items = streams[0] if len(streams) == 1 else merge_by_time(streams, _time_of)

    summary = ReplaySummary(kind=kind)
    began = clock()
    last_report = began
    anchor: tuple[float, datetime] | None = None  # (clock, event time) of the first paced record
    pace_time: datetime | None = None  # latest event time so far: never schedule backwards
    if on_progress is not None:
        on_progress(summary)

    def stop(how: str, error: ReplayError | None = None) -> None:
        summary.stopped = how
        summary.wall_s = clock() - began
        if error is not None:
            summary.error = str(error)
            error.summary = summary
        if on_progress is not None:
            on_progress(summary)

    try:
        for item in items:
            if limit is not None and summary.produced >= limit:
                break
            summary.lines_read += 1
            where = f"{item.path}:{item.line}"
            if item.error is not None:
                control = _control_message(item.raw) if kind is Kind.tweets else None
                if control is not None:
                    summary.skip(f"control_message:{control}")
                    continue
                summary.errors.add(item)
                if strict:
                    raise BadLineError(where, item.error)
                continue
            assert item.value is not None
            when = _time_of(item.value)
            if when is not None and (summary.position is None or when > summary.position):
                summary.position = when
            if start is not None or end is not None:
                if when is None:
                    summary.skip("no_time")
                    continue
                if start is not None and when < start:
                    summary.skip("before_start")
                    continue
                if end is not None and when >= end:
                    summary.skip("after_end")
                    continue
            stamp = timestamp_ms(when) if when is not None else int(now() * 1000)
            if stamp < 0:  # Kafka timestamps start at 1970
                error = RecordError("bad_time", f"event time {when} is before 1970")
                summary.errors.add(Parsed(item.path, item.line, error=error, raw=item.raw))
                if strict:
                    raise BadLineError(where, error)
                continue

            if speed is not None and when is not None:
                pace_time = when if pace_time is None or when > pace_time else pace_time
                if anchor is None:
                    anchor = (clock(), when)
                else:
                    target = anchor[0] + (pace_time - anchor[1]).total_seconds() / speed
                    delay = target - clock()
                    if delay > 0:
                        sleep(delay)
                        summary.slept_s += delay

            send(Outgoing(_key_of(item.value), _value_bytes(item.raw), stamp, where))
            summary.produced += 1
            if when is not None:
                if summary.first_event is None:
                    summary.first_event = when
                summary.last_event = when
            if limit is not None and summary.produced >= limit:
                break  # before reading another line
            if on_progress is not None:
                tick = clock()
                if tick - last_report >= progress_every:
                    last_report = tick
                    summary.wall_s = tick - began
                    on_progress(summary)
        if limit is not None and summary.produced >= limit:
            summary.stopped = "limit"
        if flush is not None:
            flush()
    except BadLineError as exc:
        stop("strict", exc)
        raise
    except ProduceError as exc:
        stop("error", exc)
        raise
    except KeyboardInterrupt:
        stop("interrupted")
        raise
    stop("limit" if summary.stopped == "limit" else "end")
    return summary


class KafkaSink:
    """``send`` for :func:`replay`: a kafka-python producer with back-pressure.

    ``acks="all"`` and idempotence (no duplicates or reordering on retries) and a
    short ``linger_ms`` to batch.  In-flight data is bounded here: kafka-python 3
    has no ``buffer_memory`` (its accumulator grows without limit), so ``send``
    blocks while more than ``max_pending_bytes`` / ``max_pending`` records are
    unacknowledged, up to ``max_block_ms`` (then :class:`ProduceError`).  The first
    failed record is remembered by its ``path:line`` and raised as
    :class:`ProduceError` from the next ``send`` or from :meth:`flush`.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        linger_ms: int = 5,
        max_pending: int = 20_000,
        max_pending_bytes: int = 32 * 1024 * 1024,
        max_block_ms: int = 60_000,
        delivery_timeout_ms: int = 120_000,
        client_id: str = "reval-replay",
        **config: Any,
    ) -> None:
        from kafka import KafkaProducer

        self.topic = topic
        self.acked = 0
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.max_block_s = max_block_ms / 1000
        self._pending = 0
        self._pending_bytes = 0
        self._done = threading.Condition()
        self._failure: ProduceError | None = None
        self._producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            client_id=client_id,
            acks="all",
            enable_idempotence=True,
            max_in_flight_requests_per_connection=5,
            linger_ms=linger_ms,
            max_block_ms=max_block_ms,
            delivery_timeout_ms=delivery_timeout_ms,
            allow_auto_create_topics=False,
            **config,
        )

    @property
    def pending(self) -> int:
        """Records sent and not yet acknowledged (or failed)."""
        return self._pending

    def _settle(self, size: int, where: str, result: Any) -> None:
        # Runs on the producer's I/O thread, once per record: ``result`` is the
        # RecordMetadata, or the exception (errback).
        with self._done:
            self._pending -= 1
            self._pending_bytes -= size
            if isinstance(result, BaseException):
                if self._failure is None:
                    self._failure = ProduceError(
                        where, f"producing to {self.topic!r} failed: {result!r}"
                    )
            else:
                self.acked += 1
            self._done.notify_all()

    def _raise_failure(self) -> None:
        with self._done:
            failure = self._failure
        if failure is not None:
            raise failure

    def __call__(self, out: Outgoing) -> None:
        from kafka.errors import KafkaError

        size = len(out.value) + len(out.key or b"")
        with self._done:
            ready = self._done.wait_for(
                lambda: self._failure is not None
                or self._pending == 0
                or (
                    self._pending < self.max_pending
                    and self._pending_bytes + size <= self.max_pending_bytes
                ),
                timeout=self.max_block_s,
            )
            if self._failure is not None:
                raise self._failure
            if not ready:
                raise ProduceError(
                    out.where,
                    f"{self._pending:,} records unacknowledged by the broker for "
                    f"{self.max_block_s:.0f}s (topic {self.topic!r})",
                )
            self._pending += 1
            self._pending_bytes += size
        try:
            future = self._producer.send(
                self.topic, key=out.key, value=out.value, timestamp_ms=out.timestamp_ms
            )
        except (KafkaError, ValueError, AssertionError) as exc:
            with self._done:
                self._pending -= 1
                self._pending_bytes -= size
            raise ProduceError(out.where, f"producing to {self.topic!r} failed: {exc!r}") from exc
        future.add_both(self._settle, size, out.where)

    def flush(self, timeout: float | None = None) -> None:
        """Wait for every record sent so far; raise the first failure."""
        from kafka.errors import KafkaError

        try:
            self._producer.flush(timeout=timeout)
        except KafkaError as exc:
            raise ProduceError("flush", f"flushing to {self.topic!r} failed: {exc!r}") from exc
        self._raise_failure()

    def close(self, timeout: float = 10.0) -> None:
        self._producer.close(timeout=timeout)

    def __enter__(self) -> KafkaSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ensure_topic(bootstrap: str, topic: str, partitions: int, *, timeout: float = 30.0) -> bool:
    """Create ``topic`` with ``partitions`` if it does not exist (never let the broker
    auto-create it with its own default count); True when it was created."""
    from workers.broker import create_topics, topic_partitions

    if topic_partitions(bootstrap, [topic], timeout=timeout).get(topic):
        return False
    create_topics(bootstrap, {topic: partitions}, timeout=timeout)
    return True


def summary_rows(summary: ReplaySummary) -> list[tuple[str, str]]:
    """The summary as (label, text) rows for printing."""
    data = summary.as_dict()
    skipped = ", ".join(f"{k} {v}" for k, v in sorted(summary.skipped.items())) or "0"
    bad = ", ".join(f"{k} {v}" for k, v in sorted(summary.errors.by_reason.items()))
    rows = [
        ("kind", data["kind"]),
        ("produced", f"{summary.produced:,}"),
        ("lines read", f"{summary.lines_read:,}"),
        ("skipped", skipped),
        ("bad lines", f"{summary.bad_lines:,}" + (f" ({bad})" if bad else "")),
    ]
    if summary.errors.first:
        rows.append(("first bad lines", "\n".join(summary.errors.first)))
    rows += [
        ("first event", data["first_event"] or "-"),
        ("last event", data["last_event"] or "-"),
        ("wall seconds", f"{summary.wall_s:.2f}"),
        ("records/s", f"{summary.rate:,.0f}"),
        ("stopped", summary.stopped),
    ]
    if summary.error:
        rows.append(("error", summary.error))
    return rows
