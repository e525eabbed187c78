"""Apache Kafka on this machine: KRaft nodes (broker + controller in one JVM) from Maven jars.

The engine production runs, started by the project for ``reval broker --engine kafka``,
the tests and the benchmarks -- no Docker, no tarball.  The version is pinned in
``workers/dev/kafka/pom.xml``; its runtime jars are fetched once with Maven into a cache
outside git (``~/.cache/reval/kafka/VERSION``, or ``$REVAL_KAFKA_CACHE``)::

    with KafkaCluster(nodes=3) as cluster:
        cluster.bootstrap            # "127.0.0.1:P,127.0.0.1:P+1,127.0.0.1:P+2"
        cluster.kill(2)              # kill -9 node 2 ...
        cluster.start_node(2)        # ... and bring it back on the same data

Node ``i`` (1-based) listens for clients on ``port + i - 1`` and for the controller quorum on
a port chosen once and kept in ``DATA/cluster.json``, so a data directory restarts as the
same cluster.  Every node of a cluster is a voter (static quorum).  With three nodes, topics
default to replication factor 3 and ``min.insync.replicas=2``.

Settings that differ from Kafka's defaults, and why:

* ``auto.create.topics.enable=false``: every topic is declared with its partition count (a
  consumer that asks for a missing topic must fail, not create one with a default count);
* ``group.initial.rebalance.delay.ms=0``: a test's group forms at once;
* ``offsets.topic.num.partitions`` / ``transaction.state.log.num.partitions`` 8 instead of
  50: the first group or transaction of a fresh cluster creates them, 50 partitions each
  take seconds on 2 cores;
* ``broker.session.timeout.ms=4000`` (9000), ``broker.heartbeat.interval.ms=1000`` (2000):
  a killed node is fenced, and its partitions move, within ~4 s;
* a smaller heap (``heap``, 512 MB) than the start script's 1 GB.

:class:`Security` adds TLS and SASL/SCRAM on the client listeners (inter-broker and
controller traffic stays on loopback listeners of their own).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Self

from workers.adapters.kafka.kafka_client import BrokerError
from workers.dev.kafka_jars import KafkaSetupError, java_binary, kafka_jars, pinned_version
from workers.dev.kafka_tls import Security, tls_files
from workers.dev.ports import find_free_port, free_run, port_is_free
from workers.dev.processes import LocalService, spawn

__all__ = [
    "KafkaCluster",
    "KafkaSetupError",
    "KafkaStartError",
    "Security",
    "kafka_jars",
    "pinned_version",
]


class KafkaStartError(BrokerError):
    """A node died or the cluster did not answer in time; the message quotes the node's log."""


@dataclass
class _Layout:
    """What ``DATA/cluster.json`` keeps: enough to restart the same cluster."""

    version: str
    cluster_id: str
    nodes: int
    port: int
    controller_ports: list[int]
    internal_ports: list[int]

    @classmethod
    def read(cls, path: Path) -> _Layout:
        try:
            data = json.loads(path.read_text())
            return cls(**{k: data[k] for k in cls.__dataclass_fields__})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise KafkaSetupError(f"{path}: not a readable cluster description ({exc})", usage=True) from None

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.__dict__, indent=2) + "\n")


@dataclass
class _Node:
    id: int
    folder: Path
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def server_log(self) -> Path:
        return self.folder / "server.log"

    def tail(self, lines: int = 30) -> str:
        for path in (self.server_log, self.folder / "stdout.log"):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").splitlines()
                errors = [ln for ln in text if " ERROR " in ln or "Exception" in ln]
                if errors:
                    return "\n".join(errors[-5:])
                if text:
                    return "\n".join(text[-lines:])
        return "(no log)"


