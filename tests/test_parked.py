"""The parked event (:class:`workers.service.parked.Parked`): its bytes in Redis are the ones
running deployments hold, and the scorer's join parks, answers and expires events through it
(the real :class:`Scorer` on a throwaway Redis prefix; no broker)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import redis

from stream.intake.records import Coordinates, Recommendation, Tweet
from workers.adapters.prometheus.exporter import Exporter
from workers.adapters.redis.redis_client import clear_prefix
from workers.service.incarnation import Incarnations
from workers.service.kafka_records import Record
from workers.service.parked import Parked
from workers.service.score import Scorer
from workers.settings import Settings

RECORD = Record(
    "recs", 2, 41, 1_700_000_000_123, "té".encode(), b'{"tweet_id":"7","recommended":["#Caf\xc3\xa9","#b"]}'
)
EVENT = Recommendation("7", ("café", "b"), None, "mowe", datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC))
#: What the scorer stored for RECORD before the parked event was its own module (score.py's
#: ``Parked.to_json`` at e420753): deployments upgraded mid-join hold these bytes.
STORED = (
    '{"tweet_id":"7","recommender":"mowe","recommended":["café","b"],"ts":"2023-11-14T22:13:20+00:00",'
    '"src":["recs",2,41,1700000000123],"key":"dMOp","size":46,'
    '"sha256":"fe266d676c9820877016be4995e2193921930ad9f193b7fa81d983bb06d14a07"}'
)


def test_the_bytes_are_those_deployments_hold_and_read_both_ways() -> None:
    parked = Parked.of(RECORD, EVENT)
    assert parked.to_bytes() == STORED.encode()
    assert Parked.from_bytes(STORED) == parked  # the text the join hands back
    assert Parked.from_bytes(STORED.encode()) == parked
    assert parked.coordinates == Coordinates("recs", 2, 41)


def test_the_letter_carries_the_parsed_event_and_the_original_fingerprint() -> None:
    letter = Parked.from_bytes(STORED).letter("join_expired", "no tweet 7 within 1s")
    assert (letter.topic, letter.key) == ("dead_letters", b"recs:2:41")
    value = letter.value
    assert isinstance(value, dict)
    assert value["source"] == {"topic": "recs", "partition": 2, "offset": 41}
    assert value["key"] == "té"
    assert json.loads(base64.b64decode(value["value_base64"])) == {
        "tweet_id": "7",
        "recommender": "mowe",
        "recommended": ["café", "b"],
        "ts": "2023-11-14T22:13:20+00:00",
    }
    assert (value["value_size"], value["value_is_parsed_event"]) == (len(RECORD.value), True)
    assert value["value_sha256"] == Parked.of(RECORD, EVENT).value_sha256


class FixedIdentity:
    """The broker's topic id, without a broker."""

    def of(self, topic: str) -> str:
        return "0000-topic-id"


@pytest.fixture
def scorer(redis_url: str, redis_prefix: str) -> Iterator[Scorer]:
    client = redis.Redis.from_url(redis_url)
    settings = Settings(
        redis_url=redis_url,
        redis_prefix=redis_prefix,
        ks="0,5",
        rs="1",
        join_window_s=0.3,
        thesaurus_source="redis",
    )
    exporter = Exporter()
    incarnations = Incarnations(FixedIdentity(), client, redis_prefix, exporter)  # type: ignore[arg-type]
    yield Scorer(settings, exporter, client, incarnations)
    clear_prefix(redis_url, redis_prefix)
    client.close()


@pytest.mark.integration
def test_a_parked_event_is_scored_when_its_tweet_comes_or_expires_as_one_letter(scorer: Scorer) -> None:
    waits = Record(
        "recs", 0, 1, 1_700_000_000_000, b"8", json.dumps({"tweet_id": "8", "recommended": ["a"]}).encode()
    )
    expires = Record(
        "recs", 0, 2, 1_700_000_000_000, None, json.dumps({"tweet_id": "9", "recommended": ["b"]}).encode()
    )
    items, letters = scorer.admit_events([waits, expires])
    assert not letters
    parked = scorer.apply_events(items)
    assert not parked.outputs and scorer.join_full() is False
    tweet = Record("tweets", 0, 5, None, None, b"{}")
    answered = scorer.apply_tweets([(tweet, Tweet("8", "#a #c", hashtags=("a", "c")))])
    [score] = answered.outputs
    assert (score.topic, score.source.coordinates, score.via) == ("scores", Coordinates("recs", 0, 1), tweet)
    assert isinstance(score.value, bytes)  # encoded from the batch's columns
    record = json.loads(score.value)
    assert record["ground_truth"] == ["a", "c"] and record["recommender"] == "default"
    for after in answered.after:  # what the runtime does once the score is acknowledged: settle
        after()
    time.sleep(0.5)  # past the join window
    [letter] = scorer.expire().outputs
    assert isinstance(letter.value, dict)
    assert letter.value["reason"] == "join_expired"
    assert letter.value["source"] == {"topic": "recs", "partition": 0, "offset": 2}
    assert letter.value["value_sha256"] == Parked.of(expires, items[1][1]).value_sha256
