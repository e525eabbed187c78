"""Redis Cluster failover: what asynchronous replication loses, and the replication barrier
(:class:`workers.adapters.redis.redis_client.Replication`) that keeps an acknowledged write from
being lost.

The loss is made deterministic: the replica of one master is cut off (paused with SIGSTOP,
its replication link dropped), so nothing written to that master afterwards reaches it; the
master is killed (``kill -9``) and the replica continued, and the cluster promotes it --
without those writes.  (Paused alone, the replica would find them in its socket buffer.)  Without the
barrier the writes were acknowledged and are gone; with it they were never acknowledged,
and are written again on the new master.

Real servers only: a 3-master + 3-replica cluster of this module's own (its nodes are
killed), every node restored before each test.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from redis.cluster import RedisCluster

from stream.intake.records import Coordinates
from stream.synonyms.means import HashtagMeans
from tests.conftest import start_redis_cluster
from tests.test_redis_store import assert_matches, batches, in_memory, zipf_stream
from workers.adapters.redis.redis_client import Replication, ReplicationLagError, connect, with_retry
from workers.adapters.redis.redis_means import Contribution, RedisMeans
from workers.adapters.redis.redis_state import RedisClaims, RedisJoin, RedisSamples
from workers.adapters.redis.redis_thesaurus import RedisThesauri
from workers.dev.redis_cluster import LocalRedisCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DIM = 16


@pytest.fixture(scope="module")
def module_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedisCluster]:
    cluster = start_redis_cluster(tmp_path_factory.mktemp("failover"))
    yield cluster
    cluster.stop()


@pytest.fixture
def cluster(module_cluster: LocalRedisCluster) -> LocalRedisCluster:
    """The module's cluster, every node running, continued and replicated (whatever the
    previous test left)."""
    for node in module_cluster.nodes:
        if node.paused:
            module_cluster.resume(node.index)
        if not node.alive:
            module_cluster.start_node(node.index)
    module_cluster.wait_ready()
    return module_cluster


@pytest.fixture
def client(cluster: LocalRedisCluster) -> Iterator[RedisCluster]:
    rc = connect(cluster.url, cluster=True)
    assert isinstance(rc, RedisCluster)
    yield rc
    rc.close()


def prefix() -> str:
    return f"fo-{uuid.uuid4().hex[:10]}"


def stream(n: int = 600, seed: int = 0) -> list[Contribution]:
    return zipf_stream(np.random.default_rng(seed), n, dim=DIM, n_tags=60)


def busiest_master(cluster: LocalRedisCluster, store: RedisMeans, items: list[Contribution]) -> int:
    """The master serving the most (tweet, hashtag) updates of ``items``."""
    load = Counter(cluster.master_of(store.key(tag)) for c in items for tag in set(c.hashtags))
    return load.most_common(1)[0][0]


def patiently(call: Callable[[], Any], errors: list[str] | None = None) -> Any:
    """``call()`` through :func:`with_retry` (short back-off), noting each error it waited out."""

    def report(what: str, error: BaseException | None) -> None:
        if errors is not None and error is not None:
            errors.append(type(error).__name__)

    return with_retry("test", call, report=report, cap=0.5)


def fail_over(cluster: LocalRedisCluster, master: int) -> int:
    """kill -9 ``master`` (its replica cut off), continue the replica, wait until it took over."""
    (replica,) = cluster.replicas_of(master)
    cluster.kill(master)
    cluster.resume(replica)
    new = cluster.wait_failover(master)
    assert new == replica
    return new


# -- the pitfall ------------------------------------------------------------------------------


def test_wait_covers_only_the_writes_of_its_own_connection(
    cluster: LocalRedisCluster, client: RedisCluster
) -> None:
    """Why the barrier writes a marker on the connection it sends WAIT on: on another
    connection, WAIT answers at once that the replica has everything -- it has not."""
    key = f"{prefix()}:k"
    master = cluster.master_of(key)
    (replica,) = cluster.replicas_of(master)
    writer, other = redis.Redis(port=master), redis.Redis(port=master)
    other.ping()
    cluster.pause(replica)
    try:
        writer.set(key, "unreplicated")
        assert other.execute_command("WAIT", 1, 300) == 1  # a fresh connection: nothing to wait for
        assert writer.execute_command("WAIT", 1, 300) == 0  # the writer's own: not replicated
        with pytest.raises(ReplicationLagError, match="0 of 1 replicas"):
            Replication(client, 1, timeout_s=0.3).wait()
    finally:
        cluster.resume(replica)
        writer.close()
        other.close()
    Replication(client, 1, timeout_s=5).wait()  # continued: the replica catches up


def test_every_write_a_commit_depends_on_waits_for_the_replicas(
    cluster: LocalRedisCluster, client: RedisCluster, tmp_path: Path
) -> None:
    """Means, retweet and event claims, drift samples, the join (put, settle) and thesaurus
    publishing all hold while a master's replica is paused, and pass once it is back."""
    p = prefix()
    replication = Replication(client, 1, timeout_s=0.3, prefix=p)
    means = RedisMeans(client, prefix=p, replication=replication)
    claims = RedisClaims(client, p, "seen", 60, replication)
    samples = RedisSamples(client, p, rate=1.0, replication=replication)
    join = RedisJoin(client, p, window=60, replication=replication)
    thesauri = RedisThesauri(client, p, replication=replication)
    version = tmp_path / "v000001"
    version.mkdir()
    for name in ("metadata.json", "hashtags.json", "table.npz"):
        (version / name).write_bytes(b"{}")
    vector = np.ones(DIM, dtype=np.float32)
    writes: dict[str, Callable[[], object]] = {
        "means": lambda: means.apply([Contribution(Coordinates("t", 0, 1), ["a", "b", "c", "d"], vector)]),
        "claims": lambda: claims.claim_many([(["k1", "k2", "k3"], "t:0:1")]),
        "samples": lambda: samples.add([("t:0:1", 0.0, vector)]),
        "join events": lambda: join.put_events([("1", "e1", "{}"), ("2", "e2", "{}")], time.time()),
        "join tweets": lambda: join.put_tweets([("1", ["a"]), ("3", ["b"])]),
        "join settle": lambda: join.settle([("1", "e1")]),
        "thesaurus": lambda: thesauri.publish(version, "v000001"),
    }
    replicas = [p for m in cluster.master_ports() for p in cluster.replicas_of(m)]
    for port in replicas:
        cluster.pause(port)
    try:
        for what, write in writes.items():
            with pytest.raises(ReplicationLagError):
                write()
            assert what
    finally:
        for port in replicas:
            cluster.resume(port)
    for write in writes.values():
        patiently(write)  # the same calls again (all idempotent): through
    assert means.read(["a"])["a"].count == 1
    assert thesauri.current_version() == "v000001"
    means.clear()


