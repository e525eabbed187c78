"""Prometheus metrics of the workers (prometheus-client).

Quality metrics are exported two ways:

* ``reval_hit_ratio_sum`` / ``reval_hit_ratio_count`` (and ``reval_exact_match_*``)
  per (recommender, k, r): monotonic, so ``rate(sum[5m]) / rate(count[5m])`` is a
  rolling mean across any number of workers and survives restarts;
* ``reval_hit_ratio_rolling`` per (recommender, k, r, window): means over the
  last window of *event* time, so a replay at 100x shows what a live run would.

The chance-corrected score (:mod:`stream.evaluation.chance`) is a kappa of sums, so its counters are
the sums: ``reval_corrected_observed_total`` (the #REval-hit-ratio of the events scored
with a null model), ``reval_corrected_expected_total`` (the null's expectation for them)
and ``reval_corrected_events_total`` (their number, the best possible sum) per
(recommender, k, r); the recording rule ``reval:hit_ratio_corrected:kappa<w>`` is
``(rate(observed) - rate(expected)) / (rate(events) - rate(expected))`` over any window,
and ``reval_hit_ratio_corrected_rolling`` is the same kappa over a window of event time.

The rank-aware #REval-hit-ratio (:mod:`stream.evaluation.rank`) has the same two shapes,
``reval_hit_ratio_ranked`` and ``reval_hit_ratio_ranked_rolling``.  The popularity
slices (:mod:`stream.evaluation.slices`: head, torso, tail, novel) are ``reval_hit_ratio_slice``
per (recommender, slice, k, r), sum and count only.

Label values are bounded: recommender names outside the allow-list (or beyond
the cap when there is no list) become ``other``, so a hostile stream cannot grow
/metrics without limit.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

from stream.monitoring.cusum import Detector
from stream.monitoring.mmd import MmdResult
from stream.synonyms.drift import QUANTILES, RecentShift, ThesaurusDrift

OTHER = "other"
#: The counters of the chance-corrected score (``reval_corrected_<key>_total``): the sums whose
#: kappa is the corrected score over any window (:func:`stream.evaluation.chance.corrected_of_sums`).
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
        # Quality: reval_hit_ratio_* and reval_exact_match_* come from QualityMetrics.collect;
        # the families below are grouped by what they describe.
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
        self._add_operations(r)
        self._add_index(r)
        self._add_drift(r)
        self._add_thesaurus_checks(r)
        self._add_detector(r)

    def _add_operations(self, r: CollectorRegistry) -> None:
        """Consumption, embedding, Redis, the join and the output: how the worker runs."""
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
        self.admit_seconds = Histogram(
            "reval_embed_admit_seconds",
            "Parsing and cleaning time per batch of tweets (REVAL_PREPARE_WORKERS processes, if any)",
            registry=r,
        )
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

    def _add_index(self, r: CollectorRegistry) -> None:
        """The current thesaurus: version, age, size, build time and hubness."""
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
        # Hubness of the current thesaurus (stream.synonyms.hubness): never a label per hashtag.
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

    def _add_drift(self, r: CollectorRegistry) -> None:
        """Embedding drift, meaning drift between versions, recent use against earlier use."""
        # Meaning drift from the previous version to the current one (stream.synonyms.drift): summary
        # quantiles only, never a label per hashtag (the movers go to the log).
        # The embedding drift test (stream.monitoring.mmd) of the index job: NaN until both windows
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
        # Recent use against earlier use per hashtag (the window means; stream.synonyms.drift.recent_shift)
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
        self.recent_shifted = Gauge(
            "reval_hashtags_shifted",
            "Hashtags whose recent tweets moved from their earlier ones beyond their own spread "
            "(the spread-aware test of stream.synonyms.shift_test, discoveries at 1% false-discovery rate)",
            registry=r,
        )
        self.set_recent_shift(None)

    def _add_detector(self, r: CollectorRegistry) -> None:
        """The change detector of each recommender (stream.monitoring.cusum.Detector; its state is shared
        in Redis, so every score worker that scored its events shows the same values)."""
        self.detector_statistic = Gauge(
            "reval_detector_statistic",
            "The change detector's CUSUM chart value; the chart alarms at its threshold",
            ["recommender", "chart"],
            registry=r,
        )
        self.detector_threshold = Gauge(
            "reval_detector_threshold",
            "The chart's threshold, calibrated to REVAL_DETECTOR_ARL0 events per false alarm",
            ["recommender", "chart"],
            registry=r,
        )
        self.detector_alarms = Gauge(
            "reval_detector_alarms",
            "Alarms the recommender's detector raised so far, by alternative (quality_lost, wording_changed)",
            ["recommender", "alternative"],
            registry=r,
        )
        self.detector_last_alarm = Gauge(
            "reval_detector_last_alarm_timestamp_seconds",
            "When the alternative last alarmed (Unix time); absent until it has",
            ["recommender", "alternative"],
            registry=r,
        )
        self.detector_events = Gauge(
            "reval_detector_events",
            "Events the recommender's detector has taken, from every score worker",
            ["recommender"],
            registry=r,
        )

    def set_detector(self, recommender: str, detector: Detector, last_alarms: Mapping[str, float]) -> None:
        """A recommender's detector gauges after an update."""
        self.detector_events.labels(recommender).set(detector.events)
        for chart, value in detector.values.items():
            self.detector_statistic.labels(recommender, chart).set(value)
            self.detector_threshold.labels(recommender, chart).set(detector.thresholds[chart])
        for alternative, n in detector.alarms.items():
            self.detector_alarms.labels(recommender, alternative).set(n)
        for alternative, when in last_alarms.items():
            self.detector_last_alarm.labels(recommender, alternative).set(when)

    def _add_thesaurus_checks(self, r: CollectorRegistry) -> None:
        """The audit of each version and what the scorer loaded (or refused), and the consumer lag."""
        # The audit of each new version (stream.auditing.coherence, stream.auditing.audit): NaN until
        # measured.
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
        """``report`` for :func:`workers.adapters.redis.redis_client.with_retry`."""
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
        self.recent_shifted.set(math.nan if shift is None else shift.significant)

    def set_coherence(self, metric: str, found: dict[str, float] | None) -> None:
        """The coherence gauges of one metric from a :meth:`stream.auditing.coherence.Lift.to_dict`;
        NaN when the version could not be measured (too few tweets sampled)."""
        get = (lambda key: math.nan) if found is None else (lambda key: float(found[key]))
        self.coherence.labels(metric, "synonyms").set(get("synonyms"))
        self.coherence.labels(metric, "random").set(get("random"))
        for bound, key in (("estimate", "lift"), ("ci_low", "lift_ci_low"), ("ci_high", "lift_ci_high")):
            self.coherence_lift.labels(metric, bound).set(get(key))

    def set_agreement(self, found: dict[str, Any] | None) -> None:
        """ρ_w and τ_w of the current version against the votes
        (:meth:`stream.auditing.audit.Agreement.to_dict`); NaN without an audit."""
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
