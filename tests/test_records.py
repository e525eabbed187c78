"""Tweet and recommendation parsing across the formats we accept, and the errors for bad ones."""

from __future__ import annotations

import json

import pytest

from stream.intake.records import RecordError, parse_recommendation, parse_tweet

V1 = {
    "id": 1050118621198921728,
    "id_str": "1050118621198921728",
    "created_at": "Wed Oct 10 20:19:24 +0000 2018",
    "text": "RT @nasa: Flooding in #Houston is getting worse, stay safe #HurricaneHarvey…",
    "lang": "en",
    "user": {"id_str": "42"},
    "entities": {"hashtags": [{"text": "Houston", "indices": [22, 30]}]},
    "retweeted_status": {
        "id_str": "999",
        "text": "Flooding in #Houston is getting worse, stay safe #HurricaneHarvey…",
        "extended_tweet": {
            "full_text": "Flooding in #Houston is getting worse, stay safe #HurricaneHarvey #TXflood",
            "entities": {"hashtags": [{"text": "Houston"}, {"text": "HurricaneHarvey"}, {"text": "TXflood"}]},
        },
    },
}

V2 = {
    "data": {
        "id": "1460323737035677698",
        "text": "Stay safe #Flood #NSW https://t.co/x",
        "created_at": "2021-11-15T18:40:18.000Z",
        "lang": "en",
        "author_id": "7",
        "entities": {"hashtags": [{"start": 10, "end": 16, "tag": "Flood"}, {"tag": "NSW"}]},
        "referenced_tweets": [{"type": "retweeted", "id": "1460000000000000000"}],
        "edit_history_tweet_ids": ["1460323737035677698"],
    }
}


def test_v1_uses_the_retweeted_full_text_and_its_entities() -> None:
    tweet = parse_tweet(json.dumps(V1))
    assert tweet.id == "1050118621198921728"
    assert tweet.created_at is not None and tweet.created_at.isoformat() == "2018-10-10T20:19:24+00:00"
    assert tweet.hashtags == ("houston", "hurricaneharvey", "txflood")
    assert tweet.retweet_of == "999" and tweet.is_retweet
    assert tweet.user_id == "42" and tweet.lang == "en"
    assert tweet.text.endswith("#TXflood")


def test_v1_full_text_field() -> None:
    tweet = parse_tweet({"id_str": "5", "full_text": "long #one", "text": "short"})
    assert tweet.text == "long #one" and tweet.hashtags == ("one",)


def test_v2_wrapped_and_flat() -> None:
    wrapped = parse_tweet(json.dumps(V2))
    flat = parse_tweet(V2["data"])
    assert wrapped == flat
    assert wrapped.hashtags == ("flood", "nsw")
    assert wrapped.retweet_of == "1460000000000000000"
    assert wrapped.user_id == "7"
    assert wrapped.created_at is not None and wrapped.created_at.year == 2021


def test_minimal_format_from_the_shared_feed() -> None:
    line = (
        '{"id": "203440928084602880", "created_at": "2012-05-18T11:04:31.662Z", '
        '"text": "E #Navelli... a che punto siamo? #laquila #sisma http://t.co/z7ZO4wQ8"}'
    )
    tweet = parse_tweet(line.encode())
    assert tweet.hashtags == ("navelli", "laquila", "sisma")
    assert tweet.lang is None and tweet.retweet_of is None


