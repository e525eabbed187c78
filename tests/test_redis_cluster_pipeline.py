"""The live pipeline on a Redis Cluster (3 masters + 3 replicas): real worker processes with
``REVAL_REDIS_CLUSTER=true`` on Apache Kafka, the running means, the retweet and event
claims, the score join and the thesaurus all in the cluster -- and a master killed
mid-stream, its replica cut off first so that asynchronous replication loses what the
master took after that.

What must hold: the running means equal the batch recomputation exactly and every event is
scored, with the replication barrier (the default on a cluster); without it
(``REVAL_REDIS_REPLICAS=0``) the same faults lose acknowledged tweets -- the test would see
it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from stream.intake.records import parse_tweet
from stream.synonyms.means import HashtagMeans
from tests.conftest import start_redis_cluster
from tests.live import assert_means_equal, batch_means, counts_reach, means_of, plain_tweets
from workers.adapters.redis.redis_client import connect
from workers.adapters.redis.redis_means import RedisMeans
from workers.adapters.redis.redis_thesaurus import RedisThesauri
from workers.dev.redis_cluster import LocalRedisCluster
from workers.dev.stack import Stack, Worker, keyed, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def cluster_stack(broker: str, cluster: LocalRedisCluster, model: Path, workdir: Path, **env: str) -> Stack:
    return Stack(
        broker,
        cluster.url,
        model,
        workdir,
        redis_cluster=True,
        extra_env={"REVAL_JOIN_WINDOW_S": "120", "REVAL_REDIS_REPLICA_TIMEOUT_S": "0.5", **env},
    )


def events_for(lines: list[str], with_truth_every: int = 3) -> list[dict[str, Any]]:
    """One event per tagged tweet; every ``with_truth_every``-th carries its ground truth,
    the others wait in the join for their tweet."""
    tagged = [t for t in (parse_tweet(line) for line in lines) if t.hashtags]
    out = []
    for i, tweet in enumerate(tagged):
        event: dict[str, Any] = {
            "tweet_id": tweet.id,
            "recommender": f"rec{i % 2}",
            "recommended": ["terremoto", "flood", "news", "sandy"],
        }
        if i % with_truth_every == 0:
            event["ground_truth"] = list(tweet.hashtags)
        out.append(event)
    return out


def send_events(stack: Stack, events: list[dict[str, Any]]) -> None:
    stack.send("recommendations", [(e["tweet_id"].encode(), json.dumps(e).encode()) for e in events])


def scored(stack: Stack) -> Counter[str]:
    return Counter(r["tweet_id"] for r in stack.read_json("scores"))


def keys_per_master(cluster: LocalRedisCluster, prefix: str) -> dict[int, int]:
    counts = {}
    for port in cluster.master_ports():
        with redis.Redis(port=port) as node:
            counts[port] = sum(1 for _ in node.scan_iter(match=f"{prefix}:*", count=1000))
    return counts


def test_the_pipeline_runs_on_a_redis_cluster(
    broker: str, redis_cluster: LocalRedisCluster, tiny_bertweet: Path, tmp_path: Path
) -> None:
    """Means, claims, the join and thesaurus versions through the cluster: the means equal the
    batch recomputation, every event is scored once, the scorer loads a version from the
    cluster, and the keys are spread over all three masters (hash tags, not one slot)."""
    stack = cluster_stack(broker, redis_cluster, tiny_bertweet, tmp_path)
    try:
        embed, score = stack.start("embed", "index"), stack.start("score")
        stack.wait_ready(embed, score, timeout=180)
        lines = plain_tweets(800)  # 352 tweets (retweets left out)
        expected = batch_means(lines, stack.model)
        events = events_for(lines)
        early = [e for e in events if "ground_truth" not in e][::2]  # these wait for their tweets
        send_events(stack, early)
        stack.send("tweets", keyed(lines))
        send_events(stack, [e for e in events if e not in early])

        wait_for("every tweet applied", lambda: counts_reach(stack, expected), 180, 1.0)
        assert_means_equal(stack, expected)
        wanted = Counter(e["tweet_id"] for e in events)
        wait_for("every event scored", lambda: scored(stack) == wanted, 120, 1.0)
        assert not stack.read_json("dead_letter")
        assert score.metric("reval_join_total", outcome="matched") == len(
            [e for e in events if "ground_truth" not in e]
        )

        client = connect(stack.redis_url, cluster=True)
        version = wait_for(
            "a version in the cluster", RedisThesauri(client, stack.prefix).current_version, 60
        )
        wait_for(
            "the scorer on it",
            lambda: score.metric("reval_scoring_thesaurus_version") == int(version[1:]),
            60,
        )
        client.close()
        spread = keys_per_master(redis_cluster, stack.prefix)
        assert len(spread) == 3 and all(n > 0 for n in spread.values()), spread
        assert embed.proc.poll() is None and score.proc.poll() is None
    finally:
        stack.close()
    assert sum(keys_per_master(redis_cluster, stack.prefix).values()) == 0  # close() cleared the cluster


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[LocalRedisCluster]:
    """A cluster of the test's own: its nodes are killed."""
    cluster = start_redis_cluster(tmp_path / "redis-cluster")
    yield cluster
    cluster.stop()


