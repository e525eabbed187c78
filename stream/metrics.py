"""#REval-hit-ratio and the exact-match metrics (paper 2.1 and 3.3, Eq. 3-4, Algorithm 2).

R is the set of recommended hashtags, G the set of ground-truth hashtags, both
normalised and without duplicates.  Synonyms are expanded for R only::

    #REval-hit-ratio(R, G) = rho / min(|R|, |G|)
      |R| <= |G|: rho = #{r in R : Syn_k(r) ∩ G ≠ ∅}
      otherwise:  rho = #{g in G : g in Syn_k(R)}

With k = 0 (Syn_0(h) = {h}) it is the plain hit ratio.  An event with an empty
R or G has no defined score: the functions return ``None`` and the aggregates
count it as unscorable, never as 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from stream.hashtags import normalise_all

Synonyms = Callable[[str], Iterable[str]]
"""Syn(h): the hashtag itself and its synonyms."""


def as_set(hashtags: Iterable[str]) -> list[str]:
    """Normalised hashtags without duplicates, in their original order (rank kept)."""
    return normalise_all(hashtags)


def matches(recommended: Sequence[str], truth: Sequence[str], synonyms: Synonyms) -> int:
    """rho of Algorithm 2 (Match_Synonyms), on already-normalised, duplicate-free lists.

    >>> syn = {"swim": ["swim", "dive", "paddle", "sport"]}
    >>> matches(["swim", "exercise"], ["sport"], lambda h: syn.get(h, [h]))
    1
    """
    gold = set(truth)
    if len(recommended) <= len(truth):
        return sum(1 for r in recommended if not gold.isdisjoint(synonyms(r)))
    expanded: set[str] = set()
    for r in recommended:
        expanded.update(synonyms(r))
    return sum(1 for g in truth if g in expanded)


def reval_hit_ratio(recommended: Iterable[str], truth: Iterable[str], synonyms: Synonyms) -> float | None:
    """#REval-hit-ratio (Eq. 4); ``None`` when R or G is empty (unscorable).

    Paper Table 2, first row (k = 3):

    >>> syn = {"hockey": ["hockey", "bowling", "golf", "sport"],
    ...        "championship": ["championship", "champion", "winner", "tournament"]}
    >>> reval_hit_ratio(["hockey", "championship"], ["football", "sport"],
    ...                 lambda h: syn.get(h, [h]))
    0.5
    """
    r, g = as_set(recommended), as_set(truth)
    if not r or not g:
        return None
    return matches(r, g, synonyms) / min(len(r), len(g))


def _self(hashtag: str) -> list[str]:
    return [hashtag]


@dataclass(frozen=True)
class ExactScores:
    """Exact-match metrics of one event (paper 2.1)."""

    hit_rate: float
    precision: float
    recall: float
    f1: float
    hit_ratio: float

    NAMES = ("hit_rate", "precision", "recall", "f1", "hit_ratio")

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.NAMES}


def exact_scores(recommended: Iterable[str], truth: Iterable[str]) -> ExactScores | None:
    """Hit rate, precision, recall, F1 and hit ratio by exact match; ``None`` if unscorable.

    >>> exact_scores(["flood", "help", "nsw"], ["flood", "qldflood"])
    ExactScores(hit_rate=1.0, precision=0.3333333333333333, recall=0.5, f1=0.4, hit_ratio=0.5)
    """
    r, g = as_set(recommended), as_set(truth)
    if not r or not g:
        return None
    hits = len(set(r) & set(g))
    precision, recall = hits / len(r), hits / len(g)
    f1 = 2 * precision * recall / (precision + recall) if hits else 0.0
    return ExactScores(
        hit_rate=1.0 if hits else 0.0,
        precision=precision,
        recall=recall,
        f1=f1,
        hit_ratio=matches(r, g, _self) / min(len(r), len(g)),
    )


class Mean:
    """Running mean of scores, river style; ``None`` values count as unscorable.

    >>> m = Mean()
    >>> for x in (1.0, 0.0, None, 0.5):
    ...     m.update(x)
    >>> m.get(), m.n, m.unscorable
    (0.5, 3, 1)
    """

    def __init__(self) -> None:
        self.total = 0.0
        self.n = 0
        self.unscorable = 0

    def update(self, value: float | None) -> None:
        if value is None:
            self.unscorable += 1
        else:
            self.total += value
            self.n += 1

    def get(self) -> float | None:
        return self.total / self.n if self.n else None


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
