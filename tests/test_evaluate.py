"""`reval evaluate`: the paper's experiment (4.2) end to end on a small real feed."""

from __future__ import annotations

import csv
import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from stream.evaluation.experiment import ExperimentConfig, split_corpus
from stream.intake.cleaning import Prepared, prepare
from stream.intake.records import parse_tweet
from workers.adapters.files.feeds import sample_feed
from workers.commands.cli import app

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
        p = prepare(
            parse_tweet(
                {
                    "id": str(i),
                    "text": f"word{i} #t{i % 3}",
                    "lang": "en",
                    "created_at": 1_350_000_000 + (i * 7919) % n,
                }
            )
        )
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
    with pytest.raises(ValueError, match="splits"):
        ExperimentConfig(splits=("season",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="recommenders"):
        ExperimentConfig(recommenders=("oracle",))
    with pytest.raises(ValueError, match="hubness"):
        ExperimentConfig(hubness=("magic",))
    with pytest.raises(ValueError, match="seeds"):
        ExperimentConfig(seeds=(1, 1))
    assert ExperimentConfig(mowe_thresholds=(0.8, 0.5)).recommender_names[:2] == ["mowe", "mowe@0.5"]


CELL_KEYS = {
    "variant",
    "hubness",
    "recommender",
    "seed",
    "r",
    "k",
    "reval_hit_ratio",
    "ci_low",
    "ci_high",
    "reval_hit_ratio_corrected",
    "corrected_ci_low",
    "corrected_ci_high",
    "corrected_null_reason",
    "events",
    "unscorable",
}


def evaluate(feed: Path, out: Path, model: Path, *extra: str) -> None:
    result = runner.invoke(
        app,
        [
            "evaluate",
            str(feed),
            "--out",
            str(out),
            "--model",
            str(model),
            "--fasttext-bucket",
            "20000",
            "--seeds",
            "7",
            "--bootstrap",
            "200",
            *extra,
        ],
    )
    assert result.exit_code == 0, result.output
    assert "mean [95% CI]" in result.output


def assert_cells_inside_their_intervals(cells: list[dict[str, Any]], test_tweets: int) -> None:
    """Every scored cell: its #REval and its chance-corrected kappa inside their bootstrap
    intervals, over every test tweet."""
    for c in cells:
        if c["reval_hit_ratio"] is not None:
            assert c["ci_low"] <= c["reval_hit_ratio"] <= c["ci_high"]
            assert c["events"] == test_tweets and c["reval_hit_ratio_corrected"] is not None
            # the kappa of the cell's sums, inside its bootstrap interval
            assert c["corrected_ci_low"] <= c["reval_hit_ratio_corrected"] <= c["corrected_ci_high"]
            assert c["corrected_null_reason"] is None


def assert_reval_score_agrees(out: Path, cell: dict[tuple[Any, ...], dict[str, Any]]) -> None:
    """The same numbers come out of `reval score` on the written events and thesaurus."""
    result = runner.invoke(
        app,
        [
            "score",
            str(out / "recommendations.jsonl"),
            "-t",
            str(out / "thesauri" / "bertag-center+csls"),
            "-k",
            ",".join(map(str, KS)),
            "-r",
            "1,5,10",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    scored = json.loads(result.stdout)
    for r in (1, 5, 10):
        for k in KS:
            got = scored["by_r"][str(r)]["by_k"][str(k)]
            want = cell[7, "bertag", "mowe", str(r), k]
            assert got["reval_hit_ratio"] == pytest.approx(want["reval_hit_ratio"])
            assert got["reval_hit_ratio_corrected"] == pytest.approx(want["reval_hit_ratio_corrected"])


@pytest.mark.slow
def test_evaluate_writes_outputs_deterministically(
    small_feed: Path, tiny_bertweet: Path, tmp_path: Path
) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    evaluate(small_feed, first, tiny_bertweet, "--save-thesauri")
    evaluate(small_feed, second, tiny_bertweet)
    for name in ("results.json", "results.csv", "curves.png", "synonyms.md", "recommendations.jsonl"):
        assert (first / name).is_file() and (first / name).stat().st_size > 0, name
    assert (first / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Same feed, options and seeds: the same results, to the byte (timings live elsewhere).
    assert (first / "results.json").read_bytes() == (second / "results.json").read_bytes()
    assert (first / "synonyms.md").read_bytes() == (second / "synonyms.md").read_bytes()

    results = json.loads((first / "results.json").read_text())
    data = results["data"]
    assert data["lines_read"] == 1500
    assert data["train_tweets"] + data["test_tweets"] == data["tweets_kept"] > 300
    assert data["test_tweets"] == data["tweets_kept"] - int(0.9 * data["tweets_kept"])
    rows = results["results"]  # the paper's table, kept for the tools that read it
    assert len(rows) == 3 * 3 * len(KS)
    by = {(row["variant"], row["r"], row["k"]): row["reval_hit_ratio"] for row in rows}
    assert {row["events"] for row in rows} == {data["test_tweets"]}

    cells = results["cells"]
    assert all(set(c) >= CELL_KEYS for c in cells)
    recommenders = {"mowe", "popular", "least-popular", "random"}
    assert {c["recommender"] for c in cells} == recommenders
    assert {c["seed"] for c in cells} == {7, "all"} and {c["r"] for c in cells} == {"1", "5", "10"}
    assert len(cells) == 2 * 3 * 4 * 3 * len(KS)  # seed 7 and pooled; embeddings; recommenders; r; k
    cell = {(c["seed"], c["variant"], c["recommender"], c["r"], c["k"]): c for c in cells}
    assert_cells_inside_their_intervals(cells, data["test_tweets"])
    for r in (1, 5, 10):
        # k = 0 is exact match: the same for every thesaurus, and what `exact` reports.
        assert by["bertag", r, 0] == by["word2vec", r, 0] == by["fasttext", r, 0]
        assert by["bertag", r, 0] == pytest.approx(results["exact"][str(r)]["hit_ratio"])
        for variant in ("bertag", "word2vec", "fasttext"):
            for name in recommenders:
                curve = [cell["all", variant, name, str(r), k]["reval_hit_ratio"] for k in KS]
                assert curve == sorted(curve), (variant, name, r)  # more synonyms never hurt
            assert [by[variant, r, k] for k in KS] == [
                cell["all", variant, "mowe", str(r), k]["reval_hit_ratio"] for k in KS
            ]
        # The canary never hits exactly: it recommends hashtags its test tweets do not use.
        assert cell["all", "bertag", "least-popular", str(r), 0]["reval_hit_ratio"] == 0.0
    assert {d["compare"] for d in results["differences"]} == {"recommenders", "embeddings"}
    assert all(
        d["ci_low"] <= d["difference"] <= d["ci_high"]
        for d in results["differences"]
        if d["difference"] is not None
    )
    with open(first / "results.csv", encoding="utf-8") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == len(cells)
    synonyms = (first / "synonyms.md").read_text()
    top = next(iter(results["synonyms"]["bertag/center+csls"]))
    assert f"| #{top} (" in synonyms and "Word2Vec" in synonyms and "skewness of N_10" in synonyms

    assert_reval_score_agrees(first, cell)


def test_evaluate_random_split_and_options(small_feed: Path, tmp_path: Path) -> None:
    out = tmp_path / "w2v"
    result = runner.invoke(
        app,
        [
            "evaluate",
            str(small_feed),
            "--out",
            str(out),
            "--split",
            "random",
            "--embeddings",
            "word2vec",
            "--recommenders",
            "popular,random",
            "--hubness",
            "raw,center+csls",
            "--seeds",
            "1,2",
            "-r",
            "3",
            "-k",
            "0,2",
            "--limit",
            "120",
            "--bootstrap",
            "200",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    cells = json.loads(result.stdout)
    keys = {(c["split"], c["seed"], c["hubness"], c["recommender"], c["r"], c["k"]) for c in cells}
    assert keys == {
        ("random", seed, method, name, "3", k)
        for seed in (1, 2, "all")
        for method in ("raw", "center+csls")
        for name in ("popular", "random")
        for k in (0, 2)
    }
    pooled = [c for c in cells if c["seed"] == "all"]
    assert all(c["events"] == 2 * 12 for c in pooled)  # two seeds' test sets of 12
    results = json.loads((out / "results.json").read_text())
    assert results["data"]["tweets_kept"] == 120 and results["config"]["splits"] == ["random"]

    result = runner.invoke(app, ["evaluate", str(small_feed), "--out", str(out), "--embeddings", "glove"])
    assert result.exit_code == 2 and "embeddings" in result.output
    # an earlier run's results are replaced only on request, before any work
    result = runner.invoke(app, ["evaluate", str(small_feed), "--out", str(out), "--limit", "120"])
    assert result.exit_code == 2 and "--force" in result.output


def test_evaluate_reruns_every_cell_on_each_core(small_feed: Path, tmp_path: Path) -> None:
    """--cores 1,2,5: the 1-core's cells are the plain run's, each core's cells are computed on
    fewer tweets, and cores.md / core_flips say where the recommenders' order changes."""
    common = ["--embeddings", "word2vec", "--recommenders", "popular,least-popular,random"]
    common += ["--seeds", "1", "-r", "5", "-k", "0,5,10", "--bootstrap", "200", "--fasttext-bucket", "20000"]
    plain, cored = tmp_path / "plain", tmp_path / "cores"
    result = runner.invoke(app, ["evaluate", str(small_feed), "--out", str(plain), *common])
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        app, ["evaluate", str(small_feed), "--out", str(cored), "--cores", "5,1,2", *common]
    )
    assert result.exit_code == 0, result.output
    assert "p-cores 1, 2, 5: the ranking of recommenders flips in" in result.output
    base = json.loads((plain / "results.json").read_text())
    results = json.loads((cored / "results.json").read_text())
    assert results["config"]["cores"] == [1, 2, 5] and base["config"]["cores"] == [1]
    assert {c["core"] for c in base["cells"]} == {1}
    assert [c for c in results["cells"] if c["core"] == 1] == base["cells"]  # the 1-core is the data
    sizes = results["data"]["cores"]
    assert sizes["1"]["tweets"] == results["data"]["tweets_kept"]
    assert sizes["1"]["tweets"] > sizes["2"]["tweets"] > sizes["5"]["tweets"] > 1
    assert sizes["1"]["hashtags"] > sizes["2"]["hashtags"] > sizes["5"]["hashtags"]
    events = {c["core"]: c["events"] for c in results["cells"] if c["seed"] == "all"}
    assert events[1] > events[2] > events[5]
    with open(cored / "results.csv", encoding="utf-8") as fh:
        assert {row["core"] for row in csv.DictReader(fh)} == {"1", "2", "5"}
    for flip in results["core_flips"]:
        assert flip["from_core"] == 1 and flip["to_core"] in (2, 5) and flip["flips"]
        before, after = (flip["ranking"][str(flip[key])] for key in ("from_core", "to_core"))
        for pair in flip["flips"]:
            assert before.index(pair["above"]) < before.index(pair["below"])
            assert after.index(pair["above"]) > after.index(pair["below"])
    report = (cored / "cores.md").read_text()
    assert "| 5 |" in report and ("flip" in report)
    assert not (plain / "cores.md").exists()
    result = runner.invoke(app, ["evaluate", str(small_feed), "--out", str(tmp_path / "x"), "--cores", "0"])
    assert result.exit_code == 2
