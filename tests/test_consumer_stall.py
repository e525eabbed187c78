"""A consumer that takes no record while records wait says why, in one line: which partitions
are behind, where they are, their end, the stable end a ``read_committed`` consumer may read up
to, and whether the step holds them -- so a worker that sits still is diagnosed from its log."""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest
from aiokafka import TopicPartition

from workers.service.consumer import STALL_WARN_S, BatchConsumer


class StillConsumer:
    """aiokafka's consumer as :meth:`BatchConsumer._warn_stalled` reads it (assignment, ends)."""

    def __init__(
        self,
        ends: dict[TopicPartition, int | None],
        stable: dict[TopicPartition, int],
        paused: set[TopicPartition],
    ) -> None:
        self.ends, self.stable, self._paused = ends, stable, paused

    def assignment(self) -> set[TopicPartition]:
        return set(self.ends)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.ends[tp]

    def last_stable_offset(self, tp: TopicPartition) -> int:
        return self.stable[tp]

    def paused(self) -> set[TopicPartition]:
        return self._paused


def consumer_with(
    still: StillConsumer, positions: dict[TopicPartition, int], *, exactly_once: bool
) -> BatchConsumer:
    runtime: Any = None  # the warning reads no runtime
    transactions: Any = object() if exactly_once else None  # only whether there are any
    consumer = BatchConsumer(runtime, {}, group="g", size=10, within=0.1, transactions=transactions)
    consumer.consumer = cast(Any, still)
    consumer._positions.update(positions)
    return consumer


def test_the_stall_line_names_each_partition_behind_and_why(caplog: pytest.LogCaptureFixture) -> None:
    recs0, recs1, tweets0, fresh = (
        TopicPartition("recs", 0),
        TopicPartition("recs", 1),
        TopicPartition("tweets", 0),
        TopicPartition("tweets", 1),
    )
    still = StillConsumer(
        ends={recs0: 120, recs1: 40, tweets0: 75, fresh: None},
        stable={recs0: 100, recs1: 40, tweets0: 75, fresh: 0},
        paused={tweets0},
    )
    consumer = consumer_with(still, {recs0: 100, recs1: 40, tweets0: 70}, exactly_once=True)
    with caplog.at_level(logging.WARNING, "reval.workers"):
        consumer._warn_stalled()
    (line,) = caplog.messages
    assert line == (
        f"consumer g: no record taken for {STALL_WARN_S:.0f} s while records wait: "
        "recs-0 (at 100, end 120, stable end 100); "
        "tweets-0 (at 70, end 75, stable end 75, paused: its step holds)"
    )


def test_no_line_when_nothing_waits(caplog: pytest.LogCaptureFixture) -> None:
    tp = TopicPartition("recs", 0)
    consumer = consumer_with(StillConsumer({tp: 40}, {tp: 40}, set()), {tp: 40}, exactly_once=False)
    with caplog.at_level(logging.WARNING, "reval.workers"):
        consumer._warn_stalled()
    assert caplog.messages == []


def test_at_least_once_states_no_stable_end(caplog: pytest.LogCaptureFixture) -> None:
    tp = TopicPartition("recs", 3)
    consumer: Any = consumer_with(StillConsumer({tp: 9}, {tp: 0}, set()), {}, exactly_once=False)
    with caplog.at_level(logging.WARNING, "reval.workers"):
        consumer._warn_stalled()
    assert caplog.messages[0].endswith("recs-3 (at unknown, end 9)")
