"""The scorer's quality metrics as one custom Prometheus collector (:class:`QualityMetrics`).

The aggregation is the core's (:class:`stream.evaluation.quality.QualityAggregate`: per recommender, a
count and a vector of sums are the whole state of the ``reval_hit_ratio`` and
``reval_exact_match`` summaries and the ``reval_corrected_*`` counters; the event-time rolling
means beside them); this adapter bounds the label values, moves the counters beside them and
renders metric families when Prometheus scrapes, not per event.  The process-wide metrics
(:class:`~workers.adapters.prometheus.exporter.Exporter`) live beside it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily

from stream.evaluation.quality import BatchCounts, QualityAggregate, Snapshot, Totals
from stream.evaluation.scoring import EventScore, ScoredBatch
from stream.evaluation.signals import SIGNALS
from workers.adapters.prometheus.exporter import CORRECTED_COUNTERS, Exporter, LabelGuard


class QualityMetrics:
    """Feeds scored events into the quality metrics, at thousands of events per second.

    The sums and windows are :attr:`sums` (:class:`stream.evaluation.quality.QualityAggregate`), kept
    under the recommenders' bounded label values (``guard``); they are turned into metric
    families only when Prometheus scrapes (this object is a custom collector), not on every
    event.  The corrected families count only events scored with a null model (every
    published thesaurus has one; the empty thesaurus before the first version has none).
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
        # Event times too far ahead or too late are scored and counted, and kept out of the
        # windows (stream.evaluation.quality.EventTimeGate says why).
        self.sums = QualityAggregate(
            ks, rs, windows, clock=clock, max_future_skew=max_future_skew, max_lateness=max_lateness
        )
        self.guard = guard
        self.window_label = window_label
        self._lock = threading.Lock()  # observe runs in the scorer thread, collect in the HTTP one
        exporter.registry.register(self)

    def observe(self, score: EventScore, event_time: float) -> None:
        self.observe_many([score], [event_time])

    def observe_many(self, scores: Sequence[EventScore], event_times: Sequence[float]) -> None:
        """:meth:`observe_batch` of events given one by one."""
        names = [self.guard(score.recommender) for score in scores]
        with self._lock:
            counts = self.sums.update_many(scores, event_times, names)
        self._count(counts)

    def observe_batch(self, batch: ScoredBatch, event_times: Sequence[float]) -> None:
        """Add a batch's scores (in order): the same sums, counts and windows as one event at a
        time, with one counter increment per label and one numpy pass per recommender's sums."""
        names = list(map(self.guard, batch.recommenders))
        with self._lock:
            counts = self.sums.update_batch(batch, event_times, names)
        self._count(counts)

    def _count(self, counts: BatchCounts) -> None:
        for (name, outcome), n in counts.outcomes.items():
            self.x.events.labels(name, outcome).inc(n)
        for name, (n_recommended, n_unknown) in counts.recommended.items():
            self.x.recommended.labels(name).inc(n_recommended)
            self.x.unknown.labels(name).inc(n_unknown)
        for reason, n in counts.outside.items():
            self.x.outside_windows.labels(reason).inc(n)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            totals = self.sums.get()
        labels = [self.window_label(seconds) for seconds in self.sums.windows]
        yield self._slice_family(totals.slices)
        yield from self._signal_families(totals, labels)
        yield from self._exact_families(totals.main, labels)
        yield from self._corrected_families(totals.corrected, labels)
        in_window = GaugeMetricFamily(
            "reval_events_rolling",
            "Scored events in a window of event time (what the rolling means average over)",
            labels=["recommender", "window"],
        )
        for name, found in totals.main.items():
            for label, n in zip(labels, found.in_window, strict=True):
                in_window.add_metric([name, label], n)
        yield in_window

    def _signal_families(self, totals: Snapshot, labels: list[str]) -> Iterator[Metric]:
        """Each signal of :data:`stream.evaluation.signals.SIGNALS`: its summary (sum, count) per recommender
        and (k, r) cell, its rolling means and the sum of its squares where it declares them."""
        by_k = ["recommender", "k", "r"]
        main_at = {(kind, k, r): i for i, (kind, k, r) in enumerate(self.sums.main_cells())}
        cells = self.sums.corrected_cells()
        sums_layout = self.sums.sums_cells()
        for signal in SIGNALS:
            summary = SummaryMetricFamily(signal.key, signal.help, labels=by_k)
            rolling = (
                GaugeMetricFamily(f"{signal.key}_rolling", signal.rolling, labels=[*by_k, "window"])
                if signal.rolling is not None
                else None
            )
            squares = (
                CounterMetricFamily(f"{signal.key}_squares", signal.squares, labels=by_k)
                if signal.squares is not None
                else None
            )
            if rolling is not None:
                for name, found in totals.main.items():
                    for k, r in cells:
                        i = main_at[signal.key, k, r]
                        summary.add_metric(
                            [name, k, r], count_value=found.count, sum_value=float(found.sums[i])
                        )
                        for label, window in zip(labels, found.means, strict=True):
                            if window is not None:
                                rolling.add_metric([name, k, r, label], float(window[i]))
            if signal.key in sums_layout:
                has_values, _ = sums_layout[signal.key]
                for name, found in totals.sums[signal.key].items():
                    for i, (k, r) in enumerate(cells):
                        if has_values:
                            summary.add_metric(
                                [name, k, r], count_value=found.count, sum_value=float(found.sums[i])
                            )
                        if squares is not None:
                            at = i + (len(cells) if has_values else 0)
                            squares.add_metric([name, k, r], float(found.sums[at]))
            yield summary
            if rolling is not None:
                yield rolling
            if squares is not None:
                yield squares

    def _exact_families(self, main: dict[str, Totals], labels: list[str]) -> list[Metric]:
        """The exact-match metrics' summary and rolling means per recommender, metric and r."""
        by_metric = ["recommender", "metric", "r"]
        summary = SummaryMetricFamily(
            "reval_exact_match", "Exact-match metric of scored events", labels=by_metric
        )
        rolling = GaugeMetricFamily(
            "reval_exact_match_rolling",
            "Exact-match metric mean over a window of event time",
            labels=[*by_metric, "window"],
        )
        for name, totals in main.items():
            for i, (kind, metric, r) in enumerate(self.sums.main_cells()):
                if kind != "exact":
                    continue
                summary.add_metric(
                    [name, metric, r], count_value=totals.count, sum_value=float(totals.sums[i])
                )
                for label, window in zip(labels, totals.means, strict=True):
                    if window is not None:
                        rolling.add_metric([name, metric, r, label], float(window[i]))
        return [summary, rolling]

    def _corrected_families(self, corrected: dict[str, Totals], labels: list[str]) -> list[Metric]:
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
        layout = self.sums.corrected_cells()
        for name, totals in corrected.items():
            kappas = self.sums.corrected_rolling(totals)
            for i, (k, r) in enumerate(layout):
                cell = [name, k, r]
                observed.add_metric(cell, float(totals.sums[i]))
                expected.add_metric(cell, float(totals.sums[len(layout) + i]))
                events.add_metric(cell, float(totals.count))
                for label, by_cell in zip(labels, kappas, strict=True):
                    kappa = by_cell[i]
                    if kappa is not None:  # none: an empty window, or no room above chance
                        rolling.add_metric([*cell, label], kappa)
        return [observed, expected, events, rolling]

    def _slice_family(self, sliced: dict[tuple[str, str], Totals]) -> Metric:
        by_slice = SummaryMetricFamily(
            "reval_hit_ratio_slice",
            "#REval-hit-ratio on the ground truths of a popularity slice (head, torso, tail, novel)",
            labels=["recommender", "slice", "k", "r"],
        )
        layout = self.sums.corrected_cells()
        for (name, label), totals in sliced.items():
            for i, (k, r) in enumerate(layout):
                by_slice.add_metric(
                    [name, label, k, r], count_value=totals.count, sum_value=float(totals.sums[i])
                )
        return by_slice
