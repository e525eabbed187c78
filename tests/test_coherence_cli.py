"""`reval thesaurus coherence` and `reval audit simulate` end to end: the packaged MiniLM
(real transformer code, token embeddings for BERTScore), a thesaurus built by `reval
thesaurus build` from part of the bundled feed, the exact JSON contracts."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workers.adapters.encoding.encoder import Encoder
from workers.adapters.files.feeds import sample_feed

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow]


def reval(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.commands.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The first 1,500 tweets with hashtags of the sample feed, and a MiniLM thesaurus of them."""
    root = tmp_path_factory.mktemp("coherence")
    feed = root / "feed.jsonl"
    with gzip.open(sample_feed(), "rt", encoding="utf-8") as src, feed.open("w") as out:
        kept = 0
        for line in src:
            if "#" in json.loads(line)["text"]:
                out.write(line)
                kept += 1
                if kept == 1500:
                    break
    done = reval("thesaurus", "build", str(feed), "--model", "minilm", "--out", str(root / "th"))
    assert done.returncode == 0, done.stderr
    return feed, root / "th"


def test_token_embeddings_are_unit_rows_without_special_tokens() -> None:
    encoder = Encoder("minilm", dtype="float32")
    texts = ["flood water rising in the river", "", "quake"]
    tokens = encoder.encode_tokens(texts)
    ids = encoder.tokenize(texts)
    special = set(encoder.tokenizer.all_special_ids)
    for got, row in zip(tokens, ids, strict=True):
        assert got.shape == (sum(1 for t in row if t not in special), 384)
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert tokens[1].shape == (0, 384)
    # batching does not change a text's tokens
    alone = encoder.encode_tokens(texts[:1], batch_size=1)[0]
    assert np.allclose(alone, tokens[0], atol=1e-5)


@pytest.mark.timeout(900)
def test_coherence_json_contract_and_order(built: tuple[Path, Path]) -> None:
    feed, thesaurus = built
    args = ["thesaurus", "coherence", str(feed), "--thesaurus", str(thesaurus), "-k", "5"]
    done = reval(*args, "--min-tweets", "3", "--sample", "40", "--seed", "2", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result["metrics"]) == {"tfidf", "bertscore"}
    for metric in result["metrics"].values():
        assert {"synonyms", "random", "lift", "lift_ci_low", "lift_ci_high"} <= set(metric)
        assert metric["lift"] == pytest.approx(metric["synonyms"] - metric["random"])
        assert metric["lift_ci_low"] <= metric["lift"] <= metric["lift_ci_high"]
    rows = result["hashtags"]
    assert 0 < len(rows) <= 40
    values = [r["bertscore"]["synonyms"] for r in rows if r["bertscore"]["synonyms"] is not None]
    assert values == sorted(values)  # least coherent first
    assert all(0 < len(r["synonyms"]) <= 5 and len(r["random"]) == len(r["synonyms"]) for r in rows)
    # the same seed gives the same numbers
    again = json.loads(reval(*args, "--min-tweets", "3", "--sample", "40", "--seed", "2", "--json").stdout)
    assert again["metrics"] == result["metrics"]


def test_coherence_usage_errors(built: tuple[Path, Path], tmp_path: Path) -> None:
    feed, thesaurus = built
    done = reval("thesaurus", "coherence", str(feed), "--thesaurus", str(thesaurus), "--min-tweets", "1")
    assert done.returncode == 2 and "--min-tweets must be at least 2" in done.stderr
    done = reval("thesaurus", "coherence", str(tmp_path / "none.jsonl"), "--thesaurus", str(thesaurus))
    assert done.returncode == 2 and "none.jsonl" in done.stderr
    done = reval("thesaurus", "coherence", str(feed), "--thesaurus", str(thesaurus), "--min-tweets", "500",
                 "--per-hashtag", "500")  # fmt: skip
    assert done.returncode == 1 and "no hashtag to score" in done.stderr


@pytest.mark.timeout(600)
def test_simulate_json_contract_and_the_papers_finding(built: tuple[Path, Path]) -> None:
    _, thesaurus = built
    done = reval("audit", "simulate", "--thesaurus", str(thesaurus), "--items", "300", "--ballots", "5",
                 "--alpha", "0.5", "--runs", "5", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result) == {"budget", "adaptive", "uniform"}
    assert set(result["adaptive"]) == set(result["uniform"]) == {"tau_w", "rho_w"}
    assert result["budget"] == 10 * (300 + 150 + 75 + 38 + 19)
    assert result["adaptive"]["tau_w"] > result["uniform"]["tau_w"]
    bad = reval("audit", "simulate", "--thesaurus", str(thesaurus), "--alpha", "0.9")
    assert bad.returncode == 2 and "alpha=0.9 is outside 001's range" in bad.stderr
