"""``reval worker``: settings, topics, /metrics, then the Faust worker (blocks until stopped)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import faust
from kafka.errors import KafkaError

from stream.feeds.retention import unread_at_risk
from workers.adapters.kafka.kafka_client import (
    BrokerError,
    create_topics,
    group_offsets,
    partition_heads,
    topic_retention,
)
from workers.adapters.prometheus.exporter import Exporter
from workers.adapters.redis.redis_client import connect, stopping
from workers.service.app import DEFAULT_PORTS, ROLES, create_app
from workers.service.incarnation import batch_group, group_generation
from workers.service.transactions import TransactionsUnsupportedError, check_transactions
from workers.settings import Settings


class MetricsPortError(OSError):
    """The /metrics endpoint could not listen (port taken, address not ours)."""


class Worker(faust.Worker):
    """The Faust worker, told to stop waiting on Redis the moment shutdown begins."""

    async def on_stop(self) -> None:
        # mode runs the worker's on_stop before stopping its children; the app's own
        # on_before_shutdown comes only after the consumer has waited for in-flight
        # batches, which cannot finish while a role thread waits for Redis.
        stopping.set()
        await super().on_stop()


def run_worker(
    roles: Sequence[str], overrides: Mapping[str, Any], loglevel: str = "info", env_file: str | None = None
) -> None:
    """Blocks until the worker is stopped (SIGTERM / Ctrl-C)."""
    unknown = sorted(set(roles) - set(ROLES))
    if unknown or not roles:
        raise ValueError(f"unknown role(s) {', '.join(unknown) or '(none)'}; use {', '.join(ROLES)}")
    settings = Settings.load(env_file, **overrides)
    logging.basicConfig(level=loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    create_topics(
        settings.broker.split(",")[0],
        settings.topics(),
        replication=settings.replication,
        timeout=settings.startup_timeout_s,
        configs=settings.topic_configs(),
        **settings.kafka_client_options(),
    )
    if "score" in roles and settings.processing_guarantee == "exactly_once":
        try:
            asyncio.run(check_transactions(settings.broker, settings.aiokafka_options(), timeout=15))
        except TransactionsUnsupportedError as exc:
            raise ValueError(
                f"REVAL_PROCESSING_GUARANTEE=exactly_once: the broker at {settings.broker} runs no "
                f"Kafka transactions ({exc}); Tansu keeps at_least_once, exactly_once needs Apache Kafka"
            ) from None
    exporter = Exporter()
    port = settings.metrics_port or DEFAULT_PORTS[sorted(roles)[0]]
    try:
        exporter.serve(port, settings.metrics_host)
    except OSError as exc:
        raise MetricsPortError(
            f"cannot serve /metrics on {settings.metrics_host}:{port}: {exc.strerror or exc}"
        ) from exc
    logging.getLogger("reval.workers").info("metrics on %s:%d/metrics", settings.metrics_host, port)
    app = create_app(settings, roles, exporter=exporter)
    check_input_retention(settings, roles, faust_group=app.conf.id)
    Worker(app, loglevel=loglevel.upper()).execute_from_commandline()


def check_input_retention(settings: Settings, roles: Sequence[str], *, faust_group: str) -> None:
    """Say, before consuming, where an input topic's retention deletes records this worker's
    consumer groups have not read (or already did): one WARNING line per partition at risk, and
    one where an existing topic keeps records for less than ``REVAL_INPUT_RETENTION_MS``.

    Waits for the group coordinator first: a fresh Kafka creates ``__consumer_offsets`` on the
    first group request and answers "coordinator not available" meanwhile, which aiokafka
    logs as an ERROR of a normal start.  A check the broker cannot answer (Tansu has no topic
    settings; a principal without DescribeConfigs) is logged and skipped, never fatal."""
    log = logging.getLogger("reval.workers")
    bootstrap, options, timeout = settings.broker, settings.kafka_client_options(), settings.startup_timeout_s
    inputs = [settings.topic_tweets, settings.topic_recommendations]
    try:
        topics = topic_retention(bootstrap, inputs, timeout=timeout, **options)
        group_offsets(bootstrap, faust_group, timeout=timeout, **options)
        client = connect(settings.redis_url, cluster=settings.redis_cluster, timeout=settings.redis_timeout_s)
        try:
            generation = group_generation(client, settings.redis_prefix)
        finally:
            client.close()
        inputs_of = {"embed": settings.topic_tweets, "score": settings.topic_recommendations}
        wanted = {
            topic: batch_group(settings.app_id, role, generation)
            for role, topic in inputs_of.items()
            if role in roles
        }
        now_ms = int(time.time() * 1000)
        for name, group in wanted.items():
            topic = topics.get(name)
            if topic is None:
                continue
            configured = settings.input_retention_ms
            if topic.deletes_by_time and (configured < 0 or topic.retention_ms < configured):
                log.warning(
                    "topic %r exists with retention.ms=%d, shorter than REVAL_INPUT_RETENTION_MS=%d "
                    "(which applies to the topics the workers create): records stamped earlier than "
                    "that are deleted, read or not",
                    name,
                    topic.retention_ms,
                    configured,
                )
            heads = partition_heads(bootstrap, group, name, timeout=timeout, **options)
            for line in unread_at_risk(topic, group, heads, now_ms=now_ms):
                log.warning("%s", line)
    except (BrokerError, KafkaError) as exc:
        log.info("input topics' retention not checked: %s", exc)
