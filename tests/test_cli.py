"""The CLI contracts: `reval thesaurus build`, `reval synonyms`, `reval score`."""

from __future__ import annotations

import gzip
import itertools
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus
from workers.adapters.files.feeds import sample_feed
from workers.adapters.files.store import load_thesaurus
from workers.commands.cli import app

runner = CliRunner()

#: The chance-corrected fields of a summary without a null model (a JSON thesaurus).
NO_CHANCE = {
    **dict.fromkeys(
        ("reval_hit_ratio_corrected", "corrected_ci_low", "corrected_ci_high", "reval_hit_ratio_expected")
    ),
    "corrected_null_reason": "no_null_model",
}


@pytest.fixture(scope="module")
def small_feed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """600 real tweets from the bundled sample plus three broken lines."""
    path = tmp_path_factory.mktemp("feed") / "feed.jsonl"
    with gzip.open(sample_feed(), "rt", encoding="utf-8") as src:
        lines = list(itertools.islice(src, 600))
    lines.insert(10, "{broken json\n")
    lines.insert(20, '{"text": "no id #x"}\n')
    lines.insert(30, '{"id": "9", "text": "bad time #x", "created_at": "never"}\n')
    path.write_text("".join(lines), encoding="utf-8")
    return path


def test_thesaurus_build_and_synonyms(small_feed: Path, tiny_bertweet: Path, tmp_path: Path) -> None:
    out = tmp_path / "th"
    result = runner.invoke(
        app,
        [
            "thesaurus",
            "build",
            str(small_feed),
            "--model",
            str(tiny_bertweet),
            "--out",
            str(out),
            "--batch-size",
            "16",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout[result.stdout.index("{") :])
    assert summary["tweets_read"] == 600
    assert summary["bad_lines"] == 3
    assert summary["bad_lines_by_reason"] == {"not_json": 1, "missing_field": 1, "bad_time": 1}
    assert any(":11: not_json" in line for line in summary["first_bad_lines"])  # 1-based line numbers
    assert summary["tweets_kept"] + sum(summary["dropped"].values()) == 600
    assert summary["hashtags_indexed"] > 20

    thesaurus = load_thesaurus(out)
    assert isinstance(thesaurus, AnnoyThesaurus)
    assert len(thesaurus) == summary["hashtags_indexed"]
    assert thesaurus.metadata.model_id == str(tiny_bertweet)
    tag = thesaurus.hashtags[0]

    result = runner.invoke(
        app, ["synonyms", f"#{tag.upper()}", "nosuchtag", "-t", str(out), "-k", "3", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {tag: thesaurus.neighbours(tag, 3), "nosuchtag": []}


def test_build_reports_missing_feed(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["thesaurus", "build", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2
    assert "not found" in result.output


def test_score_json_contract(tmp_path: Path) -> None:
    thesaurus = tmp_path / "th.json"
    thesaurus.write_text(
        json.dumps({"hockey": ["bowling", "golf", "sport"], "swim": ["dive", "paddle", "sport"]})
    )
    recs = tmp_path / "recs.jsonl"
    recs.write_text(
        "\n".join(
            [
                json.dumps({"tweet_id": "1", "recommended": ["hockey"], "ground_truth": ["sport"]}),
                json.dumps({"tweet_id": "2", "recommended": ["swim", "x"], "ground_truth": ["swim"]}),
                json.dumps({"tweet_id": "3", "recommended": [], "ground_truth": ["a"]}),
                "not json",
            ]
        )
        + "\n"
    )
    events = tmp_path / "events.jsonl"
    result = runner.invoke(
        app,
        ["score", str(recs), "--thesaurus", str(thesaurus), "-k", "0,3", "--json", "--events", str(events)],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["events"] == 3 and payload["unscorable"] == 1
    # A JSON thesaurus has no popularity to weigh a null recommender by: no chance correction.
    # Rank-aware (DCG): event 1's one hit is sport at synonym rank 3, w_syn(3) = 1/log2(5).
    # Precision form: event 1's hockey has sport among its 3 synonyms; event 2's swim is a
    # truth and x is unknown (half its list); at k=0 it is exact precision (0.25 below).
    assert payload["by_k"] == {
        "0": {
            "reval_hit_ratio": 0.5,
            **NO_CHANCE,
            "reval_hit_ratio_ranked": 0.5,
            "reval_hit_ratio_precision": 0.25,
            "reval_reciprocal_rank": 0.5,  # event 2's swim, first in its list, exactly
        },
        "3": {
            "reval_hit_ratio": 1.0,
            **NO_CHANCE,
            "reval_hit_ratio_ranked": pytest.approx((1 / math.log2(5) + 1.0) / 2),
            "reval_hit_ratio_precision": 0.75,
            "reval_reciprocal_rank": 1.0,  # and event 1's hockey, first, reaches sport at k = 3
        },
    }
    assert payload["exact"] == {
        "hit_rate": 0.5,
        "precision": 0.25,
        "recall": 0.5,
        "f1": pytest.approx(1 / 3),
        "hit_ratio": 0.5,
    }
    assert payload["skipped_lines"] == 1
    per_event = [json.loads(line) for line in events.read_text().splitlines()]
    assert [e["scorable"] for e in per_event] == [True, True, False]
    assert per_event[0]["reval_hit_ratio"]["all"] == {"0": 0.0, "3": 1.0}
    assert per_event[1]["reval_reciprocal_rank"]["all"] == {"0": 1.0, "3": 1.0}
    assert per_event[0]["reval_hit_ratio_ranked"]["all"] == {"0": 0.0, "3": pytest.approx(1 / math.log2(5))}

    by_r = runner.invoke(
        app, ["score", str(recs), "--thesaurus", str(thesaurus), "-k", "0,3", "-r", "1,all", "--json"]
    )
    assert json.loads(by_r.stdout)["by_r"]["1"]["by_k"]["3"]["reval_reciprocal_rank"] == 1.0
    table = runner.invoke(
        app, ["score", str(recs), "--thesaurus", str(thesaurus), "-k", "0,3", "-r", "1,all"]
    )
    assert table.exit_code == 0 and "k=3" in table.output and "hit_ratio" in table.output
    assert "#REval precision form" in table.output
    assert "reciprocal rank" in table.output


def test_score_corrects_for_chance_from_the_sums(tmp_path: Path) -> None:
    """A thesaurus with popularity: the summary's corrected score is the kappa of the events'
    sums with its interval, and the table prints it."""
    import numpy as np

    from stream.evaluation.chance import CorrectedSum

    rng = np.random.default_rng(2)
    names = [f"h{i}" for i in range(30)]
    thesaurus = tmp_path / "th"
    AnnoyThesaurus.build(
        names, rng.normal(size=(30, 8)), counts=list(range(30, 0, -1)), depth=5, method="raw"
    ).save(thesaurus)
    events = [
        {
            "tweet_id": str(i),
            "recommended": list(rng.choice(names, 3, replace=False)),
            "ground_truth": [names[i % 30]],
        }
        for i in range(60)
    ]
    recs = tmp_path / "recs.jsonl"
    recs.write_text("".join(json.dumps(e) + "\n" for e in events))
    out = tmp_path / "events.jsonl"
    result = runner.invoke(
        app, ["score", str(recs), "-t", str(thesaurus), "-k", "0,5", "--json", "--events", str(out)]
    )
    assert result.exit_code == 0, result.output
    by_k = json.loads(result.stdout)["by_k"]["5"]
    sums = CorrectedSum()
    for line in out.read_text().splitlines():
        event = json.loads(line)
        sums.update(event["reval_hit_ratio"]["all"]["5"], event["reval_hit_ratio_expected"]["all"]["5"])
    assert by_k["reval_hit_ratio_corrected"] == pytest.approx(sums.get())
    assert by_k["corrected_ci_low"] < by_k["reval_hit_ratio_corrected"] < by_k["corrected_ci_high"]
    table = runner.invoke(app, ["score", str(recs), "-t", str(thesaurus), "-k", "0,5"])
    assert table.exit_code == 0 and "chance-corrected" in table.output
    assert f"{by_k['reval_hit_ratio_corrected']:.4f}" in table.output


def test_score_rejects_bad_k(tmp_path: Path) -> None:
    result = runner.invoke(app, ["score", str(tmp_path / "r.jsonl"), "-t", "x.json", "-k", "a,b"])
    assert result.exit_code == 2 and "whole number" in result.output
