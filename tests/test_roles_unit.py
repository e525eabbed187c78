"""The fast tier of the roles: the real :class:`Runtime`, :class:`Scorer` and :class:`Embedder`
driven batch by batch with a fake producer (:mod:`tests.fakes`) and the session's throwaway
Redis (``scratch_redis``) -- no broker, no service running beforehand, so ``make check`` runs
them and a broken role shows in seconds, not after the integration suite's ~30 minutes.

What is pinned: partial acknowledgements (only the unacknowledged outputs go again), the
fail-stop when the broker takes nothing (and nothing settled past it), exactly one dead letter
per bad record with its reason (good neighbours scored once), the join's match and expiry, and
the scorer's fallback to the newest intact thesaurus version.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from workers.adapters.prometheus.exporter import Exporter
from workers.adapters.redis.redis_client import clear_prefix
from workers.service.embed import Embedder, load_encoder
from workers.service.incarnation import Incarnations
from workers.service.kafka_records import Record
from workers.service.runtime import FAIL_STOP_EXIT, Runtime, Step
from workers.service.score import Scorer
from workers.settings import Settings

from .fakes import Broker, FakeProducer, FixedIdentity, Halted, halt
from .thesauri import paired_thesaurus

EVENTS, TWEETS = "recs", "tweets"


# --------------------------------------------------------------------------- the harness


@dataclass
class Worker:
    """One score worker process without a broker: runtime, scorer, its steps, and the
    topics its fake producer delivered to."""

    config: Settings
    client: redis.Redis
    runtime: Runtime
    scorer: Scorer
    broker: Broker
    producer: FakeProducer

    @property
    def events(self) -> Step[Any]:
        s = self.scorer
        return Step("score", s.admit_events, s.apply_events, source=lambda item: item[0], hold=s.hold_events)

    @property
    def tweets(self) -> Step[Any]:
        s = self.scorer
        return Step("score", s.admit_tweets, s.apply_tweets, source=lambda item: item[0])

    def run(self, step: Step[Any], records: Sequence[Record]) -> None:
        asyncio.run(self.runtime.process(step, records))

    def scores(self) -> list[dict[str, Any]]:
        return [json.loads(value) for _, value in self.broker.log["scores"]]

    def letters(self) -> list[dict[str, Any]]:
        return [json.loads(value) for _, value in self.broker.log["dead-letter"]]

    def metric(self, name: str, **labels: str) -> float:
        value = self.runtime.exporter.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


@pytest.fixture
def scratch_client(scratch_redis: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(scratch_redis)
    yield client
    client.close()


def settings_for(url: str, prefix: str, **overrides: Any) -> Settings:
    base: dict[str, Any] = dict(
        redis_url=url,
        redis_prefix=prefix,
        ks="0,1",
        rs="1,2",
        topic_scores="scores",
        produce_timeout_s=5,
        thesaurus_source="redis",
    )
    return Settings(**{**base, **overrides})


@pytest.fixture
def make_worker(scratch_redis: str, scratch_client: redis.Redis) -> Iterator[Any]:
    """``make_worker(**settings)``: a score worker on a fresh key prefix (cleared after)."""
    made: list[Worker] = []
    prefix = f"test-unit-{uuid.uuid4().hex[:10]}"

    def make(**overrides: Any) -> Worker:
        config = settings_for(scratch_redis, prefix, **overrides)
        exporter = Exporter()
        incarnations = Incarnations(FixedIdentity(), scratch_client, prefix, exporter)  # type: ignore[arg-type]
        scorer = Scorer(config, exporter, scratch_client, incarnations)
        broker = Broker({"scores": 10**6, "dead-letter": 10**6})
        producer = FakeProducer(broker, 10**6)
        runtime = Runtime(config, exporter, scratch_client, ["score"], producer=producer, exit=halt)
        worker = Worker(config, scratch_client, runtime, scorer, broker, producer)
        made.append(worker)
        return worker

    yield make
    for worker in made:
        worker.runtime.close()
    clear_prefix(scratch_redis, prefix)


def event(tweet_id: str, recommended: Sequence[str], truth: Sequence[str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "tweet_id": tweet_id,
        "recommender": "r",
        "recommended": list(recommended),
        "ts": "2013-01-01T00:00:00Z",
    }
    if truth is not None:
        body["ground_truth"] = list(truth)
    return body


def tweet(tweet_id: str, text: str) -> dict[str, Any]:
    return {"id": tweet_id, "created_at": "2013-01-01T00:00:00Z", "text": text, "lang": "en"}


def records(topic: str, *values: dict[str, Any] | bytes, first: int = 0) -> list[Record]:
    return [
        Record(
            topic,
            0,
            first + i,
            1_700_000_000_000,
            None,
            v if isinstance(v, bytes) else json.dumps(v).encode(),
        )
        for i, v in enumerate(values)
    ]


def publish(worker: Worker, folder: Path, *, damaged: bool = False) -> str:
    """A thesaurus version as the index job publishes it (directory store, then Redis, which
    the scorer reads); ``damaged``: its neighbour table with every 97th byte flipped."""
    from workers.adapters.files.store import ThesaurusStore
    from workers.adapters.files.thesaurus_files import TABLE_FILE
    from workers.adapters.redis.redis_thesaurus import RedisThesauri

    version = ThesaurusStore(folder).publish(paired_thesaurus())
    if damaged:
        path = folder / version / TABLE_FILE
        data = bytearray(path.read_bytes())
        for i in range(0, len(data), 97):
            data[i] ^= 0xFF
        path.write_bytes(bytes(data))
    RedisThesauri(worker.client, worker.config.redis_prefix).publish(folder / version, version)
    return version


def hits(score: dict[str, Any], k: int, r: int = 2) -> float:
    """The event's #REval-hit-ratio at k over its top r recommendations."""
    return float(score["reval_hit_ratio"][str(r)][str(k)])


