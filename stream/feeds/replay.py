"""Replaying archived feeds into Kafka: backtests that see what the live system saw.

:func:`replay` is the whole logic -- validation with the core parsers, filtering by
event time, pacing and the summary -- over records already read from feed files
(:mod:`workers.adapters.files.feeds` reads them, several files merged in event-time order by
:func:`merge_by_time`), and hands every record to a ``send`` callable, so it runs and is
tested without Kafka or files.  :class:`workers.adapters.kafka.kafka_client.KafkaSink` is the
Kafka ``send``.

What goes to Kafka for each good record:

* value: the record's **original line** from the file (its bytes, without the line
  terminator), never re-serialised; a CSV row has no JSON line, so it goes as the
  compact JSON object of its non-empty columns;
* key: the tweet id (recommendation events: their ``tweet_id``), UTF-8;
* Kafka timestamp: the tweet's ``created_at`` (recommendation events: their ``ts``),
  else -- or with ``timestamps="now"`` always -- the wall-clock time of sending.

Pacing (``speed``): the gaps between consecutive event times are kept, divided by
``speed``, against a monotonic clock anchored at the first produced record, so
oversleeping or a slow broker never accumulates into drift (a late record is sent
at once and the schedule catches up).  ``speed=None`` sends as fast as the
producer accepts.  Events that go back in time (files not quite sorted) are sent
without a pause.

Retention (:mod:`stream.feeds.retention`): with ``timestamps="event"`` records keep their
original (2012-2013 for the sample feed) timestamps, and Kafka's time-based retention
deletes a segment whose newest timestamp is older than ``retention.ms`` at its next
check, read or not.  ``refuse`` lets the caller stop the run, before the first record
is sent, where the topic would not keep it; ``timestamps="now"`` stamps records with
the time of sending instead (the event time stays in the record, where the workers
read it).
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar

from stream.feeds.retention import Timestamps
from stream.intake.records import (
    ErrorLog,
    Parsed,
    Recommendation,
    RecordError,
    Tweet,
    parse_recommendation,
    parse_time,
    parse_tweet,
)
from stream.options import parse_number

__all__ = [
    "BadLineError",
    "Kind",
    "Outgoing",
    "ProduceError",
    "RefusedError",
    "ReplayError",
    "ReplaySummary",
    "detect_kind",
    "kind_from_topic",
    "merge_by_time",
    "parse_bound",
    "parse_speed",
    "parser_for",
    "replay",
    "summary_rows",
    "time_of",
    "timestamp_ms",
]

T = TypeVar("T")

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


class RefusedError(ReplayError):
    """The target would not keep what the replay sends (:mod:`stream.feeds.retention`): nothing
    was sent.  Its text is the one line that says why and what to do."""

    exit_code = 2

    def __str__(self) -> str:
        return self.message


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
    stopped: str = "running"  # end | limit | error | strict | interrupted | refused
    error: str | None = None

    @property
    def bad_lines(self) -> int:
        return self.errors.total

    @property
    def rate(self) -> float:
        """Produced records per wall-clock second."""
        return self.produced / self.wall_s if self.wall_s > 0 else 0.0

    def stop(self, how: str, wall_s: float, error: ReplayError | None = None) -> None:
        """The run ended ``how`` (``stopped``) after ``wall_s``; a raised ``error`` gets this summary."""
        self.stopped = how
        self.wall_s = wall_s
        if error is not None:
            self.error = str(error)
            error.summary = self

    def sent(self, when: datetime | None) -> None:
        """One record produced, with its event time (None: the record has none)."""
        self.produced += 1
        if when is not None:
            if self.first_event is None:
                self.first_event = when
            self.last_event = when

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
    value = parse_number(text, f"speed must be a positive number or 'max', not {text!r}")
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


def _raw_bytes(raw: str | dict[str, Any]) -> bytes | dict[str, Any]:
    # Lines were read with surrogateescape: this gives back the file's own bytes.
    return raw.encode("utf-8", errors="surrogateescape") if isinstance(raw, str) else raw


def parser_for(kind: Kind) -> Callable[[Any], Tweet | Recommendation]:
    """The core parser that validates records of ``kind``."""
    return parse_tweet if kind is Kind.tweets else parse_recommendation


def detect_kind(raw_records: Iterable[str | dict[str, Any]], *, peek: int = 1000) -> Kind | None:
    """The kind of the first record (of the first ``peek``) that parses as a
    recommendation event or a tweet; None when none does.

    >>> detect_kind(['not json', '{"tweet_id": "1", "recommended": ["a"]}'])
    <Kind.recommendations: 'recommendations'>
    """
    for n, raw in enumerate(raw_records):
        if n >= peek:
            break
        record = _raw_bytes(raw)
        for kind in (Kind.recommendations, Kind.tweets):
            try:
                parser_for(kind)(record)
            except RecordError:
                continue
            return kind
    return None


def time_of(value: Tweet | Recommendation) -> datetime | None:
    """A record's event time: a tweet's ``created_at``, an event's ``ts``."""
    return value.created_at if isinstance(value, Tweet) else value.ts


