"""A Kafka record as the roles see it, and the dead letter of one that was rejected."""

from __future__ import annotations

import base64
import hashlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from stream.intake.records import Coordinates, RecordError
from workers.adapters.prometheus.exporter import Exporter

T = TypeVar("T")

#: Dead letters carry the original bytes up to this size (so a letter fits in a Kafka message).
MAX_DEAD_LETTER_BYTES = 256 * 1024


@dataclass(frozen=True)
class Record:
    """One Kafka record."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes

    @property
    def coordinates(self) -> Coordinates:
        return Coordinates(self.topic, self.partition, self.offset)

    @property
    def claimant(self) -> str:
        """``topic:partition:offset`` (:class:`stream.intake.records.Coordinates`): the record in logs
        and letter keys."""
        return str(self.coordinates)

    @property
    def time(self) -> float:
        return self.timestamp_ms / 1000 if self.timestamp_ms else time.time()


def letter_key(record: Record) -> bytes:
    """A dead letter's Kafka key: its source's coordinates, so a letter produced twice (after
    a crash) has the same key as the first -- dedupe by key, or compact the topic."""
    return record.claimant.encode()


def dead_letter(record: Record, reason: str, detail: str, role: str) -> dict[str, Any]:
    """The dead-letter record: why, where from, and the original bytes (base64).

    An original larger than 256 KiB is cut to that size (``value_truncated``), with
    its full size and SHA-256, so the dead letter itself fits in a Kafka message;
    the source coordinates find the whole record while the topic retains it.
    """
    value = record.value
    return {
        "reason": reason,
        "detail": detail,
        "role": role,
        "source": record.coordinates.as_dict(),
        "key": record.key.decode("utf-8", "replace") if record.key else None,
        "value_base64": base64.b64encode(value[:MAX_DEAD_LETTER_BYTES]).decode("ascii"),
        "value_size": len(value),
        "value_truncated": len(value) > MAX_DEAD_LETTER_BYTES,
        "value_sha256": hashlib.sha256(value).hexdigest(),
        "rejected_at": datetime.now(UTC).isoformat(),
    }


def admit(
    records: Sequence[Record], parse: Callable[[bytes], T], x: Exporter, role: str
) -> tuple[list[tuple[Record, T]], list[tuple[Record, RecordError]]]:
    """Parse consumed records once: count each, and sort them into parsed and rejected.

    The counters move once per batch and label (a batch is one topic, nearly always), after
    the loop: a parser bug that escapes it counts nothing here, and the records are counted
    when they are admitted again one at a time.
    """
    parsed: list[tuple[Record, T]] = []
    rejected: list[tuple[Record, RecordError]] = []
    for record in records:
        try:
            parsed.append((record, parse(record.value)))
        except RecordError as exc:
            rejected.append((record, exc))
    count_admission(records, [(record, exc.reason) for record, exc in rejected], x)
    return parsed, rejected


def count_admission(records: Sequence[Record], rejected: Sequence[tuple[Record, str]], x: Exporter) -> None:
    """``reval_consumed_total`` and ``reval_rejected_total`` of a batch's admission (``rejected``:
    each refused record and its reason), once per batch and label."""
    for topic, n in Counter(record.topic for record in records).items():
        x.consumed.labels(topic).inc(n)
    for (topic, reason), n in Counter((record.topic, reason) for record, reason in rejected).items():
        x.rejected.labels(topic, reason).inc(n)
