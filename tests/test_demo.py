"""`reval demo` as a user runs it: in a real 80-column pseudo-terminal, read back through a
terminal emulator (the live table must be on screen, whole, and moving), piped with
``--json`` (one object per refresh, numbers that mean something), and stopped by signals
(the whole process tree must go, and nothing of the demo may stay behind); and the table and
JSON of one refresh from a real scorer's /metrics."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pexpect
import psutil
import pyte
import pytest
from prometheus_client import generate_latest

from stream.evaluation.chance import corrected_of_sums
from stream.evaluation.scoring import score_event
from stream.intake.records import Recommendation
from stream.monitoring.cusum import Detector
from stream.synonyms.neighbour_table import build_neighbour_table
from workers.adapters.files.annoy_thesaurus import neighbour_cache
from workers.adapters.prometheus.exporter import Exporter, LabelGuard
from workers.adapters.prometheus.quality_metrics import QualityMetrics
from workers.commands.demo_view import Output, Scrape, snapshot
from workers.dev.processes import at_a_terminal
from workers.dev.stack import REVAL

COLUMNS, LINES = 80, 40
NAMES = ("least-popular", "mowe", "popular", "random")
KEYS = {"elapsed_s", "thesaurus", "embedded", "scored", "recommenders"}
KS = (0, 5, 10, 20, 50)


def test_one_refresh_is_the_json_contract_and_an_80_column_table() -> None:
    """A real scorer's metrics (QualityMetrics over scored events) read back as the demo
    reads them: the JSON object has exactly the promised keys, its corrected value is the
    kappa of the sums (not a mean of per-event values), and the table fits 80 columns."""
    rng = np.random.default_rng(5)
    names = [f"tag{i}" for i in range(60)]
    unit = rng.normal(size=(60, 8))
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    table = build_neighbour_table(names, unit, list(range(60, 0, -1)), depth=50, method="raw")
    cache = neighbour_cache(table, 50)
    exporter = Exporter()
    quality = QualityMetrics(exporter, KS, (5, 10), (86400,), LabelGuard(), lambda s: "1d")
    scores = []
    for name, pool in (("popular", names[:8]), ("least-popular", names[-8:]), ("random", names)):
        for i in range(40):
            truth = tuple(rng.choice(names[:20], size=2, replace=False))
            recommended = tuple(rng.choice(pool, size=5, replace=False))
            event = Recommendation(f"{name}-{i}", recommended, truth, name, None)
            scores.append(score_event(event, truth, cache, KS, (5, 10)))
    quality.observe_many(scores, [1_350_000_000.0] * len(scores))
    detector = Detector(reference=20)  # the live change detector's gauges, as a worker sets them
    detector.events, detector.alarms["quality_lost"] = 40, 2
    exporter.set_detector("popular", detector, {"quality_lost": 1_350_000_000.0})
    score = Scrape.parse(generate_latest(exporter.registry).decode())
    embed = Scrape({("reval_tweets_embedded_total", ()): 1234.0})
    snap = snapshot(embed, score, "v000003", 60, 12.345)

    assert set(snap) == KEYS and snap["thesaurus"] == {"version": "v000003", "hashtags": 60}
    assert (snap["elapsed_s"], snap["embedded"], snap["scored"]) == (12.3, 1234, 120)
    assert list(snap["recommenders"]) == ["least-popular", "popular", "random"]
    for name, row in snap["recommenders"].items():
        assert set(row) == {"events", "exact_hit_ratio", "reval", "corrected", "detector"}
        alarms = {"quality_lost": 2 if name == "popular" else 0, "wording_changed": 0}
        assert row["detector"] == {"events": 40 if name == "popular" else 0, "alarms": alarms}
        assert list(row["reval"]) == [str(k) for k in KS] and list(row["corrected"]) == ["10"]
        mine = [s for s in scores if s.recommender == name]
        observed = sum(s.reval["5"][10] for s in mine)
        expected = sum(s.expected["5"][10] for s in mine)
        kappa = corrected_of_sums(observed, expected, best=len(mine))
        assert kappa is not None and row["corrected"]["10"] == round(kappa, 4)
        assert row["events"] == 40 and row["reval"]["10"] == round(observed / 40, 4)
        assert row["exact_hit_ratio"] == row["reval"]["0"]
    assert json.loads(json.dumps(snap)) == snap

    piped = io.StringIO()  # not a terminal: a plain table per refresh
    Output(stdout=piped).show(snap)
    text = piped.getvalue()
    assert "\x1b[" not in text and max(len(line) for line in text.splitlines()) <= 80
    assert "thesaurus v000003 (60 hashtags)" in text
    assert "change detector alarms: popular quality lost x2" in text
    for name, row in snap["recommenders"].items():
        cells = next(line for line in text.splitlines() if line.startswith(f" {name} ")).split()
        assert cells[0] == name and cells[-1] == f"{row['corrected']['10']:.3f}", text
    lines = io.StringIO()
    Output(json_lines=True, stdout=lines).show(snap)
    assert [json.loads(line) for line in lines.getvalue().splitlines()] == [snap]


class Terminal:
    """``reval demo`` in a pseudo-terminal, its output fed to a VT100 emulator."""

    def __init__(self, args: list[str], tmp_path: Path) -> None:
        self.screen = pyte.Screen(COLUMNS, LINES)
        self.stream = pyte.ByteStream(self.screen)
        env = {"TMPDIR": str(tmp_path), "HF_HUB_OFFLINE": "1", "COLUMNS": str(COLUMNS), "LINES": str(LINES)}
        self.child = pexpect.spawn(
            REVAL, ["demo", *args], dimensions=(LINES, COLUMNS), env={**os.environ, **env}, timeout=5
        )
        self.process = psutil.Process(self.child.pid)
        self.raw = b""  # everything written, for what was on screen only for a moment

    def pump(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                data = self.child.read_nonblocking(65536, timeout=0.2)
                self.raw += data
                self.stream.feed(data)
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

    def saw(self, pattern: str, seconds: float) -> None:
        """``pattern`` was written at some point (it may be off the screen now)."""
        deadline = time.monotonic() + seconds
        while not re.search(pattern.encode(), self.raw):
            if time.monotonic() > deadline or not self.child.isalive():
                raise AssertionError(f"{pattern!r} never written in {seconds:.0f}s:\n{self.text()}")
            self.pump(0.5)

    def tree(self) -> list[psutil.Process]:
        return [self.process, *self.process.children(recursive=True)]


def rows(text: str) -> dict[str, list[str]]:
    """The table's rows: recommender -> its cells."""
    out = {}
    for line in text.splitlines():
        cells = line.split()
        if len(cells) > 1 and cells[0] in NAMES and re.fullmatch(r"[\d,]+", cells[1]):  # not the legend
            out[cells[0]] = cells[1:]
    return out


