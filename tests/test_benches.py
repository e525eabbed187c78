"""The benchmarks still run (a refactor once left bench_scoring calling a method that no
longer existed): each on a tiny workload, checked for its table, not its numbers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_bench_scoring_runs_on_a_tiny_workload(tmp_path: Path) -> None:
    out = tmp_path / "scoring.md"
    workload = ["--vocab", "300", "--dim", "32", "--clusters", "10", "--events", "60", "--naive-events", "5"]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.bench_scoring",
            *workload,
            "--rounds",
            "1",
            "--n-trees",
            "5",
            "--out",
            str(out),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    text = out.read_text()
    assert "| Scorer admit + apply + json.dumps |" in text and "| naive:" in text
