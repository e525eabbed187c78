"""A Kafka record as the roles see it, and the dead letter of one that was rejected."""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from stream.records import RecordError
from workers.adapters.exporter import Exporter

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
    def claimant(self) -> str:
        """``topic:partition:offset``: who claims a retweet's content first (idempotent on redelivery)."""
        return f"{self.topic}:{self.partition}:{self.offset}"

    @property
    def time(self) -> float:
        return self.timestamp_ms / 1000 if self.timestamp_ms else time.time()


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
        "source": {"topic": record.topic, "partition": record.partition, "offset": record.offset},
        "key": record.key.decode("utf-8", "replace") if record.key else None,
        "value_base64": base64.b64encode(value[:MAX_DEAD_LETTER_BYTES]).decode("ascii"),
        "value_size": len(value),
        "value_truncated": len(value) > MAX_DEAD_LETTER_BYTES,
        "value_sha256": hashlib.sha256(value).hexdigest(),
        "rejected_at": datetime.now(UTC).isoformat(),
    }


def parse_or_reject(
    record: Record, parse: Callable[[bytes], T], x: Exporter, rejected: list[dict[str, Any]], role: str
) -> T | None:
    """Parse one consumed record, or count it and queue its dead letter (then ``None``)."""
    x.consumed.labels(record.topic).inc()
    try:
        return parse(record.value)
    except RecordError as exc:
        x.rejected.labels(record.topic, exc.reason).inc()
        rejected.append(dead_letter(record, exc.reason, exc.detail, role))
        return None
