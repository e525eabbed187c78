"""What every role's agents share: the worker threads, the batch step that never loses or
doubles a record, and delivery of outputs before a batch is acknowledged.

A batch goes through three stages:

1. ``admit`` (once per record): parse, count, and dead-letter what cannot be parsed.
2. ``apply`` (idempotent, so it may run again): the role's work.  On an unexpected error
   the batch is applied again one item at a time and the items that still fail are
   dead-lettered (``processing_error``); when *every* item fails the cause is not the
   records, and the worker stops instead (fail-stop: nothing is committed, the records
   come back after a restart).  Transient Redis errors never get here: they are waited
   out (:func:`workers.adapters.redis_client.with_retry`), which back-pressures.
3. ``deliver``: produce the outputs and wait for the broker's acknowledgement of each;
   retry only what was not acknowledged; an output that can never be produced (too
   large, not serialisable) is replaced by its source record's dead letter; when the
   broker does not take the outputs within ``REVAL_PRODUCE_TIMEOUT_S`` the worker stops
   (fail-stop) rather than acknowledge the batch.

Only then are the effects that must follow the outputs done (``after``: settling the
join, the quality metrics), and the batch is acknowledged by returning.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import Any, Generic, NoReturn, TypeVar

import faust
import orjson
from aiokafka.errors import KafkaError, MessageSizeTooLargeError, RecordTooLargeError

from workers.adapters.exporter import Exporter
from workers.adapters.redis_client import Client, Stopping
from workers.service.records import Record, dead_letter, letter_key
from workers.settings import Settings

log = logging.getLogger("reval.workers")
T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 - an admitted item

#: Exit code of a fail-stop (EX_SOFTWARE): the supervisor restarts the worker, which
#: resumes from the last committed offsets.
FAIL_STOP_EXIT = 70


class FailStop(Exception):
    """A fault the worker must not acknowledge past: it stops without committing."""


def fail_stop(reason: str) -> NoReturn:
    """Stop the process at once: no commit of the current batch, no graceful shutdown
    (which would commit what Faust considers processed)."""
    log.critical("fail-stop: %s", reason)
    logging.shutdown()
    os._exit(FAIL_STOP_EXIT)


def stop_now(role: str) -> NoReturn:
    """Shutting down while a batch waits for Redis: leave without acknowledging it (it is
    redelivered after the restart) and without waiting for Redis to come back."""
    log.warning("%s: stopping while Redis is unavailable; the batch in progress will be redelivered", role)
    logging.shutdown()
    os._exit(0)


def record_of(event: Any) -> Record:
    """The :class:`Record` of a faust event (raw bytes, as the core parsers want them)."""
    message = event.message
    value = message.value if isinstance(message.value, bytes) else bytes(message.value or b"")
    return Record(
        message.topic,
        message.partition,
        message.offset,
        int(message.timestamp * 1000) if message.timestamp else None,
        message.key,
        value,
    )


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


@dataclass(frozen=True)
class Output:
    """A record to produce: to ``topic`` ("scores" or "dead_letters"), from ``source``."""

    topic: str
    key: bytes | None
    value: dict[str, Any]
    source: Record


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
    """A role's batch step: ``admit`` once per record, ``apply`` (idempotent) on the admitted."""

    role: str
    admit: Callable[[Sequence[Record]], tuple[list[I], list[Output]]]
    apply: Callable[[Sequence[I]], Outcome]
    source: Callable[[I], Record]


