"""A consumer that takes no record while records wait says why, in one line: which partitions
are behind, its position in each, their end, the stable end a ``read_committed`` consumer may
read up to, and whether the step holds them -- so a worker that sits still is diagnosed from
its log."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest
from aiokafka import TopicPartition

from workers.service.consumer import STALL_WARN_S, BatchConsumer


class StillConsumer:
    """aiokafka's consumer as :meth:`BatchConsumer._warn_stalled` reads it: the assignment,
    each partition's end as its last fetch saw it (none: never fetched), the end it may read
    to (``end_offsets``: the stable end under read_committed), its position (none: a position
    being reset, which never answers), the paused partitions."""

    def __init__(
        self,
        fetched: dict[TopicPartition, int | None],
        at: dict[TopicPartition, int],
        *,
        readable: dict[TopicPartition, int] | None = None,
        paused: frozenset[TopicPartition] = frozenset(),
    ) -> None:
        self.fetched, self.at, self._paused = fetched, at, paused
        self.readable = readable if readable is not None else {tp: n or 0 for tp, n in fetched.items()}

    def assignment(self) -> set[TopicPartition]:
        return set(self.fetched)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.fetched[tp]

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.readable[tp] for tp in partitions}

    def paused(self) -> frozenset[TopicPartition]:
        return self._paused

    async def position(self, tp: TopicPartition) -> int:
        if tp not in self.at:
            await asyncio.Event().wait()
        return self.at[tp]


def stall_line(still: StillConsumer, *, exactly_once: bool, caplog: pytest.LogCaptureFixture) -> list[str]:
    runtime: Any = None  # the warning reads no runtime
    transactions: Any = object() if exactly_once else None  # only whether there are any
    consumer = BatchConsumer(runtime, {}, group="g", size=10, within=0.1, transactions=transactions)
    consumer.consumer = cast(Any, still)
    with caplog.at_level(logging.WARNING, "reval.workers"):
        asyncio.run(consumer._warn_stalled())
    return caplog.messages


def test_the_stall_line_names_each_partition_behind_and_why(caplog: pytest.LogCaptureFixture) -> None:
    """recs-0: an open transaction holds the stable end at the position; tweets-0: paused by
    its step before it ever fetched, so only the asked-for end shows what waits; tweets-1: a
    partition with nothing in it."""
    recs0, recs1, tweets0, empty = (
        TopicPartition("recs", 0),
        TopicPartition("recs", 1),
        TopicPartition("tweets", 0),
        TopicPartition("tweets", 1),
    )
    still = StillConsumer(
        fetched={recs0: 120, recs1: 40, tweets0: None, empty: None},
        at={recs0: 100, recs1: 40, tweets0: 0, empty: 0},
        readable={recs0: 100, recs1: 40, tweets0: 75, empty: 0},
        paused=frozenset({tweets0}),
    )
    (line,) = stall_line(still, exactly_once=True, caplog=caplog)
    assert line == (
        f"consumer g: no record taken for {STALL_WARN_S:.0f} s while records wait: "
        "recs-0 (at 100, end 120, stable end 100); "
        "tweets-0 (at 0, end 75, stable end 75, paused: its step holds)"
    )


def test_no_line_when_the_position_is_at_the_end(caplog: pytest.LogCaptureFixture) -> None:
    """At the end -- past a transaction's commit marker too, which no record follows."""
    tp = TopicPartition("recs", 0)
    assert stall_line(StillConsumer({tp: 41}, {tp: 41}), exactly_once=False, caplog=caplog) == []


def test_a_position_being_reset_is_unknown_and_at_least_once_has_no_stable_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tp = TopicPartition("recs", 3)
    (line,) = stall_line(StillConsumer({tp: 9}, {}), exactly_once=False, caplog=caplog)
    assert line.endswith("recs-3 (at unknown, end 9)")