def merge_by_time(
    streams: Iterable[Iterator[Parsed[T]]], when: Callable[[T], datetime | None]
) -> Iterator[Parsed[T]]:
    """Merge per-file streams (each already in time order) into one event-time order.

    Errors and records without a time are passed on at their position in their file.
    """

    def keyed(index: int, items: Iterator[Parsed[T]]) -> Iterator[tuple[float, int, int, Parsed[T]]]:
        last = float("-inf")
        for n, item in enumerate(items):
            at = when(item.value) if item.value is not None else None
            if at is not None:
                last = max(last, at.timestamp())
            yield last, index, n, item

    for *_, item in heapq.merge(*(keyed(i, s) for i, s in enumerate(streams))):
        yield item


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


class Pacer:
    """Keeps the gaps between event times, divided by ``speed``, on a monotonic clock.

    The schedule is anchored at the first event, so oversleeping or a slow sink never
    accumulates into drift (a late record goes at once and the schedule catches up);
    an event earlier than one already seen goes without a pause.

    >>> now = [0.0]
    >>> pacer = Pacer(10.0, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    >>> t0 = datetime(2013, 1, 1, tzinfo=UTC)
    >>> [pacer.wait(t0 + timedelta(seconds=s)) for s in (0, 20, 10, 30)]
    [0.0, 2.0, 0.0, 1.0]
    """

    def __init__(
        self,
        speed: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not speed > 0:
            raise ValueError(f"speed must be positive, not {speed!r}")
        self.speed = speed
        self.clock = clock
        self.sleep = sleep
        self._anchor: tuple[float, datetime] | None = None  # (clock, event time) of the first event
        self._latest: datetime | None = None  # never schedule backwards

    def wait(self, when: datetime) -> float:
        """Sleep until ``when`` is due; returns the seconds slept."""
        self._latest = when if self._latest is None or when > self._latest else self._latest
        if self._anchor is None:
            self._anchor = (self.clock(), when)
            return 0.0
        target = self._anchor[0] + (self._latest - self._anchor[1]).total_seconds() / self.speed
        delay = target - self.clock()
        if delay <= 0:
            return 0.0
        self.sleep(delay)
        return delay


def _check_bounds(limit: int | None, start: datetime | None, end: datetime | None) -> None:
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, not {limit}")
    if start is not None and end is not None and end <= start:
        raise ValueError(f"end ({end.isoformat()}) must be after start ({start.isoformat()})")


def _outside(when: datetime | None, start: datetime | None, end: datetime | None) -> str | None:
    """Why a record is outside ``[start, end)`` (a skip reason), or None when it is inside."""
    if start is None and end is None:
        return None
    if when is None:
        return "no_time"
    if start is not None and when < start:
        return "before_start"
    if end is not None and when >= end:
        return "after_end"
    return None


def _admit(
    item: Parsed[Tweet | Recommendation],
    kind: Kind,
    summary: ReplaySummary,
    start: datetime | None,
    end: datetime | None,
    strict: bool,
    now: Callable[[], float],
) -> tuple[int, datetime | None] | None:
    """The record's Kafka timestamp (ms) and event time, or None when it is skipped or bad
    (counted in ``summary``; with ``strict`` a bad one raises :class:`BadLineError`)."""
    where = f"{item.path}:{item.line}"
    if item.error is not None:
        control = _control_message(item.raw) if kind is Kind.tweets else None
        if control is not None:
            summary.skip(f"control_message:{control}")
            return None
        summary.errors.add(item)
        if strict:
            raise BadLineError(where, item.error)
        return None
    assert item.value is not None
    when = time_of(item.value)
    if when is not None and (summary.position is None or when > summary.position):
        summary.position = when
    reason = _outside(when, start, end)
    if reason is not None:
        summary.skip(reason)
        return None
    stamp = timestamp_ms(when) if when is not None else int(now() * 1000)
    if stamp < 0:  # Kafka timestamps start at 1970
        error = RecordError("bad_time", f"event time {when} is before 1970")
        summary.errors.add(Parsed(item.path, item.line, error=error, raw=item.raw))
        if strict:
            raise BadLineError(where, error)
        return None
    return stamp, when


def replay(
    items: Iterable[Parsed[Tweet | Recommendation]],
    send: Send,
    *,
    kind: Kind | str,
    speed: float | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    limit: int | None = None,
    strict: bool = False,
    flush: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], float] = time.time,
    on_progress: Callable[[ReplaySummary], None] | None = None,
    progress_every: float = 0.2,
    timestamps: Timestamps | str = Timestamps.event,
    refuse: Callable[[int], str | None] | None = None,
) -> ReplaySummary:
    """Replay parsed feed records through ``send``, in the order given; returns the summary.

    ``items`` are the records of ``kind`` (``"tweets"`` / ``"recommendations"``), read and
    parsed by :mod:`workers.adapters.files.feeds` (several files merged in event-time order).
    ``speed``: None = no pauses, else gaps between event times / speed.
    ``start``/``end``: only records with event time in ``[start, end)`` (others, and
    records without a time when a bound is given, are counted in ``skipped``).
    ``limit``: stop after that many produced.  Bad lines are counted (``summary.errors``)
    and skipped; with ``strict`` the first raises :class:`BadLineError`.  A
    :class:`ProduceError` from ``send`` or ``flush`` stops the run and is re-raised
    with ``summary`` attached.  ``flush`` is called once at the end (also after
    ``limit``).  ``on_progress`` gets the live summary at the start, about every
    ``progress_every`` clock seconds, and at the end.  ``timestamps``: each record's Kafka
    timestamp is its event time (``event``) or the time of sending (``now``; the event
    time stays in the record).  ``refuse`` is asked, with the first record's timestamp,
    before anything is sent: a reason it returns stops the run with :class:`RefusedError`.
    """
    _check_bounds(limit, start, end)
    kind = Kind(kind)
    stamp_now = Timestamps(timestamps) is Timestamps.now
    summary = ReplaySummary(kind=kind)
    began = clock()
    last_report = began
    pacer = Pacer(speed, clock, sleep) if speed is not None else None
    if on_progress is not None:
        on_progress(summary)

    def stop(how: str, error: ReplayError | None = None) -> None:
        summary.stop(how, clock() - began, error)
        if on_progress is not None:
            on_progress(summary)

    try:
        for item in items:
            if limit is not None and summary.produced >= limit:
                break
            summary.lines_read += 1
            admitted = _admit(item, kind, summary, start, end, strict, now)
            if admitted is None:
                continue
            stamp, when = admitted
            if pacer is not None and when is not None:
                summary.slept_s += pacer.wait(when)
            assert item.value is not None
            if stamp_now:
                stamp = int(now() * 1000)
            if refuse is not None:
                reason, refuse = refuse(stamp), None
                if reason is not None:
                    raise RefusedError("", reason)
            send(Outgoing(_key_of(item.value), _value_bytes(item.raw), stamp, f"{item.path}:{item.line}"))
            summary.sent(when)
            if limit is not None and summary.produced >= limit:
                break  # before reading another line
            if on_progress is not None and (tick := clock()) - last_report >= progress_every:
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
    except RefusedError as exc:
        stop("refused", exc)
        raise
    except KeyboardInterrupt:
        stop("interrupted")
        raise
    stop("limit" if summary.stopped == "limit" else "end")
    return summary


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
