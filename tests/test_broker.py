"""The local Tansu broker: lifecycle, topic creation, kafka-python → aiokafka round trip."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.adapters.kafka.kafka_client import TopicPartitionMismatchError, create_topics, topic_partitions
from workers.dev.tansu import BrokerStartError, TansuBroker

pytestmark = pytest.mark.integration

BASE_TS = 1_350_000_000_000  # 2012-10-12, the CrisisLex era: far from "now"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    log = tmp_path_factory.mktemp("tansu") / "broker.log"
    with TansuBroker(log_path=log) as b:
        yield b


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_lifecycle(tmp_path: Path) -> None:
    log = tmp_path / "sub" / "tansu.log"
    b = TansuBroker(log_path=log)
    with b:
        assert b.running
        host, port = b.bootstrap.split(":")
        assert host == "127.0.0.1" and int(port) == b.port > 0
        assert b.url == f"kafka://{b.bootstrap}"
        assert b.faust_settings()["broker"] == b.url
        pid = b.pid
        assert pid is not None and _alive(pid)
        assert topic_partitions(b.bootstrap, ["nothing-here"]) == {"nothing-here": None}
    assert not b.running
    assert not _alive(pid)
    assert "tansu" in log.read_text().lower()
    b.stop()  # idempotent


def test_default_log_is_temporary() -> None:
    with TansuBroker() as b:
        log = b.log_path
        assert log is not None and log.exists()
    assert not log.exists()


def test_fixed_port_in_use(broker: TansuBroker) -> None:
    with pytest.raises(BrokerStartError, match="in use"):
        TansuBroker(port=broker.port).start()


def test_start_failure_includes_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "failed.log"
    with pytest.raises(BrokerStartError, match="unexpected argument") as info:
        TansuBroker(extra_args=["--no-such-flag"], startup_timeout=10, log_path=log).start()
    assert "exited with code" in str(info.value) and str(log) in str(info.value)


def test_create_topics_explicit_partitions(broker: TansuBroker) -> None:
    spec = {_name("tweets"): 4, _name("recs"): 2, _name("scores"): 1}
    create_topics(broker.bootstrap, spec)
    assert topic_partitions(broker.bootstrap, spec) == spec
    create_topics(broker.bootstrap, spec)  # idempotent
    assert topic_partitions(broker.bootstrap, spec) == spec

    name = next(iter(spec))
    with pytest.raises(TopicPartitionMismatchError, match=r"has 4 partitions, wanted 3"):
        create_topics(broker.bootstrap, {name: 3})

    with pytest.raises(ValueError):
        create_topics(broker.bootstrap, {_name("bad"): 0})


def test_auto_created_topic_is_reported(broker: TansuBroker) -> None:
    from kafka import KafkaProducer

    name = _name("auto")
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    try:
        producer.send(name, b"x").get(timeout=10)
    finally:
        producer.close()
    auto = topic_partitions(broker.bootstrap, [name])[name]
    assert auto is not None and auto >= 1
    with pytest.raises(TopicPartitionMismatchError, match="auto-created"):
        create_topics(broker.bootstrap, {name: auto + 1})


def test_kafka_python_producer_to_aiokafka_consumer(broker: TansuBroker) -> None:
    from aiokafka import AIOKafkaConsumer, ConsumerRecord
    from kafka import KafkaProducer

    topic = _name("roundtrip")
    create_topics(broker.bootstrap, {topic: 3})
    n = 30
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5)
    try:
        futures = [
            producer.send(
                topic,
                key=f"tweet-{i}".encode(),
                value=f'{{"i": {i}}}'.encode(),
                timestamp_ms=BASE_TS + 1000 * i,
                headers=[("source", b"test"), ("i", str(i).encode())],
            )
            for i in range(n)
        ]
        producer.flush(timeout=10)
        meta = [f.get(timeout=10) for f in futures]
    finally:
        producer.close()
    assert {m.timestamp for m in meta} == {BASE_TS + 1000 * i for i in range(n)}

    async def consume() -> list[ConsumerRecord[bytes, bytes]]:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=broker.bootstrap,
            group_id=_name("group"),
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            # Tansu answers a new group's first join after ~session_timeout/2.
            session_timeout_ms=2000,
            heartbeat_interval_ms=500,
        )
        await consumer.start()
        records: list[ConsumerRecord[bytes, bytes]] = []
        try:
            async with asyncio.timeout(20):
                while len(records) < n:
                    batch = await consumer.getmany(timeout_ms=500)
                    for msgs in batch.values():
                        records.extend(msgs)
            await consumer.commit()
        finally:
            await consumer.stop()
        return records

    records = asyncio.run(consume())
    assert len(records) == n
    by_key = {r.key.decode(): r for r in records}
    assert set(by_key) == {f"tweet-{i}" for i in range(n)}
    for i in range(n):
        r = by_key[f"tweet-{i}"]
        assert r.timestamp == BASE_TS + 1000 * i
        assert r.timestamp_type == 0  # CreateTime
        assert r.value == f'{{"i": {i}}}'.encode()
        assert dict(r.headers) == {"source": b"test", "i": str(i).encode()}
    assert {r.partition for r in records} <= {0, 1, 2}
    # Per partition, offsets are dense and start at 0.
    for p in {r.partition for r in records}:
        offsets = sorted(r.offset for r in records if r.partition == p)
        assert offsets == list(range(len(offsets)))