def events_scored(text: str) -> int:
    found = re.search(r"scored ([\d,]+) events", text)
    return int(found.group(1).replace(",", "")) if found else 0


def wait_for_tree(term: Terminal, size: int, seconds: float) -> list[psutil.Process]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        term.pump(0.5)
        tree = term.tree()
        if len(tree) >= size:
            return tree
    raise AssertionError(f"fewer than {size} processes after {seconds:.0f}s: {term.tree()}\n{term.text()}")


@pytest.mark.integration
@pytest.mark.slow
def test_the_demo_table_is_live_at_80_columns_and_everything_is_cleaned_up(
    tiny_bertweet: Path, tmp_path: Path
) -> None:
    # 20 s of demo after its first scored event: the reads below take ~10 s
    term = Terminal(["--duration", "20", "--model", str(tiny_bertweet)], tmp_path)
    children: list[Any] = []
    try:
        term.wait_for(r"starting the workers", 60)
        children = wait_for_tree(term, 6, 60)[1:]  # broker, Redis, three workers
        # the progress line before the table (with the tiny model the warm-up itself may be
        # over within one refresh; the training of the recommenders takes longer)
        term.saw(r"training mowe on [\d,]+ tweets|warming the thesaurus: the embed worker is through", 600)
        term.wait_for(r"thesaurus v0000\d\d \([1-9][\d,]* hashtags\)", 300)  # the table, once scoring began
        term.wait_for(r"scored [1-9][\d,]* events", 30)
        first, first_rows = events_scored(term.text()), rows(term.text())
        term.pump(8)
        # The screen may be caught mid-redraw (the footer not drawn yet): read it once whole.
        term.wait_for(r"scored [1-9][\d,]* events", 30)
        text = term.text()
        second, second_rows = events_scored(text), rows(text)
        assert second > first, text  # the numbers move while the demo runs
        assert set(second_rows) == set(NAMES) and second_rows != first_rows, text
        for cells in second_rows.values():  # whole at 80 columns: events, 5 k columns, corrected
            assert len(cells) == 7 and re.fullmatch(r"[\d,]+", cells[0]), text
            assert all(re.fullmatch(r"-?\d\.\d{3}|-", cell) for cell in cells[1:]), text
        assert "…" not in text
        term.child.expect(pexpect.EOF, timeout=120)  # --duration 20 after the first scored event
        term.child.close()
        assert term.child.exitstatus == 0
    finally:
        if term.child.isalive():
            term.child.kill(signal.SIGKILL)
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, alive
    assert not list(tmp_path.iterdir())  # its temporary folder, Redis's and torch's: all gone


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_stops_the_whole_demo_tree(sig: signal.Signals, tiny_bertweet: Path, tmp_path: Path) -> None:
    term = Terminal(["--model", str(tiny_bertweet)], tmp_path)
    try:
        term.wait_for(r"starting the workers", 60)
        tree = wait_for_tree(term, 6, 60)
        term.process.send_signal(sig)
        _, alive = psutil.wait_procs(tree, timeout=45)
        assert not alive, [(p.pid, p.name()) for p in alive]
    finally:
        if term.process.is_running():
            term.process.kill()
    assert not list(tmp_path.iterdir())


