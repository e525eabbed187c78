"""The local broker of ``reval broker``, the tests and the benchmarks: Apache Kafka or Tansu.

* ``kafka`` (:class:`~workers.dev.kafka_cluster.KafkaCluster`): Apache Kafka in KRaft mode, 1 or
  3 nodes, from Maven jars; keeps its data across restarts with ``data_dir``.  The engine the
  tests prove the guarantees on.
* ``tansu`` (:class:`~workers.dev.tansu.TansuBroker`): an in-memory Kafka-protocol broker from
  a PyPI wheel, no Java needed; the demo's default.  No restart survives, no replication, no
  transactions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol

from workers.dev.kafka_cluster import KafkaCluster, KafkaSetupError
from workers.dev.tansu import TansuBroker

Engine = Literal["kafka", "tansu"]
ENGINES: tuple[Engine, ...] = ("kafka", "tansu")


class LocalBroker(Protocol):
    """What the callers of :func:`local_broker` use: the bootstrap list, start and stop."""

    @property
    def bootstrap(self) -> str: ...

    @property
    def running(self) -> bool: ...

    @property
    def pids(self) -> list[int]: ...

    def start(self) -> LocalBroker: ...

    def stop(self) -> None: ...


def local_broker(
    engine: Engine = "kafka",
    *,
    nodes: int = 1,
    port: int | None = None,
    data_dir: Path | None = None,
    log_path: Path | None = None,
) -> LocalBroker:
    """A broker of ``engine``, not started yet.  Tansu runs one node in memory: ``nodes`` other
    than 1 and ``data_dir`` are usage errors there (:class:`KafkaSetupError` with ``usage``)."""
    if engine == "kafka":
        return KafkaCluster(nodes, port=port, data_dir=data_dir)
    if engine != "tansu":
        raise KafkaSetupError(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}", usage=True)
    if nodes != 1:
        raise KafkaSetupError("--nodes: Tansu runs one node (use --engine kafka for 3)", usage=True)
    if data_dir is not None:
        raise KafkaSetupError("--data: Tansu keeps everything in memory (use --engine kafka)", usage=True)
    return TansuBroker(port, log_path=log_path)
