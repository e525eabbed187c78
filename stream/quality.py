"""The quality aggregation of scored events: per recommender, counts, sums and event-time
rolling means of every (k, r) cell, river-style (``update``/``get``).

A count and a vector of sums per recommender are the whole state of the whole-run quality
summaries (#REval-hit-ratio, exact match, rank-aware), of the chance correction's sums
(observed, expected, events: its kappa is :func:`stream.chance.corrected_of_sums` of them)
and of the popularity slices.  The rolling means are over windows of *event* time
(:class:`stream.windows.RollingMean`); :class:`EventTimeGate` keeps event times that would
freeze or mislead them out.  Turning these into Prometheus metric families is the
adapter's job (:class:`workers.adapters.quality_metrics.QualityMetrics`).

>>> from stream.metrics import ExactScores
>>> from stream.scoring import EventScore
>>> exact = {"all": ExactScores(1.0, 0.5, 0.5, 0.5, 0.5)}
>>> hit = EventScore("1", "mowe", "v1", reval={"all": {5: 1.0}}, exact=exact, ranked={"all": {5: 0.5}},
...                  expected={"all": {5: 0.25}}, precision={"all": {5: 0.5}})
>>> miss = EventScore("2", "mowe", "v1", reval={"all": {5: 0.0}}, exact=exact, ranked={"all": {5: 0.0}},
...                   expected={"all": {5: 0.25}}, precision={"all": {5: 0.0}})
>>> quality = QualityAggregate(ks=[5], rs=[None], windows=[3600], clock=lambda: 1e9)
>>> counts = quality.update_many([hit, miss], [100.0, 200.0])
>>> counts.outcomes, counts.recommended
({('mowe', 'scored'): 2}, {'mowe': (0, 0)})
>>> totals = quality.get()
>>> totals.main["mowe"].count, totals.main["mowe"].sums.tolist()[:1]  # the k=5 #REval-hit-ratio
(2, [1.0])
>>> quality.corrected_cells(), totals.corrected["mowe"].sums.tolist()  # observed, expected
([('5', 'all')], [1.0, 0.5])
>>> quality.corrected_rolling(totals.corrected["mowe"])  # (1 - 0.5) / (2 - 0.5) per window
[[0.3333333333333333]]
>>> totals.precision["mowe"].sums.tolist()  # the precision form's sum, then its squares
[0.5, 0.25]
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Literal, TypeVar

import numpy as np
import numpy.typing as npt

from stream.chance import corrected_of_sums
from stream.metrics import ExactScores
from stream.scoring import EventScore, r_label
from stream.windows import RollingMean

Values = npt.NDArray[np.float64]
#: Why an event was kept out of the rolling windows (it is scored and counted all the same).
OutsideReason = Literal["future", "late"]
#: The three parts of a recommender's main layout, per r: #REval-hit-ratio at each k, the
#: exact-match metrics, the rank-aware #REval-hit-ratio at each k.
CellKind = Literal["reval", "exact", "ranked"]

K = TypeVar("K", bound=Hashable)

_exact_values = attrgetter(*ExactScores.NAMES)


@dataclass(frozen=True)
class Totals:
    """What a :class:`WindowedSums` holds at one moment (copies: the sums go on)."""

    count: int
    sums: Values
    #: Each window's means, None for a window without events.
    means: tuple[Values | None, ...]
    #: Each window's number of events (what its means average over).
    in_window: tuple[int, ...]


class WindowedSums:
    """Count, sums and event-time rolling means of a vector of per-event values.

    >>> s = WindowedSums(width=2, windows=[60])
    >>> s.update(np.array([1.0, 0.0]), event_time=0.0)
    >>> s.update(np.array([0.0, 1.0]), event_time=90.0)  # t=0 leaves the 60 s window
    >>> t = s.get()
    >>> t.count, t.sums.tolist(), t.means[0].tolist(), t.in_window
    (2, [1.0, 1.0], [0.0, 1.0], (1,))
    >>> s.update(np.array([1.0, 1.0]), event_time=0.0, in_windows=False)  # sums only
    >>> s.get().count, s.get().in_window
    (3, (1,))
    """

    def __init__(self, width: int, windows: Sequence[int] = ()) -> None:
        self.count = 0
        self.sums: Values = np.zeros(width)
        self.rolling = [RollingMean(w, size=width) for w in windows]

    def update(self, values: Values, event_time: float, in_windows: bool = True) -> None:
        self.count += 1
        self.sums += values
        if in_windows:
            for window in self.rolling:
                window.update(event_time, values)

    def update_many(self, values: Values, event_times: Sequence[float], in_windows: Sequence[bool]) -> None:
        """:meth:`update` for each row of ``values`` in turn, with the sums added in the same
        order (a running sum down the rows), so the result is the same to the last bit."""
        self.count += len(values)
        self.sums[:] = np.add.accumulate(np.concatenate([self.sums[None, :], values]), axis=0)[-1]
        for window in self.rolling:
            for row, event_time, admitted in zip(values, event_times, in_windows, strict=True):
                if admitted:
                    window.update(event_time, row)

    def get(self) -> Totals:
        means: list[Values | None] = [window.get() for window in self.rolling]
        return Totals(self.count, self.sums.copy(), tuple(means), tuple(w.n for w in self.rolling))


class EventTimeGate:
    """Which event times may enter the rolling windows.

    An event time beyond now + ``max_future_skew`` (a bad clock, a year-2100 typo) would
    move the windows' watermark ahead and freeze them; one older than the newest admitted
    time - ``max_lateness`` says nothing about "now".  :meth:`update` says why an event is
    kept out (None: admitted, and its time may move the newest one on).

    >>> gate = EventTimeGate(max_future_skew=600, max_lateness=60, clock=lambda: 1000.0)
    >>> [gate.update(t) for t in (900.0, 1700.0, 830.0, 1500.0)]
    [None, 'future', 'late', None]
    >>> gate.newest
    1500.0
    """

    def __init__(self, max_future_skew: float, max_lateness: float, clock: Callable[[], float]) -> None:
        self.max_future_skew = max_future_skew
        self.max_lateness = max_lateness
        self.clock = clock
        self.newest = float("-inf")

    def update(self, event_time: float) -> OutsideReason | None:
        if event_time > self.clock() + self.max_future_skew:
            return "future"
        if event_time < self.newest - self.max_lateness:
            return "late"
        self.newest = max(self.newest, event_time)
        return None


@dataclass(frozen=True)
class Snapshot:
    """Every recommender's totals at one moment (:meth:`QualityAggregate.get`)."""

    main: dict[str, Totals]
    corrected: dict[str, Totals]
    slices: dict[tuple[str, str], Totals]
    precision: dict[str, Totals]


