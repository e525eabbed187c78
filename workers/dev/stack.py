"""Running the real workers as subprocesses against a real broker and Redis (tests, benchmarks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus
from workers.adapters.files.store import ThesaurusStore
from workers.adapters.kafka.kafka_client import create_topics
from workers.adapters.redis.redis_client import clear_prefix, connect
from workers.adapters.redis.redis_thesaurus import RedisThesauri
from workers.dev.ports import find_free_port
from workers.dev.processes import terminate

REVAL = str(Path(sys.executable).parent / "reval")


def wait_for(what: str, check: Callable[[], Any], timeout: float = 90.0, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


@dataclass
class Worker:
    roles: tuple[str, ...]
    proc: subprocess.Popen[bytes]
    log: Path
    port: int

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"worker {self.roles} exited {self.proc.returncode}:\n{self.text()[-4000:]}")
        return "[^Worker]: Ready" in self.text()

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as response:
            body = response.read().decode()
        out = {}
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics().get((name, tuple(sorted(labels.items()))), 0.0)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        terminate(self.proc)


@dataclass
class Stack:
    """One isolated deployment: its own topics, consumer groups, Redis prefix and index dir."""

    bootstrap: str
    redis_url: str
    model: Path
    workdir: Path
    partitions: int = 2
    replication: int = 1
    #: kafka-python options for the test's own clients (TLS/SASL: ``KafkaCluster.client_options``)
    client_options: dict[str, Any] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)
    redis_cluster: bool = False
    """``redis_url`` names a node of a Redis Cluster (``REVAL_REDIS_CLUSTER=true`` for the workers)."""
    input_retention_ms: int = -1
    """retention.ms of the input topics: kept forever, as replays of 2012-2013 archives need."""
    workers: list[Worker] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        tag = uuid.uuid4().hex[:8]
        self.prefix = f"test-{tag}"
        self.topics = {
            "tweets": f"tweets-{tag}",
            "recommendations": f"recs-{tag}",
            "scores": f"scores-{tag}",
            "dead_letter": f"dlq-{tag}",
        }
        self.index_dir = self.workdir / "index"
        self.env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "REVAL_BROKER": self.bootstrap,
            "REVAL_REDIS_URL": self.redis_url,
            "REVAL_REDIS_PREFIX": self.prefix,
            "REVAL_REDIS_CLUSTER": "true" if self.redis_cluster else "false",
            "REVAL_APP_ID": f"reval-{tag}",
            "REVAL_TOPIC_TWEETS": self.topics["tweets"],
            "REVAL_TOPIC_RECOMMENDATIONS": self.topics["recommendations"],
            "REVAL_TOPIC_SCORES": self.topics["scores"],
            "REVAL_TOPIC_DEAD_LETTER": self.topics["dead_letter"],
            "REVAL_TOPIC_VOTES": f"votes-{tag}",  # no audit: the index job finds no votes
            "REVAL_PARTITIONS": str(self.partitions),
            "REVAL_REPLICATION": str(self.replication),
            "REVAL_INPUT_RETENTION_MS": str(self.input_retention_ms),
            "REVAL_MODEL": str(self.model),
            "REVAL_DTYPE": "float32",  # the batch recomputation in the tests runs fp32 too
            "REVAL_EMBED_BATCH_SIZE": "16",
            "REVAL_EMBED_MAX_WAIT_S": "0.3",
            "REVAL_INDEX_DIR": str(self.index_dir),
            "REVAL_INDEX_INTERVAL_S": "1",
            "REVAL_RELOAD_INTERVAL_S": "0.5",
            "REVAL_SESSION_TIMEOUT_S": "6",
            "REVAL_JOIN_WINDOW_S": "20",
            **self.extra_env,
        }
        create_topics(
            self.bootstrap,
            {
                self.topics["tweets"]: self.partitions,
                self.topics["recommendations"]: self.partitions,
                self.topics["scores"]: self.partitions,
                self.topics["dead_letter"]: 1,
            },
            replication=self.replication,
            configs={
                self.topics[name]: {"retention.ms": str(self.input_retention_ms)}
                for name in ("tweets", "recommendations")
            },
            **self.client_options,
        )
        self.producer = KafkaProducer(
            bootstrap_servers=self.bootstrap, linger_ms=5, acks="all", **self.client_options
        )

    def start(
        self,
        *roles: str,
        loglevel: str = "info",
        env: dict[str, str] | None = None,
        wrapper: Sequence[str] = (),
    ) -> Worker:
        """Start ``reval worker ROLES``; ``env``: variables added for this worker only;
        ``wrapper``: a command the worker runs under (a profiler: ``python -m memray run ...``)."""
        port = find_free_port()
        log = self.workdir / f"worker-{'-'.join(roles)}-{len(self.workers)}.log"
        handle = log.open("wb")
        proc = subprocess.Popen(
            [*wrapper, REVAL, "worker", *roles, "--metrics-port", str(port), "--loglevel", loglevel],
            env={**self.env, **(env or {})},
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            start_new_session=True,
        )
        worker = Worker(tuple(roles), proc, log, port)
        self.workers.append(worker)
        return worker

    def publish(self, thesaurus: AnnoyThesaurus) -> str:
        """Publish a thesaurus version as the index job does: in the directory store, and in
        Redis for the scorers; return its name."""
        version = ThesaurusStore(self.index_dir).publish(thesaurus)
        client = connect(self.redis_url, cluster=self.redis_cluster)
        try:
            RedisThesauri(client, self.prefix).publish(self.index_dir / version, version)
        finally:
            client.close()
        return version

    def wait_ready(self, *workers: Worker, timeout: float = 120.0) -> None:
        wait_for("workers ready", lambda: all(w.ready() for w in workers), timeout)

    def send(self, topic: str, records: Iterable[tuple[bytes | None, bytes]], **kw: Any) -> None:
        futures = [
            self.producer.send(self.topics[topic], key=key, value=value, **kw) for key, value in records
        ]
        self.producer.flush()
        for future in futures:  # a record the broker refused fails the test here, not later
            future.get(timeout=30)

    def read(self, topic: str, *, timeout_ms: int = 1500) -> list[Any]:
        """Every record of a topic so far (no consumer group: kafka-python's hangs on Tansu)."""
        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            consumer_timeout_ms=timeout_ms,
            **self.client_options,
        )
        name = self.topics[topic]
        parts = [TopicPartition(name, p) for p in range(1 if topic == "dead_letter" else self.partitions)]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        records = list(consumer)
        consumer.close()
        return records

    def read_json(self, topic: str) -> list[dict[str, Any]]:
        return [json.loads(r.value) for r in self.read(topic)]

    def close(self) -> None:
        """Stop the workers and delete this stack's Redis keys."""
        for worker in self.workers:
            worker.stop()
        self.producer.close()
        clear_prefix(self.redis_url, self.prefix, cluster=self.redis_cluster)


def tweet_lines(path: Path, n: int, start: int = 0) -> list[str]:
    import gzip
    import itertools

    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [line.strip() for line in itertools.islice(handle, start, start + n)]


def keyed(lines: Iterable[str]) -> Iterator[tuple[bytes, bytes]]:
    for line in lines:
        yield json.loads(line)["id"].encode(), line.encode()
