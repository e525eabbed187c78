"""The live path end to end on real parts: Tansu (Kafka protocol), Redis, the worker
processes with a real (tiny, random) BERTweet-architecture model, and /metrics."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from stream.evaluation.neighbours import NeighbourCache
from stream.evaluation.scoring import score_event
from stream.intake.records import Tweet, parse_recommendation, parse_tweet
from tests.live import assert_means_equal, assert_reservoir_equal, batch_means, counts_reach, plain_tweets
from workers.adapters.files.feeds import sample_feed
from workers.adapters.files.store import ThesaurusStore
from workers.adapters.redis.redis_means import RedisMeans
from workers.dev.stack import Stack, Worker, keyed, tweet_lines, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def stack(broker: str, redis_url: str, tiny_bertweet: Path, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(broker, redis_url, tiny_bertweet, tmp_path)
    yield s
    s.close()


def recommendation_events(tagged: list[Tweet]) -> list[dict[str, Any]]:
    """Two recommenders' events for hashtagged tweets (a third joined with their tweet by id,
    the rest carrying their ground truth) and one with no hashtags at all."""
    events: list[dict[str, Any]] = []
    for i, tweet in enumerate(tagged):
        event: dict[str, Any] = {
            "tweet_id": tweet.id,
            "recommender": f"rec{i % 2}",
            "recommended": ["terremoto", "sisma", "news", "emilia"],
        }
        if i % 3:  # a third of the events are joined with their tweet by id
            event["ground_truth"] = list(tweet.hashtags)
        events.append(event)
    events.append({"tweet_id": "nohashtags", "recommended": ["x"], "ground_truth": []})
    return events


def assert_scores_equal_offline(
    results: list[dict[str, Any]], events: list[dict[str, Any]], store: ThesaurusStore, tweets: list[Tweet]
) -> None:
    """Each live score is the offline score of the same event on the version it names."""
    by_id = {r["tweet_id"]: r for r in results}
    truth = {t.id: t.hashtags for t in tweets}
    for raw in events:
        got = by_id[raw["tweet_id"]]
        parsed = parse_recommendation(json.dumps(raw))
        thesaurus = store.load(got["index_version"]) if got["index_version"] is not None else None
        assert thesaurus is not None, "scored before any index version"
        offline = score_event(
            parsed,
            parsed.ground_truth if parsed.ground_truth is not None else truth[parsed.tweet_id],
            NeighbourCache(thesaurus, max_k=70),
            ks=(0, 5, 10, 20, 30, 40, 50, 60, 70),
            rs=(1, 5, 10),
        ).to_json()
        assert got["reval_hit_ratio"] == offline["reval_hit_ratio"]
        assert got["exact"] == offline["exact"]
        assert got["scorable"] == offline["scorable"]
        assert got["thesaurus_version"] == thesaurus.version  # the content hash, as `reval score` prints


def detector_took(score: Worker, recommender: str, events: int) -> bool:
    return score.metric("reval_detector_events", recommender=recommender) == events


def assert_score_metrics(score: Worker, results: list[dict[str, Any]], events: list[dict[str, Any]]) -> None:
    """The scorer's /metrics add up what its scores say, per recommender."""
    scorable = [r for r in results if r["scorable"]]
    for rec in ("rec0", "rec1"):
        mine = [r for r in scorable if r["recommender"] == rec]
        assert score.metric("reval_hit_ratio_count", recommender=rec, k="5", r="5") == len(mine)
        total = sum(r["reval_hit_ratio"]["5"]["5"] for r in mine)
        assert score.metric("reval_hit_ratio_sum", recommender=rec, k="5", r="5") == pytest.approx(total)
        assert score.metric("reval_exact_match_count", recommender=rec, metric="f1", r="1") == len(mine)
        # the change detector (its state in Redis; updated just after the quality sums) took
        # every scorable event once
        wait_for(
            f"the detector of {rec} to take its events",
            partial(detector_took, score, rec, len(mine)),
            10,
            0.2,
        )
        # The chance-corrected score's sums: what each event's score and expectation add up to.
        corrected = [r for r in mine if r["reval_hit_ratio_expected"]]
        assert corrected, "a published thesaurus has a null model: every event has an expectation"
        sums = {
            "observed": sum(r["reval_hit_ratio"]["5"]["5"] for r in corrected),
            "expected": sum(r["reval_hit_ratio_expected"]["5"]["5"] for r in corrected),
            "events": len(corrected),
        }
        for what, want in sums.items():
            got = score.metric(f"reval_corrected_{what}_total", recommender=rec, k="5", r="5")
            assert got == pytest.approx(want), what
    assert score.metric("reval_events_total", recommender="default", outcome="unscorable") == 1
    assert score.metric("reval_join_total", outcome="matched") == sum(
        1 for e in events if "ground_truth" not in e
    )


