"""Baseline recommenders and `reval recommend`: no leakage, orderings, MOWE, the canary."""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from stream.evaluation.recommenders import (
    BaseRecommender,
    LeastPopularRecommender,
    MoweRecommender,
    NotFittedError,
    PopularByUsersRecommender,
    PopularRecommender,
    Recommender,
    labelled_tweets,
    make_recommender,
    masked,
    visible_tokens,
)
from stream.intake.hashtags import extract_hashtags
from stream.intake.records import Tweet, parse_recommendation, parse_tweet
from workers.adapters.encoding.word_vectors import trainer
from workers.adapters.files.feeds import read_tweets, sample_feed
from workers.commands.cli import app

runner = CliRunner()


def tweet(i: int | str, text: str, user: str | None = None) -> Tweet:
    raw: dict[str, object] = {
        "id": str(i),
        "text": text,
        "lang": "en",
        "created_at": 1_350_000_000 + int(i) % 1_000_000,
    }
    if user is not None:
        raw["user_id"] = user
    return parse_tweet(raw)


@pytest.fixture(scope="module")
def sample_lines() -> list[str]:
    with gzip.open(sample_feed(), "rt", encoding="utf-8") as src:
        return list(itertools.islice(src, 1200))


@pytest.fixture(scope="module")
def sample_tweets(sample_lines: list[str]) -> list[Tweet]:
    return [parse_tweet(line) for line in sample_lines]


