"""Role ``index``: rebuild the thesaurus from the running means in Redis and publish a
new version to the store when enough hashtags changed."""

from __future__ import annotations

import logging
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import faust
import numpy as np

from stream.monitoring.backtest import duration_text
from stream.monitoring.mmd import MmdResult, mmd_test
from stream.synonyms.drift import (
    TOP_NEIGHBOURS,
    RecentShift,
    ThesaurusDrift,
    recent_shift,
    with_context,
    with_examples,
)
from stream.synonyms.means import HashtagMeans, RunningMean
from stream.synonyms.thesaurus import Thesaurus
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus, build_from_means, thesaurus_drift
from workers.adapters.files.store import ThesaurusStore, version_number
from workers.adapters.prometheus.exporter import Exporter
from workers.adapters.redis.redis_client import with_retry
from workers.adapters.redis.redis_reservoir import RedisReservoir
from workers.service.runtime import Runtime
from workers.service.stores import means_of, recent_windows, samples_of, thesauri_of
from workers.service.thesaurus_audit import VersionAudit
from workers.settings import IndexSettings

log = logging.getLogger("reval.workers")

#: Movers kept in each new version's metadata (the log line names the first 5; the gauges
#: carry no hashtag).
DRIFT_MOVERS = 20


class Indexer:
    """Rebuilds the thesaurus from Redis when enough hashtags changed."""

    def __init__(self, settings: IndexSettings, exporter: Exporter, client: Any) -> None:
        self.settings = settings
        self.x = exporter
        self.means = means_of(client, settings)
        self.store = ThesaurusStore(Path(settings.index_dir), keep=settings.index_keep)
        self.thesauri = thesauri_of(client, settings)
        self.samples = samples_of(client, settings)
        self.reservoir = RedisReservoir(client, settings.redis_prefix, settings.coherence_reservoir)
        self.audit = VersionAudit(settings, exporter, client)
        current = self.store.current_version()
        if current is not None and with_retry("thesaurus", self.thesauri.current_version) is None:
            # A store from before scorers read Redis: publish its current version there now.
            with_retry("thesaurus", lambda: self.thesauri.publish(self.store.root / current, current))
        if current is not None:
            self._publish_gauges(self.store.load(current), current, None)

    def run_once(self, *, force: bool = False) -> str | None:
        """Build and publish a new version; ``None`` when too little changed."""
        changed = with_retry("changed", self.means.changed_count)
        if changed < self.settings.index_min_changes and not (force and changed):
            return None
        started = time.perf_counter()
        taken = with_retry("changed", self.means.take_changed)
        try:
            return self._build_and_publish(changed, started)
        except Exception:
            # A build that fails after the take (no space left for the version, say) would
            # otherwise wait for new tweets to trigger it again: its hashtags go back.
            with_retry("changed", lambda: self.means.restore_changed(taken))
            raise

    def _build_and_publish(self, changed: int, started: float) -> str | None:
        # Folding as it reads: every hashtag's memory back to its folded size.
        states, windows = with_retry("read all", lambda: self.means.read_all_with_windows(fold=True))
        if not states:
            return None
        recent, since = self._recent_shift(states, windows)
        until = self._events_until(windows)
        means = HashtagMeans(next(iter(states.values())).dim, states)
        thesaurus = build_from_means(
            means,
            min_count=self.settings.index_min_count,
            method=self.settings.index_hubness,
            depth=max(max(self.settings.k_values), 1),  # scorers need Syn_k up to the largest k
            model_id=self.settings.model,
            n_trees=self.settings.index_n_trees,
        )
        if thesaurus is None:
            return None
        # Opened before publishing: with keep=1 the publish prunes the previous version.
        previous = self._current()
        try:
            drift = self._drift(previous, thesaurus)
            annotation: dict[str, Any] = {} if until is None else {"events_until": until}
            if drift is not None and previous is not None:  # the movers travel with the version
                drift = self._with_examples(drift, previous)
                annotation = {**annotation, "from_version": previous.version, **drift.to_dict()}
            if recent is not None:
                recent = self._with_context(recent, since, thesaurus, previous)
                annotation["recent"] = recent.to_dict()
            if annotation:
                thesaurus.annotate(drift=annotation)
            # Coherence lift and agreement with the votes: gauges, and the version's metadata.
            audit = self.audit.run(thesaurus, {h: m.count for h, m in states.items()}, seed=changed)
            if audit:
                thesaurus.annotate(audit=audit)
            version = self.store.publish(thesaurus)
            # Scorers on other hosts load it from Redis (the neighbour table, no shared disk).
            with_retry("thesaurus", lambda: self.thesauri.publish(self.store.root / version, version))
            self._publish_gauges(thesaurus, version, time.perf_counter() - started)
            log.info("index %s: %d hashtags (%d changed)", version, len(thesaurus), changed)
            self._publish_drift(drift, version)
            self.x.set_recent_shift(recent)
            self._embedding_drift()
        finally:
            if previous is not None:
                previous.close()
        return version

    def _current(self) -> AnnoyThesaurus | None:
        """The version now current, for the drift of the next one; None when there is none
        or it cannot be read (then there is simply no drift to report)."""
        try:
            return self.store.load_current()
        except (OSError, ValueError) as exc:
            log.warning("index: previous version unreadable, no drift reported (%s)", exc)
            return None

    def _drift(self, previous: AnnoyThesaurus | None, thesaurus: AnnoyThesaurus) -> ThesaurusDrift | None:
        """Which hashtags' meaning moved since the previous version; None when there is none
        or the two are not comparable.  Never fails the build."""
        if previous is None:
            return None
        try:
            return thesaurus_drift(previous, thesaurus, top=DRIFT_MOVERS)
        except ValueError as exc:  # another model or hubness method: cosines are meaningless
            log.info("index: no drift against the previous version (%s)", exc)
            return None

    def _events_until(self, windows: dict[str, dict[int, RunningMean]]) -> float | None:
        """The event time (epoch seconds) up to which this version's tweets go: the end of the
        store's newest window; None without windows.  Recorded in the version's metadata
        (``drift.events_until``), so that the next version can split its movers' example
        tweets into those up to this version and those since."""
        width = self.settings.means_window_s or 0
        if not width or not windows:
            return None
        return float((max(max(w) for w in windows.values()) + 1) * width)

    def _with_examples(self, drift: ThesaurusDrift, previous: AnnoyThesaurus) -> ThesaurusDrift:
        """The movers since ``previous`` with example tweets of each side, split at the event
        time it covered (unchanged when it did not record one: written before this was)."""
        since = (previous.metadata.drift or {}).get("events_until")
        if not isinstance(since, int | float) or not drift.movers:
            return drift
        samples = with_retry(
            "reservoir", lambda: self.reservoir.dated_samples(m.hashtag for m in drift.movers)
        )
        return with_examples(drift, samples, float(since))

    def _recent_shift(
        self, states: dict[str, RunningMean], windows: dict[str, dict[int, RunningMean]]
    ) -> tuple[RecentShift | None, float]:
        """Each hashtag's recent use (its newest windows, up to the newest window of the whole
        store, i.e. event time, not the clock: replays too) against its use before; and when
        (epoch seconds) the recent use begins."""
        n_recent = recent_windows(self.settings)
        if not n_recent or not windows:
            return None, 0.0
        newest = max(max(w) for w in windows.values())
        since = float((newest - n_recent + 1) * (self.settings.means_window_s or 0))
        names = sorted(windows)
        dim = next(iter(states.values())).dim
        totals, counts = np.zeros((len(names), dim)), []
        recent_totals, recent_counts = np.zeros((len(names), dim)), []
        for i, tag in enumerate(names):
            totals[i] = states[tag].total
            counts.append(states[tag].count)
            recent = RunningMean.empty(dim)
            for window, mean in windows[tag].items():
                if window > newest - n_recent:
                    recent.merge(mean)
            recent_totals[i] = recent.total
            recent_counts.append(recent.count)
        shift = recent_shift(names, totals, counts, recent_totals, recent_counts, top=DRIFT_MOVERS)
        if shift.movers:
            log.info(
                "index: last %s of event time against before: %d hashtags compared, %d shifted "
                "beyond their spread; moved most (effect >= its 95%% lower end, p): %s",
                duration_text(n_recent * (self.settings.means_window_s or 0)),
                shift.compared,
                shift.significant,
                ", ".join(
                    f"#{m.hashtag} ({m.effect:.2f} >= {m.effect_low:.2f}, {m.p:.1g})"
                    for m in shift.movers[:5]
                ),
            )
        return shift, since

    def _with_context(
        self, shift: RecentShift, since: float, thesaurus: Thesaurus, previous: AnnoyThesaurus | None
    ) -> RecentShift:
        """The movers with their neighbours now and in the version before, and example
        tweets first seen on each side of ``since`` (the reservoir's sample)."""
        k = TOP_NEIGHBOURS

        def before(hashtag: str) -> list[str]:
            return previous.neighbours(hashtag, k) if previous is not None and hashtag in previous else []

        samples = with_retry(
            "reservoir", lambda: self.reservoir.dated_samples(m.hashtag for m in shift.movers)
        )

        def now(hashtag: str) -> list[str]:
            return thesaurus.neighbours(hashtag, k) if hashtag in thesaurus else []

        return with_context(shift, now, before, samples, since)

    def _embedding_drift(self) -> MmdResult | None:
        """Did the tweets change?  The MMD test (:mod:`stream.monitoring.mmd`) between the embed
        workers' samples of the last drift window and of the window before; exported, and
        None (NaN gauges) while either window has fewer than 2 samples."""
        reference, recent = with_retry("drift sample", self.samples.windows)
        result = None
        if min(len(reference), len(recent)) >= 2 and reference.shape[1] == recent.shape[1]:
            result = mmd_test(reference, recent, seed=int(time.time()))
            log.info(
                "index: embedding drift MMD %.5f, p %.3f (%d reference, %d recent tweets)",
                result.statistic,
                result.p_value,
                result.n_reference,
                result.n_recent,
            )
        self.x.set_embedding_drift(result)
        return result

    def _publish_drift(self, drift: ThesaurusDrift | None, version: str) -> None:
        """The drift's gauges (never a label per hashtag) and a log line with the movers."""
        self.x.set_thesaurus_drift(drift)
        if drift is not None and drift.shift_quantiles is not None:
            log.info(
                "index %s drift: %d hashtags compared, 1-cos p50 %.4f p99 %.4f, top-10 changed by more "
                "than half %.1f%%; moved most: %s",
                version,
                drift.compared,
                drift.shift_quantiles.p50,
                drift.shift_quantiles.p99,
                100.0 * (drift.share_top10_changed_over_half or 0.0),
                ", ".join(f"#{m.hashtag} ({m.cosine:.2f})" for m in drift.movers[:5]) or "none",
            )

    def _publish_gauges(self, thesaurus: Thesaurus, version: str, seconds: float | None) -> None:
        self.x.index_version.set(version_number(version))
        built = datetime.fromisoformat(thesaurus.metadata.built_at.replace("Z", "+00:00"))
        self.x.set_index_built(built.timestamp())
        self.x.index_hashtags.set(len(thesaurus))
        report = thesaurus.metadata.hubness or {}
        if report:
            self.x.index_hubness_skewness.set(report["skewness"])
            self.x.index_hubness_max_share.set(report["max_share"])
            self.x.index_hubness_hub_share.set(report["share_with_hub"])
        if seconds is not None:
            self.x.index_build_seconds.set(seconds)


def register(app: faust.App, rt: Runtime) -> None:
    """The ``index`` timer: one :meth:`Indexer.run_once` per interval, on the leader only."""
    indexer = Indexer(rt.settings, rt.exporter, rt.client)

    @app.timer(interval=rt.settings.index_interval_s, on_leader=True)
    async def rebuild_index() -> None:
        try:
            await rt.run("index", indexer.run_once)
        except Exception:  # a failed build must not stop the timer
            log.exception("index build failed")
