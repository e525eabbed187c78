"""Role ``embed``: tweets → cleaned text → embeddings → per-hashtag running means in Redis."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import faust

from stream.cleaning import Dropped, Prepared, dedup, prepare
from stream.records import parse_tweet
from workers.adapters.exporter import Exporter
from workers.adapters.redis_client import with_retry
from workers.adapters.redis_means import Contribution, RedisMeans
from workers.adapters.redis_state import RedisSeen
from workers.service.records import Record, parse_or_reject
from workers.service.runtime import Runtime, Topics, record_of
from workers.settings import Settings


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


def load_encoder(settings: Settings) -> Any:
    """The encoder the settings name (loaded once per worker process)."""
    from workers.adapters.encoder import Encoder  # lazy: torch loads only in embed workers

    return Encoder(
        settings.model,
        device=settings.device,
        dtype=settings.dtype,
        pooling=settings.pooling,  # type: ignore[arg-type]
        batch_size=settings.embed_batch_size,
    )


def register(app: faust.App, topics: Topics, rt: Runtime, encoder: Any = None) -> None:
    """The ``embed`` agent: batches of tweets through :class:`Embedder`."""
    embedder = Embedder(rt.settings, rt.exporter, rt.client, encoder or load_encoder(rt.settings))
    size, within = rt.settings.embed_batch_size, rt.settings.embed_max_wait_s

    @app.agent(topics.tweets, name="embed")
    async def embed(stream: Any) -> None:
        async for events in stream.take_events(size, within=within):
            results, failed = await rt.guarded("embed", embedder.process, [record_of(e) for e in events])
            letters = [*(letter for done in results for letter in done), *failed]
            await rt.send_all(topics.dead_letters, letters, "reason")