@dataclass
class BatchCounts:
    """What :meth:`QualityAggregate.update_many` counted in a batch, for counters beside the
    sums: events by (recommender, outcome), (recommended, unknown) hashtags per recommender,
    events kept out of the windows by reason."""

    outcomes: dict[tuple[str, str], int] = field(default_factory=dict)
    recommended: dict[str, tuple[int, int]] = field(default_factory=dict)
    outside: Counter[OutsideReason] = field(default_factory=Counter)


def _fixed_width(values: list[float], length: int) -> None:
    """Cut ``values`` to ``length`` (an event with more values than the layout: the extra are
    ignored), or fail when it falls short (an event missing some)."""
    if len(values) < length:
        raise ValueError(f"an event has fewer values than the metrics' layout ({len(values)} < {length})")
    del values[length:]


def _by_key(keys: Sequence[K]) -> dict[K, list[int]]:
    """The positions of each key, keys in order of first appearance."""
    found: dict[K, list[int]] = {}
    for i, key in enumerate(keys):
        found.setdefault(key, []).append(i)
    return found


def _add_sums(into: dict[K, WindowedSums], keys: Sequence[K], values: Values) -> None:
    """Rows of ``values`` (one per key, in order) into each key's sums; no windows."""
    for key, rows in _by_key(keys).items():
        sums = into.get(key)
        if sums is None:
            sums = into[key] = WindowedSums(values.shape[1])
        sums.update_many(values[rows], [0.0] * len(rows), [False] * len(rows))