# --------------------------------------------------------------------------- Scorer


def test_scores_count_hits_through_the_thesaurus(make_worker: Any, tmp_path: Path) -> None:
    """R = {floods, news}, G = {flood, help}: no exact hit (k = 0: 0/2); with one synonym each,
    floods~flood is a hit (k = 1: 1/2) -- the thesaurus the scorer loaded is the one used."""
    worker = make_worker()
    version = publish(worker, tmp_path)
    assert worker.scorer.reload(force=True)
    worker.run(worker.events, records(EVENTS, event("t1", ["floods", "news"], ["flood", "help"])))
    (score,) = worker.scores()
    assert score["tweet_id"] == "t1" and score["index_version"] == version
    assert score["ground_truth"] == ["flood", "help"]
    assert (hits(score, 0), hits(score, 1)) == (0.0, 0.5)
    assert worker.letters() == []
    assert worker.metric("reval_events_total", recommender="r", outcome="scored") == 1


def test_before_any_version_every_hashtag_is_its_only_synonym(make_worker: Any) -> None:
    worker = make_worker()
    worker.run(worker.events, records(EVENTS, event("t1", ["flood", "news"], ["flood", "help"])))
    (score,) = worker.scores()
    assert score["index_version"] is None
    assert (hits(score, 0), hits(score, 1)) == (0.5, 0.5)


def test_a_repeated_event_is_scored_once_and_counted_as_a_duplicate(make_worker: Any) -> None:
    worker = make_worker()
    body = event("t1", ["flood"], ["flood"])
    worker.run(worker.events, records(EVENTS, body))
    worker.run(worker.events, records(EVENTS, body, first=1))  # the same event, produced twice
    assert [s["tweet_id"] for s in worker.scores()] == ["t1"]
    assert worker.metric("reval_events_total", recommender="r", outcome="duplicate") == 1


# --------------------------------------------------------------------------- dead letters


def test_exactly_one_dead_letter_per_bad_record_and_good_neighbours_scored_once(make_worker: Any) -> None:
    worker = make_worker()
    batch = records(
        EVENTS,
        event("good1", ["flood"], ["flood"]),
        b'{"tweet_id": ',  # not JSON
        json.dumps({"recommended": ["a"]}).encode(),  # no tweet_id
        event("good2", ["help"], ["help"]),
        json.dumps({"tweet_id": "x", "recommended": "not a list"}).encode(),
    )
    worker.run(worker.events, batch)
    assert sorted(s["tweet_id"] for s in worker.scores()) == ["good1", "good2"]
    letters = [(d["source"]["offset"], d["reason"], d["role"]) for d in worker.letters()]
    assert letters == [(1, "not_json", "score"), (2, "missing_field", "score"), (4, "bad_type", "score")]
    consumed = worker.metric("reval_records_consumed_total", topic=EVENTS)
    assert consumed == 5


def test_a_record_that_makes_apply_raise_is_dead_lettered_alone(make_worker: Any) -> None:
    """A bug only one record triggers: the batch is applied again one record at a time, the
    culprit becomes a ``processing_error`` letter, its neighbours are scored once."""
    worker = make_worker()
    apply = worker.scorer.apply_events

    def buggy(items: Sequence[Any]) -> Any:
        if any(e.tweet_id == "poison" for _, e in items):
            raise ZeroDivisionError("a bug this record triggers")
        return apply(items)

    step = Step("score", worker.scorer.admit_events, buggy, source=lambda item: item[0])
    bodies = [event("a", ["flood"], ["flood"]), event("poison", ["x"], ["x"]), event("b", ["help"], ["help"])]
    worker.run(step, records(EVENTS, *bodies))
    assert sorted(s["tweet_id"] for s in worker.scores()) == ["a", "b"]
    ((offset, reason, detail),) = [
        (d["source"]["offset"], d["reason"], d["detail"]) for d in worker.letters()
    ]
    assert (offset, reason) == (1, "processing_error") and "ZeroDivisionError" in detail