class KafkaCluster(LocalService):
    """``nodes`` KRaft nodes on 127.0.0.1 (1 or 3; each broker + controller).

    ``data_dir``: kept across runs (the cluster restarts with its topics and offsets); None:
    a temporary folder removed by :meth:`stop`.  ``port``: node 1's client port (None: a
    free one).  ``version``: the pinned one by default.  ``config``: broker properties added
    to every node's.  ``security``: TLS + SASL on the client listeners.  ``relayed``
    (one node, no security): a second plaintext client listener, on port ``listen`` and
    advertised as ``host:port`` -- a relay in front of it (a fault test's partition proxy)
    then carries every byte of the clients that bootstrap through it, while the others use
    :attr:`bootstrap` directly.
    """

    def __init__(
        self,
        nodes: int = 1,
        *,
        port: int | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        version: str | None = None,
        heap: str = "512m",
        config: Mapping[str, str] | None = None,
        security: Security | None = None,
        startup_timeout: float = 120.0,
        stop_timeout: float = 30.0,
        relayed: tuple[int, str] | None = None,
    ) -> None:
        if nodes not in (1, 3):
            raise KafkaSetupError(f"--nodes must be 1 or 3, not {nodes}", usage=True)
        if relayed is not None and (nodes != 1 or security is not None):
            raise KafkaSetupError("a relayed listener is for one node without security")
        self.relayed = relayed
        self.nodes = nodes
        self.version = version or pinned_version()
        self.heap = heap
        self.extra_config = dict(config or {})
        self.security = security
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._requested_port = port
        self._data_arg = Path(data_dir) if data_dir is not None else None
        self.data_dir: Path | None = self._data_arg
        self._temp_dir = False
        self.layout: _Layout | None = None
        self._nodes: dict[int, _Node] = {}
        self.ca_file: Path | None = None

    # -- addresses --------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self.layout is None:
            raise BrokerError("Kafka cluster not started")
        return self.layout.port

    def client_port(self, node: int) -> int:
        return self.port + node - 1

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:P[,127.0.0.1:P+1,...]``: every node's client listener."""
        return ",".join(f"127.0.0.1:{self.client_port(i)}" for i in self.node_ids)

    @property
    def url(self) -> str:
        """The first node's ``kafka://`` URL (Faust's ``broker=`` takes a list; see settings)."""
        return f"kafka://127.0.0.1:{self.client_port(1)}"

    @property
    def node_ids(self) -> list[int]:
        return list(range(1, self.nodes + 1))

    def client_options(self) -> dict[str, Any]:
        """kafka-python options for the client listeners (TLS/SASL when ``security`` is set)."""
        if self.security is None:
            return {}
        (user, password), *_ = self.security.users.items()
        return {
            "security_protocol": self.security.protocol,
            "sasl_mechanism": self.security.mechanism,
            "sasl_plain_username": user,
            "sasl_plain_password": password,
            "ssl_cafile": str(self.ca_file),
        }

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> Self:
        """Format storage where needed, start every node, wait until the cluster answers."""
        java = java_binary()
        jars = kafka_jars(self.version)
        try:
            self._prepare()
            assert self.layout is not None
            for node_id in self.node_ids:
                self._format(java, jars, node_id)
            for node_id in self.node_ids:
                self._spawn(java, jars, node_id)
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _prepare(self) -> None:
        """The data folder and its ``cluster.json``: new, or the one a previous run left."""
        if self._data_arg is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="reval-kafka-"))
            self._temp_dir = True
        assert self.data_dir is not None
        folder = self.data_dir
        described = folder / "cluster.json"
        if described.exists():
            layout = _Layout.read(described)
            if layout.nodes != self.nodes:
                raise KafkaSetupError(
                    f"--data {folder} holds a {layout.nodes}-node cluster, not {self.nodes}", usage=True
                )
            if self._requested_port is not None and layout.port != self._requested_port:
                raise KafkaSetupError(
                    f"--data {folder} holds a cluster on port {layout.port}, not {self._requested_port}",
                    usage=True,
                )
            if layout.version != self.version:
                raise KafkaSetupError(
                    f"--data {folder} was formatted by Kafka {layout.version}, not {self.version}", usage=True
                )
        else:
            if folder.exists() and any(folder.iterdir()):
                raise KafkaSetupError(
                    f"--data {folder} is not empty and holds no cluster.json: not a reval Kafka folder",
                    usage=True,
                )
            port = self._requested_port or free_run(self.nodes)
            layout = _Layout(
                version=self.version,
                cluster_id=_cluster_id(),
                nodes=self.nodes,
                port=port,
                controller_ports=[find_free_port() for _ in self.node_ids],
                internal_ports=[find_free_port() for _ in self.node_ids] if self.security else [],
            )
            try:
                folder.mkdir(parents=True, exist_ok=True)
                layout.write(described)
            except OSError as exc:
                raise KafkaSetupError(f"--data {folder}: {exc.strerror}", usage=True) from None
        for i, busy in enumerate(self._ports(layout)):
            if not port_is_free(busy):
                what = (
                    f"--port: node {i + 1}'s client port"
                    if i < layout.nodes
                    else f"a controller port kept in {described}"
                )
                raise KafkaSetupError(f"127.0.0.1:{busy} is in use ({what})", usage=True)
        self.layout = layout
        if self.security is not None:
            self.ca_file, _ = tls_files(folder / "tls")
        self._nodes = {i: _Node(i, folder / f"node-{i}") for i in self.node_ids}
        self._stop_at_exit()

    @staticmethod
    def _ports(layout: _Layout) -> list[int]:
        clients = [layout.port + i for i in range(layout.nodes)]
        return clients + layout.controller_ports + layout.internal_ports

    def properties(self, node_id: int) -> dict[str, str]:
        """Node ``node_id``'s ``server.properties``."""
        assert self.layout is not None and self.data_dir is not None
        layout, n = self.layout, self.nodes
        voters = ",".join(f"{i}@127.0.0.1:{layout.controller_ports[i - 1]}" for i in self.node_ids)
        client = f"127.0.0.1:{self.client_port(node_id)}"
        controller = f"127.0.0.1:{layout.controller_ports[node_id - 1]}"
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node_id),
            "controller.quorum.voters": voters,
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(self._nodes[node_id].folder / "data"),
            "auto.create.topics.enable": "false",
            "group.initial.rebalance.delay.ms": "0",
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.num.partitions": "8",
            "offsets.topic.replication.factor": str(n),
            "transaction.state.log.replication.factor": str(n),
            "transaction.state.log.min.isr": "2" if n >= 3 else "1",
            "share.coordinator.state.topic.replication.factor": str(n),
            "share.coordinator.state.topic.min.isr": "2" if n >= 3 else "1",
            "default.replication.factor": str(n),
            "min.insync.replicas": "2" if n >= 3 else "1",
            "broker.session.timeout.ms": "4000",
            "broker.heartbeat.interval.ms": "1000",
            "num.io.threads": "4",
            "num.network.threads": "2",
        }
        if self.security is None:
            props |= {
                "listeners": f"PLAINTEXT://{client},CONTROLLER://{controller}",
                "advertised.listeners": f"PLAINTEXT://{client}",
                "inter.broker.listener.name": "PLAINTEXT",
                "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            }
            if self.relayed is not None:
                listen, advertised = self.relayed
                props |= {
                    "listeners": f"{props['listeners']},RELAYED://127.0.0.1:{listen}",
                    "advertised.listeners": f"PLAINTEXT://{client},RELAYED://{advertised}",
                    "listener.security.protocol.map": (
                        "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,RELAYED:PLAINTEXT"
                    ),
                }
        else:
            internal = f"127.0.0.1:{layout.internal_ports[node_id - 1]}"
            mech = self.security.mechanism
            key_store = self.data_dir / "tls" / "node.pem"
            props |= {
                "listeners": f"CLIENT://{client},INTERNAL://{internal},CONTROLLER://{controller}",
                "advertised.listeners": f"CLIENT://{client},INTERNAL://{internal}",
                "inter.broker.listener.name": "INTERNAL",
                "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,CLIENT:SASL_SSL",
                "sasl.enabled.mechanisms": mech,
                f"listener.name.client.{mech.lower()}.sasl.jaas.config": (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                ),
                "listener.name.client.ssl.keystore.type": "PEM",
                "listener.name.client.ssl.keystore.location": str(key_store),
                "listener.name.client.ssl.truststore.type": "PEM",
                "listener.name.client.ssl.truststore.location": str(self.ca_file),
            }
        return props | self.extra_config

    def _write_config(self, node_id: int) -> Path:
        node = self._nodes[node_id]
        node.folder.mkdir(parents=True, exist_ok=True)
        config = node.folder / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self.properties(node_id).items()))
        (node.folder / "log4j2.properties").write_text(_LOG4J2.format(log=node.server_log))
        return config

    def _format(self, java: str, jars: Path, node_id: int) -> None:
        """``kafka-storage format`` unless the node's data folder is already formatted."""
        assert self.layout is not None
        config = self._write_config(node_id)
        data = self._nodes[node_id].folder / "data"
        meta = data / "meta.properties"
        if meta.exists():
            self._check_meta(meta)
            return
        if data.exists() and any(data.iterdir()):
            raise KafkaSetupError(f"{data} holds data but no meta.properties: damaged; remove it", usage=True)
        cmd = [java, "-cp", f"{jars}/*", "kafka.tools.StorageTool", "format",
               "-t", self.layout.cluster_id, "-c", str(config)]  # fmt: skip
        if self.security is not None:
            for user, password in self.security.users.items():
                cmd += ["--add-scram", f"{self.security.mechanism}=[name={user},password={password}]"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            text = (done.stderr or done.stdout).strip().splitlines()
            raise KafkaStartError(f"formatting {data} failed: {text[-1] if text else done.returncode}")

    def _check_meta(self, meta: Path) -> None:
        assert self.layout is not None
        try:
            values = dict(
                line.split("=", 1)
                for line in meta.read_text().splitlines()
                if "=" in line and not line.startswith("#")
            )
        except OSError as exc:
            raise KafkaSetupError(f"{meta}: {exc.strerror}", usage=True) from None
        if values.get("cluster.id") != self.layout.cluster_id:
            raise KafkaSetupError(
                f"{meta} belongs to cluster {values.get('cluster.id')!r}, "
                f"not {self.layout.cluster_id!r}: damaged",
                usage=True,
            )

    def _spawn(self, java: str, jars: Path, node_id: int) -> None:
        node = self._nodes[node_id]
        node.log = open(node.folder / "stdout.log", "ab")  # noqa: SIM115 - closed in _stop_node
        cmd = [
            java, "-Xms64m", f"-Xmx{self.heap}", "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={node.folder / 'log4j2.properties'}",
            "-cp", f"{jars}/*", "kafka.Kafka", str(node.folder / "server.properties"),
        ]  # fmt: skip
        node.proc = spawn(cmd, node.log)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Until every running node is registered with the controller and answers metadata."""
        timeout = timeout or self.startup_timeout
        deadline = time.monotonic() + timeout
        want = {i for i, n in self._nodes.items() if n.proc is not None and n.proc.poll() is None}
        delay = 0.2
        while True:
            for node in self._nodes.values():
                if node.proc is not None and node.proc.poll() is not None:
                    raise KafkaStartError(
                        f"Kafka node {node.id} exited with code {node.proc.returncode}; "
                        f"log {node.server_log}:\n{node.tail()}"
                    )
            if all(self._listening(i) for i in want) and self._registered() >= want:
                return
            if time.monotonic() > deadline:
                node = self._nodes[min(want)] if want else next(iter(self._nodes.values()))
                raise KafkaStartError(
                    f"Kafka on {self.bootstrap} did not answer within {timeout:.0f} s; "
                    f"log {node.server_log}:\n{node.tail()}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def _listening(self, node_id: int) -> bool:
        """Whether node ``node_id``'s client listener accepts connections (Kafka opens it last,
        once the broker is unfenced; a restarted node's old registration may still be listed)."""
        import socket

        try:
            with socket.create_connection(("127.0.0.1", self.client_port(node_id)), timeout=1):
                return True
        except OSError:
            return False

    def _registered(self) -> set[int]:
        """Node ids the cluster's metadata lists as live brokers (empty when nobody answers)."""
        from kafka.admin import KafkaAdminClient

        try:
            admin = KafkaAdminClient(
                bootstrap_servers=self.bootstrap,
                request_timeout_ms=3000,
                bootstrap_timeout_ms=3000,
                **self.client_options(),
            )
        except Exception:  # not up yet
            return set()
        try:
            brokers = admin.describe_cluster()["brokers"]
            return {int(b["broker_id"]) for b in brokers if not b.get("is_fenced")}
        except Exception:
            return set()
        finally:
            admin.close()

    @property
    def running(self) -> bool:
        """Whether every node's JVM is alive."""
        return bool(self._nodes) and all(self.pid(i) is not None for i in self._nodes)

    # -- faults -------------------------------------------------------------------------

    @property
    def pids(self) -> list[int]:
        """Every running node's JVM, for CPU accounting."""
        return [pid for i in self.node_ids if (pid := self.pid(i)) is not None]

    def pid(self, node_id: int) -> int | None:
        proc = self._nodes[node_id].proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def kill(self, node_id: int) -> None:
        """``kill -9`` node ``node_id`` (its data stays for :meth:`start_node`)."""
        self._stop_node(node_id, signal.SIGKILL)

    def stop_node(self, node_id: int) -> None:
        """A clean shutdown of node ``node_id`` (SIGTERM; SIGKILL after ``stop_timeout``)."""
        self._stop_node(node_id, signal.SIGTERM)

    def start_node(self, node_id: int, *, wait: bool = True) -> None:
        """Start node ``node_id`` again on its data (after :meth:`kill` or :meth:`stop_node`)."""
        if self.pid(node_id) is not None:
            raise BrokerError(f"Kafka node {node_id} is running")
        java, jars = java_binary(), kafka_jars(self.version)
        self._write_config(node_id)
        self._spawn(java, jars, node_id)
        if wait:
            self.wait_ready()

    def _stop_node(self, node_id: int, sig: signal.Signals) -> None:
        node = self._nodes[node_id]
        proc, node.proc = node.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if node.log is not None:
            node.log.close()
            node.log = None

    def leader(self, topic: str, partition: int = 0) -> int:
        """The node that leads ``topic``'s ``partition`` now."""
        from kafka.admin import KafkaAdminClient

        live = [f"127.0.0.1:{self.client_port(i)}" for i in self.node_ids if self.pid(i) is not None]
        admin = KafkaAdminClient(bootstrap_servers=",".join(live), **self.client_options())
        try:
            (desc,) = admin.describe_topics([topic])
            for part in desc["partitions"]:
                if part["partition_index"] == partition and part["leader_id"] >= 0:
                    return int(part["leader_id"])
        finally:
            admin.close()
        raise BrokerError(f"{topic}[{partition}] has no leader")

    def stop(self) -> None:
        """Stop every node: SIGTERM to all at once (one by one, the last nodes would wait for a
        quorum that is gone), SIGKILL after ``stop_timeout``; a temporary cluster is killed at
        once and its folder removed."""
        # A temporary cluster's data is deleted anyway: no controlled shutdown to wait for.
        sig = signal.SIGKILL if self._temp_dir else signal.SIGTERM
        for node in self._nodes.values():
            if node.proc is not None and node.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.proc.pid, sig)
        for node_id in list(self._nodes):
            self._stop_node(node_id, sig)
        self._forget_at_exit()
        if self._temp_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self._temp_dir = False

    def __repr__(self) -> str:
        where = self.bootstrap if self.layout else "not started"
        return f"<KafkaCluster {self.version} x{self.nodes} {where}>"


def _cluster_id() -> str:
    """A cluster id as ``kafka-storage random-uuid`` makes one (base64url of a UUID, 22 chars)."""
    import base64

    # As Kafka's Uuid.randomUuid: never one starting with "-", which kafka-storage's command
    # line would read as an option ("--cluster-id/-t: expected one argument"), 1 time in 64.
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


_LOG4J2 = """\
status = error
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""
