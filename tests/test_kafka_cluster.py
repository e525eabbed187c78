"""`reval broker --engine kafka`: Apache Kafka (KRaft) started by the project, 1 or 3 nodes.

Real JVMs from the Maven jars the project pins (workers/dev/kafka/pom.xml): the bootstrap
line, data kept across restarts, every JVM gone after SIGTERM / SIGINT / SIGHUP, and one line
with the right exit code for each thing that can be wrong on a machine (no Java, no Maven
Central, a port in use, a damaged data folder) -- with nothing left running.  Also the
smoke test on Kafka 3.9 for users on older clusters.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import pytest
import yaml
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from workers.adapters.kafka.kafka_client import create_topics, topic_partitions
from workers.dev.kafka_cluster import KafkaCluster, kafka_jars, pinned_version
from workers.dev.ports import free_run
from workers.dev.processes import at_a_terminal
from workers.dev.stack import REVAL, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
BOOTSTRAP_LINE = re.compile(r"^bootstrap: (127\.0\.0\.1:\d+(?:,127\.0\.0\.1:\d+)*)$")


def _jvms(marker: str) -> list[psutil.Process]:
    """Java processes whose command line mentions ``marker`` (a data folder)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if "kafka.Kafka" in cmd and marker in cmd:
            found.append(proc)
    return found


class BrokerCommand:
    """``reval broker`` as a user runs it: a process, its stdout's bootstrap line, signals."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [REVAL, "broker", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env or dict(os.environ),
            start_new_session=True,
            preexec_fn=at_a_terminal,  # some tests stop it with Ctrl-C
        )

    def bootstrap(self, timeout: float = 240.0) -> str:
        """The address of the one line the command prints on stdout once the cluster answers."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line:
                break
            if self.proc.poll() is not None:
                raise AssertionError(f"reval broker exited {self.proc.returncode}: {self.stderr()}")
        match = BOOTSTRAP_LINE.match(line.rstrip("\n"))
        assert match, f"not a bootstrap line: {line!r}"
        return match.group(1)

    def stop(self, sig: signal.Signals, timeout: float = 60.0) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def _round_trip(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for value in values:
        producer.send(topic, value=value).get(timeout=30)
    producer.close()


def _read_all(bootstrap: str, topic: str, partitions: int = 1) -> list[bytes]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000)
    parts = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    values = [record.value for record in consumer]
    consumer.close()
    return values


# --------------------------------------------------------------------------- the command


def test_three_nodes_print_the_bootstrap_keep_their_data_and_stop_on_sigterm(tmp_path: Path) -> None:
    data = tmp_path / "kafka"
    port = free_run(3)
    cmd = BrokerCommand("--engine", "kafka", "--nodes", "3", "--port", str(port), "--data", str(data))
    try:
        bootstrap = cmd.bootstrap()
        assert bootstrap == f"127.0.0.1:{port},127.0.0.1:{port + 1},127.0.0.1:{port + 2}"
        assert len(_jvms(str(data))) == 3
        create_topics(bootstrap, {"kept": 3, "failover": 3}, replication=3)
        _round_trip(bootstrap, "kept", [b"one", b"two", b"three"])

        # kill -9 of one node's JVM (it leads one of failover's 3 partitions): the other two keep
        # serving, every record acknowledged with acks=all (min.insync.replicas=2)
        victim = _jvms(str(data))[0]
        victim.kill()
        victim.wait(30)
        _round_trip(bootstrap, "failover", [b"%d" % i for i in range(200)])
        assert cmd.proc.poll() is None, "the command stopped with the dead node"
        cmd.proc.send_signal(signal.SIGUSR1)  # start it again on its data
        wait_for("three JVMs again", lambda: len(_jvms(str(data))) == 3, timeout=180)
        _round_trip(bootstrap, "kept", [b"four"])
        assert cmd.stop(signal.SIGTERM) == 0
        said = cmd.stderr()
        assert re.search(r"kafka node \d stopped.*nodes \d, \d keep serving.*kill -USR1", said), said
        assert re.search(r"kafka node \d starting again on its data", said), said
    finally:
        cmd.kill()
    assert _jvms(str(data)) == []
    assert (data / "cluster.json").exists()  # --data is kept

    again = BrokerCommand("--engine", "kafka", "--nodes", "3", "--data", str(data))  # port from the data
    try:
        assert again.bootstrap() == bootstrap
        assert sorted(_read_all(bootstrap, "kept", 3)) == [b"four", b"one", b"three", b"two"]
        assert len(_read_all(bootstrap, "failover", 3)) == 200
        assert topic_partitions(bootstrap, ["kept"]) == {"kept": 3}
        assert again.stop(signal.SIGHUP) == 0
    finally:
        again.kill()
    assert _jvms(str(data)) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_one_node_without_data_removes_its_temporary_folder(sig: signal.Signals) -> None:
    before = set(Path(os.environ.get("TMPDIR", "/tmp")).glob("reval-kafka-*"))
    cmd = BrokerCommand("--engine", "kafka", "--port", str(free_run(1)))
    try:
        bootstrap = cmd.bootstrap()
        (folder,) = set(Path(os.environ.get("TMPDIR", "/tmp")).glob("reval-kafka-*")) - before
        assert len(_jvms(str(folder))) == 1
        create_topics(bootstrap, {"scratch": 1})
        assert cmd.stop(sig) == 0
    finally:
        cmd.kill()
    assert _jvms(str(folder)) == []
    assert not folder.exists()


# --------------------------------------------------------------------------- what can be wrong


