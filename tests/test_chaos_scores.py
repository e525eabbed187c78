"""No input and no shutdown can lose a score (issue 23): real `reval worker` processes on
Apache Kafka and a private Redis server, faults injected, every event accounted for.

* an output at every size around the producer's limit, each between 200 normal events:
  the worker lives, each event scored or dead-lettered exactly once (N1);
* SIGTERM while Redis is down: the taken batch is redelivered, all 200 events scored (N2);
* every secret setting absent from every log, at debug level, libraries included (N3);
* a damaged current thesaurus version at start-up: the newest intact one is used and
  named in the scores (N4);
* the outcome counters add up to the events consumed (N5).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.test_chaos import RedisServer
from tests.thesauri import paired_thesaurus
from workers.dev.stack import Stack, wait_for

if TYPE_CHECKING:
    from workers.dev.kafka_cluster import KafkaCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    yield server
    server.stop()


def event(tweet_id: str, **fields: Any) -> tuple[bytes, bytes]:
    body = {"tweet_id": tweet_id, "recommender": "r", "recommended": ["flood", "help"]}
    body.setdefault("ground_truth", ["flood"])
    body.update(fields)
    return tweet_id.encode(), json.dumps(body, ensure_ascii=False).encode()


def outcome_counts(stack: Stack) -> Counter[str]:
    """How often each event id got a score or a dead letter (keyed by the event's key)."""
    got: Counter[str] = Counter(r["tweet_id"] for r in stack.read_json("scores"))
    got.update(d["key"] for d in stack.read_json("dead_letter"))
    return got


# --------------------------------------------------------------------------- N2


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_while_redis_is_down_loses_no_score(
    broker: str, private_redis: RedisServer, tiny_bertweet: Path, tmp_path: Path, stop: signal.Signals
) -> None:
    """N2: the score agent's back-pressure check met the stop outside the guarded path; the
    agent crashed, Faust acknowledged the taken batch and committed it: 0 of 200 scored."""
    stack = Stack(broker, private_redis.url, tiny_bertweet, tmp_path)
    try:
        score = stack.start("score")
        stack.wait_ready(score)
        private_redis.stop()
        stack.send("recommendations", [event(f"e{i}") for i in range(200)])
        wait_for("the scorer waiting on Redis", lambda: score.metric("reval_redis_unavailable") == 1, 60, 0.2)
        score.proc.send_signal(stop)
        assert score.proc.wait(30) == 0
        private_redis.start()
        again = stack.start("score")
        stack.wait_ready(again)
        wanted = {f"e{i}" for i in range(200)}
        wait_for("200 scores", lambda: {r["tweet_id"] for r in stack.read_json("scores")} >= wanted, 90, 1)
        time.sleep(2)
        counts = Counter(r["tweet_id"] for r in stack.read_json("scores"))
        assert set(counts) == wanted and set(counts.values()) == {1}
        assert stack.read_json("dead_letter") == []
    finally:
        stack.close()


# --------------------------------------------------------------------------- N1

LIMIT = 1_000_000  # REVAL_MAX_MESSAGE_BYTES's default: the producer's max_request_size
SHIN = "\ufb2c"  # 3 bytes in UTF-8; NFC makes it 3 code points of 2 bytes: 6 bytes in a score


def produced_size(key: bytes, value: bytes) -> int:
    """What aiokafka's producer counts against ``max_request_size`` for one record."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    return int(DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, []))


def score_output(tweet_id: str, body: dict[str, Any]) -> tuple[bytes, bytes]:
    """The score record a worker without a thesaurus writes for ``body`` (its key and value)."""
    from stream.evaluation.neighbours import NeighbourCache
    from stream.evaluation.scoring import DEFAULT_KS, DEFAULT_RS, score_batch
    from stream.intake.records import parse_recommendation
    from workers.service.runtime import encode_json
    from workers.service.score import EMPTY

    event = parse_recommendation(json.dumps(body, ensure_ascii=False).encode())
    assert event.ground_truth is not None and event.ts is not None
    (value,) = score_batch(
        [(event, event.ground_truth)], NeighbourCache(EMPTY, max_k=70), DEFAULT_KS, DEFAULT_RS
    ).records()
    value.update(index_version=None, event_time=event.ts.timestamp(), ground_truth=list(event.ground_truth))
    return tweet_id.encode(), encode_json(value)


def event_of_output_size(tweet_id: str, target: int) -> tuple[bytes, bytes]:
    """An event under the 512 KB input limit whose score counts ``target`` bytes at the
    producer: 100 ground-truth hashtags of U+FB2C (which double in bytes when normalised),
    the last one padded with ASCII to the byte."""
    chars = (target - 3_000) // 6
    tags = [f"t{i}" + SHIN * (chars // 100) for i in range(99)]
    body: dict[str, Any] = {
        "tweet_id": tweet_id,
        "recommender": "r",
        "recommended": ["flood"],
        "ts": "2013-01-01T00:00:00Z",
    }

    def size(pad: int) -> int:
        body["ground_truth"] = [*tags, "pad" + SHIN * (chars % 100) + "a" * pad]
        return produced_size(*score_output(tweet_id, body))

    pad = target - size(0)
    assert pad >= 0 and size(pad) == target, (target, pad)
    raw = json.dumps(body, ensure_ascii=False).encode()
    assert len(raw) <= 512 * 1024, len(raw)
    return tweet_id.encode(), raw


def test_outputs_around_the_producer_limit_never_stop_the_scorer(
    broker: str, private_redis: RedisServer, tiny_bertweet: Path, tmp_path: Path
) -> None:
    """N1: the size check compared the value alone with the limit; the producer counts the
    key and the record overhead too.  A score of ~999,9xx bytes passed the check, the send
    failed with Faust's ProducerSendError, and the worker fail-stopped in a loop.

    The sweep: scores from 98% to 102% of the producer's limit (the bytes it counts), each in
    a batch of 200 normal events.  The worker stays up; every event ends scored or
    dead-lettered exactly once; a score over the limit is the one dead letter of its batch."""
    targets = sorted(
        {
            int(LIMIT * 0.98),
            int(LIMIT * 0.99),
            int(LIMIT * 0.995),
            LIMIT - 200,
            LIMIT - 1,
            LIMIT,
            LIMIT + 1,  # value alone under the limit, key and overhead over it: N1's window
            LIMIT + 40,
            LIMIT + 200,
            int(LIMIT * 1.005),
            int(LIMIT * 1.01),
            int(LIMIT * 1.02),
        }
    )
    stack = Stack(broker, private_redis.url, tiny_bertweet, tmp_path)
    try:
        score = stack.start("score")
        stack.wait_ready(score)
        expected: dict[str, str] = {}
        for n, target in enumerate(targets):
            big = f"big{n}-{target}"
            expected[big] = "score" if target <= LIMIT else "output_too_large"
            normal = [event(f"n{n}-{i}") for i in range(200)]
            expected.update((key.decode(), "score") for key, _ in normal)
            stack.send("recommendations", [*normal[:100], event_of_output_size(big, target), *normal[100:]])
        wait_for("every event settled", lambda: set(outcome_counts(stack)) >= set(expected), 240, 2)
        time.sleep(3)  # nothing comes twice
        scores = stack.read("scores")
        letters = stack.read_json("dead_letter")
        got = {r.key.decode(): "score" for r in scores} | {d["key"]: d["reason"] for d in letters}
        assert got == expected
        assert set(outcome_counts(stack).values()) == {1}  # exactly once each
        assert all(produced_size(r.key, r.value) <= LIMIT for r in scores)
        assert score.proc.poll() is None
        consumed = score.metric("reval_records_consumed_total", topic=stack.topics["recommendations"])
        scored = score.metric("reval_events_total", recommender="r", outcome="scored")
        rejected = score.metric(
            "reval_records_rejected_total", topic=stack.topics["recommendations"], reason="output_too_large"
        )
        assert consumed == len(expected)
        assert (scored, rejected) == (len(expected) - len(letters), len(letters))  # N5: once each
    finally:
        stack.close()


# --------------------------------------------------------------------------- N4


def publish_damaged(stack: Stack, thesaurus: Any) -> str:
    """A version whose neighbour table has every 97th byte flipped, published as the index
    job publishes (directory store, then Redis, whose copy the scorers load)."""
    import redis

    from workers.adapters.files.store import ThesaurusStore
    from workers.adapters.files.thesaurus_files import TABLE_FILE
    from workers.adapters.redis.redis_thesaurus import RedisThesauri

    version = ThesaurusStore(stack.index_dir).publish(thesaurus)
    path = stack.index_dir / version / TABLE_FILE
    data = bytearray(path.read_bytes())
    for i in range(0, len(data), 97):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    client = redis.Redis.from_url(stack.redis_url)
    try:
        RedisThesauri(client, stack.prefix).publish(stack.index_dir / version, version)
    finally:
        client.close()
    return version


def test_a_scorer_started_on_a_damaged_version_uses_the_newest_intact_one(
    broker: str, private_redis: RedisServer, tiny_bertweet: Path, tmp_path: Path
) -> None:
    """N4: restarted with a damaged current version, the scorer rejected it and then scored
    with no thesaurus at all: `"scorable": true` with `"index_version": null`."""
    stack = Stack(broker, private_redis.url, tiny_bertweet, tmp_path, extra_env={"REVAL_KS": "0,1,5"})
    try:
        thesaurus = paired_thesaurus()
        good = stack.publish(thesaurus)
        damaged = publish_damaged(stack, thesaurus)
        score = stack.start("score")
        stack.wait_ready(score)
        stack.send("recommendations", [event("e1", recommended=["floods"], ground_truth=["flood"])])
        (result,) = wait_for("a score", lambda: stack.read_json("scores"), 60)
        assert result["index_version"] == good and result["scorable"] is True
        assert result["reval_hit_ratio"]["1"]["5"] == 1.0  # flood is among floods' synonyms: a thesaurus
        assert score.metric("reval_thesaurus_fallbacks_total") == 1
        assert score.metric("reval_thesaurus_versions_rejected_total", role="score") == 1
        assert score.metric("reval_scoring_thesaurus_version") == int(good[1:])
        assert f"thesaurus {damaged} rejected" in score.text()
        assert f"scoring with thesaurus {good}, the newest intact one (current: {damaged})" in score.text()
    finally:
        stack.close()


def test_with_no_intact_version_events_wait_for_one(
    broker: str, private_redis: RedisServer, tiny_bertweet: Path, tmp_path: Path
) -> None:
    """N4, none intact: no score against a thesaurus the scorer does not have; the events
    wait, unacknowledged, and are scored once an intact version is published."""
    stack = Stack(broker, private_redis.url, tiny_bertweet, tmp_path, extra_env={"REVAL_KS": "0,1,5"})
    try:
        thesaurus = paired_thesaurus()
        publish_damaged(stack, thesaurus)
        score = stack.start("score")
        stack.wait_ready(score)
        stack.send("recommendations", [event(f"e{i}", recommended=["floods"]) for i in range(20)])
        wait_for("the scorer waiting", lambda: score.metric("reval_scoring_thesaurus_missing") == 1, 30, 0.5)
        time.sleep(5)
        assert stack.read_json("scores") == [] and stack.read_json("dead_letter") == []
        good = stack.publish(thesaurus)
        results = wait_for("20 scores", lambda: (r := stack.read_json("scores")) and len(r) >= 20 and r, 60)
        assert len(results) == 20 and {r["index_version"] for r in results} == {good}
        assert score.metric("reval_scoring_thesaurus_missing") == 0
    finally:
        stack.close()


# --------------------------------------------------------------------------- N3


def secured_env(
    cluster: KafkaCluster, sasl: str, redis_url: str, topics: dict[str, str], model: Path, tmp_path: Path
) -> dict[str, str]:
    """A worker's environment for Kafka with SASL/SCRAM over TLS and a Redis with a password."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "REVAL_BROKER": cluster.bootstrap,
        "REVAL_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "REVAL_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
        "REVAL_KAFKA_SASL_USERNAME": "reval",
        "REVAL_KAFKA_SASL_PASSWORD": sasl,
        "REVAL_KAFKA_SSL_CAFILE": str(cluster.ca_file),
        "REVAL_REDIS_URL": redis_url,
        "REVAL_REDIS_PREFIX": "secrets",
        "REVAL_APP_ID": "secrets",
        "REVAL_TOPIC_TWEETS": topics["tweets"],
        "REVAL_TOPIC_RECOMMENDATIONS": topics["recommendations"],
        "REVAL_TOPIC_SCORES": topics["scores"],
        "REVAL_TOPIC_DEAD_LETTER": topics["dead_letter"],
        "REVAL_PARTITIONS": "2",
        "REVAL_MODEL": str(model),
        "REVAL_DTYPE": "float32",
        "REVAL_INDEX_DIR": str(tmp_path / "index"),
        "REVAL_INDEX_INTERVAL_S": "1",
        "REVAL_RELOAD_INTERVAL_S": "0.5",
        "REVAL_SESSION_TIMEOUT_S": "6",
    }


