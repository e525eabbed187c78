"""Consumer lag from faust's public monitor hooks (no private consumer state)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, MutableMapping
from typing import Any

from faust.sensors import Monitor
from faust.types import TP
from prometheus_client import Gauge


def lag_monitor(gauge: Gauge, sources: Iterable[str]) -> type[Monitor]:
    """A faust ``Monitor`` class (the ``Monitor`` app setting) that sets ``gauge`` to the
    records behind the end of each consumed source partition.

    Faust tells the monitor each partition's end offset as it fetches
    (``track_tp_end_offset``) and the offsets it commits (``on_tp_commit``); the lag is
    their difference.  Partitions this worker no longer holds after a rebalance drop
    their series (another worker reports them).
    """
    topics = frozenset(sources)

    class LagMonitor(Monitor):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self._ends: dict[TP, int] = {}
            self._committed: dict[TP, int] = {}

        def track_tp_end_offset(self, tp: TP, offset: int) -> None:
            super().track_tp_end_offset(tp, offset)
            if tp.topic in topics:
                self._ends[tp] = offset
                self._report(tp)

        def on_tp_commit(self, tp_offsets: MutableMapping[TP, int]) -> None:
            super().on_tp_commit(tp_offsets)
            for tp, offset in tp_offsets.items():
                if tp.topic in topics:
                    self._committed[tp] = offset
                    self._report(tp)

        def on_rebalance_end(self, app: Any, state: dict[str, Any]) -> None:
            super().on_rebalance_end(app, state)
            held = set(app.consumer.assignment())
            for tp in [tp for tp in self._ends if tp not in held]:
                self._ends.pop(tp, None)
                self._committed.pop(tp, None)
                with contextlib.suppress(KeyError):  # never reported
                    gauge.remove(tp.topic, str(tp.partition))

        def _report(self, tp: TP) -> None:
            end, committed = self._ends.get(tp), self._committed.get(tp)
            if end is not None and committed is not None:
                gauge.labels(tp.topic, str(tp.partition)).set(max(0, end - committed))

    return LagMonitor
