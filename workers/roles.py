"""What each worker role does with a batch of Kafka records, without Faust.

The Faust app (:mod:`workers.app`) only moves records; these classes do the
work with the core library (parse, clean, embed, running means, thesaurus,
score) and the Redis/thesaurus adapters.  Everything here is synchronous and
runs in a worker thread, off the event loop, so heartbeats keep flowing while
the encoder is busy.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from stream.cleaning import Dropped, Prepared, dedup, prepare
from stream.means import HashtagMeans
from stream.records import Recommendation, RecordError, parse_recommendation, parse_tweet
from stream.scoring import EventScore, NeighbourCache, score_event
from stream.thesaurus import AnnoyThesaurus, JsonThesaurus, Thesaurus, ThesaurusStore
from workers.exporter import Exporter, LabelGuard, QualityMetrics
from workers.redis_state import RedisJoin, RedisSeen
from workers.redis_store import Contribution, RedisMeans
from workers.settings import Settings, window_label

log = logging.getLogger("reval.workers")
T = TypeVar("T")


@dataclass(frozen=True)
class Record:
    """One Kafka record, as the roles see it."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes

    @property
    def claimant(self) -> str:
        return f"{self.topic}:{self.partition}:{self.offset}"

    @property
    def time(self) -> float:
        return self.timestamp_ms / 1000 if self.timestamp_ms else time.time()


MAX_DEAD_LETTER_BYTES = 256 * 1024


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


