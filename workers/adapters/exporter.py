"""Prometheus metrics of the workers (prometheus-client).

Quality metrics are exported two ways:

* ``reval_hit_ratio_sum`` / ``reval_hit_ratio_count`` (and ``reval_exact_match_*``)
  per (recommender, k, r): monotonic, so ``rate(sum[5m]) / rate(count[5m])`` is a
  rolling mean across any number of workers and survives restarts;
* ``reval_hit_ratio_rolling`` per (recommender, k, r, window): means over the
  last window of *event* time, so a replay at 100x shows what a live run would.

The chance-corrected score (:mod:`stream.chance`) is a kappa of sums, so its counters are
the sums: ``reval_corrected_observed_total`` (the #REval-hit-ratio of the events scored
with a null model), ``reval_corrected_expected_total`` (the null's expectation for them)
and ``reval_corrected_events_total`` (their number, the best possible sum) per
(recommender, k, r); the recording rule ``reval:hit_ratio_corrected:kappa<w>`` is
``(rate(observed) - rate(expected)) / (rate(events) - rate(expected))`` over any window,
and ``reval_hit_ratio_corrected_rolling`` is the same kappa over a window of event time.

The rank-aware #REval-hit-ratio (:mod:`stream.rank`) has the same two shapes,
``reval_hit_ratio_ranked`` and ``reval_hit_ratio_ranked_rolling``.  The popularity
slices (:mod:`stream.slices`: head, torso, tail, novel) are ``reval_hit_ratio_slice``
per (recommender, slice, k, r), sum and count only.

Label values are bounded: recommender names outside the allow-list (or beyond
the cap when there is no list) become ``other``, so a hostile stream cannot grow
/metrics without limit.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from operator import attrgetter
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily

from stream.chance import corrected_of_sums
from stream.drift import QUANTILES, RecentShift, ThesaurusDrift
from stream.metrics import ExactScores
from stream.mmd import MmdResult
from stream.scoring import EventScore, r_label
from stream.windows import RollingMean

OTHER = "other"
#: The counters of the chance-corrected score (``reval_corrected_<key>_total``): the sums whose
#: kappa is the corrected score over any window (:func:`stream.chance.corrected_of_sums`).
CORRECTED_COUNTERS = {
    "observed": "Sum of the #REval-hit-ratio of the events scored with a null model (chance correction)",
    "expected": "Sum of the null recommender's expected #REval-hit-ratio over the same events",
    "events": "Events scored with a null model (the best possible sum: 1 per event)",
}


_LABEL_RE = re.compile(r"[A-Za-z0-9_.:@/+-]+")


class LabelGuard:
    """Maps free-form label values onto a bounded set: a few, short, plain names.

    A value is exported as itself only when it is at most ``max_length`` characters of
    ``[A-Za-z0-9_.:@/+-]``, on the allow-list (when there is one), and among the first
    ``cap`` distinct values; anything else is ``other`` and ``on_capped(reason)`` is told.

    >>> guard = LabelGuard(allow=(), cap=2)
    >>> [guard("a"), guard("b"), guard("c"), guard("a"), guard("x" * 100), guard("a b")]
    ['a', 'b', 'other', 'a', 'other', 'other']
    >>> LabelGuard(allow=("mowe",), cap=5)("popular")
    'other'
    """

    def __init__(
        self,
        allow: Sequence[str] = (),
        cap: int = 20,
        *,
        max_length: int = 64,
        on_capped: Callable[[str], None] | None = None,
    ) -> None:
        self.allow = frozenset(allow)
        self.cap = cap
        self.max_length = max_length
        self.on_capped = on_capped
        self._seen: set[str] = set()

    def _other(self, reason: str) -> str:
        if self.on_capped is not None:
            self.on_capped(reason)
        return OTHER

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(value) > self.max_length:
            return self._other("too_long")
        if not _LABEL_RE.fullmatch(value):
            return self._other("characters")
        if self.allow and value not in self.allow:
            return self._other("not_allowed")
        if len(self._seen) >= self.cap:
            return self._other("over_cap")
        self._seen.add(value)
        return value


class Exporter:
    """All metric families of a worker, on one registry (one per worker process)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._built_at = 0.0
        # Quality: reval_hit_ratio_* and reval_exact_match_* come from QualityMetrics.collect
        self.events = Counter(
            "reval_events",
            "Recommendation events by outcome",
            ["recommender", "outcome"],
            registry=r,
        )
        self.recommended = Counter(
            "reval_recommended_hashtags", "Recommended hashtags scored", ["recommender"], registry=r
        )
        self.unknown = Counter(
            "reval_recommended_unknown_hashtags",
            "Recommended hashtags the thesaurus lacks",
            ["recommender"],
            registry=r,
        )
        # Operations
        self.consumed = Counter("reval_records_consumed", "Records consumed", ["topic"], registry=r)
        self.rejected = Counter(
            "reval_records_rejected",
            "Records sent to the dead-letter topic",
            ["topic", "reason"],
            registry=r,
        )
        self.dropped = Counter(
            "reval_tweets_dropped", "Valid tweets not embedded, by reason", ["reason"], registry=r
        )
        self.embedded = Counter("reval_tweets_embedded", "Tweets embedded", registry=r)
        self.batch_size = Histogram(
            "reval_embed_batch_size",
            "Tweets per embed batch",
            registry=r,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        )
        self.embed_seconds = Histogram("reval_embed_seconds", "Encoder time per batch", registry=r)
        self.redis_seconds = Histogram(
            "reval_redis_seconds",
            "Redis round trips",
            ["op"],
            registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )
        self.updates = Counter(
            "reval_hashtag_updates", "Per-hashtag running-mean updates", ["outcome"], registry=r
        )
        self.join_pending = Gauge("reval_join_pending", "Events waiting for their tweet", registry=r)
        self.join_bytes = Gauge("reval_join_bytes", "Bytes of the events waiting in the join", registry=r)
        self.produce_retries = Counter(
            "reval_produce_retries", "Output records sent again (not acknowledged in time)", registry=r
        )
        self.redis_waiting = Gauge(
            "reval_redis_unavailable", "1 while a worker waits for Redis (back-pressure)", registry=r
        )
        self.redis_waits = Counter(
            "reval_redis_waits", "Redis calls retried after a transient error", ["error"], registry=r
        )
        self.redis_rollbacks = Counter(
            "reval_redis_rollbacks",
            "Redis masters found to have lost writes this worker had acknowledged",
            registry=r,
        )
        self.outside_windows = Counter(
            "reval_events_outside_windows",
            "Scored events kept out of the rolling windows (event time too far ahead, or too late)",
            ["reason"],
            registry=r,
        )
        self.labels_capped = Counter(
            "reval_label_values_capped",
            "Recommender names exported as 'other' (not allowed, over the cap, too long, odd characters)",
            ["reason"],
            registry=r,
        )
        self.topic_reset = Gauge(
            "reval_topic_reset_detected",
            "1 while a source topic was re-created (offsets restarted) and the worker waits for the operator",
            ["topic"],
            registry=r,
        )
        self.join = Counter("reval_join", "Join outcomes", ["outcome"], registry=r)
        self.index_version = Gauge("reval_index_version", "Current thesaurus version number", registry=r)
        self.index_built = Gauge(
            "reval_index_built_timestamp_seconds",
            "When the current thesaurus was built",
            registry=r,
        )
        self.index_age = Gauge("reval_index_age_seconds", "Age of the current thesaurus", registry=r)
        self.index_age.set_function(self._index_age)
        self.index_hashtags = Gauge("reval_index_hashtags", "Hashtags in the thesaurus", registry=r)
        self.index_build_seconds = Gauge(
            "reval_index_build_seconds", "Duration of the last index build", registry=r
        )
        # Hubness of the current thesaurus (stream.hubness): never a label per hashtag.
        self.index_hubness_skewness = Gauge(
            "reval_index_hubness_skewness", "Skewness of N_10, the 10-occurrence distribution", registry=r
        )
        self.index_hubness_max_share = Gauge(
            "reval_index_hubness_max_share",
            "Largest N_10 as a share of all hashtags (the biggest hub's reach)",
            registry=r,
        )
        self.index_hubness_hub_share = Gauge(
            "reval_index_hubness_lists_with_hub_ratio",
            "Share of hashtags whose 10 nearest hold one of the 10 largest hubs",
            registry=r,
        )
        # Meaning drift from the previous version to the current one (stream.drift): summary
        # quantiles only, never a label per hashtag (the movers go to the log).
        # The embedding drift test (stream.mmd) of the index job: NaN until both windows
        # hold samples.
        self.embedding_mmd = Gauge(
            "reval_embedding_drift_mmd",
            "MMD² between tweet embeddings of the last drift window and of the window before",
            registry=r,
        )
        self.embedding_p_value = Gauge(
            "reval_embedding_drift_p_value",
            "Permutation p-value of that MMD (small: the tweets changed)",
            registry=r,
        )
        self.embedding_samples = Gauge(
            "reval_embedding_drift_samples", "Tweets compared, per window", ["window"], registry=r
        )
        self.thesaurus_shift = Gauge(
            "reval_thesaurus_shift",
            "Quantile of 1 - cosine between a hashtag's vectors in the previous and the current version",
            ["quantile"],
            registry=r,
        )
        self.thesaurus_top10_changed_share = Gauge(
            "reval_thesaurus_top10_changed_share",
            "Share of hashtags whose top-10 neighbours changed by more than half since the previous version",
            registry=r,
        )
        self.thesaurus_drift_compared = Gauge(
            "reval_thesaurus_drift_compared",
            "Hashtags in both the previous and the current version (what the drift gauges cover)",
            registry=r,
        )
        self.set_thesaurus_drift(None)
        # Recent use against earlier use per hashtag (the window means; stream.drift.recent_shift)
        self.recent_shift = Gauge(
            "reval_hashtag_recent_shift",
            "Quantile of 1 - cosine between a hashtag's recent mean (REVAL_MEANS_RECENT_S of event "
            "time) and its mean before",
            ["quantile"],
            registry=r,
        )
        self.recent_compared = Gauge(
            "reval_hashtag_recent_compared",
            "Hashtags with enough tweets both recently and before (what the recent-shift gauge covers)",
            registry=r,
        )
        self.set_recent_shift(None)
        # The audit of each new version (stream.coherence, stream.audit): NaN until measured.
        self.coherence = Gauge(
            "reval_thesaurus_coherence",
            "Mean TF-IDF coherence of the current version's synonym clusters and of random ones",
            ["metric", "cluster"],
            registry=r,
        )
        self.coherence_lift = Gauge(
            "reval_thesaurus_coherence_lift",
            "Coherence of synonym clusters minus random clusters of matched popularity (estimate, 95% CI)",
            ["metric", "bound"],
            registry=r,
        )
        self.human_agreement = Gauge(
            "reval_thesaurus_human_agreement",
            "Top-weighted rank correlation of the current version with the audit's votes (estimate, 95% CI)",
            ["metric", "bound"],
            registry=r,
        )
        self.audit_votes = Gauge(
            "reval_audit_votes", "Votes of the audit the agreement comes from", registry=r
        )
        self.thesaurus_rejected = Counter(
            "reval_thesaurus_versions_rejected",
            "Thesaurus versions refused (damaged files, unreadable): the last good one stays in use",
            ["role"],
            registry=r,
        )
        self.thesaurus_loaded = Gauge(
            "reval_scoring_thesaurus_version",
            "Thesaurus version number the scorer uses",
            registry=r,
        )
        self.thesaurus_fallbacks = Counter(
            "reval_thesaurus_fallbacks",
            "Times the scorer took an older intact version because newer ones were refused",
            registry=r,
        )
        self.thesaurus_missing = Gauge(
            "reval_scoring_thesaurus_missing",
            "1 while versions are published but none can be loaded: events wait, unscored",
            registry=r,
        )
        self.lag = Gauge(
            "reval_consumer_lag",
            "Records behind the end of the partition",
            ["topic", "partition"],
            registry=r,
        )

    def redis_report(self, what: str, error: BaseException | None) -> None:
        """``report`` for :func:`workers.adapters.redis_client.with_retry`."""
        if error is None:
            self.redis_waiting.set(0)
            return
        self.redis_waiting.set(1)
        self.redis_waits.labels(type(error).__name__).inc()

    def set_index_built(self, timestamp: float) -> None:
        """When the current thesaurus was built (epoch seconds); the age gauge follows it."""
        self._built_at = timestamp
        self.index_built.set(timestamp)

    def set_thesaurus_drift(self, drift: ThesaurusDrift | None) -> None:
        """The drift gauges of the current version; NaN where there is no drift to report
        (a first version, or a previous one of another model), so a panel shows a gap, not 0."""
        quantiles = drift.shift_quantiles if drift is not None else None
        for key, q in QUANTILES:
            value = getattr(quantiles, key) if quantiles is not None else math.nan
            self.thesaurus_shift.labels(quantile=str(q)).set(value)
        share = drift.share_top10_changed_over_half if drift is not None else None
        self.thesaurus_top10_changed_share.set(math.nan if share is None else share)
        self.thesaurus_drift_compared.set(math.nan if drift is None else drift.compared)

    def set_recent_shift(self, shift: RecentShift | None) -> None:
        """The recent-shift gauges; NaN when there are no windows to compare."""
        quantiles = shift.shift_quantiles if shift is not None else None
        for key, q in QUANTILES:
            value = getattr(quantiles, key) if quantiles is not None else math.nan
            self.recent_shift.labels(quantile=str(q)).set(value)
        self.recent_compared.set(math.nan if shift is None else shift.compared)

    def set_coherence(self, metric: str, found: dict[str, float] | None) -> None:
        """The coherence gauges of one metric from a :meth:`stream.coherence.Lift.to_dict`;
        NaN when the version could not be measured (too few tweets sampled)."""
        get = (lambda key: math.nan) if found is None else (lambda key: float(found[key]))
        self.coherence.labels(metric, "synonyms").set(get("synonyms"))
        self.coherence.labels(metric, "random").set(get("random"))
        for bound, key in (("estimate", "lift"), ("ci_low", "lift_ci_low"), ("ci_high", "lift_ci_high")):
            self.coherence_lift.labels(metric, bound).set(get(key))

    def set_agreement(self, found: dict[str, Any] | None) -> None:
        """ρ_w and τ_w of the current version against the votes
        (:meth:`stream.audit.Agreement.to_dict`); NaN without an audit."""
        for metric in ("rho_w", "tau_w"):
            for bound, key in (
                ("estimate", metric),
                ("ci_low", f"{metric}_ci_low"),
                ("ci_high", f"{metric}_ci_high"),
            ):
                value = None if found is None else found.get(key)
                self.human_agreement.labels(metric, bound).set(math.nan if value is None else float(value))
        self.audit_votes.set(math.nan if found is None else float(found.get("votes", 0)))

    def set_embedding_drift(self, result: MmdResult | None) -> None:
        """The last embedding drift test; NaN when there were too few samples to test."""
        self.embedding_mmd.set(math.nan if result is None else result.statistic)
        self.embedding_p_value.set(math.nan if result is None else result.p_value)
        self.embedding_samples.labels("reference").set(0 if result is None else result.n_reference)
        self.embedding_samples.labels("recent").set(0 if result is None else result.n_recent)

    def _index_age(self) -> float:
        return time.time() - self._built_at if self._built_at else float("nan")

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)


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
        hit_ratio = SummaryMetricFamily(
            "reval_hit_ratio", "#REval-hit-ratio of scored events", labels=["recommender", "k", "r"]
        )
        # The corrected score is a kappa of sums: the three sums are exported as counters, and
        # the recording rules take the kappa of their rates over any window.
        corrected_observed, corrected_expected, corrected_events = (
            CounterMetricFamily(f"reval_corrected_{what}", text, labels=["recommender", "k", "r"])
            for what, text in CORRECTED_COUNTERS.items()
        )
        exact_match = SummaryMetricFamily(
            "reval_exact_match", "Exact-match metric of scored events", labels=["recommender", "metric", "r"]
        )
        reval = GaugeMetricFamily(
            "reval_hit_ratio_rolling",
            "#REval-hit-ratio mean over a window of event time",
            labels=["recommender", "k", "r", "window"],
        )
        ranked = SummaryMetricFamily(
            "reval_hit_ratio_ranked",
            "Rank-aware #REval-hit-ratio of scored events (hit credit decays with both ranks)",
            labels=["recommender", "k", "r"],
        )
        ranked_rolling = GaugeMetricFamily(
            "reval_hit_ratio_ranked_rolling",
            "Rank-aware #REval-hit-ratio mean over a window of event time",
            labels=["recommender", "k", "r", "window"],
        )
        reval_corrected = GaugeMetricFamily(
            "reval_hit_ratio_corrected_rolling",
            "Chance-corrected #REval-hit-ratio over a window of event time: the kappa of the window's sums",
            labels=["recommender", "k", "r", "window"],
        )
        exact = GaugeMetricFamily(
            "reval_exact_match_rolling",
            "Exact-match metric mean over a window of event time",
            labels=["recommender", "metric", "r", "window"],
        )
        in_window = GaugeMetricFamily(
            "reval_events_rolling",
            "Scored events in a window of event time (what the rolling means average over)",
            labels=["recommender", "window"],
        )
        labels = [self.window_label(seconds) for seconds in self.windows]
        for name, (count, total, means, ns) in main.items():
            for label, n in zip(labels, ns, strict=True):
                in_window.add_metric([name, label], n)
            i = 0
            for r in self.rs:
                for k in self.ks:
                    hit_ratio.add_metric([name, k, r], count_value=count, sum_value=float(total[i]))
                    for label, window in zip(labels, means, strict=True):
                        if window is not None:
                            reval.add_metric([name, k, r, label], float(window[i]))
                    i += 1
                for metric in ExactScores.NAMES:
                    exact_match.add_metric([name, metric, r], count_value=count, sum_value=float(total[i]))
                    for label, window in zip(labels, means, strict=True):
                        if window is not None:
                            exact.add_metric([name, metric, r, label], float(window[i]))
                    i += 1
                for k in self.ks:
                    ranked.add_metric([name, k, r], count_value=count, sum_value=float(total[i]))
                    for label, window in zip(labels, means, strict=True):
                        if window is not None:
                            ranked_rolling.add_metric([name, k, r, label], float(window[i]))
                    i += 1
        n_k = len(self.rs) * len(self.ks)
        for name, (count, total, means, _) in corrected.items():
            i = 0
            for r in self.rs:
                for k in self.ks:
                    labels_ = [name, k, r]
                    corrected_observed.add_metric(labels_, float(total[i]))
                    corrected_expected.add_metric(labels_, float(total[n_k + i]))
                    corrected_events.add_metric(labels_, float(count))
                    for label, window in zip(labels, means, strict=True):
                        # window means: the kappa of the window's sums is that of its means
                        value = None if window is None else corrected_of_sums(window[i], window[n_k + i], 1.0)
                        if value is not None:  # none: an empty window, or no room above chance
                            reval_corrected.add_metric([name, k, r, label], value)
                    i += 1
        by_slice = SummaryMetricFamily(
            "reval_hit_ratio_slice",
            "#REval-hit-ratio on the ground truths of a popularity slice (head, torso, tail, novel)",
            labels=["recommender", "slice", "k", "r"],
        )
        for (name, label), (count, total) in sliced.items():
            i = 0
            for r in self.rs:
                for k in self.ks:
                    by_slice.add_metric([name, label, k, r], count_value=count, sum_value=float(total[i]))
                    i += 1
        yield from (
            by_slice,
            hit_ratio,
            corrected_observed,
            corrected_expected,
            corrected_events,
            exact_match,
            ranked,
            reval,
            reval_corrected,
            exact,
            ranked_rolling,
            in_window,
        )