# -- the loss, and none with the barrier -----------------------------------------------------


def test_without_the_barrier_a_failover_loses_acknowledged_writes_and_says_so(
    cluster: LocalRedisCluster, client: RedisCluster
) -> None:
    """The loss the barrier exists for: applied (acknowledged) batches missing after the
    failover -- exactly those of the hashtags on the master that died.  With the barrier
    off (``replicas=0``) the rollback check still reports it, naming the master."""
    items = stream()
    rollbacks: list[tuple[str, str]] = []
    p = prefix()
    check = Replication(client, 0, prefix=p, on_rollback=lambda master, key: rollbacks.append((master, key)))
    store = RedisMeans(client, prefix=p, replication=check)  # acknowledged on the master's word
    before, after = items[:300], items[300:]
    for batch in batches(before, 50):
        store.apply(batch)
    Replication(client, 1, timeout_s=5).wait()  # the first half is on every replica
    master = busiest_master(cluster, store, after)
    everything, first_half = in_memory(items, DIM), in_memory(before, DIM)
    on_master = {tag for tag in everything.states if cluster.master_of(store.key(tag)) == master}
    cluster.cut_off(cluster.replicas_of(master)[0])
    for batch in batches(after, 50):
        store.apply(batch)  # returns: the master has the writes, its replica does not
    assert not rollbacks
    new = fail_over(cluster, master)

    got = patiently(store.read_all)
    count = {tag: state.count for tag, state in got.items()}
    # The dead master's hashtags hold the first half only: the acknowledged second half is gone.
    assert {tag: count.get(tag, 0) for tag in on_master} == {
        tag: first_half.states[tag].count if tag in first_half.states else 0 for tag in on_master
    }
    assert any(count.get(tag, 0) < everything.states[tag].count for tag in on_master), "nothing lost"
    # Every other hashtag is whole.
    assert_matches({t: m for t, m in got.items() if t not in on_master}, _without(everything, on_master))
    # The next write finds the master's marker gone back: reported, once, for that master.
    patiently(lambda: store.apply(items[:1]))
    assert [m for m, _ in rollbacks] == [f"127.0.0.1:{new}"]
    store.clear()


