"""Child processes that never outlive the command that started them, and commands that
stop cleanly on SIGTERM / SIGHUP as on Ctrl-C."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys
from collections.abc import Iterator
from types import FrameType

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn`` for a child: the kernel sends it SIGTERM when its parent dies, even by
    SIGKILL (Linux ``prctl(PR_SET_PDEATHSIG)``; a no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


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
