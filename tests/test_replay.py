"""`reval replay`: pacing, filtering, merging and bad lines without Kafka; then the real
thing against the local broker (original bytes, keys, Kafka timestamps = event time)."""

from __future__ import annotations

import gzip
import itertools
import json
import re
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from stream.feeds.replay import (
    BadLineError,
    Kind,
    Outgoing,
    ProduceError,
    RefusedError,
    kind_from_topic,
    parse_speed,
    timestamp_ms,
)
from stream.intake.records import parse_time
from workers.adapters.files.feeds import detect_file_kind as detect_kind
from workers.adapters.files.feeds import replay_files as replay
from workers.adapters.files.feeds import sample_feed
from workers.adapters.kafka.kafka_client import KafkaSink
from workers.commands.cli import app

T0 = datetime(2013, 1, 1, tzinfo=UTC)


class FakeClock:
    """A monotonic clock that only moves when slept on (or by ``cost`` per send)."""

    def __init__(self, oversleep: float = 0.0) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []
        self.oversleep = oversleep

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        self.now += seconds + self.oversleep


class Recorder:
    def __init__(self, clock: FakeClock | None = None, cost: float = 0.0) -> None:
        self.sent: list[Outgoing] = []
        self.at: list[float] = []
        self.clock, self.cost = clock, cost

    def __call__(self, out: Outgoing) -> None:
        if self.clock is not None:
            self.at.append(self.clock.now)
            self.clock.now += self.cost
        self.sent.append(out)

    @property
    def keys(self) -> list[str]:
        return [o.key.decode() for o in self.sent if o.key is not None]


