"""The batch step at the runtime level (issue 23): the real :class:`Runtime` and
:class:`Scorer` on a throwaway Redis prefix, a producer that counts and refuses as
aiokafka and a broker do, and an ``exit`` that raises instead of ending the process.

The property: whatever the batches hold -- records at every size limit (the input limit,
the output limit our check applies, the producer's request limit, a broker's smaller
limits), invalid records, records that make ``apply`` raise, repeated events -- and
wherever the process crashes (mid-delivery, after delivery and before the commit), every
record ends scored, dead-lettered or counted as a duplicate: one kind, exactly once when
nothing crashed (identical copies after a crash), never a fail-stop caused by input alone,
and the outcome counters add up to the records consumed.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream.evaluation.neighbours import NeighbourCache
from stream.evaluation.scoring import score_batch
from stream.intake.records import MAX_HASHTAGS, MAX_RECORD_BYTES, parse_recommendation
from workers.adapters.prometheus.exporter import Exporter
from workers.adapters.redis.redis_client import Stopping, clear_prefix, stopping
from workers.service.incarnation import Incarnations
from workers.service.kafka_records import Record, letter_key
from workers.service.runtime import FAIL_STOP_EXIT, Runtime, Step, encode_json, record_size
from workers.service.score import EMPTY, Scorer
from workers.settings import Settings

from .fakes import Broker, Crash, FakeProducer, FixedIdentity, Halted, halt

# A real Redis, but the session's throwaway one (``scratch_redis``): no service, so the fast tier.

TOPIC = "recs"
LIMIT = 4096  # REVAL_MAX_MESSAGE_BYTES: our check and the producer's max_request_size
SCORES_BROKER_LIMIT = 4000  # the scores topic's max.message.bytes, below the producer's
LETTERS_BROKER_LIMIT = 3000  # the dead-letter topic's
KS, RS = "0,5", "1,5"


# --------------------------------------------------------------------------- the records


def event_body(tweet_id: str, truth: Sequence[str]) -> dict[str, Any]:
    return {
        "tweet_id": tweet_id,
        "recommender": "r",
        "recommended": ["flood", "help"],
        "ground_truth": list(truth),
        "ts": "2013-01-01T00:00:00Z",
    }


def score_size(body: dict[str, Any]) -> int:
    """What the producer counts for this event's score (the scorer's composition of it)."""
    event = parse_recommendation(json.dumps(body).encode())
    assert event.ground_truth is not None and event.ts is not None
    ks = tuple(int(k) for k in KS.split(","))
    rs = tuple(int(r) for r in RS.split(","))
    (value,) = score_batch(
        [(event, event.ground_truth)], NeighbourCache(EMPTY, max_k=max(ks)), ks, rs
    ).records()
    value.update(index_version=None, event_time=event.ts.timestamp(), ground_truth=list(event.ground_truth))
    return record_size(event.tweet_id.encode(), encode_json(value))


def sized_event(tweet_id: str, target: int) -> bytes:
    """An event whose score the producer counts at ``target`` bytes (padded in ASCII)."""
    size0 = score_size(event_body(tweet_id, ["flood", "p"]))
    body = event_body(tweet_id, ["flood", "p" + "a" * max(0, target - size0)])
    assert score_size(body) == target, (target, score_size(body))
    return json.dumps(body).encode()


def invalid(kind: str, tweet_id: str) -> bytes:
    if kind == "not_json":
        return b'{"tweet_id": '
    if kind == "invalid_utf8":
        return b'{"tweet_id": "\xff", "recommended": []}'
    if kind == "missing_field":
        return json.dumps({"recommended": ["a"]}).encode()
    if kind == "bad_type":  # ~2.3 KB: its dead letter, bytes included, is over the letters' topic limit
        return json.dumps({"tweet_id": tweet_id, "recommended": "not a list " + "z" * 2300}).encode()
    if kind == "too_many_hashtags":
        return json.dumps(event_body(tweet_id, [f"h{i}" for i in range(MAX_HASHTAGS + 1)])).encode()
    assert kind == "oversize"  # one byte over the input limit
    raw = json.dumps(event_body(tweet_id, ["x"]))
    return raw.replace('"x"', '"x' + "y" * (MAX_RECORD_BYTES + 1 - len(raw)) + '"').encode()


@dataclass(frozen=True)
class Planned:
    value: bytes
    tweet_id: str
    expect: str  # "score", a dead letter's reason, or "duplicate?" (an earlier event's key)


def plan(kind: str, arg: Any, i: int, earlier: list[str]) -> Planned:
    tweet_id = f"t{i}"
    if kind == "sized":
        expect = "score" if arg <= SCORES_BROKER_LIMIT else "output_too_large"
        return Planned(sized_event(tweet_id, arg), tweet_id, expect)
    if kind == "at_input_limit":  # admitted: exactly the input limit; its score is far over the output's
        raw = json.dumps(event_body(tweet_id, ["x"]))
        value = raw.replace('"x"', '"x' + "y" * (MAX_RECORD_BYTES - len(raw)) + '"').encode()
        assert len(value) == MAX_RECORD_BYTES
        return Planned(value, tweet_id, "output_too_large")
    if kind == "invalid":
        return Planned(invalid(arg, tweet_id), tweet_id, arg)
    if kind == "poison":
        return Planned(
            json.dumps(event_body(f"poison{i}", ["flood"])).encode(), f"poison{i}", "processing_error"
        )
    assert kind == "repeat"
    if not earlier:
        return Planned(json.dumps(event_body(tweet_id, ["flood"])).encode(), tweet_id, "score")
    again = earlier[arg % len(earlier)]
    return Planned(json.dumps(event_body(again, ["flood"])).encode(), again, "duplicate?")


#: Scores' sizes as the producer counts them: around the scores topic's limit (refused by the
#: broker when over), then around the producer's (refused by our check when over).
SIZES = [2500, 3960, 3999, 4000, 4001, 4040, 4095, 4096, 4097, 4100, 5500]
KINDS = st.one_of(
    st.tuples(st.just("sized"), st.sampled_from(SIZES)),
    st.tuples(st.just("at_input_limit"), st.none()),
    st.tuples(
        st.just("invalid"),
        st.sampled_from(
            ["not_json", "invalid_utf8", "missing_field", "bad_type", "too_many_hashtags", "oversize"]
        ),
    ),
    st.tuples(st.just("poison"), st.none()),
    st.tuples(st.just("repeat"), st.integers(0, 50)),
)


# --------------------------------------------------------------------------- the worker


def poisoned(apply: Callable[[Sequence[Any]], Any]) -> Callable[[Sequence[Any]], Any]:
    """``apply`` that raises -- a bug only some records trigger -- when a poison event is in it."""

    def wrapped(items: Sequence[Any]) -> Any:
        if any(event.tweet_id.startswith("poison") for _, event in items):
            raise ZeroDivisionError("a bug this record triggers")
        return apply(items)

    return wrapped


@dataclass
class Process:
    """One worker process: its runtime, scorer and metrics."""

    runtime: Runtime
    scorer: Scorer
    step: Step[Any]

    @classmethod
    def start(cls, config: Settings, client: redis.Redis, producer: FakeProducer) -> Process:
        exporter = Exporter()
        incarnations = Incarnations(FixedIdentity(), client, config.redis_prefix, exporter)  # type: ignore[arg-type]
        scorer = Scorer(config, exporter, client, incarnations)
        runtime = Runtime(config, exporter, client, ["score"], producer=producer, exit=halt)
        step = Step(
            "score",
            scorer.admit_events,
            poisoned(scorer.apply_events),
            source=lambda item: item[0],
            hold=scorer.hold_events,
        )
        return cls(runtime, scorer, step)

    def counters(self) -> dict[str, float]:
        out: defaultdict[str, float] = defaultdict(float)
        for family in self.runtime.exporter.registry.collect():
            for sample in family.samples:
                if sample.name == "reval_events_total":
                    out[sample.labels["outcome"]] += sample.value
                elif sample.name == "reval_records_consumed_total":
                    out["consumed"] += sample.value
                elif sample.name == "reval_records_rejected_total":
                    out["dead-lettered"] += sample.value
        return dict(out)


@pytest.fixture
def redis_client(scratch_redis: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(scratch_redis)
    yield client
    client.close()


def planned_records(kinds: list[tuple[str, Any]]) -> tuple[list[Planned], list[Record]]:
    """The planned inputs (each with what must come of it) and their records, in order."""
    earlier: list[str] = []
    planned = []
    for i, (kind, arg) in enumerate(kinds):
        p = plan(kind, arg, i, earlier)
        planned.append(p)
        if p.expect in ("score", "output_too_large"):
            earlier.append(p.tweet_id)
    records = [
        Record(TOPIC, 0, i, 1_700_000_000_000, p.tweet_id.encode(), p.value) for i, p in enumerate(planned)
    ]
    return planned, records


async def run_with_crashes(
    config: Settings,
    redis_client: redis.Redis,
    producer: FakeProducer,
    records: list[Record],
    batch_sizes: list[int],
    crash_before_commit: list[bool],
) -> tuple[int, list[Process]]:
    """One process per loop, started, then crashed or done, until every record is committed;
    the crashes and the processes that finished."""
    crashes, finished = 0, []
    committed, batch_no = 0, 0
    while committed < len(records):
        process = Process.start(config, redis_client, producer)
        position = committed
        try:
            while position < len(records):
                size = batch_sizes[batch_no % len(batch_sizes)]
                batch = records[position : position + size]
                await process.runtime.process(process.step, batch)
                if batch_no < len(crash_before_commit) and crash_before_commit[batch_no]:
                    batch_no += 1
                    raise Crash("after delivery, before the commit")
                batch_no += 1
                position = committed = position + len(batch)
            finished.append(process)
        except Crash:
            crashes += 1
        finally:
            process.runtime.close()
    return crashes, finished


def outcomes_by_record(
    broker: Broker, planned: list[Planned], records: list[Record]
) -> dict[int, list[tuple[str, bytes]]]:
    """What the broker got for each input record: its scores and dead letters' reasons (a
    letter's key and size checked on the way)."""
    outcomes: dict[int, list[tuple[str, bytes]]] = defaultdict(list)
    by_tweet = {p.tweet_id: i for i, p in enumerate(planned) if p.expect != "duplicate?"}
    for key, value in broker.log["scores"]:
        assert key is not None
        outcomes[by_tweet[key.decode()]].append(("score", value))
    for key, value in broker.log["dlq"]:
        letter = json.loads(value)
        assert key == letter_key(records[letter["source"]["offset"]])
        assert len(value) <= LETTERS_BROKER_LIMIT
        outcomes[letter["source"]["offset"]].append((letter["reason"], b""))
    return outcomes


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kinds=st.lists(KINDS, min_size=1, max_size=24),
    batch_sizes=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    crash_at=st.frozensets(st.integers(1, 60), max_size=2),
    crash_before_commit=st.lists(st.booleans(), max_size=6),
    flaky=st.sampled_from([0, 0, 3, 7]),
)
# One Hypothesis run of inputs and crashes against the model of what must be settled.
def test_every_record_is_settled_once_whatever_the_input_and_the_crashes(
    scratch_redis: str,
    redis_client: redis.Redis,
    kinds: list[tuple[str, Any]],
    batch_sizes: list[int],
    crash_at: frozenset[int],
    crash_before_commit: list[bool],
    flaky: int,
) -> None:
    planned, records = planned_records(kinds)
    prefix = f"test-rt-{uuid.uuid4().hex[:10]}"
    config = Settings(
        redis_url=scratch_redis,
        redis_prefix=prefix,
        max_message_bytes=LIMIT,
        ks=KS,
        rs=RS,
        produce_timeout_s=5,
        topic_scores="scores",
        topic_dead_letter="dlq",
    )
    broker = Broker({"scores": SCORES_BROKER_LIMIT, "dlq": LETTERS_BROKER_LIMIT})
    producer = FakeProducer(broker, LIMIT, flaky=flaky, crash_at=crash_at)
    try:  # a fail-stop or a stop (Halted) fails the test: input alone caused it
        crashes, finished = asyncio.run(
            run_with_crashes(config, redis_client, producer, records, batch_sizes, crash_before_commit)
        )
    finally:
        clear_prefix(scratch_redis, prefix)

    outcomes = outcomes_by_record(broker, planned, records)
    for i, p in enumerate(planned):
        kinds_seen = {kind for kind, _ in outcomes[i]}
        if p.expect == "duplicate?":
            assert outcomes[i] == [], (i, p.expect, kinds_seen)  # counted, never output
            continue
        assert kinds_seen == {p.expect}, (i, p.expect, outcomes[i])
        if not crashes:
            assert len(outcomes[i]) == 1, (i, outcomes[i])  # exactly once
        assert len({value for _, value in outcomes[i]}) == 1  # copies after a crash are identical
    assert producer.refused_by_producer == 0  # our check counts what the producer counts
    if not crashes:  # one process saw every record: its counters add up
        (process,) = finished
        counts = process.counters()
        settled = counts.get("scored", 0) + counts.get("unscorable", 0) + counts.get("duplicate", 0)
        assert counts["consumed"] == len(records) == settled + counts.get("dead-lettered", 0), counts


