"""Fakes of what surrounds a worker, for tests without a broker: a producer that records
what the broker acknowledged and refuses as aiokafka and a broker do, the broker's topic
identity, and an ``exit`` that raises instead of ending the process (the seams of
:class:`workers.service.runtime.Runtime`)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError, RecordTooLargeError
from faust.exceptions import ProducerSendError

from workers.service.runtime import Produced, record_size


class Halted(BaseException):
    """The process ended (``exit`` was called): a fail-stop (70) or a stop (0)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Crash(BaseException):
    """kill -9, injected."""


def halt(code: int) -> NoReturn:
    raise Halted(code)


class FixedIdentity:
    """The broker's topic id, without a broker."""

    def of(self, topic: str) -> str:
        return "0000-topic-id"


@dataclass
class Broker:
    """Topics that keep what was acknowledged; refuses records over their limits."""

    limits: dict[str, int]
    log: dict[str, list[tuple[bytes | None, bytes]]] = field(default_factory=lambda: defaultdict(list))


@dataclass
class FakeProducer:
    """A producer as the runtime meets it (:class:`~workers.service.runtime.Producer`), record by
    record: ``send`` refuses a record the producer counts over ``max_request_size`` (aiokafka's
    own count, wrapped as Faust wraps it); the future fails with the broker's RecordTooLargeError over a topic's
    limit, or once with a timeout for every ``flaky``-th record (retried), or always with a
    timeout while ``down`` (a broker that takes nothing); ``crash_at``: the sends at which the
    process is killed (what was not acknowledged is lost)."""

    broker: Broker
    max_request_size: int
    flaky: int = 0
    down: bool = False
    crash_at: frozenset[int] = frozenset()
    sends: int = 0
    refused_by_producer: int = 0
    _failed_once: set[bytes] = field(default_factory=set)

    async def send_many(self, records: Sequence[Produced]) -> list[Awaitable[Any] | BaseException]:
        acks: list[Awaitable[Any] | BaseException] = []
        for topic, key, value in records:  # one by one: the limits are per record here
            try:
                acks.append(self.send(topic, key, value))
            except Exception as exc:
                acks.append(exc)
        return acks

    def send(self, topic: str, key: bytes | None, value: bytes) -> asyncio.Future[None]:
        self.sends += 1
        if self.sends in self.crash_at:
            raise Crash(f"send {self.sends}")
        if record_size(key, value) > self.max_request_size:
            self.refused_by_producer += 1
            try:
                raise MessageSizeTooLargeError("larger than the maximum request size")
            except MessageSizeTooLargeError as exc:
                raise ProducerSendError(f"Error while sending: {exc!r}") from exc
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.down:
            future.set_exception(KafkaTimeoutError())
        elif record_size(key, value) > self.broker.limits[topic]:
            future.set_exception(RecordTooLargeError())
        elif self.flaky and self.sends % self.flaky == 0 and value not in self._failed_once:
            self._failed_once.add(value)
            future.set_exception(KafkaTimeoutError())
        else:
            self.broker.log[topic].append((key, value))
            future.set_result(None)
        return future
