"""Apache Kafka's jars from Maven Central, and the Java that runs them.

The version is pinned in ``workers/dev/kafka/pom.xml``; the jars are fetched once with Maven
into a cache outside git (``$REVAL_KAFKA_CACHE``, default ``~/.cache/reval/kafka``).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from importlib import resources
from pathlib import Path

from workers.adapters.kafka.kafka_client import BrokerError

#: The cache of Kafka's jars (one folder per version); outside git.
CACHE_ENV = "REVAL_KAFKA_CACHE"
#: A Java other than ``java`` on PATH (``$JAVA_HOME/bin/java`` otherwise).
JAVA_ENV = "JAVA_HOME"


class KafkaSetupError(BrokerError):
    """Kafka cannot be run here: no Java, no Maven, the jars cannot be fetched, a data
    directory of something else.  ``usage`` is True when the caller's options are at fault
    (exit code 2), False for the machine (exit code 1)."""

    def __init__(self, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


def _pom() -> Path:
    return Path(str(resources.files("workers.dev").joinpath("kafka/pom.xml")))


def pinned_version() -> str:
    """The Kafka version the project pins (``kafka.version`` in ``workers/dev/kafka/pom.xml``)."""
    tree = ET.parse(_pom())
    node = tree.find(
        "{http://maven.apache.org/POM/4.0.0}properties/{http://maven.apache.org/POM/4.0.0}kafka.version"
    )
    if node is None or not node.text:
        raise KafkaSetupError(f"{_pom()}: no <kafka.version> property")
    return node.text.strip()


def _cache_root() -> Path:
    chosen = os.environ.get(CACHE_ENV)
    return Path(chosen) if chosen else Path.home() / ".cache" / "reval" / "kafka"


def java_binary() -> str:
    """``$JAVA_HOME/bin/java`` when set, else ``java`` on PATH; Kafka 4 needs Java 17+."""
    home = os.environ.get(JAVA_ENV)
    candidate = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not candidate or not os.access(candidate, os.X_OK):
        where = f"${JAVA_ENV}={home}" if home else "PATH"
        raise KafkaSetupError(f"no Java found ({where}): Apache Kafka needs Java 17 or newer")
    return candidate


def kafka_jars(version: str | None = None, *, timeout: float = 600.0) -> Path:
    """The folder of Kafka ``version``'s runtime jars, fetched with Maven on first use.

    Fetched into a temporary folder and renamed into the cache when complete, under a file
    lock, so concurrent first uses (parallel tests) fetch once and never see half a folder.
    """
    version = version or pinned_version()
    if not re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", version):
        raise KafkaSetupError(f"Kafka version {version!r} is not like 4.4.0", usage=True)
    root = _cache_root()
    lib = root / version / "lib"
    if (lib / ".complete").exists():
        return lib
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KafkaSetupError(f"cannot create the Kafka jar cache {root}: {exc.strerror}") from None
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (lib / ".complete").exists():
            return lib
        _fetch(version, lib, timeout)
    return lib


def _fetch(version: str, lib: Path, timeout: float) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaSetupError("Maven (mvn) is not on PATH: it fetches Apache Kafka's jars once")
    with tempfile.TemporaryDirectory(prefix="reval-kafka-mvn-", dir=lib.parent.parent) as tmp:
        project = Path(tmp) / "pom.xml"
        shutil.copyfile(_pom(), project)
        staging = Path(tmp) / "lib"
        cmd = [
            mvn, "-B", "-q", "-f", str(project), f"-Dkafka.version={version}",
            "dependency:copy-dependencies", f"-DoutputDirectory={staging}", "-DincludeScope=runtime",
        ]  # fmt: skip
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise KafkaSetupError(
                f"fetching Apache Kafka {version} from Maven Central took over {timeout:.0f} s"
            ) from None
        if done.returncode != 0 or not any(staging.glob("kafka_2.13-*.jar")):
            lines = [ln for ln in (done.stdout + done.stderr).splitlines() if "ERROR" in ln]
            reason = lines[0].strip() if lines else f"mvn exited {done.returncode}"
            raise KafkaSetupError(f"cannot fetch Apache Kafka {version} with Maven (Maven Central): {reason}")
        (staging / ".complete").write_text(version + "\n")
        if lib.exists():  # a half folder of an interrupted fetch from before the lock existed
            shutil.rmtree(lib)
        lib.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(lib)
