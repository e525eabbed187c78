"""The benchmarks still run (a refactor once left bench_scoring calling a method that no
longer existed): each on a tiny workload, checked for its table, not its numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_bench(module: str, *args: str, out: Path, timeout: float = 300) -> str:
    """Run ``bench.<module>`` with ``args`` writing its report to ``out``; the report."""
    subprocess.run(
        [sys.executable, "-m", f"bench.{module}", *args, "--out", str(out)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=timeout,
    )
    return out.read_text()


def test_bench_scoring_runs_on_a_tiny_workload(tmp_path: Path) -> None:
    workload = ["--vocab", "300", "--dim", "32", "--clusters", "10", "--events", "60", "--naive-events", "5"]
    text = run_bench(
        "bench_scoring", *workload, "--rounds", "1", "--n-trees", "5", out=tmp_path / "scoring.md"
    )
    assert "| Scorer admit + apply + encoding |" in text and "| naive:" in text


GPU_SMOKE = ["--device", "cpu", "--model", "tiny", "--tweets", "256", "--rounds", "2", "--naive-tweets", "32"]
GPU_SMOKE += ["--token-budget", "2048", "--tokenize-workers", "0"]


@pytest.mark.slow
def test_bench_gpu_encoder_part_runs_on_cpu(tmp_path: Path) -> None:
    # The GPU benchmark's encoder part (new path vs naive HF baseline, MFU) on CPU, tiny model.
    text = run_bench("bench_gpu", *GPU_SMOKE, "--no-worker", out=tmp_path / "gpu.md")
    assert "CPU SMOKE RUN (not a GPU result)" in text
    assert "| new: token budget 2048" in text and "| naive HF: fp32, batch 32" in text
    assert "(required >= 0.999)" in text and "### (b)" not in text


@pytest.mark.integration
@pytest.mark.slow
def test_bench_gpu_worker_part_runs_on_cpu(tmp_path: Path) -> None:
    # ... and its embed-worker part: a local Tansu broker, the Redis at 127.0.0.1:6379.
    worker = ["--worker-batch", "64", "--worker-tweets", "64", "--worker-rounds", "1"]
    text = run_bench("bench_gpu", *GPU_SMOKE, *worker, out=tmp_path / "gpu.md", timeout=600)
    assert "### (b) Embed worker end to end" in text
    assert "Every tweet embedded (dropped 0, rejected 0)." in text


@pytest.mark.integration
def test_bench_redis_barrier_runs_on_a_tiny_workload(tmp_path: Path, redis_url: str) -> None:
    workload = ["--tweets", "96", "--dim", "16", "--slice", "0.2", "--rounds", "1", "--calls", "20"]
    text = run_bench("bench_redis_barrier", *workload, "--url", redis_url, out=tmp_path / "barrier.md")
    assert "| cluster 3+3 | barrier: WAIT 1 (cluster default) |" in text
    assert "| single Redis | check only (single-Redis default) |" in text


@pytest.mark.slow
def test_bench_cost_curves_runs_and_plots(tmp_path: Path) -> None:
    workload = ["--sizes", "300,600", "--dim", "32", "--events", "100", "--grid-size", "600", "--trees", "5"]
    text = run_bench("bench_cost_curves", *workload, "--plots", str(tmp_path), out=tmp_path / "curves.md")
    assert "| 600 |" in text and "| largest k | events/s |" in text and "| 100 |" in text
    for png in ("cost_build_vs_vocabulary.png", "cost_scoring_vs_vocabulary.png", "cost_scoring_vs_k.png"):
        assert (tmp_path / png).read_bytes().startswith(b"\x89PNG")


@pytest.mark.integration
def test_profile_score_step_runs_on_a_tiny_workload(tmp_path: Path, redis_url: str) -> None:
    workload = ["--vocab", "300", "--dim", "32", "--clusters", "10", "--events", "300", "--rounds", "1"]
    workload += ["--redis-url", redis_url]
    text = run_bench("profile_score_step", *workload, out=tmp_path / "step.md")
    assert "| dedup claims in Redis (redis-py pipeline + Lua) |" in text
    assert "nan" not in text.lower()  # every part found in the profile under its own file


@pytest.mark.slow
def test_bench_build_memory_compares_two_trees(tmp_path: Path) -> None:
    # The repository against itself as the baseline: the same table, shown identical.
    workload = ["--sizes", "400", "--dim", "16", "--trees", "2", "--rounds", "1", "--queries", "20"]
    text = run_bench("bench_build_memory", *workload, "--baseline", str(REPO), out=tmp_path / "memory.md")
    assert "| 400 | this |" in text and "| 400 | baseline |" in text and "tables identical" in text
    assert "| 400 | this: recall@10 / @100 on 20 random hashtags" in text


@pytest.mark.slow
def test_bench_scorer_setup_compares_two_trees(tmp_path: Path) -> None:
    # The repository against itself as the baseline: the same expectations, shown identical.
    workload = ["--sizes", "3000", "--depth", "20", "--cluster", "100", "--rounds", "2", "--queries", "50"]
    text = run_bench("bench_scorer_setup", *workload, "--baseline", str(REPO), out=tmp_path / "setup.md")
    assert "| 3,000 | this |" in text and "| 3,000 | baseline |" in text
    assert "| 3,000 | baseline / this | median" in text and "| identical |" in text


def test_bench_prepare_compares_two_trees() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_prepare", "--baseline", str(REPO), "--rounds", "1"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "same output: True" in done.stdout and "| this tree |" in done.stdout


def test_bench_prepare_times_the_preparing_processes() -> None:
    args = ["--processes", "0,1", "--rounds", "1", "--limit", "2048", "--batch", "512"]
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_prepare", *args],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "same output for every count: True" in done.stdout and "| 1 |" in done.stdout


def test_bench_isolation_runs_on_a_tiny_workload(tmp_path: Path) -> None:
    args = ["--designs", "exact+wording", "--margins", "4", "--drifts", "random:1"]
    args += ["--arl0", "100", "--reps", "4", "--arl-reps", "4"]
    text = run_bench("bench_isolation", *args, out=tmp_path / "isolation.md")
    assert "| exact+wording | 4 |" in text and "random:1: joint / exact" in text


def test_bench_hijack_ranks_each_probe_among_the_real_hashtags() -> None:
    """The hijack benchmark's scoring (its encoder run takes half a minute: not here)."""
    import numpy as np

    from bench.bench_hijack import auc, probes, report

    scores = {"recent, effect": {"real1": 0.9, "real2": 0.5, "real3": 0.1, "h": 0.7, "g": 0.3, "s": 0.0}}
    kinds = {"h": ("hijacked", 20), "g": ("gradual", 20), "s": ("stable", 20)}
    found = report(scores, kinds)["recent, effect"]
    assert isinstance(found, dict)
    cell = found["sizes"]["20"]
    assert cell["ranks"] == {"hijacked": [2], "gradual": [3], "stable": [4]}
    assert found["compared"] == 4 and found["top_real"] == ["real1", "real2", "real3"]
    assert cell["hijacked_above_every_stable"] == 1 and cell["auc_hijacked"] == 1.0
    assert auc([0.2], [0.2, 0.1]) == 0.75
    made = probes({"a": list(range(50)), "b": list(range(50, 100))}, [20], 1, np.random.default_rng(0))
    by_kind = {kind: (before, after) for _, kind, _, before, after in made}
    assert set(by_kind["stable"][0]).isdisjoint(by_kind["stable"][1])
    assert all(j < 50 for j in by_kind["hijacked"][0]) and all(j >= 50 for j in by_kind["hijacked"][1])


