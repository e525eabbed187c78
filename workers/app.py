"""The Faust app: topics, agents and timers of the three worker roles, in one place.

    tweets ──► embed agent ──► Redis running means ──► index timer ──► thesaurus store
    recommendations ──► score agent ──► scores (+ /metrics)
    tweets ──► join agent ──┘ (ground truth for events that carry none)

Every role consumes in its own consumer group (``<app_id>-<role>``), so each
sees the whole stream and can be scaled on its own.  The agents only move
records; the work is done by :mod:`workers.roles` in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from pathlib import Path
from typing import Any

import faust
import redis

from workers.exporter import Exporter
from workers.roles import Embedder, Indexer, Record, Scorer, dead_letter
from workers.settings import Settings

ROLES = ("embed", "index", "score")
DEFAULT_PORTS = {"embed": 9101, "index": 9102, "score": 9103}
log = logging.getLogger("reval.workers")


def redis_client(settings: Settings) -> Any:
    """A Redis or Redis Cluster client from the URL (``rediss://`` for TLS, password in URL)."""
    if settings.redis_cluster:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(settings.redis_url)
    return redis.Redis.from_url(settings.redis_url, health_check_interval=30)


def _record(event: Any) -> Record:
    message = event.message
    value = message.value if isinstance(message.value, bytes) else bytes(message.value or b"")
    return Record(
        message.topic,
        message.partition,
        message.offset,
        int(message.timestamp * 1000) if message.timestamp else None,
        message.key,
        value,
    )


def _patch_faust_recovery() -> None:
    """faust-streaming 0.15 resumes stream partitions before it seeks them to the
    committed offsets while the fetcher runs, so records fetched in that window
    are delivered twice.  Pausing the flow around recovery completion closes it."""
    from faust.tables.recovery import Recovery

    original = Recovery.on_recovery_completed
    if getattr(original, "_reval_patched", False):
        return

    async def on_recovery_completed(self: Any, generation_id: int = 0) -> None:
        self.app.consumer.stop_flow()
        await original(self, generation_id)

    on_recovery_completed._reval_patched = True  # type: ignore[attr-defined]
    Recovery.on_recovery_completed = on_recovery_completed  # type: ignore[method-assign]


def create_app(
    settings: Settings,
    roles: Iterable[str],
    *,
    exporter: Exporter | None = None,
    encoder: Any = None,
) -> faust.App:
    """Build the app for ``roles`` (any of embed, index, score).

    ``encoder`` lets tests and the demo pass a loaded encoder; by default the
    embed role loads ``settings.model``.
    """
    roles = sorted(set(roles))
    unknown = set(roles) - set(ROLES)
    if unknown or not roles:
        raise ValueError(f"roles must be among {', '.join(ROLES)}; got {', '.join(roles) or 'none'}")
    _patch_faust_recovery()
    exporter = exporter or Exporter()
    app_id = f"{settings.app_id}-{'-'.join(roles)}"
    datadir = Path(settings.data_dir) / app_id
    datadir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        app_id,
        broker=[f"kafka://{host}" for host in settings.broker.split(",")],
        store="memory://",
        web_enabled=False,
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication,
        consumer_auto_offset_reset="earliest",
        broker_commit_every=1000,
        broker_commit_interval=1.0,
        producer_acks=-1,
        datadir=str(datadir),
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 3),
    )
    app.exporter = exporter  # type: ignore[attr-defined]

    def raw_topic(name: str, partitions: int) -> Any:
        # Bytes in, bytes out: the core parses, so a malformed record reaches us to dead-letter.
        return app.topic(name, partitions=partitions, key_serializer="raw", value_serializer="raw")

    tweets = raw_topic(settings.topic_tweets, settings.partitions)
    recommendations = raw_topic(settings.topic_recommendations, settings.partitions)
    scores = raw_topic(settings.topic_scores, settings.partitions)
    dead_letters = raw_topic(settings.topic_dead_letter, 1)
    client = redis_client(settings)
    # The encoder and Redis calls block: run them off the event loop (heartbeats keep
    # flowing), one thread per role so a role's state is never touched concurrently.
    threads = {role: ThreadPoolExecutor(1, thread_name_prefix=f"reval-{role}") for role in roles}

    async def in_thread(role: str, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(threads[role], fn, *args)

    async def send_all(topic: Any, items: Sequence[dict[str, Any]], key_field: str) -> None:
        """Produce and wait for the broker's acks before the batch is acknowledged."""
        for attempt in range(1, 6):
            try:
                futures = [
                    await topic.send(
                        key=str(item.get(key_field) or "").encode() or None,
                        value=json.dumps(item).encode(),
                    )
                    for item in items
                ]
                for future in futures:
                    await future
                return
            except Exception as exc:  # never let a send error escape: Faust would ack and lose
                log.warning("sending %d records to %s failed (%s), try %d", len(items), topic, exc, attempt)
                await asyncio.sleep(0.2 * 2**attempt)
        log.error("gave up sending %d records to %s", len(items), topic)

    async def guarded(role: str, fn: Any, records: list[Record]) -> tuple[list[Any], list[Any]]:
        """Run ``fn`` on a batch: (its results, dead letters for records that failed).

        On an unexpected error the batch is retried one record at a time (the role
        steps are idempotent) and records that still fail are dead-lettered: an
        exception escaping a Faust batching agent would be acknowledged (committed)
        and lose the batch and whatever had been fetched behind it.
        """
        try:
            return [await in_thread(role, fn, records)], []
        except Exception:
            log.exception("%s: batch of %d failed; retrying one record at a time", role, len(records))
        results, failed = [], []
        for record in records:
            try:
                results.append(await in_thread(role, fn, [record]))
            except Exception as exc:
                log.exception("%s: record %s failed", role, record.claimant)
                failed.append(dead_letter(record, "processing_error", repr(exc)[:500], role))
        return results, failed

    if "embed" in roles:
        if encoder is None:
            from stream.encoder import Encoder

            encoder = Encoder(
                settings.model,
                device=settings.device,
                dtype=settings.dtype,
                pooling=settings.pooling,  # type: ignore[arg-type]
                batch_size=settings.embed_batch_size,
            )
        embedder = Embedder(settings, exporter, client, encoder)

        @app.agent(tweets, name="embed")
        async def embed(stream: Any) -> None:
            async for events in stream.take_events(
                settings.embed_batch_size, within=settings.embed_max_wait_s
            ):
                results, failed = await guarded("embed", embedder.process, [_record(e) for e in events])
                await send_all(dead_letters, [*chain.from_iterable(results), *failed], "reason")

    if "index" in roles:
        indexer = Indexer(settings, exporter, client)

        @app.timer(interval=settings.index_interval_s, on_leader=True)
        async def rebuild_index() -> None:
            try:
                await in_thread("index", indexer.run_once)
            except Exception:  # a failed build must not stop the timer
                log.exception("index build failed")

    if "score" in roles:
        scorer = Scorer(settings, exporter, client)
        batch = max(settings.embed_batch_size, 256)

        @app.agent(recommendations, name="score")
        async def score(stream: Any) -> None:
            async for events in stream.take_events(batch, within=0.2):
                results, failed = await guarded(
                    "score", scorer.process_recommendations, [_record(e) for e in events]
                )
                await send_all(scores, [s for done, _ in results for s in done], "tweet_id")
                await send_all(dead_letters, [*(d for _, dl in results for d in dl), *failed], "reason")

        @app.agent(tweets, name="join")
        async def join(stream: Any) -> None:
            async for events in stream.take_events(batch, within=0.2):
                results, failed = await guarded("score", scorer.process_tweets, [_record(e) for e in events])
                await send_all(scores, list(chain.from_iterable(results)), "tweet_id")
                await send_all(dead_letters, failed, "reason")

        @app.timer(interval=min(settings.reload_interval_s, settings.join_window_s / 4))
        async def expire_joins_and_reload() -> None:
            try:
                await in_thread("score", scorer.reload)
                rejected = await in_thread("score", scorer.expire)
            except Exception:  # a failed round must not stop the timer
                log.exception("join expiry / thesaurus reload failed")
                return
            await send_all(dead_letters, rejected, "reason")

    sources = {tweets.get_topic_name(), recommendations.get_topic_name()}
    reported: set[tuple[str, str]] = set()

    @app.timer(interval=5.0)
    async def report_lag() -> None:
        """Consumer lag per source partition: end offset minus the committed position."""
        consumer = app.consumer
        assigned = [tp for tp in consumer.assignment() if tp.topic in sources]
        for labels in reported - {(tp.topic, str(tp.partition)) for tp in assigned}:
            exporter.lag.remove(*labels)  # revoked: another worker reports it now
            reported.discard(labels)
        if not assigned:
            return
        try:
            ends = await consumer.highwaters(*assigned)
        except Exception as exc:  # lag is best-effort telemetry; never stop the worker
            log.debug("lag: %s", exc)
            return
        for tp in assigned:
            committed = getattr(consumer, "_committed_offset", {}).get(tp)  # no public getter in faust
            end = ends.get(tp)
            if end is not None and committed is not None:
                exporter.lag.labels(tp.topic, str(tp.partition)).set(max(0, end - committed))
                reported.add((tp.topic, str(tp.partition)))

    return app
