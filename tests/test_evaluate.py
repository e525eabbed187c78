"""`reval evaluate`: the paper's experiment (4.2) end to end on a small real feed."""

from __future__ import annotations

import csv
import gzip
import itertools
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stream.cleaning import Prepared, prepare
from stream.records import parse_tweet
from workers.adapters.feeds import sample_feed
from workers.commands.cli import app
from workers.commands.evaluate import ExperimentConfig, split_corpus

runner = CliRunner()
KS = [0, 5, 10, 20, 30, 40, 50, 60, 70]


@pytest.fixture(scope="module")
def small_feed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 1,500 lines of the bundled sample: ~350 hashtagged English tweets."""
    path = tmp_path_factory.mktemp("eval") / "feed.jsonl"
    with gzip.open(sample_feed(), "rt", encoding="utf-8") as src:
        path.write_text("".join(itertools.islice(src, 1500)), encoding="utf-8")
    return path


def prepared(n: int) -> list[Prepared]:
    out = []
    for i in range(n):
        p = prepare(parse_tweet({"id": str(i), "text": f"word{i} #t{i % 3}", "lang": "en",
                                 "created_at": 1_350_000_000 + (i * 7919) % n}))
        assert isinstance(p, Prepared)
        out.append(p)
    return out


def test_split_time_and_random() -> None:
    ps = prepared(100)
    train, test = split_corpus(ps, "time")
    assert (len(train), len(test)) == (90, 10)
    train_times = [p.tweet.created_at.timestamp() for p in train if p.tweet.created_at]
    test_times = [p.tweet.created_at.timestamp() for p in test if p.tweet.created_at]
    assert len(train_times) == 90 and max(train_times) < min(test_times)
    a_train, a_test = split_corpus(ps, "random", seed=3)
    _b_train, b_test = split_corpus(ps, "random", seed=3)
    c_train, _ = split_corpus(ps, "random", seed=4)
    assert [p.tweet.id for p in a_test] == [p.tweet.id for p in b_test]
    assert {p.tweet.id for p in a_train} != {p.tweet.id for p in c_train}
    assert {p.tweet.id for p in a_train} | {p.tweet.id for p in a_test} == {str(i) for i in range(100)}
    assert [len(x) for x in split_corpus(ps[:2], "time")] == [1, 1]
    with pytest.raises(ValueError):
        split_corpus(ps[:1], "time")


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="embeddings"):
        ExperimentConfig(embeddings=("glove",))
    with pytest.raises(ValueError, match="split"):
        ExperimentConfig(split="season")  # type: ignore[arg-type]


def evaluate(feed: Path, out: Path, model: Path, *extra: str) -> None:
    result = runner.invoke(app, ["evaluate", str(feed), "--out", str(out), "--model", str(model),
                                 "--fasttext-bucket", "20000", "--seed", "7", *extra])
    assert result.exit_code == 0, result.output
    assert "average #REval-hit-ratio" in result.output


def test_evaluate_writes_outputs_deterministically(
    small_feed: Path, tiny_bertweet: Path, tmp_path: Path
) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    evaluate(small_feed, first, tiny_bertweet, "--save-thesauri")
    evaluate(small_feed, second, tiny_bertweet)
    for name in ("results.json", "results.csv", "curves.png", "synonyms.md", "recommendations.jsonl"):
        assert (first / name).is_file() and (first / name).stat().st_size > 0, name
    assert (first / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Same feed, options and seed: the same results, to the byte (timings live elsewhere).
    assert (first / "results.json").read_bytes() == (second / "results.json").read_bytes()
    assert (first / "synonyms.md").read_bytes() == (second / "synonyms.md").read_bytes()

    results = json.loads((first / "results.json").read_text())
    data = results["data"]
    assert data["lines_read"] == 1500
    assert data["train_tweets"] + data["test_tweets"] == data["tweets_kept"] > 300
    assert data["test_tweets"] == data["tweets_kept"] - int(0.9 * data["tweets_kept"])
    rows = results["results"]
    assert len(rows) == 3 * 3 * len(KS)
    by = {(row["variant"], row["r"], row["k"]): row["reval_hit_ratio"] for row in rows}
    assert {row["events"] for row in rows} == {data["test_tweets"]}
    assert {row["unscorable"] for row in rows} == {data["empty_recommendations"]}
    for r in (1, 5, 10):
        # k = 0 is exact match: the same for every thesaurus, and what `exact` reports.
        assert by["bertag", r, 0] == by["word2vec", r, 0] == by["fasttext", r, 0]
        assert by["bertag", r, 0] == pytest.approx(results["exact"][str(r)]["hit_ratio"])
        for variant in ("bertag", "word2vec", "fasttext"):
            curve = [by[variant, r, k] for k in KS]
            assert curve == sorted(curve), (variant, r)  # more synonyms never hurt
            assert curve[0] >= 0.0 and curve[-1] <= 1.0
    with open(first / "results.csv", encoding="utf-8") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == len(rows)
    assert float(table[0]["reval_hit_ratio"]) == pytest.approx(rows[0]["reval_hit_ratio"], abs=1e-6)
    synonyms = (first / "synonyms.md").read_text()
    top = next(iter(results["synonyms"]["bertag"]))
    assert f"| #{top} (" in synonyms and "Word2Vec" in synonyms and "FastText" in synonyms

    # The same numbers come out of `reval score` on the written events and thesaurus.
    result = runner.invoke(app, ["score", str(first / "recommendations.jsonl"), "-t",
                                 str(first / "thesauri" / "bertag"), "-k", ",".join(map(str, KS)),
                                 "-r", "1,5,10", "--json"])
    assert result.exit_code == 0, result.output
    scored = json.loads(result.stdout)
    for r in (1, 5, 10):
        for k in KS:
            assert scored["by_r"][str(r)]["by_k"][str(k)]["reval_hit_ratio"] == pytest.approx(by["bertag", r, k])


def test_evaluate_random_split_and_options(small_feed: Path, tmp_path: Path) -> None:
    out = tmp_path / "w2v"
    result = runner.invoke(app, ["evaluate", str(small_feed), "--out", str(out), "--split", "random",
                                 "--embeddings", "word2vec", "-r", "3", "-k", "0,2", "--limit", "120", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(row["variant"], row["r"], row["k"]) for row in rows] == [("word2vec", 3, 0), ("word2vec", 3, 2)]
    results = json.loads((out / "results.json").read_text())
    assert results["data"]["tweets_kept"] == 120 and results["config"]["split"] == "random"

    result = runner.invoke(app, ["evaluate", str(small_feed), "--out", str(out), "--embeddings", "glove"])
    assert result.exit_code == 2 and "embeddings" in result.output