def test_an_output_the_broker_refuses_as_too_large_becomes_its_dead_letter(make_worker: Any) -> None:
    worker = make_worker()
    worker.broker.limits["scores"] = 1000  # the topic's max.message.bytes: a long truth is over it
    big = event("big", ["flood"], ["flood", "p" + "a" * 1200])
    worker.run(worker.events, records(EVENTS, event("small", ["flood"], ["flood"]), big))
    assert [s["tweet_id"] for s in worker.scores()] == ["small"]
    assert [(d["source"]["offset"], d["reason"]) for d in worker.letters()] == [(1, "output_too_large")]
    # counted once, as what it became: a dead letter, not a score
    assert worker.metric("reval_events_total", recommender="r", outcome="scored") == 1


# --------------------------------------------------------------------------- acknowledgements


def test_only_the_unacknowledged_outputs_are_sent_again(make_worker: Any) -> None:
    """Partial acknowledgement: every third send times out once; each output reaches the
    topic exactly once and only the failed ones were sent twice."""
    worker = make_worker()
    worker.producer.flaky = 3
    bodies = [event(f"t{i}", ["flood"], ["flood"]) for i in range(7)]
    worker.run(worker.events, records(EVENTS, *bodies))
    assert sorted(s["tweet_id"] for s in worker.scores()) == sorted(f"t{i}" for i in range(7))
    retried = worker.metric("reval_produce_retries_total")
    assert retried == 2  # sends 3 and 6 failed
    assert worker.producer.sends == 7 + retried


def test_a_broker_that_takes_nothing_fail_stops_before_anything_is_settled(make_worker: Any) -> None:
    """No acknowledgement within ``produce_timeout_s``: the worker stops (exit 70) without
    acknowledging the batch, and nothing that must follow the outputs ran -- the matched
    event still waits in the join (redelivered, it is scored then)."""
    worker = make_worker(produce_timeout_s=0.3)
    worker.run(worker.events, records(EVENTS, event("t1", ["flood"])))  # no truth: waits
    assert worker.scorer.join.pending() == 1
    worker.producer.down = True
    with pytest.raises(Halted) as stopped:
        worker.run(worker.tweets, records(TWEETS, tweet("t1", "water everywhere #flood")))
    assert stopped.value.code == FAIL_STOP_EXIT
    assert worker.scores() == [] and worker.scorer.join.pending() == 1
    assert worker.metric("reval_join_total", outcome="matched") == 0

    worker.producer.down = False  # the restarted worker gets the tweet again
    worker.run(worker.tweets, records(TWEETS, tweet("t1", "water everywhere #flood")))
    assert [s["tweet_id"] for s in worker.scores()] == ["t1"] and worker.scorer.join.pending() == 0


def test_an_outage_is_a_fail_stop_never_a_dead_letter(make_worker: Any) -> None:
    worker = make_worker()

    def denied(items: Sequence[Any]) -> Any:
        raise redis.AuthenticationError("invalid username-password pair")

    step = Step("score", worker.scorer.admit_events, denied, source=lambda item: item[0])
    with pytest.raises(Halted) as stopped:
        worker.run(step, records(EVENTS, event("a", ["flood"], ["flood"])))
    assert stopped.value.code == FAIL_STOP_EXIT and dict(worker.broker.log) == {}


# --------------------------------------------------------------------------- the join


def test_an_event_waits_for_its_tweet_and_is_scored_against_its_hashtags(make_worker: Any) -> None:
    worker = make_worker()
    worker.run(worker.events, records(EVENTS, event("t1", ["flood", "news"]), event("t2", ["help"])))
    assert worker.scores() == [] and worker.scorer.join.pending() == 2
    worker.run(worker.tweets, records(TWEETS, tweet("t1", "rising water #Flood #rescue")))
    (score,) = worker.scores()
    assert score["tweet_id"] == "t1" and score["ground_truth"] == ["flood", "rescue"]
    assert hits(score, 0) == 0.5  # R = {flood, news}, G = {flood, rescue}: 1 / 2
    assert worker.scorer.join.pending() == 1  # t2 still waits
    assert worker.metric("reval_join_total", outcome="matched") == 1
    # the tweet again (a redelivery): nothing scored twice
    worker.run(worker.tweets, records(TWEETS, tweet("t1", "rising water #Flood #rescue")))
    assert len(worker.scores()) == 1


