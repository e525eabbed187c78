"""Topic incarnations: a source topic deleted and re-created restarts its offsets at 0.

Offsets identify records only within one incarnation, so everything keyed by offset --
the running means' watermarks, retweet claims, join event ids -- is scoped by the
topic's id (:class:`workers.adapters.kafka_client.TopicIdentity`).  The id the workers
consume is kept in Redis (``{prefix}:topic:<topic>``); when the broker reports another
one, the role *waits* (no record applied, nothing committed, ``reval_topic_reset_detected``
= 1, alert ``RevalTopicReset``) until an operator says what the new topic holds:

    reval admin accept-topic TOPIC      # its records are new data: go on

(If it holds a replay of data already counted, clear the state first -- a new
``REVAL_REDIS_PREFIX``, or ``reval admin clear-state`` -- then accept.)
"""

from __future__ import annotations

import logging
from typing import Any

from workers.adapters.exporter import Exporter
from workers.adapters.kafka_client import TopicIdentity
from workers.adapters.redis_client import Client, Stopping, stopping, with_retry

log = logging.getLogger("reval.workers")


def incarnation_key(prefix: str, topic: str) -> str:
    return f"{prefix}:topic:{topic}"


class Incarnations:
    """Checks, once per batch, that a topic is still the incarnation being consumed."""

    def __init__(self, identity: TopicIdentity, client: Client, prefix: str, exporter: Exporter) -> None:
        self.identity = identity
        self.client = client
        self.prefix = prefix
        self.x = exporter

    def current(self, topic: str, *, poll: float = 5.0) -> str:
        """The short id of ``topic``'s incarnation; waits while it is not the accepted one."""
        key = incarnation_key(self.prefix, topic)
        warned = False
        while True:
            now = self.identity.of(topic)

            def accepted(now: str = now) -> Any:
                self.client.set(key, now, nx=True)  # the first worker ever records it
                return self.client.get(key)

            stored = with_retry("topic identity", accepted, report=self.x.redis_report)
            stored = stored.decode() if isinstance(stored, bytes) else str(stored)
            if stored == now:
                if warned:
                    log.warning("topic %s: incarnation %s accepted; going on", topic, now)
                self.x.topic_reset.labels(topic).set(0)
                return now[:8]
            self.x.topic_reset.labels(topic).set(1)
            if not warned:
                log.error(
                    "topic %s was re-created (id %s, was %s): its offsets restarted, so no record is "
                    "applied until an operator runs `reval admin accept-topic %s`",
                    topic,
                    now,
                    stored,
                    topic,
                )
                warned = True
            if stopping.wait(poll):
                raise Stopping(f"topic {topic}: shutting down while waiting for accept-topic")
