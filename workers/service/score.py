"""Role ``score``: recommendation events (and tweets, for the join) → one score per event
on the scores topic, and the quality metrics on /metrics."""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faust

from stream.records import Recommendation, RecordError, parse_recommendation, parse_tweet
from stream.scoring import EventScore, NeighbourCache, score_event
from stream.thesaurus import JsonThesaurus
from workers.adapters.exporter import Exporter, LabelGuard, QualityMetrics
from workers.adapters.redis_client import with_retry
from workers.adapters.redis_state import RedisJoin
from workers.adapters.store import ThesaurusStore, neighbour_cache, version_number
from workers.service.records import Record, dead_letter, parse_or_reject
from workers.service.runtime import Runtime, Topics, record_of
from workers.settings import Settings, window_label

log = logging.getLogger("reval.workers")

EMPTY = JsonThesaurus({}, source="no index yet", built_at="1970-01-01T00:00:00Z")


class Scorer:
    """Scores recommendation events (joined with their tweets when they carry no ground
    truth) with the newest published thesaurus, and feeds the quality metrics."""

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
        self.index_version: str | None = None  # the store's name of the loaded version
        self.cache = NeighbourCache(EMPTY, max_k=max(self.ks))
        self._checked = 0.0
        self._rejected: str | None = None  # the last version refused (not retried until a newer one)
        self.reload(force=True)

    def reload(self, *, force: bool = False) -> bool:
        """Switch to the newest thesaurus version if there is one (no restart needed)."""
        now = time.monotonic()
        if not force and now - self._checked < self.settings.reload_interval_s:
            return False
        self._checked = now
        current = self.store.current_version()
        if current is None or current in (self.index_version, self._rejected):
            return False
        try:
            thesaurus = self.store.load(current, index=False)  # the neighbour table is all it needs
            cache = neighbour_cache(thesaurus, max(self.ks))
        except (OSError, ValueError) as exc:  # damaged or unreadable: keep the last good version
            self._rejected = current
            self.x.thesaurus_rejected.labels("score").inc()
            log.error("thesaurus %s rejected (%s); still scoring with %s", current, exc, self.index_version)
            return False
        self.cache = cache
        self.index_version = current
        self.x.thesaurus_loaded.set(version_number(current))
        log.info("scoring with thesaurus %s (%d hashtags)", current, len(thesaurus))
        return True

    def _score(self, event: Recommendation, truth: Sequence[str], when: float) -> dict[str, Any]:
        result: EventScore = score_event(event, truth, self.cache, self.ks, self.rs)
        event_time = event.ts.timestamp() if event.ts else when
        self.quality.observe(result, event_time)
        out = result.to_json()
        out["index_version"] = self.index_version  # the store's name; thesaurus_version is the content
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


def register(app: faust.App, topics: Topics, rt: Runtime) -> None:
    """The ``score`` agent (events), the ``join`` agent (tweets answering waiting events)
    and the timer that expires joins and reloads the thesaurus."""
    scorer = Scorer(rt.settings, rt.exporter, rt.client)
    size = max(rt.settings.embed_batch_size, 256)

    @app.agent(topics.recommendations, name="score")
    async def score(stream: Any) -> None:
        async for events in stream.take_events(size, within=0.2):
            results, failed = await rt.guarded(
                "score", scorer.process_recommendations, [record_of(e) for e in events]
            )
            await rt.send_all(topics.scores, [s for done, _ in results for s in done], "tweet_id")
            await rt.send_all(topics.dead_letters, [*(d for _, dl in results for d in dl), *failed], "reason")

    @app.agent(topics.tweets, name="join")
    async def join(stream: Any) -> None:
        async for events in stream.take_events(size, within=0.2):
            results, failed = await rt.guarded("score", scorer.process_tweets, [record_of(e) for e in events])
            await rt.send_all(topics.scores, [s for done in results for s in done], "tweet_id")
            await rt.send_all(topics.dead_letters, failed, "reason")

    settings = rt.settings

    @app.timer(interval=min(settings.reload_interval_s, settings.join_window_s / 4))
    async def expire_joins_and_reload() -> None:
        try:
            await rt.run("score", scorer.reload)
            rejected = await rt.run("score", scorer.expire)
        except Exception:  # a failed round must not stop the timer
            log.exception("join expiry / thesaurus reload failed")
            return
        await rt.send_all(topics.dead_letters, rejected, "reason")