@pytest.mark.integration
@pytest.mark.slow
def test_piped_json_shows_numbers_that_mean_something(tmp_path: Path) -> None:
    """``reval demo --json | ...`` with the packaged MiniLM: one object per refresh from the
    first scored event on, the thesaurus growing, the scored count rising all along, and --
    once 16,000 events are scored -- the least-popular canary lowest at every k >= 5 and the
    random recommender's corrected score at chance."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    with open(tmp_path.parent / f"{tmp_path.name}.stderr", "wb") as stderr:
        proc = subprocess.Popen(
            [REVAL, "demo", "--json", "--duration", "1200"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            preexec_fn=at_a_terminal,  # it is stopped with Ctrl-C below
        )
    objects: list[dict[str, Any]] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 1500
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            objects.append(json.loads(line))
            if objects[-1]["scored"] >= 16_000 and len({o["thesaurus"]["version"] for o in objects}) >= 3:
                break
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path.parent / f"{tmp_path.name}.stderr").read_text(errors="replace")
    assert objects and objects[-1]["scored"] >= 16_000, log[-3000:]
    assert all(set(o) == KEYS and set(o["recommenders"]) == set(NAMES) for o in objects[1:])
    assert "warming the thesaurus" in log
    assert objects[0]["elapsed_s"] < 5  # counted from the first scored event
    sizes = [o["thesaurus"]["hashtags"] for o in objects]
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]  # the thesaurus grows
    scored = [o["scored"] for o in objects]
    assert all(b > a for a, b in zip(scored, scored[5:], strict=False)), scored  # rising every 10 s
    last = objects[-1]["recommenders"]
    for k, value in last["least-popular"]["reval"].items():
        if int(k) >= 5:
            assert all(value < last[name]["reval"][k] for name in NAMES if name != "least-popular"), (k, last)
    assert abs(last["random"]["corrected"]["10"]) <= 0.05, last
    assert last["least-popular"]["corrected"]["10"] < 0 < last["popular"]["corrected"]["10"], last
    assert not list(tmp_path.iterdir())
