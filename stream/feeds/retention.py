"""What a Kafka topic keeps: will the records sent to it, or not yet read from it, survive
its retention?

Kafka deletes a partition's log segment when the newest timestamp in it is older than
the topic's ``retention.ms`` -- the active segment included -- and its oldest segments
when the partition grows past ``retention.bytes``.  With ``message.timestamp.type =
CreateTime`` (Kafka's default) the timestamp is the producer's: a replay that stamps each
record with its event time (2012-2013 for the bundled feed) writes records that a
7-day retention deletes at the broker's next retention check, read or not -- a race the
consumer usually loses.  ``LogAppendTime`` topics stamp records on arrival: time-based
retention then counts from the replay, not from the event.

Everything here is pure: the adapters read the topic's settings and offsets
(:mod:`workers.adapters.kafka.kafka_client`), these functions say what is at risk, in one line
each, naming the topic, the setting and the fix.

The margin: a record must stay at least :data:`KEEP_AT_LEAST_MS` (a day) after it is
sent or found unread, time for consumers that lag; closer to the limit is a refusal
(replay) or a warning (worker start-up).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

__all__ = [
    "KEEP_AT_LEAST_MS",
    "PartitionHead",
    "Timestamps",
    "TopicRetention",
    "replay_refusal",
    "unread_at_risk",
]

KEEP_AT_LEAST_MS = 86_400_000
NO_LIMIT = -1
CREATE_TIME = "CreateTime"


class Timestamps(StrEnum):
    """The Kafka timestamp a replay gives each record (the event time is in the record
    itself either way)."""

    event = "event"  # the record's event time (created_at / ts)
    now = "now"  # the time of sending


@dataclass(frozen=True)
class TopicRetention:
    """The settings of a topic that decide what it deletes.

    >>> t = TopicRetention.of("tweets", {"retention.ms": "604800000"}, partitions=4)
    >>> t.retention_ms, t.retention_bytes, t.timestamp_type, t.deletes_by_time
    (604800000, -1, 'CreateTime', True)
    """

    topic: str
    retention_ms: int
    retention_bytes: int  # per partition
    timestamp_type: str
    partitions: int
    before_max_ms: int | None = None  # message.timestamp.before.max.ms: older records refused
    compacted: bool = False

    @classmethod
    def of(cls, topic: str, configs: Mapping[str, str], *, partitions: int) -> TopicRetention:
        """From the topic's configuration entries as the broker describes them (missing
        entries take Kafka's defaults: 7 days, no size limit, CreateTime)."""
        before = configs.get("message.timestamp.before.max.ms")
        return cls(
            topic=topic,
            retention_ms=int(configs.get("retention.ms", 604_800_000)),
            retention_bytes=int(configs.get("retention.bytes", NO_LIMIT)),
            timestamp_type=configs.get("message.timestamp.type", CREATE_TIME),
            partitions=partitions,
            before_max_ms=int(before) if before is not None else None,
            compacted="delete" not in configs.get("cleanup.policy", "delete").split(","),
        )

    @property
    def deletes_by_time(self) -> bool:
        """Whether records are deleted by their producer timestamps."""
        return not self.compacted and self.retention_ms >= 0 and self.timestamp_type == CREATE_TIME

    @property
    def keep_command(self) -> str:
        """The command that makes the topic keep its records whatever their timestamps."""
        return (
            f"kafka-configs.sh --alter --entity-type topics --entity-name {self.topic} "
            f"--add-config retention.ms=-1"
        )


def _day(ms: int) -> str:
    return f"{datetime.fromtimestamp(ms / 1000, UTC):%Y-%m-%d %H:%M}Z"


def _span(ms: int) -> str:
    """``retention.ms`` in words.

    >>> _span(604_800_000), _span(3_600_000), _span(1500)
    ('7 days', '1.0 hours', '1.5 s')
    """
    if ms >= 86_400_000 and ms % 86_400_000 == 0:
        return f"{ms // 86_400_000} days"
    if ms >= 3_600_000:
        return f"{ms / 3_600_000:.1f} hours"
    return f"{ms / 1000:g} s"