class QualityAggregate:
    """Per recommender, the sums and windows of scored events (the module's example).

    Every scorable event adds to every (k, r) cell of its recommender.  Three layouts:

    * main, per recommender: for each r, the #REval-hit-ratio at each k, the exact-match
      metrics, the rank-aware #REval-hit-ratio at each k (:meth:`main_cells`); sums and
      rolling means;
    * corrected, per recommender, only events scored with a null model (every published
      thesaurus has one; the empty one before the first version has none): the observed
      #REval-hit-ratio of each (k, r) cell (:meth:`corrected_cells`), then the null's
      expectation of each; the count is the best possible sum (1 per event);
    * slices, per (recommender, popularity slice): the #REval-hit-ratio on that slice's
      ground truths per (k, r) cell; sums only;
    * precision, per recommender: the precision form of #REval of each (k, r) cell
      (:attr:`stream.scoring.EventScore.precision`), then its square (the #REval alert
      estimates its variance from them); sums only.

    ``names`` (default: each score's recommender) are the keys the totals are kept under:
    the exporter passes bounded label values.
    """

    def __init__(
        self,
        ks: Sequence[int],
        rs: Sequence[int | None],
        windows: Sequence[int],
        *,
        clock: Callable[[], float],
        max_future_skew: float = 600.0,
        max_lateness: float | None = None,
    ) -> None:
        self.ks = [str(k) for k in ks]
        self.rs = [r_label(r) for r in rs]
        self.windows = list(windows)
        lateness = max_lateness if max_lateness is not None else float(max(windows, default=0))
        self.gate = EventTimeGate(max_future_skew, lateness, clock)
        self.width = len(self.rs) * (2 * len(self.ks) + len(ExactScores.NAMES))
        self._main: dict[str, WindowedSums] = {}
        self._corrected: dict[str, WindowedSums] = {}
        self._slices: dict[tuple[str, str], WindowedSums] = {}
        self._precision: dict[str, WindowedSums] = {}

    def main_cells(self) -> list[tuple[CellKind, str, str]]:
        """``(kind, k or exact metric, r)`` of each position of the main layout."""
        parts: tuple[tuple[CellKind, Sequence[str]], ...] = (
            ("reval", self.ks),
            ("exact", ExactScores.NAMES),
            ("ranked", self.ks),
        )
        return [(kind, cell, r) for r in self.rs for kind, cells in parts for cell in cells]

    def corrected_cells(self) -> list[tuple[str, str]]:
        """``(k, r)`` of each observed sum of the corrected layout (the expected sums follow
        in the same order); also the layout of a slice's sums."""
        return [(k, r) for r in self.rs for k in self.ks]

    def corrected_rolling(self, totals: Totals) -> list[list[float | None]]:
        """Per window, per (k, r) cell, the corrected score of the window: the kappa of its
        sums, which is that of its means (None: an empty window, or no room above chance)."""
        n = len(self.rs) * len(self.ks)
        out: list[list[float | None]] = []
        for means in totals.means:
            if means is None:
                out.append([None] * n)
            else:
                out.append([corrected_of_sums(float(means[i]), float(means[n + i]), 1.0) for i in range(n)])
        return out

    def update(self, score: EventScore, event_time: float, name: str | None = None) -> BatchCounts:
        return self.update_many([score], [event_time], None if name is None else [name])

    def update_many(
        self, scores: Sequence[EventScore], event_times: Sequence[float], names: Sequence[str] | None = None
    ) -> BatchCounts:
        """Add a batch of scored events (in order): one numpy pass per recommender's sums."""
        rs, width, n_k = self.rs, self.width, len(self.rs) * len(self.ks)
        counts = BatchCounts()
        recommended: dict[str, list[int]] = {}
        scored: list[tuple[str, float]] = []  # (name, event time) per scorable event
        # Each event's values, flat (one list per layout; few objects for the GC).
        main: list[float] = []
        corrected: list[float] = []
        corrected_events: list[int] = []  # the positions in ``scored`` of the corrected rows
        sliced: list[float] = []
        shares: list[float] = []
        slice_keys: list[tuple[str, str]] = []
        if names is None:
            names = [score.recommender for score in scores]
        for score, event_time, name in zip(scores, event_times, names, strict=True):
            outcome = "unscorable" if score.unscorable is not None else "scored"
            counts.outcomes[name, outcome] = counts.outcomes.get((name, outcome), 0) + 1
            if score.unscorable is not None:
                continue
            tally = recommended.setdefault(name, [0, 0])
            tally[0] += score.n_recommended
            tally[1] += score.unknown_recommended
            for r in rs:
                main += score.reval[r].values()
                main += _exact_values(score.exact[r])
                main += score.ranked[r].values()
            _fixed_width(main, width * (len(scored) + 1))
            for r in rs:
                shares += list(score.precision[r].values())[: len(self.ks)]
            _fixed_width(shares, n_k * (len(scored) + 1))
            if score.expected:
                for r in rs:
                    corrected += list(score.reval[r].values())[: len(self.ks)]
                for r in rs:
                    corrected += list(score.expected[r].values())[: len(self.ks)]
                corrected_events.append(len(scored))
                _fixed_width(corrected, 2 * n_k * len(corrected_events))
            if score.slices and rs:
                by_r = [score.slices[r] for r in rs]
                for label in by_r[0]:
                    for by_slice in by_r:
                        sliced += by_slice[label].values()
                    slice_keys.append((name, label))
                    _fixed_width(sliced, n_k * len(slice_keys))
            scored.append((name, event_time))
        counts.recommended = {name: (n, unknown) for name, (n, unknown) in recommended.items()}
        if not scored:
            return counts
        admitted = []
        for _, event_time in scored:
            reason = self.gate.update(event_time)
            if reason is not None:
                counts.outside[reason] += 1
            admitted.append(reason is None)
        self._add(self._main, width, [n for n, _ in scored], main, scored, admitted, range(len(scored)))
        self._add(
            self._corrected,
            2 * n_k,
            [scored[i][0] for i in corrected_events],
            corrected,
            scored,
            admitted,
            corrected_events,
        )
        share_values = np.array(shares, dtype=np.float64).reshape(-1, n_k)
        precision = np.concatenate([share_values, share_values**2], axis=1)
        _add_sums(self._precision, [n for n, _ in scored], precision)
        _add_sums(self._slices, slice_keys, np.array(sliced, dtype=np.float64).reshape(-1, n_k))
        return counts

    def _add(
        self,
        into: dict[str, WindowedSums],
        width: int,
        keys: Sequence[str],
        flat: list[float],
        scored: Sequence[tuple[str, float]],
        admitted: Sequence[bool],
        events: Sequence[int],
    ) -> None:
        """Rows of ``flat`` (one per key; row i is the scored event ``events[i]``) into each
        key's sums and windows."""
        values = np.array(flat, dtype=np.float64).reshape(-1, width)
        for key, rows in _by_key(keys).items():
            sums = into.get(key)
            if sums is None:
                sums = into[key] = WindowedSums(width, self.windows)
            at = [events[row] for row in rows]
            sums.update_many(values[rows], [scored[i][1] for i in at], [admitted[i] for i in at])

    def get(self) -> Snapshot:
        return Snapshot(
            {name: sums.get() for name, sums in self._main.items()},
            {name: sums.get() for name, sums in self._corrected.items()},
            {key: sums.get() for key, sums in self._slices.items()},
            {name: sums.get() for name, sums in self._precision.items()},
        )