def assert_hot_swap(stack: Stack, store: ThesaurusStore, score: Worker, tweet: Tweet) -> None:
    """More tweets make a new version, picked up without restarting the scorer."""
    first = store.current_version()
    stack.send("tweets", keyed(tweet_lines(sample_feed(), 400, start=600)))
    wait_for("a new index version", lambda: store.current_version() != first, timeout=60)
    newest = store.current_version()
    assert newest is not None
    again = {
        "tweet_id": tweet.id,
        "recommender": "rec0-late",  # rec0's key (tweet id, recommender) was scored: a duplicate
        "recommended": ["terremoto"],
        "ground_truth": list(tweet.hashtags),
    }
    wait_for(
        "the scorer to load the new version",
        lambda: score.metric("reval_scoring_thesaurus_version") >= int(newest[1:]),
        30,
    )
    stack.send("recommendations", [(b"again", json.dumps(again).encode())])
    # By its recommender: the records of two partitions come back in no fixed order.
    late = lambda: [r for r in stack.read_json("scores") if r["recommender"] == "rec0-late"]  # noqa: E731
    later = wait_for("the late event", late, 60)
    assert later[0]["index_version"] == store.current_version() or later[0]["index_version"] >= newest


def test_end_to_end_scores_equal_offline_and_metrics(stack: Stack) -> None:
    embed, index, score = stack.start("embed"), stack.start("index"), stack.start("score")
    stack.wait_ready(embed, index, score)
    lines = tweet_lines(sample_feed(), 600)
    stack.send("tweets", keyed(lines))
    store = ThesaurusStore(stack.index_dir)
    wait_for("a first index version", store.current_version, timeout=120)
    wait_for("the scorer to load it", lambda: score.metric("reval_scoring_thesaurus_version") >= 1, 30)

    tweets = [parse_tweet(line) for line in lines]
    tagged = [t for t in tweets if t.hashtags][:60]
    events = recommendation_events(tagged)
    stack.send("recommendations", ((e["tweet_id"].encode(), json.dumps(e).encode()) for e in events))

    results = wait_for(
        "every event scored", lambda: (r := stack.read_json("scores")) and len(r) >= len(events) and r, 120
    )
    assert len(results) == len(events)
    assert_scores_equal_offline(results, events, store, tweets)
    assert_score_metrics(score, results, events)
    topic = stack.topics["tweets"]
    wait_for(
        "the embed worker to consume every tweet",
        lambda: embed.metric("reval_records_consumed_total", topic=topic) == len(lines),
        60,
    )
    assert index.metric("reval_index_version") >= 1
    lag = wait_for(
        "consumer lag reported",
        lambda: [v for (name, labels), v in score.metrics().items() if name == "reval_consumer_lag"],
        30,
    )
    assert all(v >= 0 for v in lag)
    assert_hot_swap(stack, store, score, tagged[0])


def test_kill_9_mid_stream_loses_nothing_and_counts_nothing_twice(stack: Stack) -> None:
    lines = plain_tweets(6000)
    expected = batch_means(lines, stack.model)
    embed = stack.start("embed")
    stack.wait_ready(embed)
    stack.send("tweets", keyed(lines))
    wait_for("some tweets embedded", lambda: embed.metric("reval_tweets_embedded_total") >= 64, 60, 0.1)
    embed.kill9()
    partial = RedisMeans.from_url(stack.redis_url, prefix=stack.prefix).read_all()
    assert 0 < sum(s.count for s in partial.values()) < sum(s.count for s in expected.states.values())

    restarted = stack.start("embed")
    stack.wait_ready(restarted, timeout=150)
    wait_for("all tweets applied", lambda: counts_reach(stack, expected), 180, 1.0)
    assert_means_equal(stack, expected)
    assert_reservoir_equal(stack, lines)  # the coherence sample: redeliveries changed nothing
    # the restart did see redelivered records and skipped them
    assert restarted.metric("reval_hashtag_updates_total", outcome="duplicate") >= 0