def test_hashtag_senses_and_their_partners_need_no_crisis_of_the_sample_feed() -> None:
    """On a feed without CrisisLexT26's crises the senses are its own hashtags (each with the
    tweets that carry it alone); a hijack never goes to a hashtag used in the same tweets (one
    sense, two names); sizes no sense has the tweets for are skipped, not a crash."""
    import numpy as np

    from bench.bench_hijack import apart_partners, hashtag_senses, probes
    from stream.intake.cleaning import Prepared

    def tweet(*tags: str) -> Prepared:
        return Prepared(None, "t", tags, ())  # type: ignore[arg-type]  # the senses read the hashtags only

    kept = [tweet("floods", "rain")] * 30 + [tweet("floods")] * 50 + [tweet("rain")] * 45
    kept += [tweet("quake")] * 60 + [tweet("rare")] * 5
    senses = hashtag_senses(kept, least=20)
    assert {h: len(rows) for h, rows in senses.items()} == {"quake": 60, "floods": 50, "rain": 45}
    partners = apart_partners(kept, list(senses))
    assert partners("floods", list(senses)) == ["quake"] and partners("quake", list(senses)) == [
        "floods",
        "rain",
    ]
    made = probes(senses, [20, 100], 3, np.random.default_rng(0), partners)
    assert {size for _, _, size, _, _ in made} == {20}  # no sense has 100 tweets
    for name, kind, _, before, after in made:
        first, second = name.split("__")[1:]
        assert all(kept[j].hashtags == (first,) for j in before), name
        if kind == "hijacked":
            assert {first, second} in ({"floods", "quake"}, {"rain", "quake"}), name
            assert all(kept[j].hashtags == (second,) for j in after), name


@pytest.mark.slow
def test_bench_hijack_runs_on_a_feed_without_the_crises(tmp_path: Path) -> None:
    feed = tmp_path / "feed.jsonl.gz"
    shape = ["--tweets", "2000", "--days", "10", "--topics", "8", "--seed", "1"]
    subprocess.run(
        [sys.executable, "-m", "workers.dev.synthetic", str(feed), *shape],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=120,
    )
    text = run_bench(
        "bench_hijack", "--feed", str(feed), "--sizes", "20", "--per-kind", "2", out=tmp_path / "h.md"
    )
    assert "hashtags used as the probes' senses" in text
    assert "| 1 | recent, test |" in text


@pytest.mark.slow
def test_bench_tokenizer_times_the_command_both_ways() -> None:
    """`--command`: fresh `reval tokenize` processes, fast and --slow, the same ids from both."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_tokenizer", "--command", "--limit", "40", "--repeat", "1"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    result = json.loads(done.stdout)
    assert result["tweets"] == 40 and result["identical"] is True, result
    assert len(result["fast_wall_s"]) == len(result["slow_wall_s"]) == 1, result
    assert result["cpu_x_median"] > 0 and result["wall_x_best"] > 0, result
