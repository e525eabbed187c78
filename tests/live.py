"""What the live-path tests check against: the batch recomputation of the running means,
and the state the workers left in Redis (shared by the pipeline, chaos and scale-out tests)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import redis

from stream.auditing.coherence import bottom_k, coherence_text
from stream.intake.cleaning import Cleaner, Prepared
from stream.intake.records import parse_tweet
from stream.synonyms.means import HashtagMeans
from workers.adapters.encoding.encoder import Encoder
from workers.adapters.files.feeds import sample_feed
from workers.adapters.redis.redis_means import RedisMeans
from workers.adapters.redis.redis_reservoir import RedisReservoir
from workers.dev.stack import REVAL, Stack, tweet_lines


def run_reval(
    *args: str, env: Mapping[str, str], timeout: float, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``reval ARGS`` run to its end: its exit status, stdout and stderr (text)."""
    return subprocess.run([REVAL, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)


@contextmanager
def prefixed_redis(url: str, prefix: str) -> Iterator[redis.Redis]:
    """A client of the Redis at ``url``; the keys under ``prefix:`` are deleted afterwards."""
    client = redis.Redis.from_url(url)
    try:
        yield client
    finally:
        for key in client.scan_iter(match=f"{prefix}:*"):
            client.delete(key)
        client.close()


def batch_means(lines: list[str], model: Path) -> HashtagMeans:
    """The batch definition: the same core steps over the same tweets, in one go."""
    cleaner = Cleaner()
    prepared = [p for p in (cleaner(parse_tweet(line)) for line in lines) if isinstance(p, Prepared)]
    encoder = Encoder(str(model), dtype="float32")
    means = HashtagMeans(encoder.dim)
    means.update_batch([p.hashtags for p in prepared], encoder.encode([p.text for p in prepared]))
    return means


def batch_reservoir(lines: list[str], size: int = 20) -> dict[str, list[str]]:
    """The coherence sample ``reval thesaurus coherence`` takes of the same tweets."""
    cleaner = Cleaner()
    prepared = [p for p in (cleaner(parse_tweet(line)) for line in lines) if isinstance(p, Prepared)]
    return bottom_k(
        [(t, coherence_text(p.text)) for p in prepared for t in p.hashtags if coherence_text(p.text)], size
    )


def assert_reservoir_equal(stack: Stack, lines: list[str]) -> None:
    """The embed workers' reservoir holds exactly the batch's bottom-k samples: redelivered
    tweets changed nothing."""
    expected = batch_reservoir(lines)
    reservoir = RedisReservoir(redis.Redis.from_url(stack.redis_url), stack.prefix, 20)
    assert reservoir.hashtags() == set(expected)
    assert reservoir.samples(expected) == expected


def means_of(stack: Stack) -> dict[str, Any]:
    return RedisMeans.from_url(stack.redis_url, prefix=stack.prefix, cluster=stack.redis_cluster).read_all()


def assert_means_equal(stack: Stack, expected: HashtagMeans) -> None:
    """Exactly the batch recomputation: the same hashtags, counts, and means to 1e-6."""
    got = means_of(stack)
    assert {t: s.count for t, s in got.items()} == {t: s.count for t, s in expected.states.items()}
    for tag, state in expected.states.items():
        np.testing.assert_allclose(got[tag].get(), state.get(), atol=1e-6, err_msg=tag)


def counts_reach(stack: Stack, expected: HashtagMeans) -> bool:
    try:
        got = means_of(stack)
    except redis.RedisError:  # the chaos tests stop Redis on purpose
        return False
    return {t: s.count for t, s in got.items()} == {t: s.count for t, s in expected.states.items()}


def plain_tweets(n: int, start: int = 0) -> list[str]:
    """Sample tweets without retweets: which of a tweet and its retweet is "first" differs
    between partitions processed in parallel; these tests are about redelivery and faults."""
    return [line for line in tweet_lines(sample_feed(), n, start=start) if '"text": "RT @' not in line]