def tweet_line(tid: int | str, seconds: float, text: str = "hello #x") -> str:
    when = (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")
    return json.dumps({"id": str(tid), "created_at": when, "text": text})


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


OFFSETS = [0, 10, 10, 25, 60, 61]  # event-time offsets in seconds


@pytest.fixture
def paced_feed(tmp_path: Path) -> Path:
    return write(tmp_path / "paced.jsonl", [tweet_line(i, s) for i, s in enumerate(OFFSETS)])


# -- pacing -----------------------------------------------------------------------------


def test_speed_10_sleeps_the_gaps_divided_by_10(paced_feed: Path) -> None:
    clock = FakeClock()
    sink = Recorder(clock)
    summary = replay([paced_feed], sink, speed=10, clock=clock, sleep=clock.sleep)
    gaps = [(b - a) / 10 for a, b in itertools.pairwise(OFFSETS) if b > a]
    assert clock.sleeps == pytest.approx(gaps)
    assert sum(clock.sleeps) == pytest.approx(OFFSETS[-1] / 10)
    assert [t - sink.at[0] for t in sink.at] == pytest.approx([s / 10 for s in OFFSETS])
    assert summary.produced == len(OFFSETS) and summary.slept_s == pytest.approx(6.1)


def test_pacing_does_not_drift_with_slow_sends_or_oversleeping(paced_feed: Path) -> None:
    # Each send costs 50 ms and every sleep overshoots by 10 ms: the schedule is anchored
    # at the first record, so neither accumulates.
    clock = FakeClock(oversleep=0.01)
    sink = Recorder(clock, cost=0.05)
    replay([paced_feed], sink, speed=10, clock=clock, sleep=clock.sleep)
    targets = [sink.at[0] + s / 10 for s in OFFSETS]
    for at, target in zip(sink.at, targets, strict=True):
        assert target - 1e-9 <= at <= target + 0.06 + 1e-9  # late by at most a send + an oversleep
    assert sink.at[-1] == pytest.approx(targets[-1] + 0.01)  # one oversleep, not five
    # A late record is sent at once: 10 s -> 10 s (no gap) after a 50 ms send: no sleep.
    assert len(clock.sleeps) == 4


def test_speed_max_never_sleeps(paced_feed: Path) -> None:
    def no_sleep(_: float) -> None:
        raise AssertionError("slept at --speed max")

    sink = Recorder()
    summary = replay([paced_feed], sink, speed=parse_speed("max"), sleep=no_sleep)
    assert summary.produced == len(OFFSETS) and summary.slept_s == 0


def test_out_of_order_events_are_not_paced_backwards(tmp_path: Path) -> None:
    feed = write(
        tmp_path / "f.jsonl", [tweet_line(1, 0), tweet_line(2, 30), tweet_line(3, 20), tweet_line(4, 40)]
    )
    clock = FakeClock()
    replay([feed], Recorder(clock), speed=1, clock=clock, sleep=clock.sleep)
    assert clock.sleeps == pytest.approx([30, 10])


def test_parse_speed() -> None:
    assert parse_speed("1") == 1.0 and parse_speed("MAX") is None and parse_speed("inf") is None
    for bad in ("0", "-2", "fast"):
        with pytest.raises(ValueError, match="speed"):
            parse_speed(bad)


# -- selection --------------------------------------------------------------------------


def test_start_end_is_half_open(paced_feed: Path) -> None:
    sink = Recorder()
    summary = replay([paced_feed], sink, start=T0 + timedelta(seconds=10), end=T0 + timedelta(seconds=60))
    assert sink.keys == ["1", "2", "3"]
    assert summary.skipped == {"before_start": 1, "after_end": 2}
    assert summary.first_event == T0 + timedelta(seconds=10)
    assert summary.last_event == T0 + timedelta(seconds=25)


def test_limit_stops_reading(paced_feed: Path) -> None:
    flushed: list[bool] = []
    sink = Recorder()
    summary = replay([paced_feed], sink, limit=2, flush=lambda: flushed.append(True))
    assert sink.keys == ["0", "1"]
    assert summary.stopped == "limit" and summary.lines_read == 2 and flushed == [True]


def test_from_line_resumes_the_first_file_only(tmp_path: Path) -> None:
    a = write(tmp_path / "a.jsonl", [tweet_line(f"a{i}", i * 10) for i in range(5)])
    b = write(tmp_path / "b.jsonl", [tweet_line(f"b{i}", i * 10 + 5) for i in range(3)])
    sink = Recorder()
    replay([a], sink, from_line=4)
    assert sink.keys == ["a3", "a4"]
    sink = Recorder()
    summary = replay([a, b], sink, from_line=3)
    assert sink.keys == ["b0", "b1", "a2", "b2", "a3", "a4"]
    assert summary.lines_read == 6
    assert all(o.where.startswith(str(a)) for o in sink.sent if o.key and o.key.startswith(b"a"))


def test_two_files_are_merged_by_event_time(tmp_path: Path) -> None:
    a = write(tmp_path / "a.jsonl", [tweet_line("a1", 0), tweet_line("a2", 20), tweet_line("a3", 40)])
    b = write(tmp_path / "b.jsonl", [tweet_line("b1", 10), tweet_line("b2", 30), tweet_line("b3", 50)])
    clock = FakeClock()
    sink = Recorder(clock)
    replay([b, a], sink, speed=10, clock=clock, sleep=clock.sleep)
    assert sink.keys == ["a1", "b1", "a2", "b2", "a3", "b3"]
    assert [o.timestamp_ms for o in sink.sent] == sorted(o.timestamp_ms for o in sink.sent)
    assert clock.sleeps == pytest.approx([1.0] * 5)
    assert sink.sent[1].where == f"{b}:1"


# -- what is produced -------------------------------------------------------------------


def test_original_bytes_key_and_timestamp(tmp_path: Path) -> None:
    lines = [
        '{ "text" : "Flood  #Help \\u00e9 ü",   "id": 12, "created_at": "2012-05-18T11:04:31.662Z" }',
        '{"id_str": "13", "text": "v1.1 #x", "created_at": "Wed Oct 10 20:19:24 +0000 2018"}',
        '{"data": {"id": "14", "text": "v2 #y", "created_at": "2020-01-01T00:00:00.000Z"}, "includes": {}}',
    ]
    path = tmp_path / "f.jsonl"
    path.write_bytes(b"\r\n".join(line.encode() for line in lines) + b"\r\n")
    sink = Recorder()
    summary = replay([path], sink)
    assert [o.value for o in sink.sent] == [line.encode() for line in lines]
    assert sink.keys == ["12", "13", "14"]
    assert [o.timestamp_ms for o in sink.sent] == [1337339071662, 1539202764000, 1577836800000]
    assert summary.kind is Kind.tweets and summary.bad_lines == 0


def test_csv_rows_go_as_json(tmp_path: Path) -> None:
    path = tmp_path / "f.csv"
    path.write_text('id,created_at,text\n5,2013-01-01T00:00:00Z,"a, b #c"\n', encoding="utf-8")
    sink = Recorder()
    replay([path], sink)
    assert json.loads(sink.sent[0].value) == {
        "id": "5",
        "created_at": "2013-01-01T00:00:00Z",
        "text": "a, b #c",
    }
    assert sink.sent[0].key == b"5" and sink.sent[0].timestamp_ms == timestamp_ms(T0)


def test_tweet_without_time_gets_now_and_is_skipped_by_time_filters(tmp_path: Path) -> None:
    path = write(tmp_path / "f.jsonl", ['{"id": "1", "text": "no time"}'])
    sink = Recorder()
    replay([path], sink, now=lambda: 1_700_000_000.5)
    assert sink.sent[0].timestamp_ms == 1_700_000_000_500
    summary = replay([path], Recorder(), start=T0)
    assert summary.skipped == {"no_time": 1} and summary.produced == 0


def test_timestamps_now_stamps_the_time_of_sending(paced_feed: Path) -> None:
    sink = Recorder()
    summary = replay([paced_feed], sink, timestamps="now", now=lambda: 1_700_000_000.25)
    assert [o.timestamp_ms for o in sink.sent] == [1_700_000_000_250] * len(OFFSETS)
    assert summary.first_event == T0  # the event time is still what the summary reports


def test_a_refusal_stops_the_replay_before_anything_is_sent(paced_feed: Path) -> None:
    asked: list[int] = []

    def refuse(first_ms: int) -> str | None:
        asked.append(first_ms)
        return "topic 't' deletes records: replay with --timestamps now"

    sink = Recorder()
    with pytest.raises(RefusedError) as info:
        replay([paced_feed], sink, refuse=refuse)
    assert sink.sent == [] and asked == [timestamp_ms(T0)]
    assert (
        info.value.exit_code == 2
        and str(info.value) == "topic 't' deletes records: replay with --timestamps now"
    )
    assert info.value.summary is not None and info.value.summary.stopped == "refused"
    # Asked once, with the first record; None lets every record through.
    asked.clear()

    def allow(first_ms: int) -> str | None:
        asked.append(first_ms)
        return None

    replay([paced_feed], sink, refuse=allow)
    assert len(sink.sent) == len(OFFSETS) and asked == [timestamp_ms(T0)]


# -- bad lines --------------------------------------------------------------------------


@pytest.fixture
def feed_with_bad_lines(tmp_path: Path) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(
        b"\n".join(
            [
                tweet_line(1, 0).encode(),
                b"{broken json",
                b'{"text": "no id"}',
                tweet_line(2, 1).encode(),
                b"",  # blank lines are not records
                b'{"id": "3", "text": "x", "created_at": "never"}',
                b'{"id": "4", "text": "bad \xff utf8", "created_at": "2013-01-01T00:00:00Z"}',
                b'{"delete": {"status": {"id": 1, "id_str": "1"}}}',
                tweet_line(5, 2).encode(),
            ]
        )
        + b"\n"
    )
    return path


def test_bad_lines_are_counted_with_line_numbers(feed_with_bad_lines: Path) -> None:
    sink = Recorder()
    summary = replay([feed_with_bad_lines], sink)
    assert sink.keys == ["1", "2", "5"]
    assert summary.bad_lines == 4
    assert summary.errors.by_reason == {"not_json": 1, "missing_field": 1, "bad_time": 1, "invalid_utf8": 1}
    assert [line.split(": ")[0] for line in summary.errors.first] == [
        f"{feed_with_bad_lines}:{n}" for n in (2, 3, 6, 7)
    ]
    assert summary.skipped == {"control_message:delete": 1}
    assert summary.lines_read == 8 and summary.stopped == "end"
    data = summary.as_dict()
    assert data["bad_lines"] == 4 and data["produced"] == 3 and data["first_bad_lines"]


def test_strict_raises_at_the_first_bad_line(feed_with_bad_lines: Path) -> None:
    sink = Recorder()
    with pytest.raises(BadLineError) as info:
        replay([feed_with_bad_lines], sink, strict=True)
    exc = info.value
    assert exc.where == f"{feed_with_bad_lines}:2" and exc.reason == "not_json" and exc.exit_code == 2
    assert str(exc).startswith(f"{feed_with_bad_lines}:2: not_json")
    assert exc.summary is not None and exc.summary.produced == 1 and exc.summary.stopped == "strict"


def test_a_send_error_stops_the_run_with_the_line(paced_feed: Path) -> None:
    def failing(out: Outgoing) -> None:
        if out.key == b"2":
            raise ProduceError(out.where, "broker said no")

    with pytest.raises(ProduceError, match=re.escape(f"{paced_feed}:3: broker said no")) as info:
        replay([paced_feed], failing)
    assert info.value.summary is not None
    assert info.value.summary.produced == 2 and info.value.summary.stopped == "error"


def test_missing_and_unsupported_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        replay([tmp_path / "nope.jsonl"], Recorder())
    (tmp_path / "x.txt").write_text("")
    with pytest.raises(ValueError, match="unsupported"):
        replay([tmp_path / "x.txt"], Recorder())


# -- recommendations --------------------------------------------------------------------


def test_recommendations_kind_uses_ts_and_tweet_id(tmp_path: Path) -> None:
    path = write(
        tmp_path / "recs.jsonl",
        [
            '{"tweet_id": "7", "recommended": ["#a"], "ts": "2013-01-01T00:00:10Z"}',
            '{"tweet_id": 8, "recommended": ["b"], "ground_truth": ["b"]}',
            '{"tweet_id": "9", "recommended": ["c"], "ts": 1356998430}',
            '{"id": "1", "text": "a tweet is a bad recommendation"}',
        ],
    )
    assert detect_kind([path]) is Kind.recommendations
    clock = FakeClock()
    sink = Recorder(clock)
    summary = replay([path], sink, speed=1, clock=clock, sleep=clock.sleep, now=lambda: 1_800_000_000.0)
    assert summary.kind is Kind.recommendations  # detected from the first good record
    assert sink.keys == ["7", "8", "9"]
    assert [o.timestamp_ms for o in sink.sent] == [1356998410000, 1_800_000_000_000, 1356998430000]
    assert clock.sleeps == pytest.approx([20.0])  # paced by ts; no ts = no pause
    assert summary.errors.by_reason == {"missing_field": 1}


def test_kind_detection() -> None:
    assert kind_from_topic("recommendations") is Kind.recommendations
    assert kind_from_topic("tweets-abc") is Kind.tweets
    assert kind_from_topic("firehose") is None
    assert kind_from_topic("my-feed", tweets_topic="my-feed") is Kind.tweets
    assert detect_kind([sample_feed()]) is Kind.tweets


# -- against the broker -----------------------------------------------------------------

N_TWEETS = 200


@pytest.fixture(scope="module")
def crisis_feed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """200 real tweets from the bundled sample plus three bad lines."""
    with gzip.open(sample_feed(), "rt", encoding="utf-8") as src:
        lines = [line.rstrip("\n") for line in itertools.islice(src, N_TWEETS)]
    mixed = list(lines)
    mixed.insert(5, "{broken json")
    mixed.insert(50, '{"text": "no id #x"}')
    mixed.insert(120, '{"id": "9", "text": "bad time", "created_at": "never"}')
    path = tmp_path_factory.mktemp("replay") / "crisis.jsonl"
    write(path, mixed)
    return path, lines


def _topic(bootstrap: str, partitions: int = 3) -> str:
    from workers.adapters.kafka.kafka_client import create_topics

    name = f"replay-tweets-{uuid.uuid4().hex[:8]}"
    # Kept forever: these records carry their 2012 event times (tests/test_replay_retention.py).
    create_topics(bootstrap, {name: partitions}, configs={name: {"retention.ms": "-1"}})
    return name


def _read_all(bootstrap: str, topic: str, expected: int, timeout: float = 20.0) -> list[Any]:
    """Every record of ``topic`` via assign + seek_to_beginning (no consumer group)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, client_id="replay-test"
    )
    try:
        # A new consumer may not have the topic's metadata yet: None (or nothing) until it has.
        deadline = time.monotonic() + timeout
        parts = consumer.partitions_for_topic(topic) or set()
        while not parts and time.monotonic() < deadline:
            time.sleep(0.2)
            parts = consumer.partitions_for_topic(topic) or set()
        assert parts, f"no partitions of {topic} known within {timeout:g} s"
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        records: list[Any] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
            if len(records) >= expected:
                # One more short poll: duplicates would show up here.
                for batch in consumer.poll(timeout_ms=300).values():
                    records.extend(batch)
                break
        return records
    finally:
        consumer.close()


def _check_arrived(records: list[Any], lines: list[str]) -> None:
    by_key: dict[bytes, list[Any]] = {}
    for record in records:
        by_key.setdefault(record.key, []).append(record)
    assert len(records) == len(lines), f"{len(records)} records for {len(lines)} lines"
    for line in lines:
        obj = json.loads(line)
        got = by_key[obj["id"].encode()]
        assert len(got) == 1, f"tweet {obj['id']} arrived {len(got)} times"
        assert got[0].value == line.encode("utf-8")  # the original bytes
        assert got[0].timestamp == timestamp_ms(parse_time(obj["created_at"]))
        assert got[0].timestamp_type == 0  # CreateTime


@pytest.mark.integration
def test_replay_into_kafka(broker: str, crisis_feed: tuple[Path, list[str]]) -> None:
    path, lines = crisis_feed
    topic = _topic(broker)
    with KafkaSink(broker, topic) as sink:
        summary = replay([path], sink, speed=None, flush=sink.flush)
        assert sink.acked == N_TWEETS
    assert summary.produced == N_TWEETS and summary.bad_lines == 3
    assert summary.errors.by_reason == {"not_json": 1, "missing_field": 1, "bad_time": 1}
    _check_arrived(_read_all(broker, topic, N_TWEETS), lines)


@pytest.mark.integration
def test_producer_errors_name_the_line(broker: str, tmp_path: Path) -> None:
    topic = _topic(broker, 1)
    path = write(tmp_path / "big.jsonl", [tweet_line(1, 0), tweet_line(2, 1, "long #x " * 400)])
    with KafkaSink(broker, topic, max_request_size=2000) as sink, pytest.raises(ProduceError) as info:
        replay([path], sink, flush=sink.flush)
    assert info.value.where == f"{path}:2" and "MessageSizeTooLarge" in str(info.value)
    assert info.value.summary is not None and info.value.summary.produced == 1


@pytest.mark.integration
def test_sink_bounds_what_is_in_flight(broker: str, crisis_feed: tuple[Path, list[str]]) -> None:
    path, _ = crisis_feed
    topic = _topic(broker, 2)
    seen: list[int] = []
    with KafkaSink(broker, topic, max_pending=5) as sink:

        def send(out: Outgoing) -> None:
            sink(out)
            seen.append(sink.pending)

        summary = replay([path], send, flush=sink.flush)
        assert sink.acked == summary.produced == N_TWEETS and sink.pending == 0
    assert max(seen) <= 5


@pytest.mark.integration
def test_sink_blocks_then_fails_and_reports_async_failures(
    broker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kafka.errors import KafkaError
    from kafka.future import Future

    topic = _topic(broker, 1)
    futures: list[Future] = []

    def fake_send(*_: Any, **__: Any) -> Future:
        futures.append(Future())
        return futures[-1]

    with KafkaSink(broker, topic, max_pending=1, max_block_ms=300) as sink:
        monkeypatch.setattr(sink._producer, "send", fake_send)
        sink(Outgoing(b"1", b"{}", 0, "f.jsonl:1"))
        began = time.monotonic()
        with pytest.raises(ProduceError, match=r"f\.jsonl:2: 1 records unacknowledged"):
            sink(Outgoing(b"2", b"{}", 0, "f.jsonl:2"))  # the broker never acks: back-pressure
        assert 0.25 < time.monotonic() - began < 5
        futures[0].failure(KafkaError("boom"))  # a delivery failure, reported later
        with pytest.raises(ProduceError, match=r"f\.jsonl:1: producing .* failed: KafkaError\('boom'\)"):
            sink(Outgoing(b"3", b"{}", 0, "f.jsonl:3"))
        with pytest.raises(ProduceError, match=r"f\.jsonl:1"):
            sink.flush()
        monkeypatch.undo()


runner = CliRunner()


def _invoke(args: list[str]) -> Any:
    return runner.invoke(app, ["replay", *args])


@pytest.mark.integration
def test_cli_replay(broker: str, crisis_feed: tuple[Path, list[str]]) -> None:
    path, lines = crisis_feed
    topic = _topic(broker)
    result = _invoke([str(path), "--topic", topic, "--broker", broker, "--speed", "max", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["produced"] == N_TWEETS and summary["bad_lines"] == 3 and summary["topic"] == topic
    assert summary["bad_by_reason"] == {"not_json": 1, "missing_field": 1, "bad_time": 1}
    assert summary["first_bad_lines"][0].startswith(f"{path}:6: not_json")
    assert summary["first_event"] == parse_time(json.loads(lines[0])["created_at"]).isoformat()
    _check_arrived(_read_all(broker, topic, N_TWEETS), lines)


@pytest.mark.integration
def test_cli_selection_strict_and_new_topic(broker: str, crisis_feed: tuple[Path, list[str]]) -> None:
    from workers.adapters.kafka.kafka_client import topic_partitions
    from workers.settings import Settings

    path, lines = crisis_feed
    # A topic that does not exist is created with the workers' partition count.
    topic = f"replay-new-{uuid.uuid4().hex[:8]}"
    start = json.loads(lines[10])["created_at"]
    result = _invoke(
        [
            str(path),
            "--topic",
            topic,
            "--broker",
            broker,
            "--start",
            start,
            "--limit",
            "20",
            "--speed",
            "1000000",
            "--kind",
            "tweets",
            "--timestamps",
            "now",
        ]
    )
    assert result.exit_code == 0, result.output
    assert "produced" in result.stdout and "limit" in result.stdout
    assert topic_partitions(broker, [topic])[topic] == Settings().partitions
    records = _read_all(broker, topic, 20)
    assert len(records) == 20
    first_time = parse_time(start)
    assert all(parse_time(json.loads(r.value)["created_at"]) >= first_time for r in records)
    assert all(abs(r.timestamp - time.time() * 1000) < 600_000 for r in records), "not stamped now"

    # The topic was created with the workers' 7-day retention: event times of 2012 are refused.
    result = _invoke([str(path), "--topic", topic, "--broker", broker])
    assert result.exit_code == 2, result.output
    assert "retention.ms=604800000" in result.stderr and "--timestamps now" in result.stderr
    assert len(_read_all(broker, topic, 21, timeout=3)) == 20, "a refused replay sent records"

    result = _invoke([str(path), "--topic", topic, "--broker", broker, "--strict", "--timestamps", "now"])
    assert result.exit_code == 2
    assert re.sub(r"\s", "", f"{path}:6: not_json") in re.sub(r"\s", "", result.stderr)  # rich may wrap

    for bad in (["--speed", "0"], ["--start", "yesterday"], ["--kind", "likes"]):
        result = _invoke([str(path), "--topic", topic, "--broker", broker, *bad])
        assert result.exit_code == 2, (bad, result.output)