def _fails(args: list[str], env: dict[str, str] | None = None, timeout: float = 300) -> tuple[int, str]:
    done = subprocess.run([REVAL, "broker", *args], capture_output=True, text=True, env=env, timeout=timeout)
    assert done.stdout == "", done.stdout  # no bootstrap line for a broker that is not up
    return done.returncode, done.stderr.strip()


def _one_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, text
    return lines[0]


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, text = _fails(["--engine", "kafka", "--port", str(port), "--data", str(tmp_path / "d")])
    assert code == 2
    assert f"127.0.0.1:{port} is in use" in _one_line(text)
    assert _jvms(str(tmp_path)) == []


def test_a_damaged_data_folder_is_one_line_and_exit_2(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "something.txt").write_text("not kafka")
    code, text = _fails(["--engine", "kafka", "--data", str(foreign)])
    assert code == 2 and "not a reval Kafka folder" in _one_line(text)

    data = tmp_path / "kafka"  # a real cluster folder, then its node's meta.properties damaged
    with KafkaCluster(data_dir=data):
        pass
    meta = data / "node-1" / "data" / "meta.properties"
    meta.write_text(meta.read_text().replace("cluster.id=", "cluster.id=X"))
    code, text = _fails(["--engine", "kafka", "--data", str(data)])
    assert code == 2 and "damaged" in _one_line(text) and str(meta) in text
    (data / "cluster.json").write_text("{not json")
    code, text = _fails(["--engine", "kafka", "--data", str(data)])
    assert code == 2 and "cluster.json" in _one_line(text)
    assert _jvms(str(data)) == []


def test_no_java_is_one_line_and_exit_1(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # PATH without java (and no JAVA_HOME)
    bin_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = f"{bin_dir}:{Path(REVAL).parent}"
    code, text = _fails(["--engine", "kafka", "--port", str(free_run(1))], env=env)
    assert code == 1 and "no Java found" in _one_line(text)
    env["JAVA_HOME"] = str(tmp_path / "nowhere")
    code, text = _fails(["--engine", "kafka", "--port", str(free_run(1))], env=env)
    assert code == 1 and "JAVA_HOME" in _one_line(text)


def test_an_unreachable_maven_central_is_one_line_and_exit_1(tmp_path: Path) -> None:
    """Real Maven with an empty local repository and its mirror on a closed port: the jars
    cannot be fetched, the cache stays empty, nothing is started."""
    home = tmp_path / "home"
    (home / ".m2").mkdir(parents=True)
    (home / ".m2" / "settings.xml").write_text(
        "<settings><localRepository>" + str(home / "repo") + "</localRepository>"
        "<mirrors><mirror><id>closed</id><mirrorOf>*</mirrorOf>"
        "<url>http://127.0.0.1:9/maven2</url></mirror></mirrors></settings>"
    )
    cache = tmp_path / "cache"
    # Maven finds settings.xml under Java's user.home (from the passwd file, not $HOME).
    env = {**os.environ, "MAVEN_OPTS": f"-Duser.home={home}", "REVAL_KAFKA_CACHE": str(cache)}
    code, text = _fails(["--engine", "kafka", "--port", str(free_run(1))], env=env)
    assert code == 1
    assert "cannot fetch Apache Kafka" in _one_line(text) and "Maven Central" in text
    assert not (cache / pinned_version() / "lib").exists()
    assert _jvms(str(tmp_path)) == []


def test_tansu_refuses_kafka_only_options() -> None:
    code, text = _fails(["--engine", "tansu", "--nodes", "3"])
    assert code == 2 and "--nodes" in _one_line(text)
    code, text = _fails(["--engine", "zookeeper"])
    assert code == 2 and "--engine" in _one_line(text)


# --------------------------------------------------------------------------- versions


def test_compose_runs_the_pinned_kafka_version() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    images = {name: svc.get("image", "") for name, svc in compose["services"].items()}
    kafka_images = [image for image in images.values() if image.startswith("apache/kafka:")]
    assert kafka_images and all(image == f"apache/kafka:{pinned_version()}" for image in kafka_images)


def test_the_stack_on_kafka_3_9(tmp_path: Path) -> None:
    """Smoke test for users on older clusters: kafka-python's admin, producer and consumer and
    aiokafka's (Faust's) consumer group against Kafka 3.9."""
    from aiokafka import AIOKafkaConsumer

    version = "3.9.1"
    kafka_jars(version)
    topic = f"smoke-{uuid.uuid4().hex[:6]}"
    with KafkaCluster(version=version, data_dir=tmp_path / "k39") as cluster:
        create_topics(cluster.bootstrap, {topic: 2})
        assert topic_partitions(cluster.bootstrap, [topic]) == {topic: 2}
        _round_trip(cluster.bootstrap, topic, [b"a", b"b", b"c"])
        assert sorted(_read_all(cluster.bootstrap, topic, 2)) == [b"a", b"b", b"c"]

        async def group_read() -> list[bytes]:
            consumer = AIOKafkaConsumer(
                topic,
                bootstrap_servers=cluster.bootstrap,
                group_id=f"g-{topic}",
                auto_offset_reset="earliest",
                session_timeout_ms=6000,
            )
            await consumer.start()
            try:
                got: list[bytes] = []
                deadline = time.monotonic() + 60
                while len(got) < 3 and time.monotonic() < deadline:
                    batch = await consumer.getmany(timeout_ms=1000)
                    got += [r.value for records in batch.values() for r in records if r.value]
                await consumer.commit()
                return sorted(got)
            finally:
                await consumer.stop()

        assert asyncio.run(group_read()) == [b"a", b"b", b"c"]
