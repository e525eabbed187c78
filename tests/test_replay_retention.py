"""Replays against Kafka's retention, on Apache Kafka whose retention check runs every second
(so a record the topic would delete is deleted before anyone reads it: certain, not a race).

The judge is the batch recomputation: every replayed tweet embedded exactly once.  The
replay's test runs first, on the fresh cluster: its worker's log (a normal start, run and
stop) holds no ERROR line."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from stream.feeds.replay import timestamp_ms
from stream.intake.records import parse_time
from tests.live import assert_means_equal, batch_means, counts_reach, plain_tweets, run_reval
from workers.adapters.kafka.kafka_client import create_topics, partition_heads, topic_retention
from workers.adapters.redis.redis_client import connect
from workers.commands.worker import check_input_retention
from workers.dev.kafka_cluster import KafkaCluster
from workers.dev.stack import Stack, wait_for
from workers.service.incarnation import batch_group, group_generation
from workers.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WEEK_MS = 604_800_000


@pytest.fixture(scope="module")
def fast_retention(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    config = {"log.retention.check.interval.ms": "1000"}
    with KafkaCluster(nodes=1, data_dir=tmp_path_factory.mktemp("kafka-retention"), config=config) as cluster:
        yield cluster


def _offsets(bootstrap: str, topic: str) -> tuple[dict[int, int], dict[int, int]]:
    """(log start, end) offset of every partition of ``topic``."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        starts, ends = consumer.beginning_offsets(parts), consumer.end_offsets(parts)
        return {tp.partition: starts[tp] for tp in parts}, {tp.partition: ends[tp] for tp in parts}
    finally:
        consumer.close()


def test_a_2012_archive_is_refused_or_replayed_and_every_tweet_embedded(
    fast_retention: KafkaCluster, redis_url: str, tiny_bertweet: Path, tmp_path: Path
) -> None:
    bootstrap = fast_retention.bootstrap
    stack = Stack(bootstrap, redis_url, tiny_bertweet, tmp_path, input_retention_ms=WEEK_MS)
    try:
        lines = plain_tweets(300)
        feed = tmp_path / "archive.jsonl"
        feed.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        topic = stack.topics["tweets"]

        refused = run_reval("replay", str(feed), env=stack.env, timeout=120)
        assert refused.returncode == 2, refused.stderr
        errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, refused.stderr
        assert f"topic {topic!r}" in errors[0] and "retention.ms=604800000" in errors[0]
        assert "--timestamps now" in errors[0] and "2012-" in errors[0]
        assert _offsets(bootstrap, topic)[1] == dict.fromkeys(range(stack.partitions), 0), "sent anyway"

        # The cluster is fresh: this is its first consumer group (no __consumer_offsets yet).
        worker = stack.start("embed", "index", "score")
        stack.wait_ready(worker)
        sent = run_reval("replay", str(feed), "--timestamps", "now", "--json", env=stack.env, timeout=180)
        assert sent.returncode == 0, sent.stderr
        summary = json.loads(sent.stdout.strip().splitlines()[-1])
        assert summary["produced"] == len(lines) and summary["first_event"].startswith("2012-")

        expected = batch_means(lines, tiny_bertweet)
        wait_for("every tweet embedded", lambda: counts_reach(stack, expected), timeout=180)
        time.sleep(3)  # three retention checks after the last tweet was read: nothing deleted
        assert_means_equal(stack, expected)
        starts, ends = _offsets(bootstrap, topic)
        assert set(starts.values()) == {0} and sum(ends.values()) == len(lines)
        worker.stop()
        assert "[ERROR]" not in worker.text(), "an ERROR line in a normal start, run and stop"
    finally:
        stack.close()


def test_the_broker_deletes_unread_records_stamped_with_their_2012_event_time(
    fast_retention: KafkaCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The fault this guards against is real here: 2012 timestamps into a 7-day topic are
    gone within seconds, unread -- and a worker's start-up check names them."""
    bootstrap, topic = fast_retention.bootstrap, "old-stamps"
    settings = Settings(broker=bootstrap, topic_tweets=topic, input_retention_ms=-1)
    redis = connect(settings.redis_url)
    generation = group_generation(redis, settings.redis_prefix)
    redis.close()
    group = batch_group(settings.app_id, "embed", generation)  # the embed workers' group, late to read
    create_topics(bootstrap, {topic: 1}, configs={topic: {"retention.ms": str(WEEK_MS)}})
    # A group that had read nothing yet: its committed offset is 0.
    reader = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    reader.commit({TopicPartition(topic, 0): OffsetAndMetadata(0, "", -1)})
    reader.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    old = timestamp_ms(parse_time("2012-10-29T00:00:00Z"))
    for i in range(50):
        producer.send(topic, f"tweet {i}".encode(), timestamp_ms=old + i)
    producer.flush()
    producer.close()
    wait_for("the broker's retention check", lambda: _offsets(bootstrap, topic)[0][0] == 50, timeout=30)
    retention = topic_retention(bootstrap, [topic])[topic]
    assert retention is not None and retention.retention_ms == WEEK_MS and retention.deletes_by_time
    heads = partition_heads(bootstrap, group, topic)
    assert [(h.log_start, h.end, h.committed) for h in heads] == [(50, 50, 0)]

    with caplog.at_level(logging.WARNING, logger="reval.workers"):
        check_input_retention(settings, ["embed"], faust_group=group)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("shorter than REVAL_INPUT_RETENTION_MS=-1" in line for line in said), said
    assert any(
        f"{topic}[0]: 50 records (offsets 0-49) were deleted by the broker before group {group!r}" in line
        for line in said
    ), said
