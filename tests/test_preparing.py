"""The embed role's admission in worker processes: the same results as in the worker's thread."""

from __future__ import annotations

import gzip
import json

import pytest

from stream.intake.cleaning import Dropped, Prepared, prepare
from stream.intake.records import parse_tweet
from workers.adapters.files.feeds import sample_feed
from workers.dev.synthetic import FeedShape, synthetic_tweets
from workers.service.preparing import Preparer, Rejected, prepare_values
from workers.service.runtime import FailStop


def _feed_values() -> list[bytes]:
    with gzip.open(sample_feed(), "rb") as src:
        values = [line.rstrip(b"\n") for line in src if line.strip()]
    values += [json.dumps(t).encode() for t in synthetic_tweets(FeedShape(tweets=2000))]
    # broken records among them: each must come back as its own rejection, in its place
    values[10:10] = [b"{not json", b"[]", b'{"id": "1"}', "\udcff".encode("utf-8", "surrogatepass")]
    return values


def _key(result: object) -> tuple[object, ...]:
    if isinstance(result, Prepared):
        return ("prepared", result.tweet.id, result.text, result.hashtags, result.dedup_keys)
    if isinstance(result, Dropped):
        return ("dropped", result.tweet.id, result.reason)
    assert isinstance(result, Rejected)
    return ("rejected", result.reason)


def test_processes_give_what_the_thread_gives_on_every_feed_tweet() -> None:
    values = _feed_values()
    assert len(values) > 29_000
    alone = prepare_values(values, True)
    pool = Preparer(2, language_filter=True)
    try:
        fanned = pool(values)
    finally:
        pool.close()
    assert [_key(r) for r in fanned] == [_key(r) for r in alone]
    kinds = {_key(r)[0] for r in alone}
    assert kinds == {"prepared", "dropped", "rejected"}
    assert [_key(r)[0] for r in alone[10:14]] == ["rejected"] * 4


def test_the_thread_path_is_prepare_itself() -> None:
    value = b'{"id": "7", "text": "RT @a: Flooding in #Brisbane tonight http://t.co/x", "lang": "en"}'
    (result,) = prepare_values([value], True)
    expected = prepare(parse_tweet(value), language_filter=True)
    assert isinstance(result, Prepared) and isinstance(expected, Prepared)
    assert (result.text, result.hashtags, result.dedup_keys) == (
        expected.text,
        expected.hashtags,
        expected.dedup_keys,
    )
    assert result.tweet.extra == {}  # the raw object stays behind: nothing after admission reads it


def test_a_dead_process_stops_the_worker_instead_of_dead_lettering_the_batch() -> None:
    import multiprocessing
    import os
    import signal

    before = {p.pid for p in multiprocessing.active_children()}
    pool = Preparer(1, language_filter=True)
    try:
        pool([b'{"id": "1", "text": "warm #up"}'] * 200)  # started
        (pid,) = [p.pid for p in multiprocessing.active_children() if p.pid not in before]
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(FailStop, match="preparing process died"):
            pool([b'{"id": "1", "text": "warm #up"}'] * 200)
    finally:
        pool.close()


def test_the_processes_end_with_a_worker_killed_hard() -> None:
    """A worker ended by ``os._exit`` (a fail-stop) or ``kill -9`` leaves no preparing process."""
    import os
    import subprocess
    import sys
    import time

    code = (
        "import multiprocessing, os\n"
        "from workers.service.preparing import Preparer\n"
        "pool = Preparer(1, language_filter=True)\n"
        'pool([b\'{"id": "1", "text": "warm #up"}\'] * 200)\n'
        "print(*[p.pid for p in multiprocessing.active_children()], flush=True)\n"
        "os._exit(70)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 70, done.stderr
    pids = [int(pid) for pid in done.stdout.split()]
    assert pids

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(pid) for pid in pids)
