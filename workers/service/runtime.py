"""What every role shares: the worker threads, the batch step that never loses or
doubles a record, and delivery of outputs before a batch is acknowledged.

A batch goes through four stages:

0. ``hold`` (optional): while the role must not take work (the join is full, no usable
   thesaurus), wait; the consumer stops pulling (back-pressure).
1. ``admit`` (once per record): parse, count, and dead-letter what cannot be parsed.
2. ``apply`` (idempotent, so it may run again): the role's work.  On an unexpected error
   the batch is applied again one item at a time and the items that still fail are
   dead-lettered (``processing_error``): no input can stop a worker.  An outage error
   (Redis, Kafka) is not the record's fault: the worker stops instead (fail-stop: nothing
   is committed, the records come back after a restart).  Transient Redis errors never
   get here: they are waited out (:func:`workers.adapters.redis.redis_client.with_retry`),
   which back-pressures.
3. ``deliver``: produce the outputs and wait for the broker's acknowledgement of each;
   retry only what was not acknowledged; an output that can never be produced (over the
   producer's or the broker's size limit, not serialisable) is replaced by its source
   record's dead letter; when the broker does not take the outputs within
   ``REVAL_PRODUCE_TIMEOUT_S`` the worker stops (fail-stop) rather than acknowledge the batch.

Only then are the effects that must follow the outputs done (``after``: settling the
join, the quality metrics), and the batch is acknowledged by returning.

Whatever else ends a batch -- SIGTERM or SIGINT while it waits for Redis, a cancelled
consumer, an error nobody planned for -- ends the process before the batch is acknowledged:
a graceful shutdown must never commit a batch that did not settle.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import Any, Generic, NoReturn, Protocol, TypeVar

import faust
import numpy as np
import numpy.typing as npt
import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, MessageSizeTooLargeError, RecordTooLargeError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from kafka.errors import KafkaError as KafkaPythonError
from redis.exceptions import RedisError

from workers.adapters.kafka.kafka_client import BrokerError
from workers.adapters.prometheus.exporter import Exporter
from workers.adapters.redis.redis_client import Client, Stopping, stopping
from workers.service.kafka_records import Record, dead_letter, letter_key
from workers.settings import Settings

log = logging.getLogger("reval.workers")
T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 - an admitted item
Produced = tuple[str, bytes | None, bytes]
"""A record to produce: (topic, key, value)."""

#: Exit code of a fail-stop (EX_SOFTWARE): the supervisor restarts the worker, which
#: resumes from the last committed offsets.
FAIL_STOP_EXIT = 70


class FailStop(Exception):
    """A fault the worker must not acknowledge past: it stops without committing."""


Exit = Callable[[int], NoReturn]
"""How the process ends without acknowledging its batch (``os._exit``; tests pass their own)."""

#: Errors of the systems around a worker, never of the record being processed: when one of
#: them is what a record fails with, the record is not dead-lettered, the worker stops.
OUTAGES: tuple[type[BaseException], ...] = (
    RedisError,
    KafkaError,
    KafkaPythonError,
    BrokerError,
    ConnectionError,
    TimeoutError,
    MemoryError,
)


def fail_stop(reason: str, exit: Exit = os._exit) -> NoReturn:
    """Stop the process at once: no commit of the current batch, no graceful shutdown
    (which would commit what Faust considers processed)."""
    log.critical("fail-stop: %s", reason)
    logging.shutdown()
    exit(FAIL_STOP_EXIT)


def stop_now(role: str, why: str, exit: Exit = os._exit) -> NoReturn:
    """Shutting down while a batch is not settled: leave without acknowledging it (it is
    redelivered after the restart) and without waiting for it to finish."""
    log.warning("%s: stopping %s; the batch in progress will be redelivered", role, why)
    logging.shutdown()
    exit(0)


def record_size(key: bytes | None, value: bytes) -> int:
    """The bytes the producer counts for a record against its ``max_request_size`` (key,
    value and the record batch's overhead, as aiokafka's ``send`` counts them).

    >>> record_size(b"k", b"v" * 100) - 100
    87
    """
    return int(DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, []))


def too_large(exc: BaseException) -> bool:
    """Whether a producer or broker error says the record is too large (Faust wraps the
    producer's own error in a ``ProducerSendError``)."""
    while exc is not None:
        if isinstance(exc, MessageSizeTooLargeError | RecordTooLargeError):
            return True
        exc = exc.__cause__  # type: ignore[assignment]
    return False


async def send_batched(
    producer: AIOKafkaProducer, records: Sequence[Produced]
) -> list[Awaitable[Any] | BaseException]:
    """:meth:`Producer.send_many` with aiokafka: the records of one topic partition (the one
    aiokafka's default partitioner gives their key) in one batch, or more where one would pass
    the producer's batch size -- the batches its accumulator would build from the same records,
    so the broker takes or refuses the same.  A record's acknowledgement is its batch's.

    Why not ``producer.send`` per record: a coroutine, a pure-Python murmur2 and an accumulator
    lookup each, ~15 µs of CPU a record against ~5 µs through ``send_batch`` (BENCHMARKS.md,
    "Outputs sent in batches")."""
    acks: list[Any] = [None] * len(records)  # each filled below
    by_topic: dict[str, list[int]] = {}
    for i, (topic, _, _) in enumerate(records):
        by_topic.setdefault(topic, []).append(i)

    async def submit(batch: BatchBuilder, members: list[int], topic: str, partition: int) -> None:
        ack: Awaitable[Any] | BaseException
        try:
            ack = await producer.send_batch(batch, topic, partition=partition)
        except Exception as exc:  # refused before sending (no metadata, the accumulator full)
            ack = exc
        for i in members:
            acks[i] = ack

    partitioner = DefaultPartitioner()
    for topic, indices in by_topic.items():
        try:
            partitions = sorted(await producer.partitions_for(topic))
        except Exception as exc:
            for i in indices:
                acks[i] = exc
            continue
        by_partition: dict[int, list[int]] = {}
        for i in indices:
            by_partition.setdefault(partitioner(records[i][1], partitions, partitions), []).append(i)
        for partition, members in by_partition.items():
            batch = producer.create_batch()
            held: list[int] = []
            for i in members:
                _, key, value = records[i]
                if batch.append(key=key, value=value, timestamp=None) is None:  # full: send it
                    await submit(batch, held, topic, partition)
                    batch, held = producer.create_batch(), []
                    batch.append(key=key, value=value, timestamp=None)  # a first record always fits
                held.append(i)
            await submit(batch, held, topic, partition)
    return acks


def encode_json(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON, the bytes an output record carries.

    orjson, not ``json.dumps``: ~8 instead of ~80 µs per score output, 12% of the score
    worker's time (BENCHMARKS.md).  The contract: strict JSON (RFC 8259) whose values parse
    back to the same Python values -- every float to the same float (orjson writes the
    shortest round-trip form, sometimes spelt differently: ``1e-05`` as ``0.00001``), and
    strings byte for byte as ``json.dumps(..., ensure_ascii=False)`` wrote them.  A NaN or an
    infinity, which JSON cannot spell, is written ``null`` (``json.dumps`` wrote the bare
    tokens ``NaN``/``Infinity`` that strict parsers refuse); no score holds one.

    Raises ``TypeError`` for what cannot be JSON: other objects, integers past 64 bits,
    strings that are not valid Unicode (lone surrogates).
    """
    try:
        return orjson.dumps(value, default=_plain_float)
    except orjson.JSONEncodeError:
        # Dict keys that are not strings (as json.dumps, written as strings): a slower
        # option, so only on a second try.
        return orjson.dumps(value, default=_plain_float, option=orjson.OPT_NON_STR_KEYS)


def encode_floats(values: npt.NDArray[np.float64], *, repeated: bool) -> list[bytes]:
    """Every number of a float array, in row-major order, as :func:`encode_json` writes a
    Python float (NaN and infinities as ``null``).  ``repeated``: the array holds few distinct
    values (ratios of small counts), so each distinct bit pattern is formatted once -- a
    third of the time there, more than the plain way on values that rarely repeat.

    >>> encode_floats(np.array([[0.5, float("nan")], [-0.0, 0.5]]), repeated=True)
    [b'0.5', b'null', b'-0.0', b'0.5']
    """
    if not values.size:
        return []
    if not repeated:
        text = orjson.dumps(values.reshape(len(values), -1), option=orjson.OPT_SERIALIZE_NUMPY)
        return text[2:-2].replace(b"],[", b",").split(b",")  # numbers hold no "[", "]" or ","
    # By bit pattern, not value: -0.0 and 0.0 are written apart.
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.int64).ravel()
    distinct, index = np.unique(bits, return_inverse=True)
    each = orjson.dumps(distinct.view(np.float64), option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].split(b",")
    written: list[bytes] = np.array(each, dtype=object)[index.ravel()].tolist()
    return written


def value_bytes(value: dict[str, Any] | bytes) -> bytes:
    """An output's value as the bytes produced: already encoded, or :func:`encode_json`."""
    return value if isinstance(value, bytes) else encode_json(value)


def _plain_float(value: Any) -> float:
    """Float subclasses (``numpy.float64``), which orjson leaves to this hook, as floats."""
    if isinstance(value, float):
        return float(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


@dataclass(frozen=True)
class Topics:
    """The service's topics, declared with explicit partition counts; bytes in, bytes out
    (the core parses, so a malformed record reaches a role to be dead-lettered)."""

    tweets: faust.TopicT
    recommendations: faust.TopicT
    scores: faust.TopicT
    dead_letters: faust.TopicT

    @classmethod
    def declare(cls, app: faust.App, settings: Settings) -> Topics:
        def raw(name: str, partitions: int) -> faust.TopicT:
            return app.topic(name, partitions=partitions, key_serializer="raw", value_serializer="raw")

        return cls(
            tweets=raw(settings.topic_tweets, settings.partitions),
            recommendations=raw(settings.topic_recommendations, settings.partitions),
            scores=raw(settings.topic_scores, settings.partitions),
            dead_letters=raw(settings.topic_dead_letter, 1),
        )

    def names(self) -> dict[str, str]:
        """Each topic's name on the broker, by its field here ("scores", "dead_letters", ...)."""
        return {f.name: getattr(self, f.name).get_topic_name() for f in fields(self)}


@dataclass(eq=False)
class Output:
    """A record to produce: to ``topic`` ("scores" or "dead_letters"), from ``source``.

    ``dead_lettered`` is set by :meth:`Runtime.deliver` when the output could not be produced
    and its source's dead letter went instead: after-effects that count the output (the
    quality metrics) read it, so an event is counted once, as what it became.

    ``via``: the input record of the batch that produced it, when that is not ``source`` (an
    event waiting in the join is scored when its tweet comes: source is the event, via the
    tweet).  Exactly-once delivery commits an output with the offset of its ``via`` record
    (:mod:`workers.service.transactions`).
    """

    topic: str
    key: bytes | None
    #: The record's JSON, as a dict or already encoded (the scores, from their columns).
    value: dict[str, Any] | bytes
    source: Record
    dead_lettered: bool = False
    via: Record | None = None

    @property
    def input(self) -> Record:
        """The input record whose offset is committed with this output."""
        return self.via if self.via is not None else self.source


def letter(record: Record, reason: str, detail: str, role: str) -> Output:
    """The dead letter of ``record`` as an output (key: its source coordinates)."""
    return Output("dead_letters", letter_key(record), dead_letter(record, reason, detail, role), record)


@dataclass
class Outcome:
    """What ``apply`` produced: outputs, and what to do once they are acknowledged."""

    outputs: list[Output] = field(default_factory=list)
    after: list[Callable[[], None]] = field(default_factory=list)

    def merge(self, other: Outcome) -> Outcome:
        self.outputs += other.outputs
        self.after += other.after
        return self


@dataclass(frozen=True)
class Step(Generic[I]):
    """A role's batch step: ``admit`` once per record, ``apply`` (idempotent) on the admitted.

    ``hold`` (in the role's thread, before each batch): True while the role must not take
    work -- the batch waits, unacknowledged, and the consumer stops pulling.

    ``prefetch`` (optional, on the event loop, never blocking): starts the pure part of a
    batch's admission elsewhere (worker processes) from its records' values and returns a
    token that ``admit(records, token)`` completes -- so the batch consumer can admit the next
    batch while this one is applied.  None from it: nothing started.
    """

    role: str
    admit: Callable[..., tuple[list[I], list[Output]]]  # (records[, prefetched token])
    apply: Callable[[Sequence[I]], Outcome]
    source: Callable[[I], Record]
    hold: Callable[[], bool] | None = None
    prefetch: Callable[[Sequence[bytes]], Any] | None = None


class Producer(Protocol):
    """What delivery needs of a producer: the batch consumer's (:func:`send_batched` over its
    aiokafka producer), or a test's."""

    async def send_many(self, records: Sequence[Produced]) -> list[Awaitable[Any] | BaseException]:
        """Send each (topic, key, value); each record's acknowledgement, in order, or the error
        that refused it before it was sent."""
        ...


Deliver = Callable[[Sequence[Output]], Awaitable[None]]
"""How a batch's outputs are made durable before it is acknowledged: :meth:`Runtime.deliver`
(acknowledged by the broker: at least once), or a transaction with the batch's offsets
(:meth:`workers.service.transactions.Transactions.deliver`: exactly once)."""

#: Seconds between two looks at a step's ``hold``.
HOLD_POLL_S = 1.0


class Runtime:
    """Per worker process: settings, metrics, the Redis client, one thread per role, the
    topics to deliver to.

    The encoder and Redis calls block: they run off the event loop (heartbeats keep
    flowing), one thread per role so a role's state is never touched concurrently.

    ``producer`` and ``exit`` are the seams of a test without a broker: a producer of its
    own, and an ``exit`` that raises instead of ending the process.
    """

    def __init__(
        self,
        settings: Settings,
        exporter: Exporter,
        client: Client,
        roles: Sequence[str],
        *,
        producer: Producer | None = None,
        exit: Exit = os._exit,
    ) -> None:
        self.settings = settings
        self.exporter = exporter
        self.client = client
        self.names: dict[str, str] = {
            "scores": settings.topic_scores,
            "dead_letters": settings.topic_dead_letter,
        }
        self.producer = producer
        self.exit = exit
        self.roles = tuple(roles)
        self._threads = {role: ThreadPoolExecutor(1, thread_name_prefix=f"reval-{role}") for role in roles}

    def close(self) -> None:
        """Stop the role threads (a worker process ends with them; tests make many runtimes)."""
        for pool in self._threads.values():
            pool.shutdown(wait=True)

    def attach(self, topics: Topics) -> None:
        """Deliver to ``topics``' names."""
        self.names = topics.names()

    def fail_stop(self, reason: str) -> NoReturn:
        fail_stop(reason, self.exit)

    def stop_now(self, role: str, why: str) -> NoReturn:
        stop_now(role, why, self.exit)

    async def run(self, role: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the role's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._threads[role], fn, *args)

    async def _guarded(self, role: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the role's thread.  A stop while Redis is away and a fail-stop end
        the process here (nothing acknowledged); any other error is the caller's."""
        try:
            return await self.run(role, fn, *args)
        except Stopping as exc:  # its text says whether Redis was away or only the stop came
            self.stop_now(role, f"mid-batch ({exc})")
        except FailStop as exc:
            self.fail_stop(f"{role}: {exc}")

    async def process(
        self,
        step: Step[Any],
        batch: Sequence[Any],
        *,
        to_record: Callable[[Any], Record] | None = None,
        deliver: Deliver | None = None,
        held: bool = False,
        prefetched: Any = None,
    ) -> None:
        """Hold, admit, apply, deliver, then the after-effects; returns when the batch may be
        acknowledged.  ``batch``: :class:`Record` s, or what ``to_record`` turns into them;
        ``deliver``: how the outputs are made durable (default :meth:`deliver`); ``held``: the
        step's ``hold`` was asked for this batch already (the batch consumer asks before it polls,
        pausing what holds), so it is not asked again; ``prefetched``: the token of
        ``step.prefetch`` for this batch (its admission already under way).

        Returns only then: a shutdown while the batch is not settled, a cancellation and an
        error nobody planned for end the process without acknowledging it (a crashed consumer
        would otherwise sit in a live worker consuming nothing).
        """
        try:
            if not held:
                await self._hold(step)
            taken = [to_record(e) for e in batch] if to_record is not None else list(batch)
            items, rejected = await self._admit(step, taken, prefetched)
            outcome = Outcome(list(rejected))
            if items:
                outcome.merge(await self._apply(step, items))
            await self.finish(step.role, outcome, deliver)
        except asyncio.CancelledError:
            self.stop_now(step.role, "(its consumer was cancelled)")
        except Exception as exc:
            log.exception("%s: unexpected error", step.role)
            self.fail_stop(f"{step.role}: unexpected {exc!r}")

    async def holding(self, step: Step[Any]) -> bool:
        """Whether ``step`` must not take work now (its ``hold``, in the role's thread); a
        shutdown while Redis is away ends the process here."""
        return step.hold is not None and bool(await self._guarded(step.role, step.hold))

    async def _hold(self, step: Step[Any]) -> None:
        """Wait while ``step.hold`` says so; a shutdown meanwhile leaves the batch unacknowledged."""
        if step.hold is None:
            return
        while await self._guarded(step.role, step.hold):
            if stopping.is_set():
                self.stop_now(step.role, "while its batch was held back")
            await asyncio.sleep(HOLD_POLL_S)

    async def _admit(
        self, step: Step[Any], records: list[Record], prefetched: Any = None
    ) -> tuple[list[Any], list[Output]]:
        """The batch's admission; a record whose admission raises (a parser bug) is dead-lettered alone."""
        try:
            if prefetched is not None:
                return await self._guarded(step.role, step.admit, records, prefetched)
            return await self._guarded(step.role, step.admit, records)
        except Exception:
            log.exception("%s: admitting a batch of %d failed; one record at a time", step.role, len(records))
        items: list[Any] = []
        rejected: list[Output] = []
        for record in records:
            try:
                one, out = await self._guarded(step.role, step.admit, [record])
            except Exception as exc:
                log.error("%s: record %s dead-lettered: %r", step.role, record.claimant, exc)
                self.exporter.consumed.labels(record.topic).inc()  # its admission counted nothing
                self.exporter.rejected.labels(record.topic, "processing_error").inc()
                rejected.append(letter(record, "processing_error", repr(exc)[:500], step.role))
                continue
            items += one
            rejected += out
        return items, rejected

    async def finish(self, role: str, outcome: Outcome, deliver: Deliver | None = None) -> None:
        """Deliver an outcome's outputs (``deliver``, default :meth:`deliver`), then run its
        after-effects (in the role's thread)."""
        await (deliver or self.deliver)(outcome.outputs)
        if outcome.after:
            await self._guarded(role, _run_all, outcome.after)

    async def _apply(self, step: Step[Any], items: list[Any]) -> Outcome:
        try:
            return await self._guarded(step.role, step.apply, items)
        except Exception as exc:
            self._unless_outage(step.role, exc)
            if len(items) == 1:
                log.exception("%s: record %s failed", step.role, step.source(items[0]).claimant)
            else:
                log.exception("%s: batch of %d failed; applying one record at a time", step.role, len(items))
        outcome, failed = Outcome(), []
        for item in items:
            try:
                outcome.merge(await self._guarded(step.role, step.apply, [item]))
            except Exception as exc:
                self._unless_outage(step.role, exc)
                failed.append((item, exc))
        for item, error in failed:
            record = step.source(item)
            log.error("%s: record %s dead-lettered: %r", step.role, record.claimant, error)
            self.exporter.rejected.labels(record.topic, "processing_error").inc()
            outcome.outputs.append(letter(record, "processing_error", repr(error)[:500], step.role))
        return outcome

    def _unless_outage(self, role: str, exc: Exception) -> None:
        """An outage error is not the record's: stop (the batch is redelivered), never dead-letter."""
        if isinstance(exc, OUTAGES):
            log.error("%s: %r", role, exc, exc_info=exc)
            self.fail_stop(f"{role}: {exc!r} (an outage, not a bad record)")

    # -- delivery ------------------------------------------------------------------------

    def encode(self, output: Output) -> tuple[Output, bytes]:
        """The output's bytes; an output that cannot be produced becomes its source's dead letter.

        The limit is on what the producer counts (key, value and record overhead,
        :func:`record_size`), so an output that passes here is never refused by it."""
        limit = self.settings.max_message_bytes
        try:
            data = value_bytes(output.value)
        except (TypeError, ValueError) as exc:
            return self.replace(output, "unserialisable", f"the {output.topic} record is not JSON: {exc}")
        size = record_size(output.key, data)
        if size <= limit:
            return output, data
        if output.topic == "dead_letters":
            return self._fit_letter(output, limit)
        return self.replace(
            output, "output_too_large", f"its {output.topic} record is {size:,} bytes (limit {limit:,})"
        )

    def _fit_letter(self, output: Output, limit: int) -> tuple[Output, bytes]:
        """A dead letter cut to ``limit``: the carried bytes first, then the source's key and
        the detail (its coordinates and SHA-256 still find the whole record)."""
        assert isinstance(output.value, dict), "dead letters are built as dicts"
        value = {**output.value, "value_base64": "", "value_truncated": True}
        data = encode_json(value)
        if record_size(output.key, data) > limit:
            key, detail = str(value.get("key") or ""), str(value.get("detail") or "")
            value.update(key=_cut(key, 128), key_truncated=_cut(key, 128) != key, detail=_cut(detail, 256))
            data = encode_json(value)
        output.value = value
        return output, data

    def replace(self, output: Output, reason: str, detail: str) -> tuple[Output, bytes]:
        """``output``'s source dead-lettered instead (and ``output.dead_lettered`` set).  A dead
        letter refused as too large goes again cut to its minimum; one refused at its minimum
        is not the record's fault (the dead-letter topic's limit is): the worker stops."""
        if output.topic == "dead_letters":
            if "key_truncated" in output.value:
                self.fail_stop(f"the dead letter of {output.source.claimant} cannot be produced: {detail}")
            return self._fit_letter(output, 0)
        source = output.source
        output.dead_lettered = True
        self.exporter.rejected.labels(source.topic, reason).inc()
        role = (output.value.get("role") if isinstance(output.value, dict) else None) or "score"
        replaced = letter(source, reason, detail, str(role))
        replaced.via = output.via
        return self.encode(replaced)

    async def deliver(self, outputs: Sequence[Output], producer: Producer | None = None) -> None:
        """Produce every output (with ``producer``: the batch consumer's; a test's runtime has
        its own) and wait until the broker acknowledged each.

        Only what was not acknowledged is sent again; an output the producer or the broker
        refuses for good (too large for it) becomes its source's dead letter; when the broker
        takes nothing for ``produce_timeout_s`` the worker fails-stop (never acknowledges a
        batch whose outputs are not durable).
        """
        if not outputs:
            return
        pending = [self.encode(o) for o in outputs]
        deadline = time.monotonic() + self.settings.produce_timeout_s
        delay = 0.2
        producer = producer or self.producer
        if producer is None:
            raise RuntimeError("no producer to deliver with")
        while pending:
            acks = await producer.send_many([(self.names[o.topic], o.key, data) for o, data in pending])
            retry: list[tuple[Output, bytes]] = []
            for (output, data), ack in zip(pending, acks, strict=True):
                try:
                    if isinstance(ack, BaseException):
                        raise ack
                    await ack
                except Exception as exc:
                    if too_large(exc):
                        retry.append(
                            self.replace(output, "output_too_large", f"refused as too large: {exc!r}")
                        )
                    else:  # retried until the deadline
                        log.warning("producing to %s failed (%r); will retry", output.topic, exc)
                        retry.append((output, data))
            if not retry:
                return
            if time.monotonic() > deadline:
                self.fail_stop(
                    f"{len(retry)} record(s) not acknowledged by the broker within "
                    f"{self.settings.produce_timeout_s:g}s; not acknowledging the batch"
                )
            self.exporter.produce_retries.inc(len(retry))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
            pending = retry


def _cut(text: str, size: int) -> str:
    """``text`` cut to at most ``size`` bytes of UTF-8 (never inside a character)."""
    return text.encode()[:size].decode(errors="ignore")


def _run_all(effects: Sequence[Callable[[], None]]) -> None:
    for effect in effects:
        effect()
