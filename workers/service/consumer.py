"""Every role's consumer: batches from Kafka with no task per record.

Faust's agents take records one at a time -- two tasks and an ``asyncio.wait`` per record,
~120 µs of the score worker's ~440 µs per event (py-spy, BENCHMARKS.md), whatever the
settings.  So each consuming role reads its topics with aiokafka's public consumer API
instead, inside the Faust app (:class:`BatchConsumer`, a service started and stopped with
it; Faust stays the host of the timers and of the index job's leader election), and drives
the one :meth:`~workers.service.runtime.Runtime.process`: the embed role its ``tweets``; the
score role ``recommendations`` for the ``score`` step and ``tweets`` for the join's.

* ``getmany`` takes up to ``size`` records; each topic's records are one batch of its step;
  where every step can start its admission elsewhere (``Step.prefetch``: the embed role's
  preparing processes), a batch is admitted while the one before it is applied and settled
  after the next poll (lookahead); a rebalance drops both;
* offsets are committed explicitly and only once their batch is settled: after ``process``
  returned (at least once, ``commit``), or in the batch's transactions (exactly once,
  :mod:`workers.service.transactions`); a batch that did not settle ends the process first
  (:meth:`Runtime.process`), so nothing unsettled is ever committed;
* a step that holds (the join full, no usable thesaurus) pauses its topic's partitions --
  back-pressure -- while the consumer keeps polling its other topic (tweets drain the join);
* a rebalance waits for the batch in flight before the partitions go
  (``on_partitions_revoked``); a batch fetched before a rebalance is dropped, not processed
  after it; newly assigned partitions start at the committed offsets, read only after their
  transactional producers fenced the previous owner (exactly once);
* a shutdown (SIGTERM, SIGINT) lets the batch in flight settle -- or end the process
  unacknowledged, as :meth:`Runtime.process` does while Redis is away -- and commits nothing
  else.

Consumer groups: :func:`~workers.service.incarnation.batch_group`, ``<app_id>-<role>-batch``
(``-g<n>`` from generation n on; ``reval admin accept-topic`` copies their offsets as every
group's).  Upgrading from the Faust agents, whose offsets are in the Faust app's group
(``<app_id>-<roles>``): a partition the new group has no offset for starts where that group
had committed, so the upgrade neither skips nor repeats a record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Mapping, Sequence
from functools import partial
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from mode import Service

from workers.adapters.kafka.kafka_client import group_offsets
from workers.service.kafka_records import Record
from workers.service.runtime import Deliver, Output, Produced, Runtime, Step, send_batched
from workers.service.transactions import Transactions
from workers.settings import KafkaSettings

log = logging.getLogger("reval.workers")

#: Longest a batch may take before the group considers this member gone (a batch held on a
#: Redis outage included; Faust's own default).
MAX_POLL_INTERVAL_S = 1000.0
#: How long a consumer may take no record while its partitions have records it has not taken
#: before it says why, in one warning line (then once per such period while it lasts).
STALL_WARN_S = 60.0


Batch = Mapping[TopicPartition, list[ConsumerRecord[bytes, bytes]]]
"""What ``getmany`` returns: each partition's records, in offset order."""


def _by_topic(batch: Batch) -> dict[str, list[ConsumerRecord[bytes, bytes]]]:
    by_topic: dict[str, list[ConsumerRecord[bytes, bytes]]] = {}
    for tp, messages in batch.items():
        if messages:
            by_topic.setdefault(tp.topic, []).extend(messages)
    return by_topic


def record_of(message: ConsumerRecord[bytes, bytes]) -> Record:
    """The :class:`Record` of a consumed message (raw bytes, as the core parsers want them)."""
    return Record(
        message.topic,
        message.partition,
        message.offset,
        message.timestamp if message.timestamp is not None and message.timestamp >= 0 else None,
        message.key,
        message.value if message.value is not None else b"",
    )


