"""What every role's agents share: the worker threads, the guarded batch step, and
producing with acknowledgements before a batch is acknowledged."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import faust

from workers.adapters.exporter import Exporter
from workers.adapters.redis_client import Client
from workers.service.records import Record, dead_letter
from workers.settings import Settings

log = logging.getLogger("reval.workers")
T = TypeVar("T")


def record_of(event: Any) -> Record:
    """The :class:`Record` of a faust event (raw bytes, as the core parsers want them)."""
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


@dataclass(frozen=True)
class Topics:
    """The service's topics, declared with explicit partition counts; bytes in, bytes out
    (the core parses, so a malformed record reaches a role to be dead-lettered)."""

    tweets: faust.TopicT
    recommendations: faust.TopicT
    scores: faust.TopicT
    dead_letters: faust.TopicT

    @classmethod
    def declare(cls, app: faust.App, settings: Settings) -> Topics:
        def raw(name: str, partitions: int) -> faust.TopicT:
            return app.topic(name, partitions=partitions, key_serializer="raw", value_serializer="raw")

        return cls(
            tweets=raw(settings.topic_tweets, settings.partitions),
            recommendations=raw(settings.topic_recommendations, settings.partitions),
            scores=raw(settings.topic_scores, settings.partitions),
            dead_letters=raw(settings.topic_dead_letter, 1),
        )


class Runtime:
    """Per worker process: settings, metrics, the Redis client, one thread per role.

    The encoder and Redis calls block: they run off the event loop (heartbeats keep
    flowing), one thread per role so a role's state is never touched concurrently.
    """

    def __init__(self, settings: Settings, exporter: Exporter, client: Client, roles: Sequence[str]) -> None:
        self.settings = settings
        self.exporter = exporter
        self.client = client
        self._threads = {role: ThreadPoolExecutor(1, thread_name_prefix=f"reval-{role}") for role in roles}

    async def run(self, role: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the role's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._threads[role], fn, *args)

    async def guarded(
        self, role: str, fn: Callable[[list[Record]], T], records: list[Record]
    ) -> tuple[list[T], list[dict[str, Any]]]:
        """Run ``fn`` on a batch: (its results, dead letters for records that failed).

        On an unexpected error the batch is retried one record at a time (the role
        steps are idempotent) and records that still fail are dead-lettered: an
        exception escaping a Faust batching agent would be acknowledged (committed)
        and lose the batch and whatever had been fetched behind it.
        """
        try:
            return [await self.run(role, fn, records)], []
        except Exception:
            log.exception("%s: batch of %d failed; retrying one record at a time", role, len(records))
        results, failed = [], []
        for record in records:
            try:
                results.append(await self.run(role, fn, [record]))
            except Exception as exc:
                log.exception("%s: record %s failed", role, record.claimant)
                failed.append(dead_letter(record, "processing_error", repr(exc)[:500], role))
        return results, failed

    async def send_all(self, topic: faust.TopicT, items: Sequence[dict[str, Any]], key_field: str) -> None:
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
