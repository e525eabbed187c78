"""The live embedding drift test: samples of tweet embeddings in Redis (embed workers), the
MMD test on them (index job), its gauges."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from workers.adapters.prometheus.exporter import Exporter
from workers.adapters.redis.redis_means import RedisMeans
from workers.adapters.redis.redis_state import RedisSamples
from workers.service.index import Indexer
from workers.settings import Settings

pytestmark = pytest.mark.integration
HOUR = 3600


@pytest.fixture
def client(redis_url: str, redis_prefix: str) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(redis_url)
    try:
        yield connection
    finally:
        RedisMeans(connection, prefix=redis_prefix).clear()  # every key under the prefix
        connection.close()


def test_samples_are_bounded_deterministic_and_exactly_once(client: redis.Redis, redis_prefix: str) -> None:
    samples = RedisSamples(client, redis_prefix, rate=0.1, cap=50, bucket_s=HOUR, window_s=24 * HOUR)
    claimants = [f"tweets@1:0:{i}" for i in range(3000)]
    chosen = [c for c in claimants if samples.sampled(c)]
    assert 0.08 <= len(chosen) / len(claimants) <= 0.12  # the rate, by hash
    vector = np.arange(4, dtype=np.float32)
    # 3,000 tweets in one hour: at most 50 kept; the same batch again (a redelivery) adds nothing.
    batch = [(c, 10.5 * HOUR, vector) for c in claimants]
    assert samples.add(batch) == 50
    assert samples.add(batch) == 0
    assert client.hlen(f"{redis_prefix}:sample:10") == 50
    assert 0 < client.ttl(f"{redis_prefix}:sample:10") <= 49 * HOUR


def test_windows_follow_event_time(client: redis.Redis, redis_prefix: str) -> None:
    samples = RedisSamples(client, redis_prefix, rate=1.0, cap=1000, bucket_s=HOUR, window_s=2 * HOUR)
    rows = [(f"t:0:{i}", (100 + i % 6) * HOUR + 1.0, np.full(3, i % 6, dtype=np.float32)) for i in range(60)]
    samples.add(rows)  # hours 100..105: recent = 104, 105; reference = 102, 103; 100, 101 too old
    reference, recent = samples.windows()
    assert sorted(set(recent[:, 0].tolist())) == [4.0, 5.0]
    assert sorted(set(reference[:, 0].tolist())) == [2.0, 3.0]
    assert len(reference) == len(recent) == 20


class RescanningRedis(redis.Redis):
    """A client whose SCAN returns every key twice, as Redis may while it rehashes."""

    def scan_iter(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for key in super().scan_iter(*args, **kwargs):
            yield key
            yield key


def test_a_key_scanned_twice_is_read_once(redis_url: str, redis_prefix: str) -> None:
    """Seen in CI with another test writing to the same Redis: a bucket SCAN returned twice
    was read twice, 30 samples in a window of 20."""
    rescanning = RescanningRedis.from_url(redis_url)
    try:
        samples = RedisSamples(rescanning, redis_prefix, rate=1.0, cap=1000, bucket_s=HOUR, window_s=HOUR)
        samples.add(
            [(f"t:0:{i}", (200 + i % 2) * HOUR + 1.0, np.full(3, i % 2, dtype=np.float32)) for i in range(20)]
        )
        reference, recent = samples.windows()
        assert len(reference) == len(recent) == 10
    finally:
        RedisMeans(rescanning, prefix=redis_prefix).clear()
        rescanning.close()


def test_the_index_job_exports_the_embedding_drift(
    client: redis.Redis, redis_prefix: str, tmp_path: Path
) -> None:
    settings = Settings(
        index_dir=tmp_path / "store",
        redis_prefix=redis_prefix,
        drift_sample_rate=1.0,
        drift_window_s=24 * HOUR,
    )
    x = Exporter()
    indexer = Indexer(settings, x, client)
    assert indexer._embedding_drift() is None  # nothing sampled yet: NaN, not 0
    assert math.isnan(x.registry.get_sample_value("reval_embedding_drift_p_value") or 0.0)
    rng = np.random.default_rng(0)
    before = [(f"t:0:{i}", 10 * HOUR + i, rng.normal(size=16)) for i in range(200)]
    after = [(f"t:0:{1000 + i}", 34 * HOUR + i, rng.normal(size=16) + 0.6) for i in range(200)]
    indexer.samples.add(before + after)
    result = indexer._embedding_drift()
    assert result is not None and result.p_value <= 0.01 and result.statistic > 0
    assert x.registry.get_sample_value("reval_embedding_drift_p_value") == result.p_value
    assert x.registry.get_sample_value("reval_embedding_drift_samples", {"window": "recent"}) == 200
