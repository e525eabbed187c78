"""`reval demo` as a user runs it: in a real pseudo-terminal, read back through a terminal
emulator (the live table must be on screen and moving), and stopped by signals (the whole
process tree must go, and nothing of the demo may stay behind)."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import pexpect
import psutil
import pyte
import pytest

from workers.dev.stack import REVAL

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COLUMNS, LINES = 150, 40


class Terminal:
    """``reval demo`` in a pseudo-terminal, its output fed to a VT100 emulator."""

    def __init__(self, args: list[str], tmp_path: Path) -> None:
        self.screen = pyte.Screen(COLUMNS, LINES)
        self.stream = pyte.ByteStream(self.screen)
        env = {"TMPDIR": str(tmp_path), "HF_HUB_OFFLINE": "1", "COLUMNS": str(COLUMNS), "LINES": str(LINES)}
        self.child = pexpect.spawn(
            REVAL, ["demo", *args], dimensions=(LINES, COLUMNS), env={**_environ(), **env}, timeout=5
        )
        self.process = psutil.Process(self.child.pid)

    def pump(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                self.stream.feed(self.child.read_nonblocking(65536, timeout=0.2))
            except pexpect.TIMEOUT:
                continue
            except pexpect.EOF:
                return

    def text(self) -> str:
        return "\n".join(self.screen.display)

    def wait_for(self, pattern: str, seconds: float) -> re.Match[str]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.pump(0.5)
            found = re.search(pattern, self.text())
            if found:
                return found
            if not self.child.isalive():
                break
        raise AssertionError(f"{pattern!r} not on screen after {seconds:.0f}s:\n{self.text()}")

    def tree(self) -> list[psutil.Process]:
        return [self.process, *self.process.children(recursive=True)]


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


def rows(text: str) -> dict[str, list[str]]:
    """The table's rows: recommender -> its cells."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line) if c.strip()]
        if cells and cells[0] in ("mowe", "popular", "least-popular", "random"):
            out[cells[0]] = cells[1:]
    return out


def events_scored(text: str) -> int:
    found = re.search(r"scored ([\d,]+) events", text)
    return int(found.group(1).replace(",", "")) if found else 0


def test_the_demo_table_is_live_and_everything_is_cleaned_up(tiny_bertweet: Path, tmp_path: Path) -> None:
    term = Terminal(["--duration", "75", "--model", str(tiny_bertweet)], tmp_path)
    children: list[Any] = []
    try:
        term.wait_for(r"average #REval-hit-ratio", 150)
        children = term.tree()[1:]
        assert len(children) >= 4, children  # broker, Redis, three workers
        term.wait_for(r"scored [1-9][\d,]* events", 90)
        first, first_rows = events_scored(term.text()), rows(term.text())
        term.pump(12)
        # The screen may be caught mid-redraw (the footer not drawn yet): read it once whole.
        term.wait_for(r"scored [1-9][\d,]* events", 30)
        second, second_rows = events_scored(term.text()), rows(term.text())
        assert second > first, term.text()  # the numbers move while the demo runs
        assert set(second_rows) == {"mowe", "popular", "least-popular", "random"}, term.text()
        assert second_rows != first_rows
        assert re.search(r"index v0000\d\d \([1-9][\d,]* hashtags\)", term.text())
        term.child.expect(pexpect.EOF, timeout=120)
        term.child.close()
        assert term.child.exitstatus == 0
    finally:
        if term.child.isalive():
            term.child.kill(signal.SIGKILL)
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, alive
    assert not list(tmp_path.glob("reval-demo-*")), list(tmp_path.iterdir())  # its temp dir removed


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_stops_the_whole_demo_tree(sig: signal.Signals, tiny_bertweet: Path, tmp_path: Path) -> None:
    term = Terminal(["--model", str(tiny_bertweet)], tmp_path)
    try:
        term.wait_for(r"average #REval-hit-ratio", 150)
        tree = term.tree()
        assert len(tree) >= 5
        term.process.send_signal(sig)
        _, alive = psutil.wait_procs(tree, timeout=45)
        assert not alive, [(p.pid, p.name()) for p in alive]
    finally:
        if term.process.is_running():
            term.process.kill()
    assert not list(tmp_path.glob("reval-demo-*"))