@pytest.mark.parametrize(
    ("raw", "reason", "words"),
    [
        (b"{not json", "not_json", "not JSON"),
        (b"\xff\xfe{}", "invalid_utf8", "UTF-8"),
        (b"[1, 2]", "not_object", "list"),
        (b'{"text": "x"}', "missing_field", "'id'"),
        (b'{"id": "1"}', "missing_field", "'text'"),
        (b'{"id": ["1"], "text": "x"}', "bad_type", "'id'"),
        (b'{"id": "1", "text": 5}', "bad_type", "'text'"),
        (b'{"id": "1", "text": "x", "created_at": "yesterday"}', "bad_time", "yesterday"),
        (b'{"id": "1", "text": "x", "created_at": true}', "bad_time", "True"),
        (b'{"id": "1", "text": "x", "entities": {"hashtags": [{"nope": 1}]}}', "bad_type", "hashtags[0]"),
        (b'{"id": " ", "text": "x"}', "bad_value", "empty"),
        (b"[" * 100_000 + b"]" * 100_000, "not_json", "nested too deeply"),  # a RecursionError
        (b'{"id": ' + b"9" * 5000 + b', "text": "x"}', "not_json", "digits"),  # a ValueError
    ],
)
def test_bad_records_say_what_is_wrong(raw: bytes, reason: str, words: str) -> None:
    with pytest.raises(RecordError) as info:
        parse_tweet(raw)
    assert info.value.reason == reason
    assert words in str(info.value)


def test_oversize_text_and_record() -> None:
    big = json.dumps({"id": "1", "text": "a" * 1_000_000}).encode()
    with pytest.raises(RecordError) as info:
        parse_tweet(big)
    assert info.value.reason == "oversize"
    with pytest.raises(RecordError) as info:
        parse_tweet({"id": "1", "text": "a" * 30_000})
    assert info.value.reason == "oversize"


def test_too_many_hashtags() -> None:
    text = " ".join(f"#t{i}" for i in range(10_000))
    with pytest.raises(RecordError) as info:
        parse_tweet({"id": "1", "text": text})
    assert info.value.reason in {"oversize", "too_many_hashtags"}
    tags = [{"text": f"t{i}"} for i in range(10_000)]
    with pytest.raises(RecordError) as info:
        parse_tweet({"id": "1", "text": "x", "entities": {"hashtags": tags}})
    assert info.value.reason == "too_many_hashtags"


def test_epoch_times() -> None:
    seconds = parse_tweet({"id": "1", "text": "x", "created_at": 1_600_000_000})
    millis = parse_tweet({"id": "1", "text": "x", "created_at": 1_600_000_000_000})
    assert seconds.created_at == millis.created_at


def test_recommendation_events() -> None:
    event = parse_recommendation(
        b'{"tweet_id": "9", "recommender": "mowe", "recommended": ["#A", "b", "a"], '
        b'"ground_truth": ["Covid19:"], "ts": "2020-01-01T00:00:00Z", "extra": {"x": 1}}'
    )
    assert event.recommended == ("a", "b")
    assert event.ground_truth == ("covid19",)
    assert event.recommender == "mowe" and event.ts is not None
    assert parse_recommendation('{"tweet_id": 1, "recommended": []}').recommended == ()
    for raw, reason in [
        ('{"recommended": []}', "missing_field"),
        ('{"tweet_id": "1"}', "missing_field"),
        ('{"tweet_id": "1", "recommended": "a"}', "bad_type"),
        ('{"tweet_id": "1", "recommended": [1]}', "bad_type"),
        ('{"tweet_id": "1", "recommended": [], "ts": "soon"}', "bad_time"),
    ]:
        with pytest.raises(RecordError) as info:
            parse_recommendation(raw)
        assert info.value.reason == reason, raw


def test_admit_counts_each_record_once_per_batch() -> None:
    from prometheus_client import generate_latest

    from workers.adapters.prometheus.exporter import Exporter
    from workers.service.kafka_records import Record, admit

    good = json.dumps({"tweet_id": "1", "recommended": ["a"]}).encode()
    records = [
        Record("recs", 0, i, None, None, value) for i, value in enumerate([good, b"{", good, b"[]", good])
    ]
    exporter = Exporter()
    parsed, rejected = admit(records, parse_recommendation, exporter, "score")
    assert [r.offset for r, _ in parsed] == [0, 2, 4]
    assert [(r.offset, e.reason) for r, e in rejected] == [(1, "not_json"), (3, "not_object")]
    text = generate_latest(exporter.registry).decode()
    assert 'reval_records_consumed_total{topic="recs"} 5.0' in text
    assert 'reval_records_rejected_total{reason="not_json",topic="recs"} 1.0' in text
    assert 'reval_records_rejected_total{reason="not_object",topic="recs"} 1.0' in text