class BatchConsumer(Service):
    """Consumes ``steps`` (topic name -> step) in batches of up to ``size`` records, waiting up to
    ``within`` seconds for a batch, in consumer group ``group``.

    ``transactions``: exactly once (each batch's outputs and offsets in one transaction per
    input partition); None: at least once (outputs acknowledged, then the offsets committed).
    ``legacy_group``: where a partition without an offset in ``group`` starts (the Faust
    agents' group, before the upgrade).  ``lag_topics``: the topics whose
    ``reval_consumer_lag`` this consumer reports (a topic another role of the process consumes
    in its own group is that role's to report).
    """

    def __init__(
        self,
        rt: Runtime,
        steps: Mapping[str, Step[Any]],
        *,
        group: str,
        size: int,
        within: float,
        transactions: Transactions | None = None,
        legacy_group: str | None = None,
        lag_topics: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.rt = rt
        self.steps = dict(steps)
        self.group = group
        self.size = size
        self.within = within
        self.transactions = transactions
        self.legacy_group = legacy_group
        self.lag_topics = frozenset(lag_topics)
        self.consumer: AIOKafkaConsumer | None = None
        #: The plain (idempotent) producer: at-least-once outputs, and the join's expiry letters.
        self.producer: AIOKafkaProducer | None = None
        self._busy = asyncio.Lock()  # held while a batch is processed and committed
        self._generation = 0  # assignments seen: a batch fetched under an older one is dropped
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._paused: set[str] = set()
        self._positions: dict[TopicPartition, int] = {}  # next offset to settle, per partition
        self._legacy: dict[TopicPartition, int] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._progress_at = 0.0  # when a batch last had records, or the partitions changed

    # -- lifecycle -------------------------------------------------------------------------

    def _plain_producer(self, *, idempotent: bool) -> AIOKafkaProducer:
        settings: KafkaSettings = self.rt.settings
        return AIOKafkaProducer(
            bootstrap_servers=settings.broker.split(","),
            client_id=f"{self.group}-producer",
            acks="all",
            enable_idempotence=idempotent,
            max_request_size=settings.max_message_bytes,
            # One batch per partition can hold a whole step batch's outputs (as the app's
            # producer: runtime.Runtime.deliver).
            max_batch_size=settings.max_message_bytes,
            linger_ms=5,
            **settings.aiokafka_options(),
        )

    async def on_start(self) -> None:
        settings: KafkaSettings = self.rt.settings
        options = settings.aiokafka_options()
        self._loop = asyncio.get_running_loop()
        self.producer = self._plain_producer(idempotent=True)
        try:
            await self.producer.start()
        except KafkaError as exc:
            # Tansu answers InitProducerId with an error: no idempotent producer there.  The
            # outputs are at-least-once either way (idempotence only spares the duplicates of
            # the producer's own retries), so go on without it.
            await self.producer.stop()
            log.warning(
                "consumer %s: the broker refused an idempotent producer (%s: %s); "
                "outputs are sent without idempotence (at-least-once either way)",
                self.group,
                type(exc).__name__,
                exc,
            )
            self.producer = self._plain_producer(idempotent=False)
            await self.producer.start()
        session_ms = int(settings.session_timeout_s * 1000)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.broker.split(","),
            group_id=self.group,
            client_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=self.size,
            isolation_level="read_committed" if self.transactions is not None else "read_uncommitted",
            session_timeout_ms=session_ms,
            heartbeat_interval_ms=int(min(3.0, settings.session_timeout_s / 3) * 1000),
            max_poll_interval_ms=int(MAX_POLL_INTERVAL_S * 1000),
            rebalance_timeout_ms=max(60_000, session_ms),
            **options,
        )
        self.consumer.subscribe(sorted(self.steps), listener=_Listener(self))
        await self.consumer.start()
        self._task = asyncio.create_task(self._run(), name=f"{self.group}-batches")
        log.info("consumer %s: topics %s", self.group, ", ".join(sorted(self.steps)))

    async def on_stop(self) -> None:
        """Let the batch in flight settle (or end the process), then leave: nothing else is
        committed (auto-commit is off)."""
        self._closing = True
        async with self._busy:
            if self._task is not None:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
        if self.consumer is not None:
            await self.consumer.stop()
        if self.transactions is not None:
            await self.transactions.close()
        if self.producer is not None:
            await self.producer.stop()

    # -- the loop --------------------------------------------------------------------------

    @property
    def lookahead(self) -> bool:
        """Whether the next batch's admission starts while a batch is applied: every step can
        prefetch, and none holds (a hold decided before the poll would be stale by then)."""
        return all(step.prefetch is not None and step.hold is None for step in self.steps.values())

    async def _run(self) -> None:
        assert self.consumer is not None
        # The batch fetched last, its admission under way (lookahead), settled after the next
        # poll: while the role's thread applies it, the next one is admitted elsewhere.
        ahead: tuple[int, Batch, dict[str, Any]] | None = None
        loop = asyncio.get_running_loop()
        self._progress_at = loop.time()
        try:
            while not self._closing:
                await self._hold()
                generation = self._generation
                wait_ms = 0 if ahead is not None else int(self.within * 1000)
                batch = await self.consumer.getmany(timeout_ms=wait_ms, max_records=self.size)
                async with self._busy:
                    if self._closing:
                        continue  # the shutdown: redelivered to the next owner
                    if generation != self._generation or (ahead is not None and ahead[0] != self._generation):
                        # fetched across a rebalance: read again -- the newer batch first, so
                        # where a partition has no settled position the older one's start wins
                        self._rewind(batch)
                        if ahead is not None:
                            self._rewind(ahead[1])
                            ahead = None
                        continue
                    if self.lookahead:
                        fetched = (generation, batch, self._prefetch(batch)) if batch else None
                        if ahead is not None:
                            await self._settle(ahead[1], ahead[2])
                        ahead = fetched
                    elif batch:
                        await self._settle(batch)
                    self._report_lag()
                    if batch:
                        self._progress_at = loop.time()
                    elif loop.time() - self._progress_at >= STALL_WARN_S:
                        self._progress_at = loop.time()  # the next line one period later
                        await self._warn_stalled()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in the loop itself: never sit in a worker consuming nothing
            log.exception("consumer %s: unexpected error", self.group)
            self.rt.fail_stop(f"consumer {self.group}: unexpected {exc!r}")

    async def _warn_stalled(self) -> None:
        """One line saying why no record was taken for :data:`STALL_WARN_S` while some are
        waiting: per partition behind its end, the consumer's position (past any transaction
        marker, which no record follows), its end, the end a ``read_committed`` consumer may
        read up to (another producer's open transaction holds it back: the stable end) and
        whether the step holds it (paused: a paused partition is not fetched, so its end is
        asked for here)."""
        assert self.consumer is not None
        held = sorted(self.consumer.assignment())
        try:  # the end this consumer may read to (the stable end under read_committed)
            readable: dict[TopicPartition, int] = await asyncio.wait_for(
                self.consumer.end_offsets(held), 10.0
            )
        except (TimeoutError, KafkaError):
            readable = {}
        paused = self.consumer.paused()
        behind = []
        for tp in held:
            end = max(self.consumer.highwater(tp) or 0, readable.get(tp, 0))
            try:  # waits while the position is being reset: a second at most
                at: int | None = await asyncio.wait_for(self.consumer.position(tp), 1.0)
            except (TimeoutError, KafkaError, IllegalStateError):
                at = None
            if (at >= end) if at is not None else end == 0:
                continue  # nothing waiting
            state = [f"at {'unknown' if at is None else at}", f"end {end}"]
            if self.transactions is not None and tp in readable:
                state.append(f"stable end {readable[tp]}")
            if tp in paused:
                state.append("paused: its step holds")
            behind.append(f"{tp.topic}-{tp.partition} ({', '.join(state)})")
        if behind:
            log.warning(
                "consumer %s: no record taken for %.0f s while records wait: %s",
                self.group,
                STALL_WARN_S,
                "; ".join(behind),
            )

    def _rewind(self, batch: Batch) -> None:
        """Drop a batch: its partitions still held go back to their settled positions (the
        committed offsets :meth:`assigned` read after fencing), else to the batch's first
        record -- getmany moved them past it, and a dropped record must be read again."""
        assert self.consumer is not None
        held = self.consumer.assignment()
        for tp, messages in batch.items():
            if messages and tp in held:
                self.consumer.seek(tp, self._positions.get(tp, messages[0].offset))

    def _prefetch(self, batch: Batch) -> dict[str, Any]:
        """Each topic's ``step.prefetch`` over its records (in :meth:`_settle`'s order)."""
        tokens: dict[str, Any] = {}
        for topic, messages in sorted(_by_topic(batch).items()):
            prefetch = self.steps[topic].prefetch
            if prefetch is not None:
                tokens[topic] = prefetch([m.value if m.value is not None else b"" for m in messages])
        return tokens

    async def _settle(self, batch: Batch, prefetched: Mapping[str, Any] | None = None) -> None:
        """Each topic's records through its step, then (at least once) their offsets committed."""
        positions = {tp: messages[-1].offset + 1 for tp, messages in batch.items() if messages}
        for topic, messages in sorted(_by_topic(batch).items()):
            ends = {tp: n for tp, n in positions.items() if tp.topic == topic}
            deliver: Deliver
            if self.transactions is not None:
                deliver = partial(self.transactions.deliver, positions=ends)
            else:
                deliver = self.deliver
            # _hold asked each step before the poll (a held topic's partitions are paused).
            await self.rt.process(
                self.steps[topic],
                messages,
                to_record=record_of,
                deliver=deliver,
                held=True,
                prefetched=(prefetched or {}).get(topic),
            )
        if self.transactions is None:
            await self._commit(positions)
        self._positions.update(positions)

    async def deliver(self, outputs: Sequence[Output]) -> None:
        """At-least-once delivery with this consumer's producer (:meth:`Runtime.deliver`)."""
        await self.rt.deliver(outputs, producer=_Sender(self.producer))

    async def _commit(self, positions: Mapping[TopicPartition, int]) -> None:
        assert self.consumer is not None
        try:
            await self.consumer.commit(dict(positions))
        except (CommitFailedError, IllegalStateError) as exc:
            # The group moved the partitions while the batch ran (this member was too slow to
            # answer): their new owner reads the batch again (at least once).
            log.warning("consumer %s: offsets of a settled batch not committed (%s)", self.group, exc)

    async def _hold(self) -> None:
        """Pause the partitions of each topic whose step holds; resume the others."""
        assert self.consumer is not None
        for topic, step in self.steps.items():
            held = await self.rt.holding(step)
            parts = [tp for tp in self.consumer.assignment() if tp.topic == topic]
            if held:
                self.consumer.pause(*parts)
                self._paused.add(topic)
            elif topic in self._paused:
                self.consumer.resume(*parts)
                self._paused.discard(topic)

    # -- rebalances ------------------------------------------------------------------------

    async def revoked(self, partitions: set[TopicPartition]) -> None:
        """Before partitions go: the batch in flight settles (and commits) first."""
        async with self._busy:
            self._generation += 1
            if self.transactions is not None:
                await self.transactions.release(partitions)
            for tp in partitions:
                self._positions.pop(tp, None)
                if tp.topic in self.lag_topics:
                    with contextlib.suppress(KeyError):  # never reported
                        self.rt.exporter.lag.remove(tp.topic, str(tp.partition))

    async def assigned(self, partitions: set[TopicPartition]) -> None:
        """New partitions start at their committed offsets -- read after their transactional
        producers fenced the previous owner and finished its last transaction, so none of its
        committed batches is read again -- or, never committed in this group, where the Faust
        agents' group stopped."""
        assert self.consumer is not None
        async with self._busy:
            await self._assigned(partitions)

    async def _assigned(self, partitions: set[TopicPartition]) -> None:
        assert self.consumer is not None
        self._generation += 1
        self._paused.clear()
        if self._loop is not None:
            self._progress_at = self._loop.time()
        if self.transactions is not None:
            await self.transactions.own(partitions)
        for tp in sorted(partitions):
            committed = await self.consumer.committed(tp)
            if committed is None:
                committed = (await self._legacy_offsets()).get(tp)
                if committed is not None:
                    log.info(
                        "consumer %s: %s starts at %d, the Faust agents' offset", self.group, tp, committed
                    )
            if committed is not None:
                self.consumer.seek(tp, committed)
                self._positions[tp] = committed
        # Again, now that the positions are set: while the producers were fencing, the
        # consumer may have fetched from the positions it found itself -- offsets read before
        # the previous owner's last transaction was completed (a batch already scored), and
        # for partitions with no producer yet.  A batch whose fetch began before this line is
        # dropped and its partitions rewound to these positions (``_run``).
        self._generation += 1

    async def _legacy_offsets(self) -> dict[TopicPartition, int]:
        """The Faust agents' group's committed offsets (read once: nothing commits there now)."""
        if self._legacy is None:
            self._legacy = {}
            if self.legacy_group is not None:
                settings: KafkaSettings = self.rt.settings
                found = await asyncio.to_thread(
                    group_offsets,
                    settings.broker.split(",")[0],
                    self.legacy_group,
                    **settings.kafka_client_options(),
                )
                self._legacy = {TopicPartition(t, p): n for (t, p), n in found.items() if t in self.steps}
        return self._legacy

    def committed_offset(self, topic: str, partition: int, timeout: float = 30.0) -> int | None:
        """The group's committed offset of any partition, from another thread (a role's: the
        join asks whether the record holding a claim is settled)."""
        assert self.consumer is not None and self._loop is not None
        future = asyncio.run_coroutine_threadsafe(
            self.consumer.committed(TopicPartition(topic, partition)), self._loop
        )
        committed: int | None = future.result(timeout)
        return committed

    # -- metrics ---------------------------------------------------------------------------

    def _report_lag(self) -> None:
        """``reval_consumer_lag``: records behind each partition's end, from the settled offset."""
        assert self.consumer is not None
        for tp in self.consumer.assignment():
            if tp.topic not in self.lag_topics:
                continue
            end, settled = self.consumer.highwater(tp), self._positions.get(tp)
            if end is not None and settled is not None:
                self.rt.exporter.lag.labels(tp.topic, str(tp.partition)).set(max(0, end - settled))