def test_the_expiry_letters_name_each_event_once(make_worker: Any) -> None:
    worker = make_worker(join_window_s=0.2)
    worker.run(worker.events, records(EVENTS, event("t1", ["flood"]), event("t2", ["help"])))
    asyncio.run(worker.runtime.finish("score", worker.scorer.expire()))
    assert worker.letters() == []  # not due yet
    time.sleep(0.4)
    asyncio.run(worker.runtime.finish("score", worker.scorer.expire()))
    letters = sorted((d["source"]["offset"], d["reason"]) for d in worker.letters())
    assert letters == [(0, "join_expired"), (1, "join_expired")]
    assert worker.scorer.join.pending() == 0
    assert worker.metric("reval_join_total", outcome="expired") == 2
    worker.run(worker.tweets, records(TWEETS, tweet("t1", "too late #flood")))
    assert worker.scores() == []  # an expired event is never scored


# --------------------------------------------------------------------------- reload


def test_a_damaged_current_version_falls_back_to_the_newest_intact_one(
    make_worker: Any, tmp_path: Path
) -> None:
    worker = make_worker()
    good = publish(worker, tmp_path)
    damaged = publish(worker, tmp_path, damaged=True)
    assert worker.scorer.store.current_version() == damaged
    assert worker.scorer.reload(force=True)
    assert worker.scorer.index_version == good
    assert worker.metric("reval_thesaurus_fallbacks_total") == 1
    assert not worker.scorer.hold_events()
    worker.run(worker.events, records(EVENTS, event("t1", ["floods"], ["flood"])))
    (score,) = worker.scores()
    assert score["index_version"] == good and hits(score, 1) == 1.0

    newer = publish(worker, tmp_path)  # an intact version later: taken at the next reload
    assert worker.scorer.reload(force=True) and worker.scorer.index_version == newer


def test_with_no_intact_version_events_wait_instead_of_being_scored(make_worker: Any, tmp_path: Path) -> None:
    worker = make_worker()
    publish(worker, tmp_path, damaged=True)
    assert not worker.scorer.reload(force=True)
    assert worker.scorer.hold_events()  # the consumer stops pulling
    assert worker.metric("reval_scoring_thesaurus_missing") == 1


# --------------------------------------------------------------------------- Embedder


@pytest.fixture(scope="module")
def tiny_encoder(tiny_bertweet: Path) -> Any:
    return load_encoder(Settings(model=str(tiny_bertweet), device="cpu", embed_batch_size=8))


def test_the_embedder_adds_each_tweet_once_to_its_hashtags_means(
    scratch_redis: str, scratch_client: redis.Redis, tiny_encoder: Any
) -> None:
    prefix = f"test-unit-{uuid.uuid4().hex[:10]}"
    config = settings_for(scratch_redis, prefix)
    exporter = Exporter()
    incarnations = Incarnations(FixedIdentity(), scratch_client, prefix, exporter)  # type: ignore[arg-type]
    embedder = Embedder(config, exporter, scratch_client, tiny_encoder, incarnations)
    broker = Broker({"scores": 10**6, "dead-letter": 10**6})
    runtime = Runtime(
        config, exporter, scratch_client, ["embed"], producer=FakeProducer(broker, 10**6), exit=halt
    )
    step = Step("embed", embedder.admit, embedder.apply, source=lambda item: item[0])
    batch = records(
        TWEETS,
        tweet("1", "the river is rising #flood #help"),
        b"[1, 2",  # not JSON
        tweet("2", "roads closed by water #flood"),
        tweet("3", "stay safe everyone #help"),
    )
    try:
        asyncio.run(runtime.process(step, batch))
        means = embedder.means.read(["flood", "help"])
        assert {tag: means[tag].count for tag in means} == {"flood": 2, "help": 2}
        letters = [json.loads(v) for _, v in broker.log["dead-letter"]]
        assert [(d["source"]["offset"], d["reason"], d["role"]) for d in letters] == [
            (1, "not_json", "embed")
        ]

        asyncio.run(runtime.process(step, batch))  # redelivered: the means are unchanged
        again = embedder.means.read(["flood", "help"])
        assert {tag: again[tag].count for tag in again} == {"flood": 2, "help": 2}
        updates = {
            outcome: exporter.registry.get_sample_value("reval_hashtag_updates_total", {"outcome": outcome})
            for outcome in ("applied", "duplicate")
        }
        assert updates == {"applied": 4, "duplicate": 4}  # four (tweet, hashtag) pairs, then none again
    finally:
        runtime.close()
        clear_prefix(scratch_redis, prefix)
