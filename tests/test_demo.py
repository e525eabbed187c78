"""`reval demo`'s machinery on a short run: broker, Redis, three workers, the bundled feed
with two recommenders, and the live table's numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.commands.demo import Demo, sample_feed_events
from workers.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_demo_runs_the_live_path(redis_url: str, tiny_bertweet: Path, tmp_path: Path) -> None:
    settings = Settings(redis_url=redis_url, redis_prefix="test-demo", index_interval_s=2.0)
    demo = Demo(settings, duration=45, model=str(tiny_bertweet), workdir=tmp_path)
    embed, index, score = demo.run(sample_feed_events(None, limit=1500))
    assert (embed.get("reval_tweets_embedded_total") or 0) > 100
    assert (index.get("reval_index_version") or 0) >= 1
    for recommender in ("mowe", "popular"):
        assert score.total("reval_events_total", recommender=recommender) > 50
        assert score.get("reval_hit_ratio_count", recommender=recommender, k="10", r="5")
    assert all(proc.poll() is not None for proc in demo.procs)  # everything stopped
