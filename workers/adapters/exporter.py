"""Prometheus metrics of the workers (prometheus-client).

Quality metrics are exported two ways:

* ``reval_hit_ratio_sum`` / ``reval_hit_ratio_count`` (and ``reval_exact_match_*``)
  per (recommender, k, r): monotonic, so ``rate(sum[5m]) / rate(count[5m])`` is a
  rolling mean across any number of workers and survives restarts;
* ``reval_hit_ratio_rolling`` per (recommender, k, r, window): means over the
  last window of *event* time, so a replay at 100x shows what a live run would.

Label values are bounded: recommender names outside the allow-list (or beyond
the cap when there is no list) become ``other``, so a hostile stream cannot grow
/metrics without limit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from itertools import chain

import numpy as np
import numpy.typing as npt
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric, SummaryMetricFamily

from stream.metrics import ExactScores
from stream.scoring import EventScore, r_label
from stream.windows import RollingMean

OTHER = "other"


class LabelGuard:
    """Maps free-form label values onto a bounded set.

    >>> guard = LabelGuard(allow=(), cap=2)
    >>> [guard("a"), guard("b"), guard("c"), guard("a")]
    ['a', 'b', 'other', 'a']
    >>> LabelGuard(allow=("mowe",), cap=5)("popular")
    'other'
    """

    def __init__(self, allow: Sequence[str] = (), cap: int = 20) -> None:
        self.allow = frozenset(allow)
        self.cap = cap
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if self.allow:
            return value if value in self.allow else OTHER
        if value in self._seen:
            return value
        if len(self._seen) < self.cap:
            self._seen.add(value)
            return value
        return OTHER


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
        self.thesaurus_loaded = Gauge(
            "reval_scoring_thesaurus_version",
            "Thesaurus version number the scorer uses",
            registry=r,
        )
        self.lag = Gauge(
            "reval_consumer_lag",
            "Records behind the end of the partition",
            ["topic", "partition"],
            registry=r,
        )

    def set_index_built(self, timestamp: float) -> None:
        """When the current thesaurus was built (epoch seconds); the age gauge follows it."""
        self._built_at = timestamp
        self.index_built.set(timestamp)

    def _index_age(self) -> float:
        return time.time() - self._built_at if self._built_at else float("nan")

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)


class QualityMetrics:
    """Feeds scored events into the quality metrics, at thousands of events per second.

    Every scorable event adds to every (k, r) cell of its recommender, so one count
    and one vector of sums per recommender are the whole state of the
    ``reval_hit_ratio`` / ``reval_exact_match`` summaries; they and the event-time
    rolling means are turned into metric families only when Prometheus scrapes
    (this object is a custom collector), not on every event.
    """

    def __init__(
        self,
        exporter: Exporter,
        ks: Sequence[int],
        rs: Sequence[int | None],
        windows: Sequence[int],
        guard: LabelGuard,
        window_label: Callable[[int], str],
    ) -> None:
        self.x = exporter
        self.ks = [str(k) for k in ks]
        self.rs = [r_label(r) for r in rs]
        self.windows = list(windows)
        self.guard = guard
        self.window_label = window_label
        # value layout: for each r, the k values then the exact metrics
        self.width = len(self.rs) * (len(self.ks) + len(ExactScores.NAMES))
        self._counts: dict[str, int] = {}
        self._sums: dict[str, npt.NDArray[np.float64]] = {}
        self._rolling: dict[str, list[RollingMean]] = {}
        self._lock = threading.Lock()  # observe runs in the scorer thread, collect in the HTTP one
        exporter.registry.register(self)

    def observe(self, score: EventScore, event_time: float) -> None:
        name = self.guard(score.recommender)
        if score.unscorable is not None:
            self.x.events.labels(name, "unscorable").inc()
            return
        self.x.events.labels(name, "scored").inc()
        self.x.recommended.labels(name).inc(score.n_recommended)
        self.x.unknown.labels(name).inc(score.unknown_recommended)
        values = np.fromiter(
            chain.from_iterable(
                chain(score.reval[r].values(), score.exact[r].as_dict().values()) for r in self.rs
            ),
            dtype=np.float64,
            count=self.width,
        )
        with self._lock:
            if name not in self._sums:
                self._counts[name] = 0
                self._sums[name] = np.zeros(self.width)
                self._rolling[name] = [RollingMean(w, size=self.width) for w in self.windows]
            self._counts[name] += 1
            self._sums[name] += values
            for window in self._rolling[name]:
                window.update(event_time, values)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        reval = GaugeMetricFamily(
            "reval_hit_ratio_rolling",
            "#REval-hit-ratio mean over a window of event time",
            labels=["recommender", "k", "r", "window"],
        )
        exact = GaugeMetricFamily(
            "reval_exact_match_rolling",
            "Exact-match metric mean over a window of event time",
            labels=["recommender", "metric", "r", "window"],
        )
        hit_ratio = SummaryMetricFamily(
            "reval_hit_ratio", "#REval-hit-ratio of scored events", labels=["recommender", "k", "r"]
        )
        exact_match = SummaryMetricFamily(
            "reval_exact_match", "Exact-match metric of scored events", labels=["recommender", "metric", "r"]
        )
        with self._lock:
            counts = dict(self._counts)
            sums = {name: total.copy() for name, total in self._sums.items()}
            rolling_means = {
                name: [window.get() for window in windows] for name, windows in self._rolling.items()
            }
        for name, total in sums.items():
            i = 0
            for r in self.rs:
                for k in self.ks:
                    hit_ratio.add_metric([name, k, r], count_value=counts[name], sum_value=float(total[i]))
                    i += 1
                for metric in ExactScores.NAMES:
                    exact_match.add_metric(
                        [name, metric, r], count_value=counts[name], sum_value=float(total[i])
                    )
                    i += 1
        yield hit_ratio
        yield exact_match
        for name, all_means in rolling_means.items():
            for seconds, means in zip(self.windows, all_means, strict=True):
                if means is None:
                    continue
                label = self.window_label(seconds)
                i = 0
                for r in self.rs:
                    for k in self.ks:
                        reval.add_metric([name, k, r, label], float(means[i]))
                        i += 1
                    for metric in ExactScores.NAMES:
                        exact.add_metric([name, metric, r, label], float(means[i]))
                        i += 1
        yield reval
        yield exact
