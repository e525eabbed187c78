"""Broker failover, proven on Apache Kafka with real processes and kill -9.

Each test runs its own KRaft cluster (the session's broker must survive the suite) and the real
workers, and checks the results against the batch recomputation:

* one node killed -9 mid-stream and restarted on the same data: the running means exact, every
  event scored, nothing lost;
* three nodes (replication factor 3, ``min.insync.replicas=2``, ``acks=all``): the leader of the
  busiest partition killed -9 mid-stream and restarted later, then a rolling restart of all
  three; the workers ride through (no restart), nothing is lost, the means are exact;
* a consumer group of three score workers on six partitions: one killed -9, one started again:
  every event scored.

(A topic really deleted and re-created -- a new topic id -- is in test_chaos.py; it runs on the
session's Apache Kafka.)
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from kafka.errors import KafkaError

from stream.intake.records import parse_tweet
from stream.synonyms.means import HashtagMeans
from tests.live import assert_means_equal, batch_means, counts_reach, plain_tweets
from workers.adapters.kafka.kafka_client import BrokerError
from workers.dev.kafka_cluster import KafkaCluster
from workers.dev.stack import Stack, Worker, keyed, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def events_for(lines: Sequence[str], recommenders: int = 2) -> list[tuple[bytes, bytes]]:
    """Recommendation events with their ground truth, one per hashtagged tweet."""
    tagged = [t for t in (parse_tweet(line) for line in lines) if t.hashtags]
    return [
        (
            t.id.encode(),
            json.dumps(
                {
                    "tweet_id": t.id,
                    "recommender": f"rec{i % recommenders}",
                    "recommended": ["flood", "sandy", "news", "terremoto"],
                    "ground_truth": list(t.hashtags),
                }
            ).encode(),
        )
        for i, t in enumerate(tagged)
    ]


def settled(stack: Stack, wanted: set[str]) -> set[str]:
    """The wanted events that have a score or a dead letter so far."""
    done = {r["tweet_id"] for r in stack.read_json("scores")}
    done |= {letter["key"] for letter in stack.read_json("dead_letter") if letter.get("key")}
    return done & wanted


def assert_scores_consistent(stack: Stack) -> None:
    """A redelivered event scored on the same thesaurus version gets the same score."""
    by_key: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for result in stack.read_json("scores"):
        by_key.setdefault((result["tweet_id"], result["index_version"]), []).append(result)
    for rows in by_key.values():
        assert all(row["reval_hit_ratio"] == rows[0]["reval_hit_ratio"] for row in rows)


def leader_of(cluster: KafkaCluster, topic: str, partition: int) -> int | None:
    """The partition's leader, or None while the cluster cannot say (kafka-python's admin may
    send its request to the node just killed, which metadata still lists until it is fenced)."""
    try:
        return cluster.leader(topic, partition)
    except (KafkaError, BrokerError):
        return None


def alive(*workers: Worker) -> None:
    for worker in workers:
        assert worker.proc.poll() is None, f"worker {worker.roles} died:\n{worker.text()[-3000:]}"


def close(stack: Stack) -> None:
    stack.close()
    for worker in stack.workers:
        assert worker.proc.poll() is not None, f"worker {worker.roles} still running"


def start_all_roles(
    stack: Stack, tweets: int, events: int, timeout: float
) -> tuple[list[str], HashtagMeans, list[tuple[bytes, bytes]], Worker]:
    """The workload (tweets, their batch means, recommendation events) and one worker of
    every role, ready."""
    lines = plain_tweets(tweets)
    expected = batch_means(lines, stack.model)
    recs = events_for(plain_tweets(events, start=3000))
    worker = stack.start("embed", "index", "score")
    stack.wait_ready(worker, timeout=timeout)
    return lines, expected, recs, worker


def assert_nothing_lost(
    stack: Stack, expected: HashtagMeans, events: list[tuple[bytes, bytes]], timeouts: tuple[float, float]
) -> None:
    """Every tweet applied once, every event settled, redeliveries scored alike, no dead letter."""
    wait_for("every tweet applied", lambda: counts_reach(stack, expected), timeouts[0], 1.0)
    time.sleep(2)  # and nothing applied twice after the counts matched
    assert_means_equal(stack, expected)
    wanted = {key.decode() for key, _ in events}
    wait_for("every event settled", lambda: settled(stack, wanted) == wanted, timeouts[1], 1.0)
    assert_scores_consistent(stack)
    assert stack.read_json("dead_letter") == []


@pytest.fixture
def one_node(tmp_path: Path) -> Iterator[KafkaCluster]:
    with KafkaCluster(nodes=1, data_dir=tmp_path / "kafka") as cluster:
        yield cluster


@pytest.fixture
def three_nodes(tmp_path: Path) -> Iterator[KafkaCluster]:
    with KafkaCluster(nodes=3, data_dir=tmp_path / "kafka", heap="384m") as cluster:
        yield cluster


def test_kill_9_of_the_only_broker_mid_stream_loses_nothing(
    one_node: KafkaCluster, redis_url: str, tiny_bertweet: Path, tmp_path: Path
) -> None:
    stack = Stack(one_node.bootstrap, redis_url, tiny_bertweet, tmp_path / "stack", partitions=2)
    try:
        lines, expected, events, worker = start_all_roles(stack, 1200, 900, timeout=180)
        half, third = len(lines) // 2, len(events) // 3
        stack.send("tweets", keyed(lines[:half]))
        stack.send("recommendations", events[:third])
        time.sleep(1.5)  # mid-stream: the worker is embedding and scoring
        one_node.kill(1)
        time.sleep(5)  # the workers see a dead broker: connections refused, nothing to commit
        one_node.start_node(1)
        stack.send("tweets", keyed(lines[half:]))
        stack.send("recommendations", events[third:])

        assert_nothing_lost(stack, expected, events, timeouts=(300, 240))
        alive(worker)  # it rode through the outage: no supervisor restarted it
    finally:
        close(stack)


def test_the_brokers_disk_full_mid_stream_loses_nothing(
    redis_url: str, tiny_bertweet: Path, tmp_path: Path
) -> None:
    """The broker's disk full while the workers produce (issue 38 §3): the only node's log
    directory on a small tmpfs, filled to the last byte mid-stream. Kafka cannot append
    (its log directory goes offline and the broker stops -- it has no other); the workers
    wait, unacknowledged. Space freed and the node started again on its data: every tweet
    applied once, every event settled, no dead letter, the worker never restarted."""
    logs = tmp_path / "kafka-logs"
    logs.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=160m", "tmpfs", str(logs)], capture_output=True
    )
    if done.returncode != 0:  # not root, or no CAP_SYS_ADMIN in this container
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    filler = logs / "filler"
    try:
        with KafkaCluster(nodes=1, data_dir=tmp_path / "kafka", config={"log.dirs": str(logs)}) as cluster:
            stack = Stack(cluster.bootstrap, redis_url, tiny_bertweet, tmp_path / "stack", partitions=2)
            try:
                lines, expected, events, worker = start_all_roles(stack, 1200, 900, timeout=180)
                half, third = len(lines) // 2, len(events) // 3
                stack.send("tweets", keyed(lines[:half]))
                stack.send("recommendations", events[:third])
                time.sleep(1.0)  # mid-stream: the worker is embedding, scoring and producing
                # until ENOSPC: the workers' next scores, offsets and dead letters find no room
                subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)
                log = cluster.data_dir / "node-1" / "server.log" if cluster.data_dir else None
                wait_for("the broker to stop on the full disk", lambda: cluster.pid(1) is None, 120, 0.5)
                assert log is not None
                why = _disk_full_evidence(log.read_text(errors="replace"))
                assert why, f"the broker stopped, but not on a full disk: {_errors(log)}"
                time.sleep(3)  # the workers see a dead broker
                alive(worker)
                filler.unlink()
                cluster.stop_node(1)  # already stopped: closes its log
                cluster.start_node(1)  # on its data: Kafka recovers the logs it was writing
                stack.send("tweets", keyed(lines[half:]))
                stack.send("recommendations", events[third:])

                assert_nothing_lost(stack, expected, events, timeouts=(300, 240))
                alive(worker)
            finally:
                close(stack)
    finally:
        subprocess.run(["umount", "-l", str(logs)], capture_output=True)


#: How the JVM reports the full tmpfs: a write(2) that fails (an IOException), or a store into a
#: memory-mapped index page the tmpfs cannot back (SIGBUS, which the JVM raises as an
#: InternalError in the appending thread -- the raft thread's, for the metadata log).
_DISK_FULL = ("No space left on device", "unsafe memory access operation")


def _disk_full_evidence(log: str) -> list[str]:
    return [sign for sign in _DISK_FULL if sign in log]


def _errors(log: Path, most: int = 12) -> str:
    """The broker log's ERROR lines and exception lines, for a failure message."""
    lines = log.read_text(errors="replace").splitlines()
    wanted = [ln for ln in lines if " ERROR " in ln or "Exception" in ln or "Error:" in ln]
    return "\n".join(wanted[-most:]) or "\n".join(lines[-most:])