def with_retry(what: str, call: Callable[[], T], *, attempts: int | None = None) -> T:
    """Retry a Redis round trip on connection trouble, with back-off.

    While this waits the batch is not acknowledged, so the consumer stops
    pulling (back-pressure) and nothing is committed that was not applied.
    """
    delay, tried = 0.2, 0
    while True:
        try:
            return call()
        except (RedisConnectionError, RedisTimeoutError) as exc:
            tried += 1
            if attempts is not None and tried >= attempts:
                raise
            log.warning("%s: Redis unavailable (%s); retrying in %.1fs", what, exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


class Embedder:
    """Role ``embed``: tweets → cleaned text → embeddings → per-hashtag running means."""

    def __init__(self, settings: Settings, exporter: Exporter, client: Any, encoder: Any) -> None:
        self.settings = settings
        self.x = exporter
        self.encoder = encoder
        self.means = RedisMeans(client, prefix=settings.redis_prefix, dim=encoder.dim)
        self.seen = RedisSeen(client, settings.redis_prefix, ttl=settings.dedup_ttl_s)

    def process(self, records: Sequence[Record]) -> list[dict[str, Any]]:
        """Apply a batch; returns dead-letter records for the ones that were rejected."""
        rejected: list[dict[str, Any]] = []
        candidates: list[tuple[Record, Prepared]] = []
        for record in records:
            tweet = parse_or_reject(record, parse_tweet, self.x, rejected, "embed")
            if tweet is None:
                continue
            result = prepare(tweet, language_filter=self.settings.language_filter)
            if isinstance(result, Dropped):
                self.x.dropped.labels(result.reason).inc()
            else:
                candidates.append((record, result))
        if not candidates:
            return rejected

        started = time.perf_counter()
        claims = with_retry(
            "claims",
            lambda: self.seen.claim_many([(p.dedup_keys, r.claimant) for r, p in candidates]),
        )
        self.x.redis_seconds.labels("claim").observe(time.perf_counter() - started)
        kept: list[tuple[Record, Prepared]] = []
        for (record, prepared), owned in zip(candidates, claims, strict=True):
            result = dedup(prepared, owned)
            if isinstance(result, Dropped):
                self.x.dropped.labels(result.reason).inc()
            else:
                kept.append((record, result))
        if not kept:
            return rejected

        started = time.perf_counter()
        vectors = self.encoder.encode([p.text for _, p in kept])
        self.x.embed_seconds.observe(time.perf_counter() - started)
        self.x.batch_size.observe(len(kept))
        self.x.embedded.inc(len(kept))
        contributions = [
            Contribution(r.topic, r.partition, r.offset, p.hashtags, v)
            for (r, p), v in zip(kept, vectors, strict=True)
        ]
        started = time.perf_counter()
        applied = with_retry("running means", lambda: self.means.apply(contributions))
        self.x.redis_seconds.labels("apply").observe(time.perf_counter() - started)
        self.x.updates.labels("applied").inc(applied.applied)
        self.x.updates.labels("duplicate").inc(applied.skipped)
        return rejected


class Indexer:
    """Role ``index``: rebuild the Annoy thesaurus from Redis when enough hashtags changed."""

    def __init__(self, settings: Settings, exporter: Exporter, client: Any) -> None:
        self.settings = settings
        self.x = exporter
        self.client = client
        self.means = RedisMeans(client, prefix=settings.redis_prefix)
        self.store = ThesaurusStore(Path(settings.index_dir), keep=settings.index_keep)
        self.current_key = f"{settings.redis_prefix}:thesaurus:current"
        current = self.store.current_version()
        if current is not None:
            self._publish_gauges(self.store.load(current), current, None)

    def run_once(self, *, force: bool = False) -> str | None:
        """Build and publish a new version; ``None`` when too little changed."""
        changed = with_retry("changed", self.means.changed_count)
        if changed < self.settings.index_min_changes and not (force and changed):
            return None
        started = time.perf_counter()
        with_retry("changed", self.means.take_changed)
        states = with_retry("read all", self.means.read_all)
        if not states:
            return None
        dim = next(iter(states.values())).dim
        names, vectors, counts = HashtagMeans(dim, states).matrix(self.settings.index_min_count)
        if not names:
            return None
        thesaurus = AnnoyThesaurus.build(
            names,
            vectors,
            counts=counts,
            min_count=self.settings.index_min_count,
            model_id=self.settings.model,
            n_trees=self.settings.index_n_trees,
        )
        version = self.store.publish(thesaurus)
        with_retry("announce", lambda: self.client.set(self.current_key, version))
        self._publish_gauges(thesaurus, version, time.perf_counter() - started)
        log.info("index %s: %d hashtags (%d changed)", version, len(names), changed)
        return version

    def _publish_gauges(self, thesaurus: Thesaurus, version: str, seconds: float | None) -> None:
        self.x.index_version.set(version_number(version))
        built = datetime.fromisoformat(thesaurus.metadata.built_at.replace("Z", "+00:00"))
        self.x.index_built.set(built.timestamp())
        self.x.index_hashtags.set(len(thesaurus))
        if seconds is not None:
            self.x.index_build_seconds.set(seconds)


def version_number(version: str) -> int:
    """``v000012`` → 12 (the store's sortable version names), else 0."""
    digits = "".join(c for c in version if c.isdigit())
    return int(digits) if digits else 0


EMPTY = JsonThesaurus({}, source="no index yet", built_at="1970-01-01T00:00:00Z")


class Scorer:
    """Role ``score``: recommendation events (+ tweets for the join) → scores and metrics."""

    def __init__(self, settings: Settings, exporter: Exporter, client: Any) -> None:
        self.settings = settings
        self.x = exporter
        self.ks = settings.k_values
        self.rs = settings.r_values
        self.store = ThesaurusStore(Path(settings.index_dir), keep=settings.index_keep)
        self.join = RedisJoin(client, settings.redis_prefix, window=settings.join_window_s)
        self.quality = QualityMetrics(
            exporter,
            self.ks,
            self.rs,
            settings.window_seconds,
            LabelGuard(settings.recommender_allowlist, settings.max_recommenders),
            window_label,
        )
        self.version: str | None = None
        self.cache = NeighbourCache(EMPTY, max_k=max(self.ks))
        self._checked = 0.0
        self.reload(force=True)

    def reload(self, *, force: bool = False) -> bool:
        """Switch to the newest thesaurus version if there is one (no restart needed)."""
        now = time.monotonic()
        if not force and now - self._checked < self.settings.reload_interval_s:
            return False
        self._checked = now
        current = self.store.current_version()
        if current is None or current == self.version:
            return False
        thesaurus = self.store.load(current)
        self.cache = NeighbourCache(thesaurus, max_k=max(self.ks))
        self.version = current
        self.x.thesaurus_loaded.set(version_number(current))
        log.info("scoring with thesaurus %s (%d hashtags)", current, len(thesaurus))
        return True

    def _score(self, event: Recommendation, truth: Sequence[str], when: float) -> dict[str, Any]:
        result: EventScore = score_event(event, truth, self.cache, self.ks, self.rs)
        event_time = event.ts.timestamp() if event.ts else when
        self.quality.observe(result, event_time)
        out = result.to_json()
        out["thesaurus_id"] = out["thesaurus_version"]  # content hash, as `reval score` prints
        out["thesaurus_version"] = self.version or "none"  # the store's version name
        out["event_time"] = event_time
        out["ground_truth"] = list(truth)
        return out

    def process_recommendations(
        self, records: Sequence[Record]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Returns (scores, dead letters)."""
        self.reload()
        scores: list[dict[str, Any]] = []
        rejected: list[dict[str, Any]] = []
        waiting: list[tuple[Record, Recommendation]] = []
        for record in records:
            event = parse_or_reject(record, parse_recommendation, self.x, rejected, "score")
            if event is None:
                continue
            if event.ground_truth is not None:
                scores.append(self._score(event, event.ground_truth, record.time))
            else:
                waiting.append((record, event))
        if waiting:
            offers = [(e.tweet_id, f"{r.partition}:{r.offset}", _payload(r)) for r, e in waiting]
            replies = with_retry("join", lambda: self.join.put_events(offers, time.time()))
            for (record, event), (status, truth) in zip(waiting, replies, strict=True):
                outcome = {"match": "matched", "wait": "waiting"}.get(status, "duplicate")
                self.x.join.labels(outcome).inc()
                if status == "match":
                    assert truth is not None
                    scores.append(self._score(event, truth, record.time))
        return scores, rejected

    def process_tweets(self, records: Sequence[Record]) -> list[dict[str, Any]]:
        """Record the tweets' hashtags for the join; score the events that waited for them.

        Malformed tweets are dead-lettered by the embed role, not again here.
        """
        self.reload()
        tweets = []
        for record in records:
            try:
                tweet = parse_tweet(record.value)
            except RecordError:
                continue
            tweets.append((tweet.id, list(tweet.hashtags)))
        answered = with_retry("join", lambda: self.join.put_tweets(tweets))
        scores = []
        for item in answered:
            self.x.join.labels("matched").inc()
            record, event = _unpayload(item.payload)
            scores.append(self._score(event, item.truth or [], record.time))
        return scores

    def expire(self) -> list[dict[str, Any]]:
        """Dead-letter the events whose tweet did not come within the join window."""
        expired = with_retry("join expiry", lambda: self.join.expire(time.time()))
        out = []
        for item in expired:
            record, _ = _unpayload(item.payload)
            self.x.join.labels("expired").inc()
            self.x.rejected.labels(record.topic, "join_expired").inc()
            detail = f"no tweet {item.tweet_id} within {self.settings.join_window_s:g}s"
            out.append(dead_letter(record, "join_expired", detail, "score"))
        self.x.join_pending.set(with_retry("join", self.join.pending))
        return out


def _payload(record: Record) -> str:
    """What waits in Redis for the join: the whole record, so it can be dead-lettered."""
    return json.dumps(
        {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "timestamp_ms": record.timestamp_ms,
            "key": base64.b64encode(record.key).decode() if record.key else None,
            "value": base64.b64encode(record.value).decode(),
        }
    )


def _unpayload(payload: str) -> tuple[Record, Recommendation]:
    data = json.loads(payload)
    record = Record(
        data["topic"],
        data["partition"],
        data["offset"],
        data["timestamp_ms"],
        base64.b64decode(data["key"]) if data["key"] else None,
        base64.b64decode(data["value"]),
    )
    return record, parse_recommendation(record.value)