def host(app: faust.App, consumer: BatchConsumer) -> None:
    """Start ``consumer`` with the Faust app (and stop it with the app)."""

    @app.task
    async def start_consumer() -> None:
        try:
            await app.add_runtime_dependency(consumer)
        except Exception as exc:  # a worker whose consumer did not start must not look alive
            log.exception("consumer %s: not started", consumer.group)
            consumer.rt.fail_stop(f"consumer {consumer.group} not started: {exc!r}")


class _Listener(ConsumerRebalanceListener):
    """The consumer's rebalance callbacks, handed to its :class:`BatchConsumer`."""

    def __init__(self, owner: BatchConsumer) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.owner.revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        try:
            await self.owner.assigned(set(assigned))
        except Exception as exc:  # aiokafka would log it and consume from unchecked positions
            log.exception("consumer %s: taking partitions %s failed", self.owner.group, sorted(assigned))
            self.owner.rt.fail_stop(f"consumer {self.owner.group}: taking partitions failed: {exc!r}")


class _Sender:
    """An aiokafka producer as :class:`~workers.service.runtime.Producer`."""

    def __init__(self, producer: AIOKafkaProducer | None) -> None:
        if producer is None:
            raise RuntimeError("the batch consumer's producer is not started yet")
        self.producer = producer

    async def send_many(self, records: Sequence[Produced]) -> list[Awaitable[Any] | BaseException]:
        return await send_batched(self.producer, records)
