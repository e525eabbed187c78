"""How the workers produce (:func:`workers.service.runtime.send_batched`), on Apache Kafka: each
record acknowledged at the partition aiokafka's own ``send`` gives its key, in order; a batch
fuller than the producer's batch size split, never a record lost or doubled."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from workers.service.runtime import send_batched

pytestmark = pytest.mark.integration


async def produce_both_ways(
    bootstrap: str, topics: tuple[str, str], values: list[bytes]
) -> list[list[tuple]]:
    """The same keyed records to ``topics[0]`` by ``send`` one at a time and to ``topics[1]`` by
    :func:`send_batched` (with small batches: 2 KB); what each topic holds, read back."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, max_batch_size=2048
    )
    await producer.start()
    try:
        keys = [f"tweet-{i}".encode() for i in range(len(values))]
        await asyncio.gather(
            *[await producer.send(topics[0], value=v, key=k) for k, v in zip(keys, values, strict=True)]
        )
        acks = await send_batched(producer, [(topics[1], k, v) for k, v in zip(keys, values, strict=True)])
        assert not [a for a in acks if isinstance(a, BaseException)]
        await asyncio.gather(*acks)  # type: ignore[arg-type]
    finally:
        await producer.stop()
    held = []
    for topic in topics:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
        await consumer.start()
        try:
            records: list[tuple] = []
            deadline = time.monotonic() + 60  # a record lost must fail here, not at pytest's timeout
            while len(records) < len(values) and time.monotonic() < deadline:
                for batch in (await consumer.getmany(timeout_ms=2000)).values():
                    records += [(r.partition, r.offset, r.key, r.value) for r in batch]
        finally:
            await consumer.stop()
        held.append(sorted(records))
    return held


def test_send_batched_puts_every_record_where_send_does_in_order(broker: str) -> None:
    topics = (f"send-one-{uuid.uuid4().hex[:8]}", f"send-batched-{uuid.uuid4().hex[:8]}")
    admin = KafkaAdminClient(bootstrap_servers=broker)
    try:
        admin.create_topics([NewTopic(t, 4, 1) for t in topics])
    finally:
        admin.close()
    values = [f'{{"i": {i}, "pad": "{"x" * (i % 700)}"}}'.encode() for i in range(300)]  # 2 KB batches fill
    one, batched = asyncio.run(produce_both_ways(broker, topics, values))
    assert len(batched) == len(values) and batched == one  # same partition, offset, key, value
    assert len({p for p, *_ in batched}) == 4