# --------------------------------------------------------------------------- targeted cases


@pytest.fixture
def process(scratch_redis: str, redis_client: redis.Redis) -> Iterator[tuple[Process, Broker]]:
    prefix = f"test-rt-{uuid.uuid4().hex[:10]}"
    config = Settings(redis_url=scratch_redis, redis_prefix=prefix, ks=KS, rs=RS, topic_scores="scores")
    broker = Broker({"scores": 10**6, "dead-letter": 10**6})
    p = Process.start(config, redis_client, FakeProducer(broker, 10**6))
    yield p, broker
    p.runtime.close()
    stopping.clear()
    clear_prefix(scratch_redis, prefix)


def records_of(*bodies: dict[str, Any]) -> list[Record]:
    return [Record(TOPIC, 0, i, None, None, json.dumps(b).encode()) for i, b in enumerate(bodies)]


def test_a_shutdown_while_a_batch_is_held_leaves_it_unacknowledged(process: tuple[Process, Broker]) -> None:
    """N2 at the runtime level: the hold meets a shutdown while Redis is away (Stopping) --
    the process ends (exit 0) inside ``process``, which never returns (no acknowledgement)."""
    p, broker = process

    def redis_away() -> bool:
        stopping.set()
        raise Stopping("join size: shutting down while Redis was unavailable")

    step = Step("score", p.step.admit, p.step.apply, p.step.source, hold=redis_away)
    with pytest.raises(Halted) as stopped:
        asyncio.run(p.runtime.process(step, records_of(event_body("a", ["flood"]))))
    assert stopped.value.code == 0 and dict(broker.log) == {}


