"""Exactly-once scores on Apache Kafka: a batch's outputs and its input offsets in one
transaction per input partition (``REVAL_PROCESSING_GUARANTEE=exactly_once``).

Each input partition the score consumer holds has its own transactional producer,
``transactional.id = <consumer group>-<topic>-<partition>`` (KIP-98's zombie fencing: aiokafka's
``send_offsets_to_transaction`` takes a group name, not the group's generation, so a producer
per input partition is how a newer owner fences an older one).  Starting it (``init``) fences
whatever process held the partition before and completes or aborts that process' open
transaction; only then does the consumer read the partition's committed offset
(:meth:`workers.service.consumer.BatchConsumer.assigned`).  For each batch and each of its
input partitions: begin; produce the outputs that came from that partition's records
(:attr:`~workers.service.runtime.Output.input`); ``send_offsets_to_transaction`` of the
partition's next offset; commit.  A ``read_committed`` consumer of the scores topic sees a
batch's scores if and only if the batch's offsets are committed: never twice, never lost,
whatever is killed when.

Faults, as :meth:`workers.service.runtime.Runtime.deliver` handles them: an output the broker
refuses as too large aborts the transaction and goes again as its source's dead letter; any
other refusal aborts and retries until ``REVAL_PRODUCE_TIMEOUT_S``, then the worker
fail-stops; a fenced producer (another process holds the partition now) fail-stops at once --
its transaction is aborted, the new owner reads the batch again.

Tansu has no transactions: the setting is refused there (:func:`check_transactions`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from workers.service.runtime import Output, Runtime, send_batched, too_large
from workers.settings import KafkaSettings

T = TypeVar("T")

log = logging.getLogger("reval.workers")


class TransactionsUnsupportedError(RuntimeError):
    """The broker cannot run Kafka transactions (Tansu)."""


def transactional_id(group: str, tp: TopicPartition) -> str:
    """The transactional id of an input partition's producer.

    >>> transactional_id("reval-score-batch", TopicPartition("recommendations", 3))
    'reval-score-batch-recommendations-3'
    """
    return f"{group}-{tp.topic}-{tp.partition}"


class Transactions:
    """The transactional producers of the input partitions held, and delivery through them."""

    def __init__(self, rt: Runtime, group: str, options: Mapping[str, Any]) -> None:
        self.rt = rt
        self.group = group
        self.options = dict(options)
        self.producers: dict[TopicPartition, AIOKafkaProducer] = {}

    def _producer(self, tp: TopicPartition) -> AIOKafkaProducer:
        settings: KafkaSettings = self.rt.settings
        return AIOKafkaProducer(
            bootstrap_servers=settings.broker.split(","),
            client_id=transactional_id(self.group, tp),
            transactional_id=transactional_id(self.group, tp),
            acks="all",
            max_request_size=settings.max_message_bytes,
            max_batch_size=settings.max_message_bytes,
            linger_ms=5,
            # Longer than a batch can take; a process that dies mid-transaction has it aborted
            # by its partitions' next owner (init), not by this timeout.
            transaction_timeout_ms=max(60_000, int(settings.produce_timeout_s * 1000) + 30_000),
            **self.options,
        )

    async def own(self, partitions: Iterable[TopicPartition]) -> None:
        """Start (init, fencing the previous owner) a producer for each new partition."""
        new = [tp for tp in partitions if tp not in self.producers]
        started = [self._producer(tp) for tp in new]
        results = await asyncio.gather(*(p.start() for p in started), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        for tp, producer, result in zip(new, started, results, strict=True):
            if isinstance(result, BaseException):
                await producer.stop()
            else:
                self.producers[tp] = producer
        if failed:
            raise failed[0]

    async def release(self, partitions: Iterable[TopicPartition]) -> None:
        """Stop the producers of partitions this process no longer holds."""
        gone = [self.producers.pop(tp) for tp in partitions if tp in self.producers]
        await asyncio.gather(*(p.stop() for p in gone), return_exceptions=True)

    async def close(self) -> None:
        await self.release(list(self.producers))

    async def deliver(self, outputs: Sequence[Output], positions: Mapping[TopicPartition, int]) -> None:
        """Commit ``outputs`` with the batch's ``positions`` (next offset per input partition):
        one transaction per input partition, all at once."""
        encoded = [self.rt.encode(o) for o in outputs]
        by_partition: dict[TopicPartition, list[tuple[Output, bytes]]] = {tp: [] for tp in positions}
        for output, data in encoded:
            source = output.input
            tp = TopicPartition(source.topic, source.partition)
            if tp not in by_partition:  # a bug: an output no input of this batch accounts for
                self.rt.fail_stop(f"an output of {source.claimant} is not from this batch's partitions")
            by_partition[tp].append((output, data))
        await asyncio.gather(
            *(self._commit(tp, by_partition[tp], position) for tp, position in positions.items())
        )

    async def _commit(self, tp: TopicPartition, pending: list[tuple[Output, bytes]], position: int) -> None:
        producer = self.producers.get(tp)
        if producer is None:
            self.rt.fail_stop(f"{tp.topic}:{tp.partition} has no transactional producer (not held)")
        timeout = self.rt.settings.produce_timeout_s
        deadline = time.monotonic() + timeout

        async def bounded(step: Awaitable[T]) -> T:
            # aiokafka's transactional calls wait on its sender without a timeout of their own:
            # a step that never returns would leave the worker consuming nothing, silently.
            try:
                return await asyncio.wait_for(step, max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                self.rt.fail_stop(
                    f"{tp.topic}:{tp.partition}: the batch's transaction not finished within "
                    f"{timeout:g}s (the producer stalled); not acknowledging the batch"
                )

        delay = 0.2
        while True:
            try:
                await bounded(producer.begin_transaction())
            except Exception as exc:  # fenced, or a fatal producer state: never commit this batch
                self.rt.fail_stop(f"{tp.topic}:{tp.partition}: cannot begin a transaction: {exc!r}")
            failed = await bounded(self._produce(producer, pending))
            if not failed:
                try:
                    await bounded(producer.send_offsets_to_transaction({tp: position}, self.group))
                    await bounded(producer.commit_transaction())
                    return
                except KafkaError as exc:
                    log.warning("%s:%d: transaction failed (%r); aborting it", tp.topic, tp.partition, exc)
                    failed = {}
            try:
                await bounded(producer.abort_transaction())
            except Exception as exc:  # fenced (another process holds the partition) or fatal
                self.rt.fail_stop(f"{tp.topic}:{tp.partition}: transaction not aborted: {exc!r}")
            retry: list[tuple[Output, bytes]] = []
            for i, (output, data) in enumerate(pending):
                error = failed.get(i)
                if error is not None and too_large(error):
                    detail = f"refused as too large: {error!r}"
                    retry.append(self.rt.replace(output, "output_too_large", detail))
                else:
                    retry.append((output, data))
            pending = retry
            if time.monotonic() > deadline:
                self.rt.fail_stop(
                    f"{tp.topic}:{tp.partition}: the batch's transaction not committed within "
                    f"{self.rt.settings.produce_timeout_s:g}s; not acknowledging the batch"
                )
            self.rt.exporter.produce_retries.inc(len(failed) or 1)
            if not any(too_large(e) for e in failed.values()):
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _produce(
        self, producer: AIOKafkaProducer, pending: list[tuple[Output, bytes]]
    ) -> dict[int, BaseException]:
        """Send ``pending`` in the open transaction; the errors by position (none: all acknowledged)."""
        acks = await send_batched(producer, [(self.rt.names[o.topic], o.key, data) for o, data in pending])
        failed: dict[int, BaseException] = {}
        for i, ack in enumerate(acks):
            try:
                if isinstance(ack, BaseException):
                    raise ack
                await ack
            except Exception as exc:
                failed[i] = exc
        for i, error in failed.items():
            log.warning("producing to %s in a transaction failed (%r)", pending[i][0].topic, error)
        return failed


async def check_transactions(bootstrap: str, options: Mapping[str, Any], *, timeout: float = 30.0) -> None:
    """Raise :class:`TransactionsUnsupportedError` when the broker cannot run a transaction
    (a throwaway transactional id: init, begin, abort)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap.split(","),
        transactional_id=f"reval-probe-{uuid.uuid4().hex[:12]}",
        request_timeout_ms=int(timeout * 1000),
        **options,
    )
    try:
        await asyncio.wait_for(producer.start(), timeout)
        await asyncio.wait_for(producer.begin_transaction(), timeout)
        await asyncio.wait_for(producer.abort_transaction(), timeout)
    except (KafkaError, TimeoutError, AssertionError) as exc:
        detail = f"{type(exc).__name__}: {exc}".rstrip(": ")
        raise TransactionsUnsupportedError(detail) from exc
    finally:
        await producer.stop()
