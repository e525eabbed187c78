"""Every command over a table of bad inputs, through the real ``reval`` console script:
no traceback, one error line naming the culprit, exit 2 for a usage error (found
before any work), 1 for a runtime failure, 0 only when work was done."""

from __future__ import annotations

import gzip
import itertools
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from workers.adapters.files.feeds import sample_feed

REVAL = str(Path(sys.executable).with_name("reval"))


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]
    code: int
    culprit: str  # must appear on the error line (or in the output, for code 0)
    env: tuple[tuple[str, str], ...] = ()


def recommend(method: str, train: str, feed: str, out: str) -> tuple[str, ...]:
    return ("recommend", "-m", method, "--train", train, "--feed", feed, "--out", out)


def build(feed: str, out: str, *options: str, model: str = "model") -> tuple[str, ...]:
    return ("thesaurus", "build", feed, "--model", model, "--out", out, *options)


@dataclass(frozen=True)
class Ran:
    code: int
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory, tiny_bertweet: Path) -> Path:
    """A feed, a thesaurus, events, a directory, a text file, a file of random bytes."""
    root = tmp_path_factory.mktemp("bad-inputs")
    with gzip.open(sample_feed(), "rt", encoding="utf-8") as src:
        (root / "feed.jsonl").write_text("".join(itertools.islice(src, 400)), encoding="utf-8")
    (root / "notes.txt").write_text("not a feed\n", encoding="utf-8")
    (root / "folder").mkdir()
    (root / "random.jsonl").write_bytes(os.urandom(4000).replace(b"\n", b"\n\xff"))
    (root / "model").symlink_to(tiny_bertweet)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for argv in (
        ["thesaurus", "build", "feed.jsonl", "--model", "model", "--out", "th"],
        [
            "recommend",
            "-m",
            "popular",
            "--train",
            "feed.jsonl",
            "--feed",
            "feed.jsonl",
            "--with-truth",
            "--out",
            "events.jsonl",
        ],
    ):
        subprocess.run([REVAL, *argv], cwd=root, env=env, check=True, capture_output=True, timeout=300)
    (root / "no-truth.jsonl").write_text(
        '{"tweet_id": "1", "recommender": "x", "recommended": ["a"]}\n', encoding="utf-8"
    )
    return root


CASES = [
    # usage errors: exit 2, before any model or thesaurus loads
    Case("score-dir", ("score", "folder", "-t", "th"), 2, "folder is a directory"),
    Case("score-txt", ("score", "notes.txt", "-t", "th"), 2, "notes.txt: unsupported feed type"),
    Case("score-missing", ("score", "nope.jsonl", "-t", "th"), 2, "nope.jsonl"),
    Case("score-k-abc", ("score", "events.jsonl", "-t", "th", "-k", "abc"), 2, "-k"),
    Case("score-r-bad", ("score", "events.jsonl", "-t", "th", "-r", "x"), 2, "-r"),
    Case("score-no-thesaurus", ("score", "events.jsonl", "-t", "nowhere"), 2, "nowhere"),
    Case(
        "score-events-under-a-file",
        ("score", "events.jsonl", "-t", "th", "--events", "notes.txt/out.jsonl"),
        2,
        "notes.txt",
    ),
    Case("score-bad-option", ("score", "events.jsonl", "-t", "th", "--bogus"), 2, "--bogus"),
    Case("synonyms-not-a-hashtag", ("synonyms", "-t", "th", "##"), 2, "'##' is not a hashtag"),
    Case("synonyms-negative-k", ("synonyms", "-t", "th", "-k", "-1", "news"), 2, "-k"),
    Case(
        "recommend-train-dir",
        recommend("popular", "folder", "feed.jsonl", "o.jsonl"),
        2,
        "folder is a directory",
    ),
    Case("recommend-feed-txt", recommend("popular", "feed.jsonl", "notes.txt", "o.jsonl"), 2, "notes.txt"),
    Case("recommend-unknown-method", recommend("best", "feed.jsonl", "feed.jsonl", "o.jsonl"), 2, "'best'"),
    Case(
        "recommend-out-under-a-file",
        recommend("popular", "feed.jsonl", "feed.jsonl", "notes.txt/o.jsonl"),
        2,
        "notes.txt",
    ),
    Case("build-batch-size-0", build("feed.jsonl", "t2", "--batch-size", "0"), 2, "--batch-size"),
    Case("build-out-under-a-file", build("feed.jsonl", "notes.txt/t"), 2, "notes.txt"),
    Case("build-over-user-files", build("feed.jsonl", "."), 2, "refusing"),
    Case("build-bad-hubness", ("thesaurus", "build", "feed.jsonl", "--out", "t3", "--hubness", "x"), 2, "x"),
    Case("evaluate-out-under-a-file", ("evaluate", "feed.jsonl", "--out", "notes.txt/r"), 2, "notes.txt"),
    Case("evaluate-over-user-files", ("evaluate", "feed.jsonl", "--out", "."), 2, "refusing"),
    Case("evaluate-feed-dir", ("evaluate", "folder", "--out", "r"), 2, "folder is a directory"),
    Case("worker-unknown-role", ("worker", "scorer"), 2, "scorer"),
    Case("replay-bad-speed", ("replay", "feed.jsonl", "--topic", "t", "--speed", "fast"), 2, "fast"),
    Case("demo-bad-duration", ("demo", "--duration", "0"), 2, "--duration"),
    Case("demo-bad-rate", ("demo", "--rate", "0"), 2, "--rate"),
    Case("evaluate-bad-cores", ("evaluate", "feed.jsonl", "--out", "out", "--cores", "0,2"), 2, "cores"),
    # runtime failures: exit 1
    Case("score-random-bytes", ("score", "random.jsonl", "-t", "th"), 1, "all "),
    Case(
        "score-nothing-scorable", ("score", "no-truth.jsonl", "-t", "th"), 1, "reval recommend --with-truth"
    ),
    Case(
        "recommend-feed-random-bytes",
        recommend("popular", "feed.jsonl", "random.jsonl", "o.jsonl"),
        1,
        "were bad",
    ),
    Case("build-random-bytes", build("random.jsonl", "t4"), 1, "were bad"),
    Case("build-model-offline", build("feed.jsonl", "t5", model="vinai/bertweet-base"), 1, "--model"),
    Case(
        "worker-no-broker",
        ("worker", "score", "--broker", "127.0.0.1:1", "--metrics-port", "0"),
        1,
        "REVAL_BROKER",
        (("REVAL_STARTUP_TIMEOUT_S", "3"),),
    ),
    # work done: exit 0 (huge k is capped at the thesaurus size, not an Annoy overflow)
    Case("synonyms-huge-k", ("synonyms", "-t", "th", "-k", "100000000", "earthquake"), 0, "#earthquake"),
    Case("score-huge-k", ("score", "events.jsonl", "-t", "th", "-k", "0,99999999999"), 0, "k=99999999999"),
]


