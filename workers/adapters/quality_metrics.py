"""The scorer's quality metrics as one custom Prometheus collector (:class:`QualityMetrics`).

The aggregation is the core's (:class:`stream.quality.QualityAggregate`: per recommender, a
count and a vector of sums are the whole state of the ``reval_hit_ratio`` and
``reval_exact_match`` summaries and the ``reval_corrected_*`` counters; the event-time rolling
means beside them); this adapter bounds the label values, moves the counters beside them and
renders metric families when Prometheus scrapes, not per event.  The process-wide metrics
(:class:`~workers.adapters.exporter.Exporter`) live beside it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily

from stream.quality import QualityAggregate, Totals
from stream.scoring import EventScore
from workers.adapters.exporter import (
    CORRECTED_COUNTERS,
    PRECISION_HELP,
    PRECISION_SQUARES_HELP,
    Exporter,
    LabelGuard,
)


class QualityMetrics:
    """Feeds scored events into the quality metrics, at thousands of events per second.

    The sums and windows are :attr:`sums` (:class:`stream.quality.QualityAggregate`), kept
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
        # windows (stream.quality.EventTimeGate says why).
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
        """:meth:`observe` for a batch: the same sums, counts and windows (events in order),
        with one counter increment per label and one numpy pass per recommender's sums."""
        names = [self.guard(score.recommender) for score in scores]
        with self._lock:
            counts = self.sums.update_many(scores, event_times, names)
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
        main_families = self._main_families(totals.main, labels)
        corrected_families = self._corrected_families(totals.corrected, labels)
        # The order families are yielded in is the order of the exposition (tests read it).
        yield self._slice_family(totals.slices)
        yield main_families["hit_ratio"]
        yield from corrected_families[:3]
        yield from (main_families[key] for key in ("exact_match", "ranked", "reval"))
        yield corrected_families[3]
        yield from (main_families[key] for key in ("exact", "ranked_rolling", "in_window"))
        yield from self._precision_families(totals.precision)

    def _main_families(self, main: dict[str, Totals], labels: list[str]) -> dict[str, Metric]:
        """The summaries of the whole run and the rolling means, per recommender, from the
        main layout (:meth:`stream.quality.QualityAggregate.main_cells`)."""
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
        # kind of cell (stream.quality) -> (its summary, its rolling gauge)
        families = {"reval": ("hit_ratio", "reval"), "exact": ("exact_match", "exact")}
        families["ranked"] = ("ranked", "ranked_rolling")
        layout = self.sums.main_cells()
        for name, totals in main.items():
            for label, n in zip(labels, totals.in_window, strict=True):
                gauges["in_window"].add_metric([name, label], n)
            for i, (kind, cell, r) in enumerate(layout):
                summary, rolling = families[kind]
                summaries[summary].add_metric(
                    [name, cell, r], count_value=totals.count, sum_value=float(totals.sums[i])
                )
                for label, window in zip(labels, totals.means, strict=True):
                    if window is not None:
                        gauges[rolling].add_metric([name, cell, r, label], float(window[i]))
        return {**summaries, **gauges}

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

    def _precision_families(self, precision: dict[str, Totals]) -> list[Metric]:
        """The precision form's summary and the sum of its squares, per (k, r) cell."""
        labels = ["recommender", "k", "r"]
        summary = SummaryMetricFamily("reval_hit_ratio_precision", PRECISION_HELP, labels=labels)
        squares = CounterMetricFamily(
            "reval_hit_ratio_precision_squares", PRECISION_SQUARES_HELP, labels=labels
        )
        layout = self.sums.corrected_cells()
        for name, totals in precision.items():
            for i, (k, r) in enumerate(layout):
                cell = [name, k, r]
                summary.add_metric(cell, count_value=totals.count, sum_value=float(totals.sums[i]))
                squares.add_metric(cell, float(totals.sums[len(layout) + i]))
        return [summary, squares]

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
