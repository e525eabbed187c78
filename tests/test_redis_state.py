"""Retweet claims and the recommendation/tweet join, against the real Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from stream.intake.cleaning import Cleaner, Dropped, Prepared
from stream.intake.records import parse_tweet
from workers.adapters.redis.redis_state import RedisClaims, RedisJoin, RedisSeen

pytestmark = pytest.mark.integration


@pytest.fixture
def client(redis_url: str, redis_prefix: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    for key in c.scan_iter(f"{redis_prefix}:*"):
        c.delete(key)


def test_claims_are_first_come_and_idempotent(client: redis.Redis, redis_prefix: str) -> None:
    seen = RedisSeen(client, redis_prefix, ttl=60)
    assert seen.claim(["a", "b"], "t:0:1") == [True, True]
    assert seen.claim(["a", "c"], "t:0:2") == [False, True]
    assert seen.claim(["a", "b"], "t:0:1") == [True, True]  # redelivery of the first record
    client.script_flush()  # NOSCRIPT is handled by reloading
    assert seen.claim_many([(["a"], "t:0:3"), (["d"], "t:0:3")]) == [[False], [True]]


def test_a_batch_of_claims_on_a_cluster_is_one_script_call_per_slot(redis_cluster) -> None:
    """The same answers as claims one at a time, whichever slots the keys fall in: the first
    claimant of a key owns it, a redelivery (same claimant) still owns it, a key twice in a batch
    goes to its first claimant."""
    from redis.cluster import RedisCluster

    client = RedisCluster.from_url(redis_cluster.url)
    try:
        claims = RedisClaims(client, "claimtest", "ev", ttl=60)
        keys = [f"k{i}" for i in range(40)]  # spread over many slots
        assert len({client.keyslot(f"claimtest:ev:{k}") for k in keys}) > 10
        first = claims.claim_many([([k], f"c{i}") for i, k in enumerate(keys)])
        assert first == [[True]] * 40
        again = claims.claim_many([([k], f"c{i}" if i % 2 else "other") for i, k in enumerate(keys)])
        assert again == [[bool(i % 2)] for i in range(40)]
        assert claims.claim_many([(["new", "new"], "a"), (["new"], "b")]) == [[True, True], [False]]
    finally:
        for key in client.scan_iter(match="claimtest:*", target_nodes=RedisCluster.ALL_NODES):
            client.delete(key)
        client.close()


def test_cleaner_with_redis_claims_matches_memory(client: redis.Redis, redis_prefix: str) -> None:
    tweets = [
        parse_tweet({"id": str(i), "text": text, "lang": "en"})
        for i, text in enumerate(
            [
                "Water rising fast in the valley #flood",
                "RT @a: Water rising fast in the valley #flood",
                "RT @b: Water rising fast in the valley #flood",
                "RT @c: Roads closed #flood #roads",
            ]
        )
    ]
    memory, shared = Cleaner(), Cleaner(seen=RedisSeen(client, redis_prefix))
    for tweet in tweets:
        a, b = memory(tweet), shared(tweet)
        assert type(a) is type(b)
        if isinstance(a, Prepared) and isinstance(b, Prepared):
            assert a.hashtags == b.hashtags
        elif isinstance(a, Dropped) and isinstance(b, Dropped):
            assert a.reason == b.reason


def test_join_in_either_order_and_settled_only_when_told(client: redis.Redis, redis_prefix: str) -> None:
    join = RedisJoin(client, redis_prefix, window=30)
    # event first, then its tweet
    assert join.put_events([("1", "0:10", '{"e": 1}')], now=100.0) == [("wait", None)]
    assert join.pending() == 1 and join.stored_bytes() == len('{"e": 1}')
    answered = join.put_tweets([("1", ["flood", "help"])])
    assert [(a.tweet_id, a.event_id, a.payload, a.truth) for a in answered] == [
        ("1", "0:10", '{"e": 1}', ["flood", "help"])
    ]
    # Not settled yet (say the scorer died before its score was acknowledged): the tweet,
    # redelivered, answers the event again.
    assert [a.event_id for a in join.put_tweets([("1", ["flood", "help"])])] == ["0:10"]
    join.settle([("1", "0:10")])
    assert join.pending() == 0 and join.stored_bytes() == 0
    assert join.put_tweets([("1", ["flood", "help"])]) == []
    # tweet first, then the event: a match, which a crash before settling lets redeliver
    assert join.put_tweets([("2", [])]) == []
    assert join.put_events([("2", "0:11", "{}")], now=100.0) == [("match", [])]
    assert join.put_events([("2", "0:11", "{}")], now=100.0) == [("match", [])]
    join.settle([("2", "0:11")])
    assert join.put_events([("2", "0:11", "{}"), ("1", "0:10", "{}")], now=100.0) == [
        ("dup", None),
        ("dup", None),
    ]


def test_expiry_leaves_answered_events_to_the_join(client: redis.Redis, redis_prefix: str) -> None:
    join = RedisJoin(client, redis_prefix, window=10)
    join.put_events([("9", "1:1", "late"), ("8", "1:2", "later"), ("7", "1:3", "answered")], now=0.0)
    join.put_tweets([("7", ["x"])])  # its tweet came: the join, not expiry, settles it
    assert join.due(now=5.0) == []
    due = join.due(now=11.0)
    assert sorted(a.payload for a in due) == ["late", "later"]
    assert sorted(a.payload for a in join.due(now=11.0)) == ["late", "later"]  # until settled
    join.settle([(a.tweet_id, a.event_id) for a in due])
    assert join.due(now=11.0) == [] and join.pending() == 1  # "answered" waits for its settle