def test_bad_input_is_dead_lettered_and_neighbours_survive(stack: Stack) -> None:
    embed, score = stack.start("embed"), stack.start("score")
    stack.wait_ready(embed, score)
    good = plain_tweets(300)
    bad_tweets: list[tuple[bytes | None, bytes]] = [
        (b"b1", b"{not json"),
        (b"b2", json.dumps({"text": "no id #x"}).encode()),
        (b"b3", json.dumps({"id": ["1"], "text": "wrong id type #x"}).encode()),
        (b"b4", json.dumps({"id": "b4", "text": "a" * 1_000_000}).encode()),
        (b"b5", b'{"id": "b5", "text": "\xff\xfe invalid utf-8 #x"}'),
        (
            b"b6",
            json.dumps(
                {
                    "id": "b6",
                    "text": "#t0 #t1",
                    "entities": {"hashtags": [{"text": f"t{i}"} for i in range(10_000)]},
                }
            ).encode(),
        ),
    ]
    mixed: list[tuple[bytes | None, bytes]] = []
    for i, record in enumerate(keyed(good)):
        mixed.append(record)
        if i % 40 == 0 and bad_tweets:
            mixed.append(bad_tweets.pop())
    mixed += bad_tweets
    # unknown extra fields are fine
    extra = json.loads(good[0])
    extra.update({"id": "extra1", "something_new": {"a": 1}})
    mixed.append((b"extra1", json.dumps(extra).encode()))
    stack.send("tweets", mixed)

    recs = [
        (b"r1", b"[1, 2, 3]"),
        (b"r2", json.dumps({"tweet_id": "r2", "recommended": "notalist"}).encode()),
        (b"r3", json.dumps({"tweet_id": "r3", "recommended": [], "ground_truth": ["a"]}).encode()),
        (
            b"r4",
            json.dumps({"tweet_id": "r4", "recommended": ["a"], "ground_truth": [], "new_field": 1}).encode(),
        ),
        (b"r5", json.dumps({"tweet_id": "r5", "recommended": ["a"], "ground_truth": ["a"]}).encode()),
    ]
    stack.send("recommendations", recs)

    expected = batch_means([*good, json.dumps(extra)], stack.model)
    wait_for("good tweets applied", lambda: counts_reach(stack, expected), 120, 1.0)
    assert_means_equal(stack, expected)

    try:
        dead = wait_for(
            "dead letters", lambda: (d := stack.read_json("dead_letter")) and len(d) >= 8 and d, 60
        )
    except TimeoutError:
        raise AssertionError(
            f"dead letters: {[(d['reason'], d['detail'][:80]) for d in stack.read_json('dead_letter')]}"
        ) from None
    reasons = sorted(d["reason"] for d in dead)
    assert reasons == sorted(
        [
            "not_json",
            "missing_field",
            "bad_type",
            "oversize",
            "invalid_utf8",
            "too_many_hashtags",
            "not_object",
            "bad_type",
        ]
    )
    for letter in dead:
        assert letter["source"]["topic"] in (stack.topics["tweets"], stack.topics["recommendations"])
        assert base64.b64decode(letter["value_base64"])  # the original bytes are kept
    scored = wait_for("scores", lambda: (s := stack.read_json("scores")) and len(s) >= 3 and s, 60)
    scores = {r["tweet_id"]: r for r in scored}
    assert scores["r3"]["unscorable_reason"] == "empty_recommended"
    assert scores["r4"]["unscorable_reason"] == "empty_ground_truth"
    assert scores["r5"]["scorable"] is True
    assert embed.metric("reval_records_rejected_total", topic=stack.topics["tweets"], reason="oversize") == 1
    assert embed.proc.poll() is None and score.proc.poll() is None
