"""Event-time windows: means over the last W seconds of *event* time, not wall-clock time.

Time is the event's own, so a replay at any speed shows what a live run would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt


class RollingMean:
    """Mean over the last ``window`` seconds of *event* time, for a vector of values.

    Time is the event's own, not the wall clock, so a replay at any speed shows
    what a live run would.  The window is bucketed: ``buckets`` slots of
    ``window / buckets`` seconds; it covers the slot holding the newest event
    time seen (the watermark) and the ``buckets - 1`` slots before it.  Events
    older than that are counted in ``late`` and otherwise ignored.

    >>> m = RollingMean(window=60, buckets=6)
    >>> m.update(0.0, [1.0]); m.update(30.0, [0.0]); m.get().tolist()
    [0.5]
    >>> m.update(65.0, [0.0]); m.get().tolist()  # the slot of t=0 fell out
    [0.0]
    """

    def __init__(self, window: float, buckets: int = 60, size: int = 1) -> None:
        if window <= 0 or buckets < 1:
            raise ValueError("window must be > 0 and buckets >= 1")
        self.window = window
        self.buckets = buckets
        self.slot = window / buckets
        self.size = size
        self._sums: dict[int, npt.NDArray[np.float64]] = {}
        self._counts: dict[int, int] = {}
        self.watermark: int | None = None
        self.late = 0

    def _evict(self) -> None:
        assert self.watermark is not None
        oldest = self.watermark - self.buckets + 1
        for index in [i for i in self._counts if i < oldest]:
            del self._counts[index], self._sums[index]

    def update(self, t: float, values: Sequence[float] | npt.NDArray[np.float64]) -> None:
        if len(values) != self.size:
            raise ValueError(f"expected {self.size} values, got {len(values)}")
        index = int(t // self.slot)
        if self.watermark is None or index > self.watermark:
            self.watermark = index
            self._evict()
        elif index <= self.watermark - self.buckets:
            self.late += 1
            return
        sums = self._sums.get(index)
        if sums is None:
            sums = self._sums[index] = np.zeros(self.size)
        sums += values
        self._counts[index] = self._counts.get(index, 0) + 1

    def update_many(self, times: npt.NDArray[np.float64], values: npt.NDArray[np.float64]) -> None:
        """:meth:`update` for each row of ``values`` (at ``times``) in turn: the same slots, sums
        (added row after row: a running sum per slot), late count and watermark.

        >>> a, b = RollingMean(60, buckets=6, size=1), RollingMean(60, buckets=6, size=1)
        >>> times, rows = np.array([0.0, 65.0, 3.0, 61.0]), np.array([[1.0], [0.5], [9.0], [0.25]])
        >>> for t, row in zip(times, rows): a.update(t, row)
        >>> b.update_many(times, rows)
        >>> (a.get().tolist(), a.late, a.watermark) == (b.get().tolist(), b.late, b.watermark)
        True
        """
        if len(times) == 0:
            return
        if values.shape[1:] != (self.size,):
            raise ValueError(f"expected {self.size} values, got {values.shape[1:]}")
        index = np.floor_divide(np.asarray(times, dtype=np.float64), self.slot).astype(np.int64)
        # The watermark before each row: the newest slot of the rows before it (and before the batch).
        start = index[0] if self.watermark is None else self.watermark  # the first row: never late
        before = np.maximum.accumulate(np.concatenate([[start], index[:-1]]))
        late = index <= before - self.buckets
        self.late += int(late.sum())
        kept, rows = index[~late], values[~late]
        for slot in dict.fromkeys(kept.tolist()):
            mine = rows[kept == slot]
            sums = self._sums.get(slot)
            if sums is None:
                sums = self._sums[slot] = np.zeros(self.size)
            sums[:] = np.add.accumulate(np.concatenate([sums[None, :], mine]), axis=0)[-1]
            self._counts[slot] = self._counts.get(slot, 0) + len(mine)
        newest = int(index.max())
        if self.watermark is None or newest > self.watermark:
            self.watermark = newest
            self._evict()

    @property
    def n(self) -> int:
        return sum(self._counts.values())

    def get(self) -> Any:
        """The means as a numpy array, or ``None`` before any event in the window."""
        n = self.n
        if not n:
            return None
        total = np.zeros(self.size)
        for sums in self._sums.values():
            total += sums
        return total / n

    def covers(self, t: float) -> bool:
        """Whether an event at time ``t`` falls in the current window (for checking)."""
        if self.watermark is None:
            return False
        return self.watermark - self.buckets < t // self.slot <= self.watermark
