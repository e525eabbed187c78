"""Child processes that never outlive the command that started them, and commands that
stop cleanly on SIGTERM / SIGHUP as on Ctrl-C."""

from __future__ import annotations

import abc
import atexit
import contextlib
import ctypes
import functools
import signal
import subprocess
import sys
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any, Self

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn`` for a child: the kernel sends it SIGTERM when its parent dies, even by
    SIGKILL (Linux ``prctl(PR_SET_PDEATHSIG)``; a no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(
    command: Sequence[str | Path], log: IO[Any], *, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A child service: output (both streams) to ``log``, no stdin, its own process group (a
    signal to the group reaches its children; Ctrl-C reaches only us, who stop it in order),
    and it dies with us even after a SIGKILL (:func:`die_with_parent`)."""
    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent,
        env=env,
    )


def at_a_terminal() -> None:
    """A child's ``preexec_fn``: Ctrl-C (SIGINT) stops it as it would at a terminal, even where
    the tests themselves run in the background (``nohup``, ``cmd &``), whose children inherit
    SIGINT ignored -- and a Python started with SIGINT ignored never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def terminate(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL if the process has not exited within ``timeout`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP interrupt the main thread like Ctrl-C, so the
    block's own clean-up (``finally``, context managers) stops what it started."""
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Within the block, SIGINT, SIGTERM and SIGHUP wait (blocked, delivered after it): a
    second Ctrl-C or a SIGTERM from a supervisor cannot cut a clean-up short."""
    sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class LocalService(abc.ABC):
    """A service run as local child processes (a broker, a cluster): ``with X() as x`` starts
    and stops it; one still running when the interpreter exits is stopped by an ``atexit``
    hook (:meth:`_stop_at_exit`, undone by :meth:`_forget_at_exit` in ``stop``)."""

    _atexit: Callable[[], None] | None = None

    @abc.abstractmethod
    def start(self) -> Self: ...

    @abc.abstractmethod
    def stop(self) -> None: ...

    def _stop_at_exit(self) -> None:
        # A partial of its own: atexit.unregister drops every registration equal to it.  A
        # weak reference, so the hook does not keep a forgotten service alive.
        self._atexit = functools.partial(_stop_if_alive, weakref.ref(self))
        atexit.register(self._atexit)

    def _forget_at_exit(self) -> None:
        if self._atexit is not None:
            atexit.unregister(self._atexit)
            self._atexit = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _stop_if_alive(ref: weakref.ReferenceType[LocalService]) -> None:
    service = ref()
    if service is not None:
        service.stop()
