"""``reval worker``: settings, topics, /metrics, then the Faust worker (blocks until stopped)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import faust

from workers.adapters.exporter import Exporter
from workers.adapters.kafka_client import create_topics
from workers.adapters.redis_client import stopping
from workers.service.app import DEFAULT_PORTS, ROLES, create_app
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
    Worker(app, loglevel=loglevel.upper()).execute_from_commandline()
