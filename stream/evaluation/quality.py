"""The quality aggregation of scored events: per recommender, counts, sums and event-time
rolling means of every (k, r) cell, river-style (``update``/``get``), over a batch's columns.

A count and a vector of sums per recommender are the whole state of the whole-run quality
summaries (every signal of :data:`stream.evaluation.signals.SIGNALS`, the exact-match metrics), of the
chance correction's sums (observed, expected, events: its kappa is
:func:`stream.evaluation.chance.corrected_of_sums` of them) and of the popularity slices.  The rolling
means are over windows of *event* time (:class:`stream.synonyms.windows.RollingMean`);
:class:`EventTimeGate` keeps event times that would freeze or mislead them out.  Turning these
into Prometheus metric families is the adapter's job
(:class:`workers.adapters.prometheus.quality_metrics.QualityMetrics`).

>>> from stream.evaluation.neighbours import NeighbourCache
>>> from stream.intake.records import Recommendation
>>> from stream.evaluation.scoring import score_batch
>>> from stream.synonyms.thesaurus import JsonThesaurus
>>> cache = NeighbourCache(JsonThesaurus({"flood": ["rain"], "rain": ["flood"]}), max_k=1)
>>> events = [(Recommendation("1", ("rain",), recommender="mowe"), ["flood"]),
...           (Recommendation("2", ("help",), recommender="mowe"), ["flood"])]
>>> quality = QualityAggregate(ks=[1], rs=[None], windows=[3600], clock=lambda: 1e9)
>>> counts = quality.update_batch(score_batch(events, cache, ks=[1]), [100.0, 200.0])
>>> counts.outcomes, counts.recommended
({('mowe', 'scored'): 2}, {'mowe': (2, 1)})
>>> totals = quality.get()
>>> totals.main["mowe"].count, totals.main["mowe"].sums.tolist()[:1]  # the k=1 #REval-hit-ratio
(2, [1.0])
>>> totals.sums["reval_hit_ratio_precision"]["mowe"].sums.tolist()  # its sum, then its squares
[1.0, 1.0]
>>> totals.corrected  # a JSON thesaurus has no null model
{}
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import numpy as np
import numpy.typing as npt

from stream.evaluation.chance import corrected_of_sums
from stream.evaluation.metrics import ExactScores
from stream.evaluation.scoring import EventScore, ScoredBatch, r_label
from stream.evaluation.signals import SIGNALS
from stream.evaluation.slices import SLICES
from stream.synonyms.windows import RollingMean

Values = npt.NDArray[np.float64]
#: Why an event was kept out of the rolling windows (it is scored and counted all the same).
OutsideReason = Literal["future", "late"]
#: The parts of a recommender's main layout, per r: each signal with rolling means (its key) at
#: each k, then the exact-match metrics ("exact").
CellKind = str
#: The signals whose windows are kept (the main layout) and those kept as sums only.
_ROLLING = tuple(s for s in SIGNALS if s.rolling is not None)

K = TypeVar("K", bound=Hashable)


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
        if not len(values):
            return
        self.sums[:] = np.add.accumulate(np.concatenate([self.sums[None, :], values]), axis=0)[-1]
        if self.rolling:
            admitted = np.asarray(in_windows, dtype=bool)
            times = np.asarray(event_times, dtype=np.float64)[admitted]
            for window in self.rolling:
                window.update_many(times, values[admitted])

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
    #: Per signal kept as sums (:meth:`QualityAggregate.sums_cells`), per recommender.
    sums: dict[str, dict[str, Totals]]


@dataclass
class BatchCounts:
    """What :meth:`QualityAggregate.update_batch` counted in a batch, for counters beside the
    sums: events by (recommender, outcome), (recommended, unknown) hashtags per recommender,
    events kept out of the windows by reason."""

    outcomes: dict[tuple[str, str], int] = field(default_factory=dict)
    recommended: dict[str, tuple[int, int]] = field(default_factory=dict)
    outside: Counter[OutsideReason] = field(default_factory=Counter)

    def add(self, other: BatchCounts) -> None:
        """Count ``other``'s events too."""
        for key, n in other.outcomes.items():
            self.outcomes[key] = self.outcomes.get(key, 0) + n
        for name, (n, unknown) in other.recommended.items():
            before = self.recommended.get(name, (0, 0))
            self.recommended[name] = (before[0] + n, before[1] + unknown)
        self.outside.update(other.outside)


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

    Every scorable event adds to every (k, r) cell of its recommender.  Layouts:

    * main, per recommender: for each r, each signal with rolling means at each k, then the
      exact-match metrics (:meth:`main_cells`); sums and rolling means;
    * sums, per signal without rolling means (or with squares), per recommender: its values at
      each (k, r) cell (:meth:`corrected_cells`' order) unless they are in the main layout, then
      their squares if the signal declares them (:meth:`sums_cells`); sums only;
    * corrected, per recommender, only events scored with a null model (every published
      thesaurus has one; the empty one before the first version has none): the observed
      #REval-hit-ratio of each (k, r) cell (:meth:`corrected_cells`), then the null's
      expectation of each; the count is the best possible sum (1 per event);
    * slices, per (recommender, popularity slice): the #REval-hit-ratio on that slice's
      ground truths per (k, r) cell; sums only.

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
        self._k_values = [int(k) for k in ks]
        self.windows = list(windows)
        lateness = max_lateness if max_lateness is not None else float(max(windows, default=0))
        self.gate = EventTimeGate(max_future_skew, lateness, clock)
        self.width = len(self.rs) * (len(_ROLLING) * len(self.ks) + len(ExactScores.NAMES))
        self._main: dict[str, WindowedSums] = {}
        self._corrected: dict[str, WindowedSums] = {}
        self._slices: dict[tuple[str, str], WindowedSums] = {}
        self._sums: dict[str, dict[str, WindowedSums]] = {key: {} for key in self.sums_cells()}

    def main_cells(self) -> list[tuple[CellKind, str, str]]:
        """``(kind, k or exact metric, r)`` of each position of the main layout; the kind is a
        signal's key or "exact"."""
        parts: list[tuple[CellKind, Sequence[str]]] = [(s.key, self.ks) for s in _ROLLING]
        parts.append(("exact", ExactScores.NAMES))
        return [(kind, cell, r) for r in self.rs for kind, cells in parts for cell in cells]

    def corrected_cells(self) -> list[tuple[str, str]]:
        """``(k, r)`` of each observed sum of the corrected layout (the expected sums follow
        in the same order); also the layout of a slice's sums and of a signal's sums."""
        return [(k, r) for r in self.rs for k in self.ks]

    def sums_cells(self) -> dict[str, tuple[bool, bool]]:
        """The signals kept as sums: whether their values are there (not in the main layout),
        and whether their squares follow."""
        return {
            s.key: (s.rolling is None, s.squares is not None)
            for s in SIGNALS
            if s.rolling is None or s.squares is not None
        }

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
        """:meth:`update_batch` of events given one by one (runs of events of the same batch at
        once), in order."""
        counts = BatchCounts()
        start = 0
        while start < len(scores):
            end = start + 1
            while end < len(scores) and scores[end].batch is scores[start].batch:
                end += 1
            batch = scores[start].batch.take([s.index for s in scores[start:end]])
            part = self.update_batch(
                batch, event_times[start:end], None if names is None else names[start:end]
            )
            counts.add(part)
            start = end
        return counts

    def _cells(self, batch: ScoredBatch) -> tuple[list[int], list[int]]:
        """The positions of this aggregate's r and k in the batch's arrays."""
        try:
            return [batch.rs.index(r) for r in self.rs], [batch.ks.index(k) for k in self._k_values]
        except ValueError:
            raise ValueError(
                f"the scores' grid (r {list(batch.rs)}, k {list(batch.ks)}) lacks cells of the metrics' "
                f"layout (r {self.rs}, k {self.ks})"
            ) from None

    def update_batch(
        self, batch: ScoredBatch, event_times: Sequence[float], names: Sequence[str] | None = None
    ) -> BatchCounts:
        """Add a batch of scored events (in order), from its columns: one numpy pass per
        recommender's sums."""
        counts = BatchCounts()
        if names is None:
            names = batch.recommenders
        scorable = batch.scorable
        outcomes = Counter(zip(names, np.where(scorable, "scored", "unscorable").tolist(), strict=True))
        counts.outcomes = dict(outcomes)
        rows = np.flatnonzero(scorable)
        if not len(rows):
            return counts
        keys = [names[i] for i in rows.tolist()]
        n_rec, n_unknown = batch.n_recommended[rows].tolist(), batch.unknown_recommended[rows].tolist()
        recommended: dict[str, list[int]] = {}
        for name, n, unknown in zip(keys, n_rec, n_unknown, strict=True):
            tally = recommended.setdefault(name, [0, 0])
            tally[0] += n
            tally[1] += unknown
        counts.recommended = {name: (n, unknown) for name, (n, unknown) in recommended.items()}
        times = [event_times[i] for i in rows.tolist()]
        admitted = []
        for event_time in times:
            reason = self.gate.update(event_time)
            if reason is not None:
                counts.outside[reason] += 1
            admitted.append(reason is None)
        r_at, k_at = self._cells(batch)
        n = len(rows)

        def cells(values: Values) -> Values:  # n x (r, k), r-major
            picked: Values = values[rows][:, r_at][:, :, k_at].reshape(n, -1)
            return picked

        parts = []
        for r in r_at:
            parts += [batch.values[s.key][rows, r][:, k_at] for s in _ROLLING]
            parts.append(batch.exact[rows, r])
        main = np.concatenate(parts, axis=1) if parts else np.zeros((n, 0))
        self._add(self._main, keys, main, times, admitted, windows=True)
        for key, (values, squares) in self.sums_cells().items():
            found = cells(batch.values[key])
            kept = [found] if values else []
            if squares:
                kept.append(found**2)
            _add_sums(self._sums[key], keys, np.concatenate(kept, axis=1))
        if batch.expected is not None:
            corrected = np.concatenate(
                [cells(batch.values["reval_hit_ratio"]), cells(batch.expected)], axis=1
            )
            self._add(self._corrected, keys, corrected, times, admitted, windows=True)
        for label in SLICES:
            found_slice = batch.slices.get(label)
            if found_slice is None:
                continue
            present = found_slice[0][rows]
            if present.any():
                at = np.flatnonzero(present)
                _add_sums(self._slices, [(keys[i], label) for i in at.tolist()], cells(found_slice[1])[at])
        return counts

    def _add(
        self,
        into: dict[str, WindowedSums],
        keys: Sequence[str],
        values: Values,
        times: Sequence[float],
        admitted: Sequence[bool],
        *,
        windows: bool,
    ) -> None:
        """Rows of ``values`` (one per key) into each key's sums and windows."""
        for key, rows in _by_key(keys).items():
            sums = into.get(key)
            if sums is None:
                sums = into[key] = WindowedSums(values.shape[1], self.windows if windows else ())
            sums.update_many(values[rows], [times[i] for i in rows], [admitted[i] for i in rows])

    def get(self) -> Snapshot:
        return Snapshot(
            {name: sums.get() for name, sums in self._main.items()},
            {name: sums.get() for name, sums in self._corrected.items()},
            {key: sums.get() for key, sums in self._slices.items()},
            {
                key: {name: sums.get() for name, sums in by_name.items()}
                for key, by_name in self._sums.items()
            },
        )