@pytest.fixture(scope="module")
def train_and_feed(sample_lines: list[str], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The first 900 lines of the bundled sample to train on, the next 300 to recommend for."""
    root = tmp_path_factory.mktemp("recs")
    train, feed = root / "train.jsonl", root / "feed.jsonl"
    train.write_text("".join(sample_lines[:900]), encoding="utf-8")
    feed.write_text("".join(sample_lines[900:]), encoding="utf-8")
    return train, feed


# --------------------------------------------------------------------------- leakage


class Spy(BaseRecommender):
    """Records what it is shown and 'recommends' every hashtag it can find in it."""

    method = "spy"

    def _fit(self, tweets: Sequence[Tweet]) -> None:
        self.seen: list[Tweet] = []

    def _recommend(
        self, tweets: Sequence[Tweet], r: int, progress: Callable[[int], None] | None
    ) -> list[list[str]]:
        self.seen.extend(tweets)
        out = []
        for t in tweets:
            found = [*t.hashtags, *extract_hashtags(t.text), *(json.dumps(t.extra).split("#")[1:])]
            out.append(found[:r])
        return out


def test_hidden_hashtags_never_reach_the_recommender(sample_tweets: list[Tweet]) -> None:
    v1 = parse_tweet(
        {
            "id_str": "5",
            "text": "Stay safe x#glued ＃東京 and #Flood… http://t.co/x",
            "lang": "en",
            "entities": {"hashtags": [{"text": "Flood"}, {"text": "Entityonly"}]},
        }
    )
    tweets = [*[t for t in sample_tweets if t.hashtags][:300], v1]
    assert len(tweets) > 250
    spy = Spy().fit(tweets)
    assert spy.recommend_many(tweets, 10) == [[] for _ in tweets]
    assert len(spy.seen) == len(tweets)
    for original, seen in zip(tweets, spy.seen, strict=True):
        assert seen.id == original.id and seen.created_at == original.created_at
        assert seen.hashtags == () and dict(seen.extra) == {}
        assert "#" not in seen.text and "＃" not in seen.text
        words = visible_tokens(original)
        assert not any(w.startswith("#") for w in words)
        assert not {f"#{h}" for h in original.hashtags} & set(seen.text.split())


def test_mowe_is_blind_to_the_tweets_own_hashtags(sample_tweets: list[Tweet]) -> None:
    labelled = [t for t in sample_tweets if t.hashtags]
    mowe = MoweRecommender(trainer=trainer(epochs=5)).fit(labelled[:250])
    probes = labelled[250:300]
    stripped = [tweet(t.id, " ".join(w for w in t.text.split() if "#" not in w)) for t in probes]
    with_tags = mowe.tweet_vectors(probes)
    np.testing.assert_array_equal(with_tags, mowe.tweet_vectors([masked(t) for t in probes]))
    assert mowe.recommend_many(probes, 5) == mowe.recommend_many(stripped, 5)


# --------------------------------------------------------------------------- popularity


CORPUS = [
    tweet(1, "a #A #a #b"),  # a tweet counts once per distinct hashtag
    tweet(2, "#a #c"),
    tweet(3, "#a #b #c"),
    tweet(4, "#d"),
    tweet(5, "#e #b"),
    tweet(6, "#c"),
]  # tweet counts: a 3, b 3, c 3, d 1, e 1


def test_popular_and_least_popular_orderings() -> None:
    query = tweet(99, "anything #z")
    assert PopularRecommender().fit(CORPUS).recommend(query, 4) == ["a", "b", "c", "d"]
    assert PopularRecommender().fit(CORPUS).recommend(query, 99) == ["a", "b", "c", "d", "e"]
    assert LeastPopularRecommender().fit(CORPUS).recommend(query, 3) == ["d", "e", "a"]
    assert make_recommender("popular", name="pop").name == "pop"
    assert isinstance(PopularRecommender(), Recommender)
    with pytest.raises(NotFittedError):
        PopularRecommender().recommend(query, 1)
    with pytest.raises(ValueError, match="positive"):
        PopularRecommender().fit(CORPUS).recommend(query, 0)
    with pytest.raises(ValueError, match="unknown method"):
        make_recommender("oracle")


def test_random_recommender_draws_by_popularity_without_repeats() -> None:
    train = [tweet(i, f"x #{h}") for i, h in enumerate(["a"] * 80 + ["b"] * 15 + ["c"] * 5)]
    rec = make_recommender("random", seed=3).fit(train)
    picks = rec.recommend_many([tweet(1000 + i, "q") for i in range(4000)], 1)
    share = {h: sum(p == [h] for p in picks) / len(picks) for h in "abc"}
    assert share["a"] == pytest.approx(0.80, abs=0.03) and share["c"] == pytest.approx(0.05, abs=0.015)
    two = rec.recommend_many([tweet(1, "q")] * 500, 2)
    assert all(len(set(p)) == 2 for p in two)
    assert rec.recommend_many([tweet(1, "q")] * 3, 5) == make_recommender("random", seed=3).fit(
        train
    ).recommend_many([tweet(1, "q")] * 3, 5)  # seeded: reproducible
    assert all(sorted(p) == ["a", "b", "c"] for p in rec.recommend_many([tweet(1, "q")] * 3, 5))


def test_popular_users_counts_distinct_users() -> None:
    posts = [("spam", "u1")] * 4 + [("flood", "u1"), ("flood", "u2"), ("flood", "u3")]
    posts += [("rain", "u4"), ("rain", "u5"), ("rain", "u5"), ("help", "u6"), ("help", "u7")]
    tweets = [tweet(i, f"#{tag}", user) for i, (tag, user) in enumerate(posts, start=1)]
    query = tweet(99, "x")
    assert PopularRecommender().fit(tweets).recommend(query, 4) == ["spam", "flood", "rain", "help"]
    by_users = PopularByUsersRecommender().fit(tweets)
    # flood 3 users; rain and help 2 users (rain has more tweets); spam 1 user.
    assert by_users.recommend(query, 4) == ["flood", "rain", "help", "spam"]
    assert by_users.counts["spam"] == 1 and by_users.has_users


def test_popular_users_falls_back_to_tweet_counts_with_a_warning() -> None:
    with pytest.warns(UserWarning, match="no user ids"):
        rec = PopularByUsersRecommender().fit(CORPUS)
    assert rec.recommend(tweet(99, "x"), 5) == PopularRecommender().fit(CORPUS).recommend(tweet(99, "x"), 5)


# --------------------------------------------------------------------------- MOWE


def hand_made_vectors() -> object:
    from gensim.models import KeyedVectors

    kv = KeyedVectors(vector_size=2)
    words = {
        "flood": [1.0, 0.1],
        "river": [1.0, 0.0],
        "rain": [0.9, 0.2],
        "blaze": [0.0, 1.0],
        "smoke": [0.1, 1.0],
        "bushland": [0.2, 0.9],
    }
    kv.add_vectors(list(words), np.array(list(words.values()), dtype=np.float32))
    return kv


MOWE_TRAIN = [
    tweet(1, "flood river #flood #qld"),
    tweet(2, "rain flood #flood"),
    tweet(3, "river rain #qld #storm"),
    tweet(4, "river #qld"),
    tweet(5, "rain #wet"),
    tweet(6, "flood #aaa"),
    tweet(7, "blaze smoke #blaze #nsw"),
    tweet(8, "bushland blaze #blaze #nsw"),
    tweet(9, "smoke #nsw"),
    tweet(10, "blaze #nsw #storm"),
    tweet(11, "#nsw only hashtags here"),  # no known words: never similar to anything
]  # global: nsw 5, qld 3, flood 2, blaze 2, storm 2, wet 1, aaa 1


def test_mowe_ranks_hashtags_of_similar_tweets_by_popularity() -> None:
    mowe = MoweRecommender(word_vectors=hand_made_vectors()).fit(MOWE_TRAIN)
    water = tweet(20, "river flood rain #secret")
    # votes among the 6 water tweets: qld 3, flood 2; then 1 vote each, by global
    # popularity (storm 2) and then by name (aaa before wet).
    assert mowe.recommend(water, 10) == ["qld", "flood", "storm", "aaa", "wet"]  # fewer than r
    assert mowe.recommend(water, 2) == ["qld", "flood"]
    assert mowe.last_similar_counts == [6]
    assert mowe.recommend(tweet(21, "smoke and bushland"), 3) == ["nsw", "blaze", "storm"]
    assert mowe.recommend(tweet(22, "nothing known here #flood"), 5) == []
    # Cosine exactly at the threshold counts; a stricter one finds fewer similar tweets.
    strict = MoweRecommender(word_vectors=hand_made_vectors(), threshold=0.9999).fit(MOWE_TRAIN)
    assert strict.recommend(tweet(23, "river"), 10) == ["qld"]
    with pytest.raises(ValueError, match="threshold"):
        MoweRecommender(threshold=0.0)


def test_mowe_recommends_from_similar_training_tweets(sample_tweets: list[Tweet]) -> None:
    labelled = [t for t in sample_tweets if t.hashtags]
    train, test = labelled[:250], labelled[250:]
    mowe = MoweRecommender(trainer=trainer(epochs=5, seed=1)).fit(train)
    recs = mowe.recommend_many(test, 5)
    assert [mowe.recommend(t, 5) for t in test[:5]] == recs[:5]  # one at a time = batched
    train_vectors = mowe.tweet_vectors(train)
    test_vectors = mowe.tweet_vectors(test)
    for vector, rec in zip(test_vectors, recs, strict=True):
        assert len(rec) <= 5 and len(set(rec)) == len(rec)
        similar = [t for t, v in zip(train, train_vectors, strict=True) if float(v @ vector) >= 0.5]
        votes = {h: sum(h in t.hashtags for t in similar) for h in {h for t in similar for h in t.hashtags}}
        assert set(rec) <= set(votes)
        assert [votes[h] for h in rec] == sorted((votes[h] for h in rec), reverse=True)
        if rec:
            assert votes[rec[0]] == max(votes.values())
    # Reproducible: same seed, same recommendations (one worker, stable word hashing).
    again = MoweRecommender(trainer=trainer(epochs=5, seed=1)).fit(train)
    assert again.recommend_many(test, 5) == recs


# --------------------------------------------------------------------------- CLI


def read_events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def recommend(method: str, train: Path, feed: Path, *options: str) -> Result:
    """``reval recommend -m METHOD --train TRAIN --feed FEED OPTIONS...`` in-process."""
    return runner.invoke(
        app, ["recommend", "-m", method, "--train", str(train), "--feed", str(feed), *options]
    )


def test_recommend_cli_writes_events_reval_score_accepts_and_the_canary(
    train_and_feed: tuple[Path, Path], tmp_path: Path
) -> None:
    train, feed = train_and_feed
    thesaurus = tmp_path / "empty.json"
    thesaurus.write_text("{}")
    hashtagged = [p.value for p in read_tweets([feed]) if p.value is not None and p.value.hashtags]
    scores = {}
    for method in ("popular", "least-popular", "mowe"):
        out = tmp_path / f"{method}.jsonl"
        result = recommend(method, train, feed, "-r", "5", "--out", str(out), "--with-truth")
        assert result.exit_code == 0, result.output
        events = read_events(out)
        assert [e["tweet_id"] for e in events] == [t.id for t in hashtagged]
        for event, source in zip(events, hashtagged, strict=True):
            parsed = parse_recommendation(json.dumps(event))
            assert parsed.recommender == method
            assert len(parsed.recommended) <= 5
            assert parsed.ground_truth == source.hashtags
            assert parsed.ts == source.created_at
        result = runner.invoke(app, ["score", str(out), "-t", str(thesaurus), "-k", "0", "--json"])
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout)
        assert summary["events"] == len(events) and summary["skipped_lines"] == 0
        scores[method] = summary["by_k"]["0"]["reval_hit_ratio"]
    # The canary: the least used hashtags must score below the most used ones.
    assert scores["least-popular"] < scores["popular"]
    assert scores["popular"] > 0.1 and scores["mowe"] > scores["least-popular"]


def test_recommend_cli_options(train_and_feed: tuple[Path, Path], tmp_path: Path) -> None:
    train, feed = train_and_feed
    out = tmp_path / "recs.jsonl"
    options = ["-r", "3", "--out", str(out), "--recommender-name", "baseline-1", "--all-tweets"]
    result = recommend("popular-users", train, feed, *options)
    assert result.exit_code == 0, result.output
    assert "no user ids" in result.output  # the sample feed has none: warned, then by tweet count
    events = read_events(out)
    assert len(events) == sum(1 for p in read_tweets([feed]) if p.value is not None)
    assert all("ground_truth" not in e and e["recommender"] == "baseline-1" for e in events)
    assert len({tuple(e["recommended"]) for e in events}) == 1  # type: ignore[arg-type]

    result = recommend("popular", train, feed)
    assert result.exit_code == 2 and "--out" in result.output
    result = recommend("best", train, feed, "--out", str(out))
    assert result.exit_code == 2 and "unknown method" in result.output
    result = recommend("popular", tmp_path / "nope.jsonl", feed, "--out", str(out))
    assert result.exit_code == 2 and "not found" in result.output


def test_training_tweets_are_preprocessed(train_and_feed: tuple[Path, Path]) -> None:
    train, _ = train_and_feed
    tweets = labelled_tweets(read_tweets([train]))
    assert tweets and all(t.hashtags for t in tweets)
    assert len(tweets) < sum(1 for p in read_tweets([train]) if p.value is not None and p.value.hashtags)
    assert len(labelled_tweets(read_tweets([train]), limit=10)) == 10


@pytest.mark.integration
def test_recommend_cli_produces_to_kafka(broker: str, train_and_feed: tuple[Path, Path]) -> None:
    from aiokafka import AIOKafkaConsumer

    from workers.adapters.kafka.kafka_client import create_topics

    train, feed = train_and_feed
    topic = f"recommendations-{uuid.uuid4().hex[:8]}"
    create_topics(broker, {topic: 2})
    result = recommend(
        "popular", train, feed, "-r", "2", "--topic", topic, "--broker", broker, "--with-truth"
    )
    assert result.exit_code == 0, result.output
    expected = {t.id: t for p in read_tweets([feed]) if (t := p.value) is not None and t.hashtags}

    async def consume() -> list[object]:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=broker,
            group_id=f"g-{uuid.uuid4().hex[:8]}",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=6000,  # Kafka refuses less (group.min.session.timeout.ms)
            heartbeat_interval_ms=1000,
        )
        await consumer.start()
        records: list[object] = []
        try:
            async with asyncio.timeout(30):
                while len(records) < len(expected):
                    for batch in (await consumer.getmany(timeout_ms=500)).values():
                        records.extend(batch)
        finally:
            await consumer.stop()
        return records

    records = asyncio.run(consume())
    assert len(records) == len(expected)
    for record in records:
        event = parse_recommendation(record.value)  # type: ignore[attr-defined]
        source = expected[event.tweet_id]
        assert record.key == source.id.encode()  # type: ignore[attr-defined]
        assert source.created_at is not None
        assert record.timestamp == int(source.created_at.timestamp() * 1000)  # type: ignore[attr-defined]
        assert event.ground_truth == source.hashtags and len(event.recommended) == 2
