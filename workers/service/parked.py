"""What of a recommendation event waits in the join for its tweet (:class:`Parked`), and its
bytes in Redis -- written once per event, read once per answer or expiry."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from functools import cached_property

import orjson

from stream.intake.records import Coordinates, Recommendation, parse_time
from workers.service.kafka_records import Record, dead_letter, letter_key
from workers.service.runtime import Output


@dataclass(frozen=True)
class Parked:
    """An event waiting in the join: what scoring needs and where it came from -- never the
    whole record (a 480 KB event would park ~0.6 MB in Redis).

    Its bytes (:meth:`to_bytes`) are the JSON object running deployments hold in Redis:
    ``tweet_id``, ``recommender``, ``recommended``, ``ts``, ``src`` (``[topic, partition,
    offset, timestamp_ms]``), ``key`` (base64), ``size`` and ``sha256`` of the original value.

    >>> record = Record("recs", 0, 7, 1_700_000_000_000, b"k", b'{"tweet_id": "1", "recommended": ["a"]}')
    >>> parked = Parked.of(record, Recommendation("1", ("a",), None, recommender="mowe"))
    >>> parked.to_bytes()[:61]
    b'{"tweet_id":"1","recommender":"mowe","recommended":["a"],"ts"'
    >>> Parked.from_bytes(parked.to_bytes()) == parked
    True
    >>> parked.source.value, parked.source.claimant  # the letter carries the event as parsed
    (b'{"tweet_id": "1", "recommender": "mowe", "recommended": ["a"]}', 'recs:0:7')
    """

    event: Recommendation
    coordinates: Coordinates
    timestamp_ms: int | None
    key: bytes | None
    value_size: int
    value_sha256: str

    @classmethod
    def of(cls, record: Record, event: Recommendation) -> Parked:
        return cls(
            event,
            record.coordinates,
            record.timestamp_ms,
            record.key,
            len(record.value),
            hashlib.sha256(record.value).hexdigest(),
        )

    def to_bytes(self) -> bytes:
        e, c = self.event, self.coordinates
        return orjson.dumps(
            {
                "tweet_id": e.tweet_id,
                "recommender": e.recommender,
                "recommended": list(e.recommended),
                "ts": e.ts.isoformat() if e.ts else None,
                "src": [c.topic, c.partition, c.offset, self.timestamp_ms],
                "key": base64.b64encode(self.key).decode() if self.key else None,
                "size": self.value_size,
                "sha256": self.value_sha256,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes | str) -> Parked:
        """The event of :meth:`to_bytes` (also the text earlier versions stored: the same JSON)."""
        fields = orjson.loads(data)
        event = Recommendation(
            tweet_id=fields["tweet_id"],
            recommended=tuple(fields["recommended"]),
            ground_truth=None,
            recommender=fields["recommender"],
            ts=parse_time(fields["ts"]) if fields.get("ts") else None,
        )
        topic, partition, offset, timestamp_ms = fields["src"]
        key = base64.b64decode(fields["key"]) if fields.get("key") else None
        return cls(
            event,
            Coordinates(topic, partition, offset),
            timestamp_ms,
            key,
            int(fields["size"]),
            str(fields["sha256"]),
        )

    @cached_property
    def source(self) -> Record:
        """The event's record for outputs and letters; its value is the parsed event as JSON,
        not the original bytes (those stay in the source topic at these coordinates)."""
        e, c = self.event, self.coordinates
        parsed = {"tweet_id": e.tweet_id, "recommender": e.recommender, "recommended": list(e.recommended)}
        if e.ts:
            parsed["ts"] = e.ts.isoformat()
        value = json.dumps(parsed, ensure_ascii=False).encode()
        return Record(c.topic, c.partition, c.offset, self.timestamp_ms, self.key, value)

    def letter(self, reason: str, detail: str) -> Output:
        value = dead_letter(self.source, reason, detail, "score")
        value.update(value_size=self.value_size, value_sha256=self.value_sha256, value_is_parsed_event=True)
        return Output("dead_letters", letter_key(self.source), value, self.source)