def _send_slowly(
    stack: Stack, topic: str, records: list[tuple[bytes, bytes]], chunks: int
) -> threading.Thread:
    """Produce in chunks from a thread, so faults land while records are in flight."""

    def run() -> None:
        size = max(1, len(records) // chunks)
        for start in range(0, len(records), size):
            stack.send(topic, records[start : start + size])
            time.sleep(0.3)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_three_nodes_leader_kill_and_rolling_restart_lose_nothing(
    three_nodes: KafkaCluster, redis_url: str, tiny_bertweet: Path, tmp_path: Path
) -> None:
    cluster = three_nodes
    stack = Stack(
        cluster.bootstrap, redis_url, tiny_bertweet, tmp_path / "stack", partitions=3, replication=3
    )
    try:
        lines, expected, events, worker = start_all_roles(stack, 1500, 1200, timeout=240)
        tweets = list(keyed(lines))
        third, ev_third = len(tweets) // 3, len(events) // 3
        stack.send("tweets", tweets[:third])
        stack.send("recommendations", events[:ev_third])

        # kill -9 the leader of the busiest tweets partition while records are in flight
        topic = stack.topics["tweets"]
        counts = [0] * stack.partitions
        for record in stack.read("tweets"):
            counts[record.partition] += 1
        busiest = max(range(stack.partitions), key=counts.__getitem__)
        leader = cluster.leader(topic, busiest)
        sender = _send_slowly(stack, "tweets", tweets[third : 2 * third], chunks=6)
        time.sleep(0.6)
        cluster.kill(leader)
        wait_for("a new leader", lambda: leader_of(cluster, topic, busiest) not in (None, leader), 60, 0.5)
        stack.send("recommendations", events[ev_third : 2 * ev_third])
        sender.join(120)
        time.sleep(3)
        cluster.start_node(leader)

        # a rolling restart of all three, clean shutdowns, records in flight
        sender = _send_slowly(stack, "tweets", tweets[2 * third :], chunks=9)
        for node in cluster.node_ids:
            cluster.stop_node(node)
            time.sleep(2)
            cluster.start_node(node)
        sender.join(180)
        stack.send("recommendations", events[2 * ev_third :])

        assert_nothing_lost(stack, expected, events, timeouts=(360, 300))
        alive(worker)  # the worker rode through the leader kill and the rolling restart
    finally:
        close(stack)


def test_three_score_workers_on_six_partitions_survive_a_kill(
    broker: str, redis_url: str, tiny_bertweet: Path, tmp_path: Path
) -> None:
    stack = Stack(broker, redis_url, tiny_bertweet, tmp_path, partitions=6)
    try:
        lines = plain_tweets(600)
        embed_index = stack.start("embed", "index")
        scores = [stack.start("score") for _ in range(3)]
        stack.wait_ready(embed_index, *scores, timeout=240)
        stack.send("tweets", keyed(lines))
        from workers.adapters.files.store import ThesaurusStore

        wait_for("a first index version", ThesaurusStore(stack.index_dir).current_version, 120)
        events = events_for(plain_tweets(1800, start=3000), recommenders=3)
        third = len(events) // 3
        topic = stack.topics["recommendations"]
        stack.send("recommendations", events[:third])
        wait_for(
            "all three score workers consuming",
            lambda: all(w.metric("reval_records_consumed_total", topic=topic) > 0 for w in scores),
            120,
        )
        sender = _send_slowly(stack, "recommendations", events[third : 2 * third], chunks=4)
        time.sleep(0.5)
        scores[1].kill9()  # its partitions move to the other two, mid-batch
        sender.join(120)
        scores[1] = stack.start("score")
        stack.wait_ready(scores[1], timeout=180)
        stack.send("recommendations", events[2 * third :])

        wanted = {key.decode() for key, _ in events}
        wait_for("every event settled", lambda: settled(stack, wanted) == wanted, 240, 1.0)
        assert_scores_consistent(stack)
        assert stack.read_json("dead_letter") == []
        alive(embed_index, scores[0], scores[2])
    finally:
        close(stack)
