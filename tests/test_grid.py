"""The detector benchmark (workers.commands.backtest.grid): every detector at one calibrated
budget on simulated production-rate streams, and the model those streams are drawn from."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from workers.commands.backtest import grid
from workers.commands.backtest.simulation import Scores
from workers.commands.report import write_report

P0 = np.array([0.12, 0.18, 0.70])
MODEL = grid.Model(p0=P0, units=np.array([1, 1, 2, 3, 5, 10]), chance=0.1)


def to_chance(share: float) -> np.ndarray:
    return (1 - share) * P0 + share * np.array([0.0, 0.1, 0.9])


def reworded(share: float) -> np.ndarray:
    return np.array([P0[0] * (1 - share), P0[1] + share * P0[0], P0[2]])


@pytest.fixture(scope="module")
def result() -> dict:
    laws = {"random:1": to_chance(1.0), "random:0.25": to_chance(0.25), "synonyms:1": reworded(1.0)}
    return grid.simulate(MODEL, laws, grid.GridConfig(arl0=2000, reps=60, window=300))


def test_every_detector_keeps_the_budget_it_was_calibrated_to(result: dict) -> None:
    runs = result["in_control_run_length"]
    assert list(runs) == list(grid.DETECTORS)
    assert runs["dummy"] == {"mean": 2000.0, "low": 2000.0, "high": 2000.0}
    for name in ("joint", "exact_cusum", "synonym_cusum", "window_exact", "window_synonym"):
        # 60 run lengths of a roughly geometric law: the mean within ~35% of the budget
        assert 1300 < runs[name]["mean"] < 3000, (name, runs[name])
    # ADWIN cannot alarm as often as that here (its largest delta): it is never above budget
    assert all(runs[n]["mean"] > 1300 for n in ("adwin_exact", "adwin_synonym"))
    assert result["checks"]["in_control_run_length"]["measured"] == runs["joint"]


def test_a_broken_recommender_is_caught_fast_and_named_quality_lost(result: dict) -> None:
    row = {r["drift"]: r for r in result["rows"]}["random:1"]
    joint = row["joint"]
    assert joint["detected"] == 1.0
    assert joint["median_delay_events"] < 50 < row["dummy"]["median_delay_events"]
    assert joint["median_low"] <= joint["median_delay_events"] <= joint["median_high"]
    assert joint["alternatives"]["quality_lost"] >= 57 and joint["isolation_error"] <= 0.05
    assert joint["median_delay_minutes"] == round(joint["median_delay_events"] / 3000 * 60, 1)


def test_a_rewording_is_named_wording_changed_and_escapes_the_synonym_signal(result: dict) -> None:
    row = {r["drift"]: r for r in result["rows"]}["synonyms:1"]
    assert row["expected"] == "wording_changed"
    named = row["joint"]["alternatives"]
    # A false alarm of a quality chart can land in the ~15 events before the wording chart
    # crosses: at ARL0 2,000 about one stream in 200 -- never more than two of these 60.
    assert named["wording_changed"] >= 58 and sum(named.values()) == 60
    # the synonym-aware signal does not move: its detectors find it no sooner than chance does
    assert row["synonym_cusum"]["detected"] < 0.8
    assert result["checks"]["synonyms_1_never_pages"]["ok"] == (named["quality_lost"] == 0)


def test_the_first_alarm_after_the_change_skips_earlier_false_ones() -> None:
    alarms = iter([(3, None), (9, "quality_lost")])
    seen = []

    def next_alarm(begin: int) -> tuple[int, str | None] | None:
        seen.append(begin)
        return next(alarms, None)

    assert grid.first_after(next_alarm, 5) == (9, "quality_lost")
    assert seen == [0, 4]


def test_the_model_takes_each_drifts_effect_not_the_feeds_own_change() -> None:
    n = 8
    t = np.arange(n, dtype=float)
    control, drifted = Scores(n, 1), Scores(n, 1)
    for col in (control, drifted):
        col.units[:] = 2
        col.values["reval_hit_ratio"][:] = 0.5
        col.exact[:] = 0.5
    drifted.exact[4:] = 0.0  # from t = 4 every exact hit is synonym-only
    model, laws = grid.model_of(control, {"synonyms:1": drifted}, {"synonyms:1": 4.0}, t)
    # from the earliest start: (4, 0, 4) units, +0.5 each
    assert model.p0.round(3).tolist() == [0.474, 0.053, 0.474]
    assert model.units.tolist() == [2, 2, 2, 2]
    # the drift's shares over the control's, (0.5, 4.5, 4.5) / (4.5, 0.5, 4.5), applied to p0
    assert laws["synonyms:1"].round(3).tolist() == [0.053, 0.474, 0.474]


def test_the_report_shows_the_benchmark_beside_a_backtest(tmp_path: Path, result: dict) -> None:
    (tmp_path / "detection.json").write_text(json.dumps({"signals": []}))
    (tmp_path / "grid.json").write_text(json.dumps({"feed": "f", "feed_rows": [], "streams": result}))
    page = write_report(tmp_path).read_text(encoding="utf-8")
    assert 'data-plot="grid"' in page
    assert "(h) Detector benchmark" in page and "adwin_synonym" in page
    assert 'isolation_error: <span class="met">met</span>' in page


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--arl0", "50"], "--arl0 is a run length in events (>= 100)"),
        (["--window", "5000"], "--window: 10 to 2000 events"),
        (["--inject", "nonsense:1"], "unknown kind 'nonsense'"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(
    argv: list[str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert grid.main(["feed.jsonl", *argv]) == 2
    err = capsys.readouterr().err
    assert problem in err and err.count("\n") == 1


def test_the_markdown_names_every_detector_and_the_checks(result: dict) -> None:
    text = grid.markdown({"feed": "f.jsonl", "feed_events": 0, "feed_rows": [], "streams": result})
    assert "ARL0 = 2,000 events" in text
    assert all(f"| {name} |" in text for name in grid.DETECTORS)  # the run-length table
    assert "- isolation_error:" in text and "| random:1 |" in text
