"""Topic incarnations: a source topic deleted and re-created restarts its offsets at 0.

Offsets identify records only within one incarnation, so everything keyed by offset --
the running means' watermarks, retweet claims, join event ids -- is scoped by the
topic's id (:class:`workers.adapters.kafka.kafka_client.TopicIdentity`).  The id the workers
consume is kept in Redis (``{prefix}:topic:<topic>``); when the broker reports another
one, the role *waits* (no record applied, nothing committed, ``reval_topic_reset_detected``
= 1, alert ``RevalTopicReset``) until an operator says what the new topic holds:

    reval admin accept-topic TOPIC      # its records are new data: read it from its start

The consumers' positions (in memory and committed) belong to the old incarnation, and
Kafka will not move the committed offsets of a group with members.  So accept-topic starts
a new *generation* of consumer groups (``<group>-g<n>``): it copies every committed offset
of the old groups except TOPIC's, records the new topic id, and bumps the generation in
Redis.  A worker still waiting on the topic then stops itself; restarted, it joins the new
generation and reads TOPIC from its start (every other topic goes on where it was).  If
the new topic holds a replay of data already counted, use a new ``REVAL_REDIS_PREFIX``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections.abc import Sequence
from typing import Any

import faust
from kafka.errors import KafkaError
from redis.backoff import ExponentialBackoff

from workers.adapters.kafka.kafka_client import BrokerError, TopicIdentity
from workers.adapters.prometheus.exporter import Exporter
from workers.adapters.redis.redis_client import Client, Stopping, stopping, with_retry
from workers.service.runtime import fail_stop

log = logging.getLogger("reval.workers")


def incarnation_key(prefix: str, topic: str) -> str:
    return f"{prefix}:topic:{topic}"


def short_id(topic_id: str) -> str:
    """A short, well-spread tag of a topic id for keys.  Not a prefix: Kafka's ids may be
    time-ordered UUIDs (v7: Tansu's are), whose leading digits are shared by topics created
    within a minute of each other.

    >>> short_id("01a208f8-325d-7be0-a8ba-8ba0bf98159e") != short_id("01a208f8-9b7f-7a73-bb38-cbe42972f19d")
    True
    """
    return hashlib.blake2b(topic_id.encode(), digest_size=6).hexdigest()


def generation_key(prefix: str) -> str:
    return f"{prefix}:groups:generation"


def group_generation(client: Client, prefix: str) -> int:
    """How many times a re-created topic was accepted: the consumer groups' generation."""
    value = with_retry("group generation", lambda: client.get(generation_key(prefix)))
    return int(value or 0)


def group_id(app_id: str, roles: Sequence[str], generation: int) -> str:
    """The consumer group of a worker running ``roles``.

    >>> group_id("reval", ["score", "embed"], 0), group_id("reval", ["embed"], 2)
    ('reval-embed-score', 'reval-embed-g2')
    """
    name = f"{app_id}-{'-'.join(sorted(roles))}"
    return f"{name}-g{generation}" if generation else name


def batch_group(app_id: str, role: str, generation: int) -> str:
    """A role's batch consumer group (:mod:`workers.service.consumer`), whatever other roles
    its process runs: one group of every worker of that role.  Named as :func:`group_id` names
    the Faust app's groups, so ``reval admin accept-topic`` finds and copies its offsets as theirs.

    >>> batch_group("reval", "score", 0), batch_group("reval", "embed", 2)
    ('reval-score-batch', 'reval-embed-batch-g2')
    """
    return group_id(app_id, [f"{role}-batch"], generation)


def next_group(group: str, generation: int) -> str:
    """The name ``group`` (of ``generation``) takes in the next generation.

    >>> next_group("reval-embed", 0), next_group("reval-embed-g2", 2)
    ('reval-embed-g1', 'reval-embed-g3')
    """
    base = group.removesuffix(f"-g{generation}") if generation else group
    return f"{base}-g{generation + 1}"


class Incarnations:
    """Which incarnation of each source topic is being consumed, checked once per batch
    and on a timer (a re-created topic may bring no batch at all: the consumer's position
    from the old incarnation can lie beyond the new one's end)."""

    def __init__(self, identity: TopicIdentity, client: Client, prefix: str, exporter: Exporter) -> None:
        self.identity = identity
        self.client = client
        self.prefix = prefix
        self.x = exporter
        self._reset_seen: set[str] = set()
        self._lock = threading.Lock()

    def check(self, topic: str) -> str | None:
        """The short id of ``topic``'s incarnation if it is the accepted one, else None
        (``reval_topic_reset_detected`` = 1 and one error log).

        A topic accepted after this process saw it re-created stops the process: its
        consumer positions belong to the old incarnation; restarted, it joins the consumer
        groups' new generation, which reads the new incarnation from its start.
        """
        key = incarnation_key(self.prefix, topic)
        now = self.identity.of(topic)

        def accepted() -> Any:  # one round trip (checked once per batch)
            pipe = self.client.pipeline(transaction=False)
            pipe.set(key, now, nx=True)  # the first worker ever records it
            pipe.get(key)
            return pipe.execute()[1]

        stored = with_retry("topic identity", accepted, report=self.x.redis_report)
        stored = stored.decode() if isinstance(stored, bytes) else str(stored)
        with self._lock:
            if stored == now:
                self.x.topic_reset.labels(topic).set(0)
                if topic in self._reset_seen:
                    fail_stop(
                        f"topic {topic}: incarnation {now} accepted; restart to read it from its "
                        "start in the consumer groups' new generation"
                    )
                return short_id(now)
            self.x.topic_reset.labels(topic).set(1)
            if topic not in self._reset_seen:
                self._reset_seen.add(topic)
                log.error(
                    "topic %s was re-created (id %s, was %s): its offsets restarted, so no record is "
                    "applied until an operator runs `reval admin accept-topic %s`",
                    topic,
                    now,
                    stored,
                    topic,
                )
        return None

    def current(self, topic: str, *, poll: float = 5.0) -> str:
        """The short id of ``topic``'s incarnation; waits while it is not the accepted one,
        and while the broker cannot say (down, electing a leader, the topic being deleted):
        nothing of the batch is applied or committed meanwhile (back-pressure), as for Redis."""
        backoff = ExponentialBackoff(cap=poll, base=0.2)
        failures = 0
        while True:
            try:
                short = self.check(topic)
            except (BrokerError, KafkaError) as exc:
                failures += 1
                delay = backoff.compute(failures)
                if failures == 1 or failures % 10 == 0:
                    log.warning("topic %s: the broker cannot tell its id (%s); retrying", topic, exc)
                if stopping.wait(delay):
                    raise Stopping(f"topic {topic}: shutting down while the broker was unavailable") from exc
                continue
            if short is not None:
                return short
            if stopping.wait(poll):
                raise Stopping(f"topic {topic}: shutting down while waiting for accept-topic")

    def watch(self, app: faust.App, topics: Sequence[str], *, interval: float = 5.0) -> None:
        """A timer checking ``topics`` between batches too."""

        @app.timer(interval=interval, name=f"incarnations-{'-'.join(topics)}")
        async def check_topics() -> None:
            for topic in topics:
                try:
                    await asyncio.to_thread(self.check, topic)
                except (Stopping, BrokerError, KafkaError) as exc:  # the next tick tries again
                    log.warning("topic %s: incarnation check failed: %s", topic, exc)
