"""Replay parity: an archive replayed through the live workers at --speed max gives, per
event and on average, what `reval score` computes offline with the same thesaurus
version, and the event-time rolling gauges equal the averages over the matching windows."""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stream.intake.records import parse_tweet
from stream.synonyms.windows import RollingMean
from tests.live import run_reval
from workers.adapters.files.feeds import sample_feed
from workers.adapters.files.store import ThesaurusStore
from workers.adapters.redis.redis_means import RedisMeans
from workers.dev.stack import REVAL, Stack, Worker, tweet_lines, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KS = (0, 5, 10, 20, 30, 40, 50, 60, 70)
WINDOWS = {"5m": 300, "1h": 3600, "1d": 86400}


@pytest.fixture
def stack(broker: str, redis_url: str, tiny_bertweet: Path, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(broker, redis_url, tiny_bertweet, tmp_path, extra_env={"REVAL_LANGUAGE_FILTER": "false"})
    yield s
    s.close()


def popular_events(lines: list[str], r: int = 10) -> list[dict[str, object]]:
    """A simple recommender's events: the globally most used hashtags so far."""
    counts: Counter[str] = Counter()
    events: list[dict[str, object]] = []
    for line in lines:
        tweet = parse_tweet(line)
        if tweet.hashtags and counts:
            events.append(
                {
                    "tweet_id": tweet.id,
                    "recommender": "popular",
                    "recommended": [h for h, _ in counts.most_common(r)],
                    "ground_truth": list(tweet.hashtags),
                    "ts": tweet.created_at.isoformat() if tweet.created_at else None,
                }
            )
        counts.update(tweet.hashtags)
    return events


def replay(stack: Stack, path: Path, topic: str) -> None:
    subprocess.run(
        [
            REVAL,
            "replay",
            str(path),
            "--topic",
            stack.topics[topic],
            "--broker",
            stack.bootstrap,
            "--speed",
            "max",
            "--json",
        ],
        check=True,
        capture_output=True,
        env=stack.env,
    )


def wait_until_settled(stack: Stack, embed: Worker, score: Worker, tweets: int) -> str:
    """Wait until every tweet is embedded, the index built on all of them and the scorer uses
    that version; the version."""
    means = RedisMeans.from_url(stack.redis_url, prefix=stack.prefix)
    store = ThesaurusStore(stack.index_dir)
    seen: dict[str, float] = {}

    def settled() -> bool:
        done = embed.metric("reval_records_consumed_total", topic=stack.topics["tweets"]) == tweets
        current = store.current_version()
        ready = bool(
            done
            and means.changed_count() == 0
            and current
            and score.metric("reval_scoring_thesaurus_version") == int(current[1:])
        )
        # The changed set empties when a build *starts*: the version must also stay current
        # for a few index intervals, so that no build that began before it is still running.
        if not ready or current is None:
            seen.clear()
            return False
        if current not in seen:
            seen.clear()
            seen[current] = time.monotonic()
        return time.monotonic() - seen[current] >= 4.0

    wait_for("the index to settle on the whole feed", settled, 120, 1.0)
    version = store.current_version()
    assert version is not None
    return version


def score_offline(stack: Stack, recs: Path, version: str, events: Path) -> dict[str, Any]:
    """``reval score`` of the events file on the thesaurus version; its summary (--json),
    each event's score written to ``events``."""
    offline = run_reval(
        "score",
        str(recs),
        "-t",
        str(stack.index_dir / version),
        "-k",
        ",".join(map(str, KS)),
        "-r",
        "1,5,10",
        "--json",
        "--events",
        str(events),
        env=stack.env,
        timeout=600,
    )
    assert offline.returncode == 0, offline.stderr[-3000:]
    summary: dict[str, Any] = json.loads(offline.stdout)
    return summary


def assert_rolling_windows(score: Worker, results: list[dict[str, Any]]) -> None:
    """Event-time windows: the same bucketing as the worker, recomputed from the results."""
    metrics = score.metrics()
    for label, seconds in WINDOWS.items():
        window = RollingMean(seconds, size=1)
        for result in results:
            window.update(result["event_time"], [0.0])
        inside = [res for res in results if window.covers(res["event_time"])]
        assert inside
        for r in ("1", "5", "10"):
            for k in (0, 10, 70):
                expected_mean = sum(res["reval_hit_ratio"][r][str(k)] for res in inside) / len(inside)
                key = (
                    "reval_hit_ratio_rolling",
                    tuple(sorted({"recommender": "popular", "k": str(k), "r": r, "window": label}.items())),
                )
                assert metrics[key] == pytest.approx(expected_mean, abs=1e-9), (label, r, k)


def test_replay_matches_offline_scoring_and_event_time_windows(stack: Stack, tmp_path: Path) -> None:
    embed, index, score = stack.start("embed"), stack.start("index"), stack.start("score")
    stack.wait_ready(embed, index, score)
    lines = tweet_lines(sample_feed(), 800, start=2000)
    feed = tmp_path / "feed.jsonl"
    feed.write_text("\n".join(lines) + "\n")
    events = popular_events(lines)
    recs = tmp_path / "recs.jsonl"
    recs.write_text("".join(json.dumps(e) + "\n" for e in events))

    replay(stack, feed, "tweets")
    version = wait_until_settled(stack, embed, score, len(lines))

    replay(stack, recs, "recommendations")
    results = wait_for(
        "every event scored", lambda: (r := stack.read_json("scores")) and len(r) >= len(events) and r, 120
    )
    assert len(results) == len(events)
    assert {r["index_version"] for r in results} == {version}

    offline_events = tmp_path / "offline.jsonl"
    summary = score_offline(stack, recs, version, offline_events)
    by_id = {r["tweet_id"]: r for r in results}
    for line in offline_events.read_text().splitlines():
        expected = json.loads(line)
        got = by_id[expected["tweet_id"]]
        for r, by_k in expected["reval_hit_ratio"].items():
            for k, value in by_k.items():
                assert got["reval_hit_ratio"][r][k] == pytest.approx(value, abs=1e-9)
        for r, metrics in expected["exact"].items():
            for name, value in metrics.items():
                assert got["exact"][r][name] == pytest.approx(value, abs=1e-9)
        assert got["thesaurus_version"] == expected["thesaurus_version"]

    # Averages: live counters (sum/count) against the offline summary.
    for r in ("1", "5", "10"):
        for k in KS:
            live_sum = score.metric("reval_hit_ratio_sum", recommender="popular", k=str(k), r=r)
            live_count = score.metric("reval_hit_ratio_count", recommender="popular", k=str(k), r=r)
            offline_mean = summary["by_r"][r]["by_k"][str(k)]["reval_hit_ratio"]
            assert live_count == summary["by_r"][r]["events"] - summary["by_r"][r]["unscorable"]
            assert live_sum / live_count == pytest.approx(offline_mean, abs=1e-9)
    assert_rolling_windows(score, results)
