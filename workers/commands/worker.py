"""``reval worker``: settings, topics, /metrics, then the Faust worker (blocks until stopped)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import faust

from workers.adapters.exporter import Exporter
from workers.adapters.kafka_client import create_topics
from workers.service.app import DEFAULT_PORTS, ROLES, create_app
from workers.settings import Settings


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
        **settings.kafka_client_options(),
    )
    exporter = Exporter()
    port = settings.metrics_port or DEFAULT_PORTS[sorted(roles)[0]]
    exporter.serve(port, settings.metrics_host)
    logging.getLogger("reval.workers").info("metrics on %s:%d/metrics", settings.metrics_host, port)
    app = create_app(settings, roles, exporter=exporter)
    faust.Worker(app, loglevel=loglevel.upper()).execute_from_commandline()