@pytest.fixture(scope="module")
def results(place: Path) -> dict[str, Ran]:
    """Every case at once (each is a process start), a few at a time."""

    def run(case: Case) -> tuple[str, Ran]:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "100", **dict(case.env)}
        done = subprocess.run(
            [REVAL, *case.argv], cwd=place, env=env, capture_output=True, text=True, timeout=180
        )
        return case.name, Ran(done.returncode, done.stdout, done.stderr)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(run, CASES))


# 34 process starts (torch imported in most) after a thesaurus build: ~3 min on 2 cores
@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_gives_one_clear_line(case: Case, results: dict[str, Ran]) -> None:
    ran = results[case.name]
    both = ran.stdout + ran.stderr
    assert "Traceback" not in both and "╭─" not in both, both
    assert ran.code == case.code, both
    if case.code == 0:
        assert case.culprit in ran.stdout, both
        return
    errors = [line for line in ran.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, ran.stderr  # exactly one error line, not wrapped over several
    assert case.culprit in errors[0], errors[0]
    if case.code == 2:  # a usage error is found before any model loads, not minutes later
        assert "encoder:" not in ran.stderr and "embedding" not in ran.stderr, ran.stderr


@pytest.mark.slow  # its fixture builds a thesaurus and events in subprocesses
def test_help_is_plain_and_whole(place: Path) -> None:
    """No `<bool>` metavar on flags, option names never cut at 80 columns."""
    env = {**os.environ, "COLUMNS": "80"}
    for argv in (["--help"], ["recommend", "--help"], ["thesaurus", "build", "--help"], ["demo", "--help"]):
        text = subprocess.run([REVAL, *argv], env=env, capture_output=True, text=True, check=True).stdout
        assert "<bool>" not in text and "…" not in text, text
        assert max(len(line) for line in text.splitlines()) <= 80, text
    text = subprocess.run([REVAL, "recommend", "--help"], env=env, capture_output=True, text=True).stdout
    assert "--recommender-name" in text
    text = subprocess.run(
        [REVAL, "thesaurus", "build", "--help"], env=env, capture_output=True, text=True
    ).stdout
    assert "network" in text and "minilm" in text  # says the default model needs the hub


@pytest.mark.integration
@pytest.mark.parametrize(
    ("flags", "culprit"),
    [
        (("--model", "/nowhere/bertweet"), "REVAL_MODEL"),  # the README's worker on an offline machine
        (("--metrics-port", "{taken}"), "REVAL_METRICS_PORT"),
    ],
    ids=["model", "metrics-port"],
)
def test_worker_that_cannot_start_says_why_in_one_line(
    flags: tuple[str, ...], culprit: str, broker: str, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        argv = [REVAL, "worker", "embed", "--broker", broker, "--redis-url", redis_url]
        argv += [f.replace("{taken}", port) for f in flags]
        if "--metrics-port" not in flags:
            argv += ["--metrics-port", "0"]
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "REVAL_REDIS_PREFIX": redis_prefix,
            "REVAL_METRICS_HOST": "127.0.0.1",
        }
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    both = done.stdout + done.stderr
    assert done.returncode == 1, both
    assert "Traceback" not in both and "╭─" not in both, both
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and culprit in errors[0], done.stderr
