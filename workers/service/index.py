"""Role ``index``: rebuild the thesaurus from the running means in Redis and publish a
new version to the store when enough hashtags changed."""

from __future__ import annotations

import logging
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import faust

from stream.means import HashtagMeans
from stream.thesaurus import Thesaurus
from workers.adapters.exporter import Exporter
from workers.adapters.redis_client import with_retry
from workers.adapters.redis_means import RedisMeans
from workers.adapters.store import ThesaurusStore, build_from_means, version_number
from workers.service.runtime import Runtime
from workers.settings import Settings

log = logging.getLogger("reval.workers")


class Indexer:
    """Rebuilds the thesaurus from Redis when enough hashtags changed."""

    def __init__(self, settings: Settings, exporter: Exporter, client: Any) -> None:
        self.settings = settings
        self.x = exporter
        self.means = RedisMeans(client, prefix=settings.redis_prefix)
        self.store = ThesaurusStore(Path(settings.index_dir), keep=settings.index_keep)
        current = self.store.current_version()
        if current is not None:
            self._publish_gauges(self.store.load(current), current, None)

    def run_once(self, *, force: bool = False) -> str | None:
        """Build and publish a new version; ``None`` when too little changed."""
        changed = with_retry("changed", self.means.changed_count)
        if changed < self.settings.index_min_changes and not (force and changed):
            return None
        started = time.perf_counter()
        with_retry("changed", self.means.take_changed)
        states = with_retry("read all", self.means.read_all)
        if not states:
            return None
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
        version = self.store.publish(thesaurus)
        self._publish_gauges(thesaurus, version, time.perf_counter() - started)
        log.info("index %s: %d hashtags (%d changed)", version, len(thesaurus), changed)
        return version

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
