"""The live change detector's shared state in real Redis: several score workers feed one
recommender's charts, none of their batches lost or applied twice, alarms time-stamped."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
import redis

from stream.monitoring.cusum import Detector
from tests.live import prefixed_redis
from workers.adapters.redis.redis_detector import RedisDetectors

pytestmark = [pytest.mark.integration]

P0 = np.array([0.35, 0.05, 0.60])


@pytest.fixture
def client(redis_url: str, redis_prefix: str) -> Iterator[redis.Redis]:
    with prefixed_redis(redis_url, redis_prefix) as c:
        yield c


def _batch(p: np.ndarray, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    return rng.multinomial(rng.choice([1, 1, 2, 3], size=n), p), np.full(n, 0.1)


def test_workers_racing_on_one_recommender_lose_and_double_nothing(
    client: redis.Redis, redis_prefix: str
) -> None:
    def make() -> Detector:
        return Detector(arl0=2_000, reference=300, window=300, lag=100)

    rng = np.random.default_rng(5)
    batches = [_batch(P0, 64, rng) for _ in range(48)]
    workers = [RedisDetectors(client, redis_prefix, make) for _ in range(3)]

    def run(w: int) -> None:
        for counts, chance in batches[w::3]:
            own = {f"own{w}": (counts, chance)} if w == 0 else {}
            workers[w].update({"popular": (counts, chance), **own})

    threads = [threading.Thread(target=run, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shared = workers[0].update({"popular": _batch(P0, 1, rng)})["popular"].detector
    assert shared.events == 48 * 64 + 1  # every batch once, whichever worker wrote it
    assert shared.thresholds and set(shared.values) == set(shared.thresholds)
    own = workers[0].update({"own0": _batch(P0, 1, rng)})["own0"].detector  # only one worker saw it
    assert own.events == 16 * 64 + 1


def test_an_alarm_is_shared_and_time_stamped(client: redis.Redis, redis_prefix: str) -> None:
    detectors = RedisDetectors(
        client,
        redis_prefix,
        lambda: Detector(arl0=5_000, reference=300, window=300, lag=100),
        clock=lambda: 1234.5,
    )
    rng = np.random.default_rng(8)
    assert detectors.update({"mowe": _batch(P0, 600, rng)})["mowe"].last_alarms == {}
    after = detectors.update({"mowe": _batch(np.array([0.02, 0.03, 0.95]), 400, rng)})["mowe"]
    assert after.alarms and after.alarms[0].alternative == "quality_lost"
    lost = [a for a in after.alarms if a.alternative == "quality_lost"]
    assert after.detector.alarms["quality_lost"] == len(lost)
    assert after.last_alarms == {"quality_lost": 1234.5}
    # another worker reads the same state: its detector goes on from there, alarm times too
    again = RedisDetectors(client, redis_prefix, lambda: Detector(), clock=lambda: 2000.0)
    later = again.update({"mowe": _batch(P0, 1, rng)})["mowe"]
    assert later.detector.events == 1001 and later.detector.alarms["quality_lost"] == len(lost)
    assert later.last_alarms == {"quality_lost": 1234.5}
