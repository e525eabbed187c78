"""The exactly-once delivery's bound: a transaction whose producer stalls (aiokafka's
transactional calls have no timeout of their own) fail-stops the worker within
``REVAL_PRODUCE_TIMEOUT_S`` instead of leaving it consuming nothing, silently."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
import redis
from aiokafka import TopicPartition

from tests.fakes import Halted, halt
from workers.adapters.prometheus.exporter import Exporter
from workers.service.runtime import FAIL_STOP_EXIT, Runtime
from workers.service.transactions import Transactions
from workers.settings import Settings


class StalledProducer:
    """A transactional producer whose ``stalled`` call never returns (the others do at once)."""

    def __init__(self, stalled: str) -> None:
        self.stalled = stalled
        self.calls: list[str] = []

    async def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == self.stalled:
            await asyncio.Event().wait()

    async def begin_transaction(self) -> None:
        await self._call("begin_transaction")

    async def send_offsets_to_transaction(self, offsets: object, group: str) -> None:
        await self._call("send_offsets_to_transaction")

    async def commit_transaction(self) -> None:
        await self._call("commit_transaction")

    async def abort_transaction(self) -> None:
        await self._call("abort_transaction")


@pytest.fixture
def runtime(scratch_redis: str) -> Iterator[Runtime]:
    client = redis.Redis.from_url(scratch_redis)
    settings = Settings(redis_url=scratch_redis, redis_prefix="test-txn", produce_timeout_s=0.5)
    rt = Runtime(settings, Exporter(), client, ["score"], exit=halt)
    yield rt
    rt.close()
    client.close()


@pytest.mark.parametrize("stalled", ["begin_transaction", "commit_transaction"])
def test_a_stalled_transaction_fail_stops_within_the_produce_timeout(
    runtime: Runtime, stalled: str, caplog: pytest.LogCaptureFixture
) -> None:
    tp = TopicPartition("recs", 2)
    transactions = Transactions(runtime, "group", {})
    producer = StalledProducer(stalled)
    transactions.producers[tp] = producer

    async def deliver() -> None:
        await asyncio.wait_for(transactions.deliver([], {tp: 7}), 10)  # the bound, not this, must end it

    with caplog.at_level(logging.CRITICAL), pytest.raises(Halted) as halted:
        asyncio.run(deliver())
    assert halted.value.code == FAIL_STOP_EXIT
    assert producer.calls[-1] == stalled and "commit_transaction" not in producer.calls[:-1]
    assert "recs:2: the batch's transaction not finished within 0.5s (the producer stalled)" in caplog.text