def test_a_cancelled_agent_leaves_its_batch_unacknowledged(process: tuple[Process, Broker]) -> None:
    p, broker = process

    def slow(items: Sequence[Any]) -> Any:
        import time

        time.sleep(0.5)
        return p.scorer.apply_events(items)

    step = Step("score", p.step.admit, slow, p.step.source)

    async def cancel_midway() -> None:
        task = asyncio.ensure_future(p.runtime.process(step, records_of(event_body("a", ["flood"]))))
        await asyncio.sleep(0.1)
        task.cancel()
        await task

    with pytest.raises(Halted) as stopped:
        asyncio.run(cancel_midway())
    assert stopped.value.code == 0 and dict(broker.log) == {}


def test_an_outage_error_stops_the_worker_and_never_dead_letters(process: tuple[Process, Broker]) -> None:
    """A Redis error that is not waited out (a wrong password, say) is not the record's fault:
    before, a batch of one record was dead-lettered as processing_error."""
    p, broker = process

    def denied(items: Sequence[Any]) -> Any:
        raise redis.AuthenticationError("invalid username-password pair")

    step = Step("score", p.step.admit, denied, p.step.source)
    with pytest.raises(Halted) as stopped:
        asyncio.run(p.runtime.process(step, records_of(event_body("a", ["flood"]))))
    assert stopped.value.code == FAIL_STOP_EXIT and dict(broker.log) == {}


def test_records_that_all_fail_on_their_own_are_dead_lettered_not_a_fail_stop(
    process: tuple[Process, Broker],
) -> None:
    """Input alone never stops a worker: a batch of nothing but records that trigger a bug
    gives one dead letter each (it was a fail-stop, and a crash loop on their redelivery)."""
    p, broker = process
    bodies = [event_body(f"poison{i}", ["flood"]) for i in range(3)]
    asyncio.run(p.runtime.process(p.step, records_of(*bodies)))
    letters = [json.loads(value) for _, value in broker.log["dead-letter"]]
    assert [(d["reason"], d["source"]["offset"]) for d in letters] == [
        ("processing_error", i) for i in range(3)
    ]
