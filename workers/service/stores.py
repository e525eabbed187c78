"""The Redis stores as the settings configure them: one place for the roles that share them
(embed workers and the index job write the means and samples, the index job and the scorers
read and write the thesaurus versions), so that no role imports another.
"""

from __future__ import annotations

import math
from typing import Any

from workers.adapters.prometheus.exporter import Exporter
from workers.adapters.redis.redis_client import Client, Replication
from workers.adapters.redis.redis_means import RedisMeans
from workers.adapters.redis.redis_state import RedisSamples
from workers.adapters.redis.redis_thesaurus import RedisThesauri
from workers.settings import StoreSettings


def recent_windows(settings: StoreSettings) -> int:
    """How many event-time windows make up the recent use the index job compares."""
    if not settings.means_window_s:
        return 0
    return max(1, math.ceil(settings.means_recent_s / settings.means_window_s))


def replication_of(client: Client, settings: StoreSettings, exporter: Exporter | None = None) -> Replication:
    """The replication barrier and rollback check as the settings configure them (every role
    that writes); rollbacks count in ``reval_redis_rollbacks_total``."""
    return Replication(
        client,
        settings.replicas_required(),
        timeout_s=settings.redis_replica_timeout_s,
        prefix=settings.redis_prefix,
        on_rollback=(lambda master, key: exporter.redis_rollbacks.inc()) if exporter is not None else None,
    )


def means_of(
    client: Client, settings: StoreSettings, dim: int | None = None, replication: Replication | None = None
) -> RedisMeans:
    """The running means as the settings configure them (embed workers and index job): each
    hashtag keeps its recent windows and one more, the one the recent use starts in."""
    return RedisMeans(
        client,
        prefix=settings.redis_prefix,
        dim=dim,
        fold_after=settings.means_fold_after,
        window_s=settings.means_window_s or None,
        window_keep=recent_windows(settings) + 1,
        replication=replication,
    )


def samples_of(
    client: Client, settings: StoreSettings, replication: Replication | None = None
) -> RedisSamples:
    """The embedding samples as the settings configure them (embed workers and index job)."""
    return RedisSamples(
        client,
        settings.redis_prefix,
        rate=settings.drift_sample_rate,
        cap=settings.drift_sample_cap,
        bucket_s=settings.drift_bucket_s,
        window_s=settings.drift_window_s,
        replication=replication,
    )


def thesauri_of(client: Any, settings: StoreSettings) -> RedisThesauri:
    """The thesaurus versions in Redis, as the settings configure them (index job, scorers)."""
    return RedisThesauri(
        client, settings.redis_prefix, keep=settings.index_keep, replication=replication_of(client, settings)
    )