def feed_and_score(cluster: KafkaCluster, topics: dict[str, str], log: Path) -> None:
    """200 tweets, then (once a thesaurus is in use, says the worker's log) 20 events; wait
    until 20 scores are out."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    from tests.live import plain_tweets
    from workers.dev.stack import keyed

    options = cluster.client_options()
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, **options)
    for key, value in keyed(plain_tweets(200)):
        producer.send(topics["tweets"], key=key, value=value)
    wait_for("a thesaurus", lambda: "scoring with thesaurus" in log.read_text(errors="replace"), 120, 1)
    for i in range(20):
        producer.send(topics["recommendations"], key=b"%d" % i, value=event(str(i))[1])
    producer.flush()
    producer.close()

    def scores() -> int:
        consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, consumer_timeout_ms=1500, **options)
        parts = [TopicPartition(topics["scores"], p) for p in range(2)]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        n = len(list(consumer))
        consumer.close()
        return n

    wait_for("20 scores", lambda: scores() >= 20, 120, 2)


def test_no_secret_setting_in_any_log_at_debug_level(tiny_bertweet: Path, tmp_path: Path) -> None:
    """N3: kafka-python's admin client logged its configuration, SASL password included, at
    debug level.  Every role in one worker at --loglevel debug, on Kafka with SASL/SCRAM over
    TLS and a Redis with a password (one that URL-encoding changes): tweets embedded, a
    thesaurus built, events scored; then a worker with a wrong SASL password fails.  No
    spelling of any secret setting is in any of their output."""
    import subprocess
    from urllib.parse import quote

    from workers.adapters.kafka.kafka_client import create_topics
    from workers.dev.kafka_cluster import KafkaCluster, Security
    from workers.dev.ports import find_free_port
    from workers.dev.stack import REVAL

    sasl, wrong, redis_pw = "sasl-Pw-31c9e", "wrong-Pw-8d02a", "r3dis/Pw+7#q"
    secrets = {sasl, wrong, redis_pw, quote(redis_pw, safe="")}
    topics = {"tweets": "tw", "recommendations": "recs", "scores": "sc", "dead_letter": "dlq"}
    server = RedisServer(tmp_path / "redis", password=redis_pw)
    with KafkaCluster(nodes=1, data_dir=tmp_path / "kafka", security=Security({"reval": sasl})) as cluster:
        options = cluster.client_options()
        create_topics(cluster.bootstrap, {**{t: 2 for t in topics.values()}, "dlq": 1}, **options)
        redis_url = f"redis://:{quote(redis_pw, safe='')}@127.0.0.1:{server.port}/0"
        env = secured_env(cluster, sasl, redis_url, topics, tiny_bertweet, tmp_path)
        log = tmp_path / "worker.log"
        command = [REVAL, "worker", "embed", "index", "score", "--loglevel", "debug"]
        with log.open("wb") as out:
            worker = subprocess.Popen(
                [*command, "--metrics-port", str(find_free_port())],
                env=env,
                stdout=out,
                stderr=out,
                cwd=tmp_path,
            )
        try:
            wait_for(
                "the worker ready", lambda: "[^Worker]: Ready" in log.read_text(errors="replace"), 180, 1
            )
            feed_and_score(cluster, topics, log)
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(60)
        failed = subprocess.run(
            [*command, "--metrics-port", str(find_free_port())],
            env={**env, "REVAL_KAFKA_SASL_PASSWORD": wrong, "REVAL_STARTUP_TIMEOUT_S": "10"},
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
    server.stop()
    assert failed.returncode != 0
    texts = {"worker": log.read_text(errors="replace"), "failed": failed.stdout + failed.stderr}
    assert "DEBUG" in texts["worker"] and "sasl_plain_password" in texts["worker"]  # debug from kafka-python
    leaks = [(name, secret) for name, text in texts.items() for secret in secrets if secret in text]
    assert leaks == []