class Runtime:
    """Per worker process: settings, metrics, the Redis client, one thread per role, the
    topics to deliver to.

    The encoder and Redis calls block: they run off the event loop (heartbeats keep
    flowing), one thread per role so a role's state is never touched concurrently.
    """

    def __init__(self, settings: Settings, exporter: Exporter, client: Client, roles: Sequence[str]) -> None:
        self.settings = settings
        self.exporter = exporter
        self.client = client
        self.topics: Topics | None = None
        self._threads = {role: ThreadPoolExecutor(1, thread_name_prefix=f"reval-{role}") for role in roles}

    async def run(self, role: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the role's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._threads[role], fn, *args)

    async def _guarded(self, role: str, fn: Callable[[list[Any]], T], batch: list[Any]) -> T:
        """``fn(batch)`` in the role's thread.  A stop while Redis is away and a fail-stop end
        the process here (``os._exit``: nothing acknowledged); any other error is the caller's."""
        try:
            return await self.run(role, fn, batch)
        except Stopping:
            stop_now(role)
        except FailStop as exc:
            fail_stop(f"{role}: {exc}")

    async def process(self, step: Step[Any], records: list[Record]) -> None:
        """Admit, apply, deliver, then the after-effects; returns when the batch may be acknowledged.

        An error nobody planned for stops the process (a crashed Faust agent would
        otherwise sit in a live worker consuming nothing); the batch is redelivered.
        """
        try:
            items, rejected = await self._admit(step, records)
            outcome = Outcome(list(rejected))
            if items:
                outcome.merge(await self._apply(step, items))
            await self.finish(step.role, outcome)
        except Exception as exc:
            log.exception("%s: unexpected error", step.role)
            fail_stop(f"{step.role}: unexpected {exc!r}")

    async def _admit(self, step: Step[Any], records: list[Record]) -> tuple[list[Any], list[Output]]:
        """The batch's admission; a record whose admission raises (a parser bug) is dead-lettered alone."""
        try:
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
                self.exporter.rejected.labels(record.topic, "processing_error").inc()
                rejected.append(letter(record, "processing_error", repr(exc)[:500], step.role))
                continue
            items += one
            rejected += out
        return items, rejected

    async def finish(self, role: str, outcome: Outcome) -> None:
        """Deliver an outcome's outputs, then run its after-effects (in the role's thread)."""
        await self.deliver(outcome.outputs)
        if outcome.after:
            try:
                await self.run(role, _run_all, outcome.after)
            except Stopping:
                stop_now(role)

    async def _apply(self, step: Step[Any], items: list[Any]) -> Outcome:
        try:
            return await self._guarded(step.role, step.apply, items)
        except Exception:
            if len(items) == 1:
                log.exception("%s: record %s failed", step.role, step.source(items[0]).claimant)
            else:
                log.exception("%s: batch of %d failed; applying one record at a time", step.role, len(items))
        outcome, failed = Outcome(), []
        for item in items:
            try:
                outcome.merge(await self._guarded(step.role, step.apply, [item]))
            except Exception as exc:
                failed.append((item, exc))
        if failed and len(failed) == len(items) > 1:
            # Every record fails on its own too: the cause is not in the records.
            fail_stop(f"{step.role}: every record of a batch of {len(items)} failed ({failed[0][1]!r})")
        for item, error in failed:
            record = step.source(item)
            log.error("%s: record %s dead-lettered: %r", step.role, record.claimant, error)
            self.exporter.rejected.labels(record.topic, "processing_error").inc()
            outcome.outputs.append(letter(record, "processing_error", repr(error)[:500], step.role))
        return outcome

    # -- delivery ------------------------------------------------------------------------

    def _encode(self, output: Output) -> tuple[Output, bytes]:
        """The output's bytes; an output that cannot be produced becomes its source's dead letter."""
        limit = self.settings.max_message_bytes
        try:
            data = encode_json(output.value)
        except (TypeError, ValueError) as exc:
            return self._replace(output, "unserialisable", f"the {output.topic} record is not JSON: {exc}")
        if len(data) <= limit:
            return output, data
        if output.topic == "dead_letters":  # cut the carried bytes: the coordinates find the whole record
            value = {**output.value, "value_base64": "", "value_truncated": True}
            return output, encode_json(value)
        return self._replace(
            output, "output_too_large", f"its {output.topic} record is {len(data):,} bytes (limit {limit:,})"
        )

    def _replace(self, output: Output, reason: str, detail: str) -> tuple[Output, bytes]:
        source = output.source
        self.exporter.rejected.labels(source.topic, reason).inc()
        role = output.value.get("role") or "score"
        return self._encode(letter(source, reason, detail, str(role)))

    async def deliver(self, outputs: Sequence[Output]) -> None:
        """Produce every output and wait until the broker acknowledged each.

        Only what was not acknowledged is sent again; an output the broker refuses for
        good (too large for it) becomes its source's dead letter; when the broker takes
        nothing for ``produce_timeout_s`` the worker fails-stop (never acknowledges a batch
        whose outputs are not durable).
        """
        if not outputs:
            return
        assert self.topics is not None
        pending = [self._encode(o) for o in outputs]
        deadline = time.monotonic() + self.settings.produce_timeout_s
        delay = 0.2
        # Faust's producer itself rather than ``Topic.send``: the bytes are ready, and the
        # channel's per-message wrapping (a FutureMessage, sensor callbacks, a topic lookup)
        # cost ~25 µs per output, ~4% of the score worker (py-spy).
        producer = await self.topics.scores.app.maybe_start_producer()
        names = self.topics.names()
        while pending:
            sent = []
            for output, data in pending:
                try:
                    future = await producer.send(names[output.topic], output.key, data, None, None, None)
                    sent.append((output, data, future))
                except KafkaError as exc:
                    sent.append((output, data, exc))
            retry: list[tuple[Output, bytes]] = []
            for output, data, future in sent:
                try:
                    if isinstance(future, BaseException):
                        raise future
                    await future
                except (MessageSizeTooLargeError, RecordTooLargeError) as exc:
                    replaced = self._replace(output, "output_too_large", f"the broker refused it: {exc!r}")
                    retry.append(replaced)
                except Exception as exc:  # retried until the deadline
                    log.warning("producing to %s failed (%r); will retry", output.topic, exc)
                    retry.append((output, data))
            if not retry:
                return
            if time.monotonic() > deadline:
                fail_stop(
                    f"{len(retry)} record(s) not acknowledged by the broker within "
                    f"{self.settings.produce_timeout_s:g}s; not acknowledging the batch"
                )
            self.exporter.produce_retries.inc(len(retry))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
            pending = retry


def _run_all(effects: Sequence[Callable[[], None]]) -> None:
    for effect in effects:
        effect()