def assert_rode_through(
    stack: Stack, embed: Worker, score: Worker, expected: HashtagMeans, events: list[dict[str, Any]]
) -> None:
    """With the barrier: means exact, every event scored, no worker died, no rollback reported."""
    wait_for("every tweet applied", lambda: counts_reach(stack, expected), 180, 1.0)
    assert_means_equal(stack, expected)
    wanted = Counter(e["tweet_id"] for e in events)
    wait_for("every event scored", lambda: set(scored(stack)) >= set(wanted), 120, 1.0)
    assert not [d for d in stack.read_json("dead_letter") if d["reason"] == "join_expired"]
    assert embed.proc.poll() is None and score.proc.poll() is None  # rode through
    assert embed.metric("reval_redis_unavailable") == 0
    for worker in (embed, score):  # nothing lost, no false alarm
        assert worker.metric("reval_redis_rollbacks_total") == 0


def assert_loss_reported(stack: Stack, embed: Worker, expected: HashtagMeans, on_master: set[str]) -> None:
    """Without it: the rollback reported, the lost master's hashtags short (never doubled),
    every other hashtag whole."""
    wait_for(
        "the rollback reported",
        lambda: embed.metric("reval_redis_rollbacks_total") >= 1,
        120,
        1.0,
    )
    others = {t: s.count for t, s in expected.states.items() if t not in on_master}

    def rest() -> dict[str, int]:
        return {t: s.count for t, s in means_of(stack).items() if t not in on_master}

    wait_for("the other masters' hashtags whole", lambda: rest() == others, 120, 1.0)
    got = means_of(stack)
    lost = {t: expected.states[t].count - (got[t].count if t in got else 0) for t in on_master}
    assert any(n > 0 for n in lost.values()), "nothing was lost: the fault did not bite"
    assert all(n >= 0 for n in lost.values())  # lost, never counted twice


@pytest.mark.parametrize("barrier", [True, False], ids=["barrier", "no-barrier"])
def test_kill_9_of_a_master_mid_stream(
    broker: str, own_cluster: LocalRedisCluster, tiny_bertweet: Path, tmp_path: Path, barrier: bool
) -> None:
    """kill -9 of the busiest master while its replica is cut off and the workers stream: with
    the barrier the workers hold their batches (unacknowledged) until the promoted replica has
    a replica again, then ride on -- means exact, every event scored, no worker died, no
    rollback reported; without it (``REVAL_REDIS_REPLICAS=0``) the acknowledged tweets of
    that master's hashtags are lost -- and ``reval_redis_rollbacks_total`` says so."""
    cluster = own_cluster
    env = {} if barrier else {"REVAL_REDIS_REPLICAS": "0"}
    stack = cluster_stack(broker, cluster, tiny_bertweet, tmp_path, **env)
    try:
        embed, score = stack.start("embed"), stack.start("score")
        stack.wait_ready(embed, score, timeout=180)
        lines = plain_tweets(1000)  # 463 tweets (retweets left out)
        first, second, third = lines[:150], lines[150:400], lines[400:]
        stack.send("tweets", keyed(first))
        wait_for(
            "the first tweets applied", lambda: counts_reach(stack, batch_means(first, stack.model)), 180, 1
        )

        expected = batch_means(lines, stack.model)
        store = RedisMeans.from_url(stack.redis_url, prefix=stack.prefix, cluster=True)
        load = Counter(cluster.master_of(store.key(tag)) for tag in expected.states)
        master = load.most_common(1)[0][0]
        on_master = {tag for tag in expected.states if cluster.master_of(store.key(tag)) == master}
        replica = cluster.replicas_of(master)[0]
        cluster.cut_off(replica)

        events = events_for(second)
        stack.send("tweets", keyed(second))
        send_events(stack, events)
        topic = stack.topics["tweets"]
        if barrier:
            wait_for(
                "the embed worker holding its batch",
                lambda: embed.metric("reval_redis_waits_total", error="ReplicationLagError") > 0,
                60,
                0.2,
            )
            assert embed.metric("reval_records_consumed_total", topic=topic) < len(lines)
        else:
            applied = batch_means(first + second, stack.model)
            wait_for("every tweet applied on the master", lambda: counts_reach(stack, applied), 180, 1)

        cluster.kill(master)
        cluster.resume(replica)
        assert cluster.wait_failover(master) == replica
        cluster.start_node(master)  # back as the new master's replica
        cluster.wait_ready()
        stack.send("tweets", keyed(third))  # after the failover

        if barrier:
            assert_rode_through(stack, embed, score, expected, events)
        else:
            assert_loss_reported(stack, embed, expected, on_master)
    finally:
        stack.close()