def test_a_rollback_on_a_single_redis_is_reported(redis_url: str) -> None:
    """A Redis restarted from older data (here: the marker set back by hand) is reported at
    the next write; an unchanged one never is."""
    client = redis.Redis.from_url(redis_url)
    rollbacks: list[str] = []
    p = prefix()
    check = Replication(client, 0, prefix=p, on_rollback=lambda master, key: rollbacks.append(key))
    for _ in range(3):
        check.wait()
    assert not rollbacks
    (marker,) = [k.decode() for k in client.scan_iter(match=f"{p}:sync:*")]
    assert 0 < client.pttl(marker) <= 7 * 86400 * 1000  # a dead process' markers expire
    client.set(marker, 1)
    check.wait()
    assert rollbacks == [marker]
    check.wait()
    assert rollbacks == [marker]  # once per rollback
    client.delete(marker)
    client.close()


def test_with_the_barrier_a_failover_loses_nothing(cluster: LocalRedisCluster, client: RedisCluster) -> None:
    """The same faults with the barrier: the batches written while the replica was paused are
    held (never acknowledged), written again on the promoted replica once it has a replica of
    its own (the killed master, restarted), and the means equal the in-memory ones exactly."""
    items = stream(seed=1)
    p = prefix()
    rollbacks: list[str] = []
    barrier = Replication(client, 1, timeout_s=0.3, prefix=p, on_rollback=lambda m, key: rollbacks.append(m))
    store = RedisMeans(client, prefix=p, replication=barrier)
    before, after = items[:300], items[300:]
    for batch in batches(before, 50):
        store.apply(batch)
    master = busiest_master(cluster, store, after)
    cluster.cut_off(cluster.replicas_of(master)[0])

    errors: list[str] = []
    acknowledged: list[int] = []  # batches whose apply returned, in order

    def consume() -> None:
        for i, batch in enumerate(batches(after, 50)):
            patiently(lambda b=batch: store.apply(b), errors)  # type: ignore[misc]
            acknowledged.append(i)

    worker = threading.Thread(target=consume, daemon=True)
    worker.start()
    deadline = time.monotonic() + 30
    while "ReplicationLagError" not in errors:
        assert time.monotonic() < deadline, f"never held: {errors}"
        time.sleep(0.05)
    time.sleep(1.0)
    assert not acknowledged, "a batch was acknowledged while its master's replica was paused"

    fail_over(cluster, master)  # the replica is promoted without the held batch's writes
    time.sleep(1.5)
    assert not acknowledged, "acknowledged while the new master has no replica"
    cluster.start_node(master)  # rejoins as the new master's replica
    worker.join(timeout=120)
    assert not worker.is_alive(), f"the batches were never acknowledged: {Counter(errors)}"
    assert acknowledged == list(range(len(acknowledged))) and len(acknowledged) == 6
    assert "ReplicationLagError" in errors and "ConnectionError" in errors

    assert_matches(patiently(store.read_all), in_memory(items, DIM), tol=1e-7)
    assert not rollbacks  # nothing acknowledged was lost: nothing to report
    store.clear()


def _without(table: HashtagMeans, tags: set[str]) -> HashtagMeans:
    return HashtagMeans(table.dim, {t: m for t, m in table.states.items() if t not in tags})


def test_the_cluster_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """kill -9 of the process that started a LocalRedisCluster takes its six redis-servers
    along (PR_SET_PDEATHSIG)."""
    import subprocess
    import sys

    script = (
        "import sys, time\n"
        "from workers.dev.redis_cluster import LocalRedisCluster\n"
        f"c = LocalRedisCluster(data_dir={str(tmp_path)!r}).start()\n"
        "print(' '.join(str(n.port) for n in c.nodes), flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    ports = [int(p) for p in owner.stdout.readline().split()]
    assert len(ports) == 6 and all(redis.Redis(port=p).ping() for p in ports)
    owner.kill()
    owner.wait(10)
    deadline = time.monotonic() + 20
    while any(_answers(p) for p in ports):
        assert time.monotonic() < deadline, "redis-servers outlived the process that started them"
        time.sleep(0.2)


def _answers(port: int) -> bool:
    try:
        with redis.Redis(port=port, socket_connect_timeout=0.5) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False