def replay_refusal(
    topic: TopicRetention,
    *,
    oldest_ms: int | None,
    now_ms: int,
    size_bytes: int | None,
    timestamps: Timestamps | str,
) -> str | None:
    """Why a replay must not send to ``topic`` (one line: the topic, the setting, the fix),
    or None when the topic keeps what it will be sent.

    ``oldest_ms``: the Kafka timestamp of the first record to send (None: none is known);
    ``size_bytes``: about how many bytes the replay sends (None: unknown).

    >>> week = TopicRetention.of("tweets", {}, partitions=4)
    >>> now = 1_796_000_000_000  # 2026-11-30
    >>> print(replay_refusal(week, oldest_ms=1_351_463_499_292, now_ms=now, size_bytes=None,
    ...                      timestamps="event"))  # doctest: +NORMALIZE_WHITESPACE
    topic 'tweets' deletes records whose timestamp is older than retention.ms=604800000 (7 days),
    and this replay's first record is stamped 2012-10-28 22:31Z: replay with --timestamps now
    (the event time stays in each record), or keep them: kafka-configs.sh --alter --entity-type
    topics --entity-name tweets --add-config retention.ms=-1
    >>> replay_refusal(week, oldest_ms=1_351_463_499_292, now_ms=now, size_bytes=None, timestamps="now")
    >>> replay_refusal(week, oldest_ms=now - 3_600_000, now_ms=now, size_bytes=None, timestamps="event")
    """
    timestamps = Timestamps(timestamps)
    if topic.retention_bytes >= 0 and size_bytes is not None and not topic.compacted:
        kept = topic.retention_bytes * topic.partitions
        if size_bytes > kept:
            return (
                f"topic {topic.topic!r} keeps at most retention.bytes={topic.retention_bytes} per "
                f"partition ({kept:,} bytes in {topic.partitions} partitions) and this replay sends "
                f"about {size_bytes:,}: the oldest would be deleted before the workers read them; "
                f"replay fewer records (--limit, --start/--end) or raise it: kafka-configs.sh --alter "
                f"--entity-type topics --entity-name {topic.topic} --add-config retention.bytes=-1"
            )
    if timestamps is Timestamps.now or oldest_ms is None or topic.timestamp_type != CREATE_TIME:
        return None
    if topic.before_max_ms is not None and 0 <= topic.before_max_ms < now_ms - oldest_ms:
        return (
            f"topic {topic.topic!r} refuses records stamped more than message.timestamp.before.max.ms="
            f"{topic.before_max_ms} ({_span(topic.before_max_ms)}) in the past, and this replay's first "
            f"record is stamped {_day(oldest_ms)}: replay with --timestamps now (the event time stays "
            f"in each record)"
        )
    if topic.deletes_by_time and oldest_ms + topic.retention_ms < now_ms + KEEP_AT_LEAST_MS:
        return (
            f"topic {topic.topic!r} deletes records whose timestamp is older than retention.ms="
            f"{topic.retention_ms} ({_span(topic.retention_ms)}), and this replay's first record is "
            f"stamped {_day(oldest_ms)}: replay with --timestamps now (the event time stays in each "
            f"record), or keep them: {topic.keep_command}"
        )
    return None


@dataclass(frozen=True)
class PartitionHead:
    """Where a consumer group stands on one partition.

    ``committed``: the group's committed offset (None: it never committed, so it starts
    at ``log_start``); ``first_unread_ms``: the timestamp of the record at its position
    (None: nothing unread, or not fetched).
    """

    partition: int
    log_start: int
    end: int
    committed: int | None
    first_unread_ms: int | None = None

    @property
    def position(self) -> int:
        return self.log_start if self.committed is None else max(self.committed, self.log_start)

    @property
    def unread(self) -> int:
        return max(self.end - self.position, 0)


def unread_at_risk(
    topic: TopicRetention, group: str, heads: list[PartitionHead], *, now_ms: int
) -> list[str]:
    """One line per partition where ``group`` lost records to retention before reading them,
    or has unread records the topic deletes within :data:`KEEP_AT_LEAST_MS`.

    >>> week = TopicRetention.of("tweets", {}, partitions=2)
    >>> now = 1_796_000_000_000
    >>> heads = [PartitionHead(0, log_start=808, end=900, committed=0),
    ...          PartitionHead(1, log_start=0, end=700, committed=None, first_unread_ms=1_351_463_499_292)]
    >>> for line in unread_at_risk(week, "reval-embed", heads, now_ms=now):
    ...     print(line)  # doctest: +NORMALIZE_WHITESPACE
    tweets[0]: 808 records (offsets 0-807) were deleted by the broker before group 'reval-embed'
    read them (retention.ms=604800000, retention.bytes=-1, message.timestamp.type=CreateTime)
    tweets[1]: 700 unread records from offset 0 are stamped 2012-10-28 22:31Z and retention.ms=604800000
    (7 days) deletes them at the broker's next retention check: kafka-configs.sh --alter --entity-type
    topics --entity-name tweets --add-config retention.ms=-1 keeps them
    """
    lines = []
    settings = (
        f"retention.ms={topic.retention_ms}, retention.bytes={topic.retention_bytes}, "
        f"message.timestamp.type={topic.timestamp_type}"
    )
    for head in heads:
        name = f"{topic.topic}[{head.partition}]"
        if head.committed is not None and head.committed < head.log_start:
            lost = head.log_start - head.committed
            lines.append(
                f"{name}: {lost} records (offsets {head.committed}-{head.log_start - 1}) were deleted by "
                f"the broker before group {group!r} read them ({settings})"
            )
        first = head.first_unread_ms
        doomed = first is not None and first + topic.retention_ms < now_ms + KEEP_AT_LEAST_MS
        if head.unread and doomed and topic.deletes_by_time:
            assert first is not None
            lines.append(
                f"{name}: {head.unread} unread records from offset {head.position} are stamped "
                f"{_day(first)} and retention.ms={topic.retention_ms} ({_span(topic.retention_ms)}) "
                f"deletes them at the broker's next retention check: {topic.keep_command} keeps them"
            )
    return lines
