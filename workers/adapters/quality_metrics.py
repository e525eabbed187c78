"""The scorer's quality metrics as one custom Prometheus collector (:class:`QualityMetrics`).

Per recommender, a count and a vector of sums are the whole state of the ``reval_hit_ratio``
and ``reval_exact_match`` summaries and the ``reval_corrected_*`` counters; the event-time
rolling means beside them.  Metric families are made when Prometheus scrapes, not per event.
The process-wide metrics (:class:`~workers.adapters.exporter.Exporter`) live beside it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from operator import attrgetter
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily

from stream.chance import corrected_of_sums
from stream.metrics import ExactScores
from stream.scoring import EventScore, r_label
from stream.windows import RollingMean
from workers.adapters.exporter import CORRECTED_COUNTERS, Exporter, LabelGuard


class _Accumulator:
    """Count, sums and event-time rolling means of one vector of per-event values."""

    def __init__(self, width: int, windows: Sequence[int]) -> None:
        self.count = 0
        self.sums = np.zeros(width)
        self.rolling = [RollingMean(w, size=width) for w in windows]

    def update(self, values: npt.NDArray[np.float64], event_time: float, in_windows: bool = True) -> None:
        self.count += 1
        self.sums += values
        if in_windows:
            for window in self.rolling:
                window.update(event_time, values)

    def update_many(
        self, values: npt.NDArray[np.float64], event_times: Sequence[float], in_windows: Sequence[bool]
    ) -> None:
        """:meth:`update` for each row of ``values`` in turn, with the sums added in the same
        order (a running sum down the rows), so the result is the same to the last bit."""
        self.count += len(values)
        self.sums[:] = np.add.accumulate(np.concatenate([self.sums[None, :], values]), axis=0)[-1]
        for window in self.rolling:
            for row, event_time, admitted in zip(values, event_times, in_windows, strict=True):
                if admitted:
                    window.update(event_time, row)

    def snapshot(self) -> tuple[int, npt.NDArray[np.float64], list[Any], list[int]]:
        """Count, sums, each window's means (None when empty) and each window's event count."""
        means = [window.get() for window in self.rolling]
        return self.count, self.sums.copy(), means, [window.n for window in self.rolling]


K = TypeVar("K")


_exact_values = attrgetter(*ExactScores.NAMES)


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


class QualityMetrics:
    """Feeds scored events into the quality metrics, at thousands of events per second.

    Every scorable event adds to every (k, r) cell of its recommender, so a count and a
    vector of sums per recommender are the whole state of the ``reval_hit_ratio`` and
    ``reval_exact_match`` summaries and the ``reval_corrected_*`` counters; they and the
    event-time rolling means are turned into metric families only when Prometheus
    scrapes (this object is a custom collector), not on every event.  The corrected
    families count only events scored with a null model (every published thesaurus
    has one; the empty thesaurus before the first version has none): per event, the
    observed value and the null's expectation at each (r, k).
    """

    def __init__(
        self,
        exporter: Exporter,
        ks: Sequence[int],
        rs: Sequence[int | None],
        windows: Sequence[int],
        guard: LabelGuard,
        window_label: Callable[[int], str],
        *,
        max_future_skew: float = 600.0,
        max_lateness: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.x = exporter
        # An event time beyond now + max_future_skew (a bad clock, a year-2100 typo) would
        # move the windows' watermark ahead and freeze them; one older than the newest
        # accepted time - max_lateness says nothing about "now".  Both are scored and
        # counted, and kept out of the windows.
        self.max_future_skew = max_future_skew
        self.max_lateness = max_lateness if max_lateness is not None else float(max(windows, default=0))
        self.clock = clock
        self._newest = float("-inf")
        self.ks = [str(k) for k in ks]
        self._k_ints = list(ks)
        self.rs = [r_label(r) for r in rs]
        self.windows = list(windows)
        self.guard = guard
        self.window_label = window_label
        # main layout: for each r, the k values, the exact metrics, then the rank-aware k values
        # (every scorable event has all three); corrected: the observed k values per r, then
        # the expected ones (the sums whose kappa is the corrected score)
        self.width = len(self.rs) * (2 * len(self.ks) + len(ExactScores.NAMES))
        self._main: dict[str, _Accumulator] = {}
        self._corrected: dict[str, _Accumulator] = {}
        # (recommender, slice) -> #REval on that popularity slice's ground truths (k values per r)
        self._slices: dict[tuple[str, str], _Accumulator] = {}
        self._lock = threading.Lock()  # observe runs in the scorer thread, collect in the HTTP one
        exporter.registry.register(self)

    def observe(self, score: EventScore, event_time: float) -> None:
        self.observe_many([score], [event_time])

    def observe_many(self, scores: Sequence[EventScore], event_times: Sequence[float]) -> None:
        """:meth:`observe` for a batch: the same sums, counts and windows (events in order),
        with one counter increment per label and one numpy pass per accumulator."""
        rs, width, n_k = self.rs, self.width, len(self.rs) * len(self.ks)
        outcomes: dict[tuple[str, str], int] = {}
        recommended: dict[str, list[int]] = {}  # name -> [recommended, unknown]
        scored: list[tuple[str, float]] = []  # (name, event time) per scorable event
        # Each event's values, flat (one list per accumulator kind; few objects for the GC).
        main: list[float] = []
        corrected: list[float] = []
        corrected_events: list[int] = []  # the positions in ``scored`` of the corrected rows
        sliced: list[float] = []
        slice_keys: list[tuple[str, str]] = []
        for score, event_time in zip(scores, event_times, strict=True):
            name = self.guard(score.recommender)
            outcome = "unscorable" if score.unscorable is not None else "scored"
            outcomes[name, outcome] = outcomes.get((name, outcome), 0) + 1
            if score.unscorable is not None:
                continue
            counts = recommended.setdefault(name, [0, 0])
            counts[0] += score.n_recommended
            counts[1] += score.unknown_recommended
            for r in rs:
                main += score.reval[r].values()
                main += _exact_values(score.exact[r])
                main += score.ranked[r].values()
            _fixed_width(main, width * (len(scored) + 1))
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
        for (name, outcome), n in outcomes.items():
            self.x.events.labels(name, outcome).inc(n)
        for name, (n_recommended, n_unknown) in recommended.items():
            self.x.recommended.labels(name).inc(n_recommended)
            self.x.unknown.labels(name).inc(n_unknown)
        if not scored:
            return
        main_values = np.array(main, dtype=np.float64).reshape(-1, width)
        corrected_values = np.array(corrected, dtype=np.float64).reshape(-1, 2 * n_k)
        slice_values = np.array(sliced, dtype=np.float64).reshape(-1, n_k)
        with self._lock:
            admitted = [self._admit_time(event_time) for _, event_time in scored]
            for name, rows in _by_key([name for name, _ in scored]).items():
                acc = self._main.get(name)
                if acc is None:
                    acc = self._main[name] = _Accumulator(width, self.windows)
                acc.update_many(main_values[rows], [scored[i][1] for i in rows], [admitted[i] for i in rows])
            for name, rows in _by_key([scored[i][0] for i in corrected_events]).items():
                acc = self._corrected.get(name)
                if acc is None:
                    acc = self._corrected[name] = _Accumulator(2 * n_k, self.windows)
                events = [corrected_events[row] for row in rows]
                acc.update_many(
                    corrected_values[rows], [scored[i][1] for i in events], [admitted[i] for i in events]
                )
            for (name, label), rows in _by_key(slice_keys).items():
                acc = self._slices.get((name, label))
                if acc is None:
                    acc = self._slices[name, label] = _Accumulator(n_k, ())  # sums only
                acc.update_many(slice_values[rows], [0.0] * len(rows), [False] * len(rows))

    def _admit_time(self, event_time: float) -> bool:
        """Whether the event may enter the rolling windows (else counted by reason)."""
        if event_time > self.clock() + self.max_future_skew:
            self.x.outside_windows.labels("future").inc()
            return False
        if event_time < self._newest - self.max_lateness:
            self.x.outside_windows.labels("late").inc()
            return False
        self._newest = max(self._newest, event_time)
        return True

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            main = {name: acc.snapshot() for name, acc in self._main.items()}
            corrected = {name: acc.snapshot() for name, acc in self._corrected.items()}
            sliced = {key: (acc.count, acc.sums.copy()) for key, acc in self._slices.items()}
        labels = [self.window_label(seconds) for seconds in self.windows]
        main_families = self._main_families(main, labels)
        corrected_families = self._corrected_families(corrected, labels)
        # The order families are yielded in is the order of the exposition (tests read it).
        yield self._slice_family(sliced)
        yield main_families["hit_ratio"]
        yield from corrected_families[:3]
        yield from (main_families[key] for key in ("exact_match", "ranked", "reval"))
        yield corrected_families[3]
        yield from (main_families[key] for key in ("exact", "ranked_rolling", "in_window"))

    def _main_families(
        self, main: dict[str, tuple[int, npt.NDArray[np.float64], list[Any], list[int]]], labels: list[str]
    ) -> dict[str, Metric]:
        """The summaries of the whole run and the rolling means, per recommender, from each
        accumulator's layout: per r, the k cells, the exact-match metrics, the ranked k cells."""
        by_k = ["recommender", "k", "r"]
        by_metric = ["recommender", "metric", "r"]
        summaries = {
            "hit_ratio": SummaryMetricFamily(
                "reval_hit_ratio", "#REval-hit-ratio of scored events", labels=by_k
            ),
            "exact_match": SummaryMetricFamily(
                "reval_exact_match", "Exact-match metric of scored events", labels=by_metric
            ),
            "ranked": SummaryMetricFamily(
                "reval_hit_ratio_ranked",
                "Rank-aware #REval-hit-ratio of scored events (hit credit decays with both ranks)",
                labels=by_k,
            ),
        }
        gauges = {
            "reval": GaugeMetricFamily(
                "reval_hit_ratio_rolling",
                "#REval-hit-ratio mean over a window of event time",
                labels=[*by_k, "window"],
            ),
            "ranked_rolling": GaugeMetricFamily(
                "reval_hit_ratio_ranked_rolling",
                "Rank-aware #REval-hit-ratio mean over a window of event time",
                labels=[*by_k, "window"],
            ),
            "exact": GaugeMetricFamily(
                "reval_exact_match_rolling",
                "Exact-match metric mean over a window of event time",
                labels=[*by_metric, "window"],
            ),
            "in_window": GaugeMetricFamily(
                "reval_events_rolling",
                "Scored events in a window of event time (what the rolling means average over)",
                labels=["recommender", "window"],
            ),
        }
        for name, (count, total, means, ns) in main.items():
            for label, n in zip(labels, ns, strict=True):
                gauges["in_window"].add_metric([name, label], n)
            cells = [
                (summary, rolling, cell)
                for r in self.rs
                for summary, rolling, cell_labels in (
                    ("hit_ratio", "reval", self.ks),
                    ("exact_match", "exact", ExactScores.NAMES),
                    ("ranked", "ranked_rolling", self.ks),
                )
                for cell in [[name, c, r] for c in cell_labels]
            ]
            for i, (summary, rolling, cell) in enumerate(cells):
                summaries[summary].add_metric(cell, count_value=count, sum_value=float(total[i]))
                for label, window in zip(labels, means, strict=True):
                    if window is not None:
                        gauges[rolling].add_metric([*cell, label], float(window[i]))
        return {**summaries, **gauges}

    def _corrected_families(
        self,
        corrected: dict[str, tuple[int, npt.NDArray[np.float64], list[Any], list[int]]],
        labels: list[str],
    ) -> list[Metric]:
        """The corrected score's three counters and its rolling kappa, per recommender."""
        # The corrected score is a kappa of sums: the three sums are exported as counters, and
        # the recording rules take the kappa of their rates over any window.
        observed, expected, events = (
            CounterMetricFamily(f"reval_corrected_{what}", text, labels=["recommender", "k", "r"])
            for what, text in CORRECTED_COUNTERS.items()
        )
        rolling = GaugeMetricFamily(
            "reval_hit_ratio_corrected_rolling",
            "Chance-corrected #REval-hit-ratio over a window of event time: the kappa of the window's sums",
            labels=["recommender", "k", "r", "window"],
        )
        n_k = len(self.rs) * len(self.ks)
        for name, (count, total, means, _) in corrected.items():
            cells = [[name, k, r] for r in self.rs for k in self.ks]
            for i, cell in enumerate(cells):
                observed.add_metric(cell, float(total[i]))
                expected.add_metric(cell, float(total[n_k + i]))
                events.add_metric(cell, float(count))
                for label, window in zip(labels, means, strict=True):
                    # window means: the kappa of the window's sums is that of its means
                    value = None if window is None else corrected_of_sums(window[i], window[n_k + i], 1.0)
                    if value is not None:  # none: an empty window, or no room above chance
                        rolling.add_metric([*cell, label], value)
        return [observed, expected, events, rolling]

    def _slice_family(self, sliced: dict[tuple[str, str], tuple[int, npt.NDArray[np.float64]]]) -> Metric:
        by_slice = SummaryMetricFamily(
            "reval_hit_ratio_slice",
            "#REval-hit-ratio on the ground truths of a popularity slice (head, torso, tail, novel)",
            labels=["recommender", "slice", "k", "r"],
        )
        for (name, label), (count, total) in sliced.items():
            cells = [[name, label, k, r] for r in self.rs for k in self.ks]
            for i, cell in enumerate(cells):
                by_slice.add_metric(cell, count_value=count, sum_value=float(total[i]))
        return by_slice
