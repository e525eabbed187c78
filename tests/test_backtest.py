"""`reval backtest`: the alert rules replayed over event time, drifts, and the command
end to end on the bundled feed (tiny real BERTweet-shaped encoder)."""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from stream.monitoring import backtest as bt
from stream.monitoring import drift_injection as di
from stream.monitoring.alert_params import rule_params
from tests.test_deploy import require_binary
from tests.test_prometheus import Prometheus
from workers.adapters.files.feeds import sample_feed
from workers.commands.backtest import EMBEDDING_SIGNAL, rules_for
from workers.commands.cli import app

runner = CliRunner()
DAY = 86_400.0
STEP = 30.0  # one event every 30 s: 120 in the 1 h quality window, above min_events (50)


def steady(days: float = 12.0) -> bt.Series:
    """A recommender that never changes: #REval 0.5 against a chance expectation of 0.3
    (corrected: 0.2 / 0.7), exact 0.4, 10 recommended hashtags of which none unknown, #REval's
    precision form 0.6 and 0.2 in turn (mean 0.4, variance 0.04)."""
    t = np.arange(0.0, days * DAY, STEP)
    n = len(t)
    precision = np.where(np.arange(n) % 2 == 0, 0.6, 0.2)
    return bt.Series(
        t, np.full(n, 0.5), np.full(n, 0.3), np.full(n, 0.4), np.full(n, 10.0), np.zeros(n), precision
    )


def drifted(start: float, **after: float) -> bt.Series:
    """:func:`steady` with the named columns set to new values from ``start`` on."""
    base = steady()
    columns = {
        name: getattr(base, name).copy()
        for name in ("reval", "expected", "exact", "recommended", "unknown", "precision")
    }
    for name, value in after.items():
        columns[name][base.t >= start] = value
    return bt.Series(base.t, **columns)


@pytest.fixture(scope="module")
def rules() -> bt.Rules:
    """The deployed rules (deploy/prometheus defaults) at production speed."""
    return rules_for(rule_params(), 1.0)[0]


def delays(series: bt.Series, rules: bt.Rules, start: float) -> dict[str, float | None]:
    control = steady()
    at = np.arange(control.t[0], control.t[-1], rules.step)
    return bt.detect(bt.signals(series, at, rules), bt.signals(control, at, rules), at, start)


def test_the_steady_run_raises_no_alarm(rules: bt.Rules) -> None:
    control = steady()
    at = np.arange(control.t[0], control.t[-1], rules.step)
    assert {name: bt.episodes(f) for name, f in bt.signals(control, at, rules).items()} == dict.fromkeys(
        bt.SIGNALS, 0
    )


def reference_llr(m0: float, v0: float, p1: float, x: float, n: int, shift: float) -> float:
    """The #REval alert's log-likelihood ratio, written out for a window of ``n`` events of
    which a share ``x`` has the precision form ``p1`` and the rest the baseline's mean ``m0``,
    against a baseline of mean ``m0`` and variance ``v0`` (stream.monitoring.backtest.skill_loss, docstring)."""
    total = n * ((1 - x) * m0 + x * p1)
    delta = shift * m0
    return delta / v0 * ((m0 - delta / 2) * n - total)


def test_a_quality_drop_fires_when_the_statistics_cross_then_holds(rules: bt.Rules) -> None:
    start = 10 * DAY
    found = delays(drifted(start, reval=0.2, exact=0.1, precision=0.1), rules, start)
    # #REval: the sequential test crosses log(1 / alpha) once a share x of the 1 h window
    # (120 events) has drifted, then the rule holds for skill_loss_for (15 min).
    n = int(rules.quality_window / STEP)
    shares = np.linspace(0.0, 1.0, 100_001)
    llr = np.array([reference_llr(0.4, 0.04, 0.1, x, n, rules.skill_loss_fraction) for x in shares])
    x = shares[np.argmax(llr > rules.skill_loss_bound)]
    expected = rules.quality_window * x + rules.skill_loss_for
    assert found["reval_drop"] is not None and abs(found["reval_drop"] - expected) <= 2 * STEP
    # exact: the 1 h mean of v0 before / v1 after falls below 0.8 v0 once a share
    # x = 0.2 v0 / (v0 - v1) of the window has drifted, then holds for quality_for.
    v0, v1 = 0.4, 0.1
    expected = rules.quality_window * 0.2 * v0 / (v0 - v1) + rules.quality_for
    delay = found["exact_drop"]
    # (events come every STEP seconds: the crossing is exact to one event)
    assert delay is not None and abs(delay - expected) <= 2 * STEP, (delay, expected)
    assert found["semantic_gap"] is None  # #REval fell too: not a move to synonyms
    assert found["corrected_at_chance"] is not None  # 0.2 against an expectation of 0.3: below chance
    assert found["unknown_rising"] is None


def test_a_small_drop_within_the_noise_is_no_alarm(rules: bt.Rules) -> None:
    """A loss of a tenth of the precision form: far below the tested half, the statistic
    never crosses; the fixed-fraction rule on exact match fires on a 25% drop."""
    start = 10 * DAY
    found = delays(drifted(start, precision=0.36, exact=0.3), rules, start)
    assert found["reval_drop"] is None
    assert found["exact_drop"] is not None


def test_synonyms_open_the_semantic_gap_and_leave_reval_quiet(rules: bt.Rules) -> None:
    start = 10 * DAY
    found = delays(drifted(start, exact=0.1), rules, start)
    assert found["reval_drop"] is None
    assert found["exact_drop"] is not None
    gap = found["semantic_gap"]
    assert gap is not None and gap >= rules.gap_for


def test_at_chance_and_unknown_hashtags(rules: bt.Rules) -> None:
    start = 10 * DAY
    found = delays(drifted(start, reval=0.25), rules, start)
    chance = found["corrected_at_chance"]
    # The window's kappa, (0.2 (1 - x) - 0.05 x) / 0.7, is <= 0 once x >= 0.8, held chance_for.
    expected = rules.quality_window * 0.8 + rules.chance_for
    assert chance is not None and abs(chance - expected) <= 2 * STEP, (chance, expected)
    found = delays(drifted(start, unknown=5.0), rules, start)
    assert found["unknown_rising"] is not None and found["unknown_rising"] >= rules.unknown_for
    assert {k: v for k, v in found.items() if k != "unknown_rising"} == dict.fromkeys(
        set(bt.SIGNALS) - {"unknown_rising"}
    )


def test_operating_curves_trade_delay_for_false_alarms(rules: bt.Rules) -> None:
    start = 10 * DAY
    # precision form 0.4 -> 0.285: the full window's ratio is 0.2 / 0.04 x (0.3 - 0.285) x 120
    # = 9.0, past log(1 / alpha) for alpha >= 0.001, short of it for 1e-4 and 1e-6.
    control, drift = steady(), drifted(start, reval=0.2, exact=0.1, precision=0.285)
    at = np.arange(control.t[0], control.t[-1], rules.step)  # instants every 15 s: 69,000
    curves = bt.operating_curves(control, {"d": drift}, {"d": start}, at, rules, days=12.0)
    assert set(curves) == set(bt.SIGNALS)
    points = curves["reval_drop"]["points"]
    deployed = [p for p in points if p["deployed"]]
    assert len(deployed) == 1 and deployed[0]["value"] == pytest.approx(0.01)
    assert deployed[0]["delays"]["d"] == pytest.approx(delays(drift, rules, start)["reval_drop"], abs=0.1)
    assert all(p["false_alarms_per_day"] == 0 for p in points)  # a steady control never alarms
    # A smaller false-alarm probability is a higher bound: never an earlier alarm (None: never).
    by_alpha = sorted(points, key=lambda p: -p["value"])
    found = [np.inf if p["delays"]["d"] is None else p["delays"]["d"] for p in by_alpha]
    assert found == sorted(found) and found[0] < np.inf and found[-1] == np.inf
    exact = {p["value"]: p["delays"]["d"] for p in curves["exact_drop"]["points"]}
    early, late = exact[0.05], exact[0.5]
    assert early is not None and late is not None and early < late  # a 5% drop is crossed first


def test_too_few_events_never_alert(rules: bt.Rules) -> None:
    full = steady()
    sparse = bt.Series(**{name: getattr(full, name)[::200] for name in bt.Series.__dataclass_fields__})
    sparse.reval[sparse.t >= 10 * DAY] = 0.0
    sparse.precision[sparse.t >= 10 * DAY] = 0.0
    at = np.arange(sparse.t[0], sparse.t[-1], rules.step)
    assert bt.episodes(bt.signals(sparse, at, rules)["reval_drop"]) == 0  # 1.2 events an hour < 50


def test_a_baseline_of_a_few_events_is_no_baseline(rules: bt.Rules) -> None:
    """As deploy/prometheus's unit test of the alert: 5 events at 0.8 a day ago (a lucky mean,
    a variance of 0), then steady's 0.4 -- with a baseline from those 5 the statistic divides
    by the variance's floor and pages; below min_events events a window there is no baseline."""
    full = steady(2.0)
    keep = (full.t >= DAY) | ((full.t >= 4_800) & (full.t < 4_950))  # 5 events in hour 2
    young = bt.Series(**{name: getattr(full, name)[keep].copy() for name in bt.Series.__dataclass_fields__})
    young.precision[young.t < DAY] = 0.8
    at = np.array([DAY + 8_400.0])  # its window (1h20m, 2h20m] a day ago holds the 5
    qw, offsets, shift = rules.quality_window, rules.baseline_offsets, rules.skill_loss_fraction
    assert bt.skill_loss(young.t, young.precision, at, qw, offsets, shift, 1)[0] > 1e6
    assert np.isnan(bt.skill_loss(young.t, young.precision, at, qw, offsets, shift, rules.min_events)[0])
    assert not bt.signals(young, at, rules)["reval_drop"].any()


def test_drifts_change_lists_as_described() -> None:
    rng = np.random.default_rng(3)
    recs = ["a", "b", "c", "d"]
    random = di.inject("random", 0.5, recs, rng, vocabulary=["x", "y", "z"])
    assert (
        len(random) == 4 and len(set(random) - set(recs)) == 2 and set(random) <= set(recs) | {"x", "y", "z"}
    )
    known = {"a", "b", "c", "d", "aa"}
    assert di.inject("vocab", 1.0, recs, rng, known=known.__contains__) == ["a_2", "bb", "cc", "dd"]
    table = {"a": ["b", "e"], "b": ["c"], "e": ["a"]}
    assert di.inject("synonyms", 1.0, ["a"], rng, synonym=lambda h, taken: di.mutual_synonym(
        h, taken, lambda x: table.get(x, []))) == ["e"]  # fmt: skip
    with pytest.raises(ValueError, match="whole lists"):
        di.inject("stale", 1.0, recs, rng)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("random", "expected KIND:AMOUNT"),
        ("drop:0.5", "unknown kind"),
        ("random:0", "fraction must be in"),
        ("stale:-3", "positive number of days"),
        ("swap:popular", "least-popular"),
        ("vocab:0.5@yesterday", "not an ISO 8601"),
    ],
)
def test_bad_injections_are_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        di.parse_injection(text)


ARGS = [
    "--recommender",
    "popular",
    "--limit",
    "3000",
    "--refit-days",
    "3",
    "--inject",
    "swap:least-popular",
    "--inject",
    "vocab:1",
    # 2,100 events over 192 days: the default 50 events per window would rarely be met.
    "--set",
    "min_events=10",
]


@pytest.fixture(scope="module")
def backtest_run(
    tiny_bertweet: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, list[str]]:
    """One backtest of the bundled feed, with its backfill: (out, backfill dir, arguments)."""
    root = tmp_path_factory.mktemp("backtest")
    out, blocks = root / "bt", root / "blocks"
    args = ["backtest", str(sample_feed()), "--out", str(out), "--model", str(tiny_bertweet), *ARGS]
    result = runner.invoke(app, [*args, "--backfill", str(blocks), "--backfill-interval", "1h"])
    assert result.exit_code == 0, result.output
    assert "TSDB blocks" in result.output
    return out, blocks, args


@pytest.mark.slow
def test_backtest_end_to_end(backtest_run: tuple[Path, Path, list[str]], tmp_path: Path) -> None:
    out, _, args = backtest_run
    detection = json.loads((out / "detection.json").read_text())
    rows = detection["signals"]
    assert {(r["drift"], r["signal"]) for r in rows} == {
        (d, s) for d in ("swap:least-popular", "vocab:1") for s in [*bt.SIGNALS, EMBEDDING_SIGNAL]
    }
    # The embedding test ran at the refits, with its own calibration beside it.
    embedding = detection["embedding_drift"]
    assert embedding["tests"] and all(0 < t["p_value"] <= 1 for t in embedding["tests"])
    assert embedding["calibration_alarm_rate"] is not None
    assert all({"signal", "drift", "delay_s", "false_alarms_per_day"} <= set(r) for r in rows)
    by = {(r["drift"], r["signal"]): r for r in rows}
    # Every recommended hashtag respelled: the unknown share jumps from 0 to 1.
    assert by["vocab:1", "unknown_rising"]["delay_s"] is not None
    assert by["vocab:1", "unknown_rising"]["false_alarms_per_day"] == 0
    assert detection["effects"]["vocab:1"]["unknown_share_after"] == {"control": 0.0, "drifted": 1.0}
    # ... and no respelled hashtag has a synonym: the precision form the #REval alert tests is 0.
    assert detection["effects"]["vocab:1"]["precision_after"]["drifted"] == 0.0
    # The canary recommends what nobody uses: exact match collapses.
    swap = detection["effects"]["swap:least-popular"]["exact_after"]
    assert swap["drifted"] < swap["control"] / 2
    assert by["swap:least-popular", "exact_drop"]["delay_s"] is not None
    assert detection["time_scale"] >= 1 and detection["scored_events"] > 500
    # Popularity slices: every scored event counts in at least one; respelled lists hit nothing.
    slices = detection["slices"]
    assert list(slices) == ["head", "torso", "tail", "novel"]
    assert sum(s["events"] for s in slices.values()) >= detection["scored_events"]
    assert slices["head"]["control"] > slices["novel"]["control"]
    assert all(s["drifts"]["vocab:1"] in (0.0, None) for s in slices.values())
    assert "| vocab:1 |" in (out / "detection.md").read_text()
    # The change detector: one diagnosis row per drift, every chart at the same ARL0.
    diagnosis = {r["drift"]: r for r in detection["diagnosis"]}
    assert set(diagnosis) == {"swap:least-popular", "vocab:1"}
    keys = {"drift", "arl0_events", "alternative", "delay_events", "delay_s"}
    keys |= {"exact_cusum_delay_events", "synonym_cusum_delay_events"}
    assert all(keys <= set(r) for r in diagnosis.values())
    assert all(
        r["arl0_events"] == detection["detector"]["arl0_events"] == 100_000 for r in diagnosis.values()
    )
    # Every hashtag respelled: every unit a miss -- quality lost, as soon as exact match alone sees it.
    vocab = diagnosis["vocab:1"]
    assert vocab["alternative"] == "quality_lost" and vocab["delay_events"] is not None
    assert vocab["delay_events"] <= vocab["exact_cusum_delay_events"] <= vocab["synonym_cusum_delay_events"]
    # Against the counterfactual (the control run around each event) the respelling is quality
    # lost too, and the control against itself is what the budget is about.
    assert vocab["counterfactual_alternative"] == "quality_lost"
    assert vocab["counterfactual_delay_events"] is not None
    assert vocab["counterfactual_delay_events"] <= vocab["counterfactual_synonym_cusum_delay_events"]
    assert detection["detector"]["counterfactual"]["half_window_events"] == 50
    # The live detector (as the score workers run it) on the same reference: the same
    # thresholds as the backtest's charts, and the respelling is quality lost there too.
    live = detection["detector"]["live"]
    assert live["thresholds"] == {
        name: h for name, h in detection["detector"]["thresholds"].items() if name not in ("exact", "synonym")
    }
    assert vocab["live_alternative"] == "quality_lost" and vocab["live_delay_events"] is not None
    assert isinstance(detection["detector"]["counterfactual"]["control_false_alarms"], int)
    assert "## Change detector" in (out / "detection.md").read_text()
    series = json.loads((out / "series.json").read_text())
    assert len(series["t"]) == len(series["control"]["reval"]) == len(series["drifts"]["vocab:1"]["exact"])
    # reval report: the page of this run, and a clear error for a directory without one.
    shown = runner.invoke(app, ["report", str(out)])
    assert shown.exit_code == 0, shown.output
    page = (out / "report.html").read_text()
    assert page.count('<figure class="plot"') >= 3 and "no slices in this run" not in page
    assert "(g) Change detector" in page and "Against the counterfactual" in page  # both tables
    missing = runner.invoke(app, ["report", str(tmp_path)])
    assert missing.exit_code == 2 and "detection.json" in missing.output
    # A second run into the same directory needs --force; a foreign directory is refused.
    again = runner.invoke(app, args)
    assert again.exit_code == 2 and "--force" in again.output
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    foreign = runner.invoke(app, [*args[:2], "--out", str(tmp_path / "mine"), *args[4:]])
    assert foreign.exit_code == 2 and "notes.txt" in foreign.output


@pytest.mark.integration
def test_backfill_lands_in_prometheus_at_event_time(
    backtest_run: tuple[Path, Path, list[str]], tmp_path: Path
) -> None:
    """A real Prometheus started on the blocks answers for the feed's own dates."""
    out, blocks, _ = backtest_run
    detection = json.loads((out / "detection.json").read_text())
    info = detection["backfill"]
    assert info["blocks"] and info["samples"] > 0
    data = tmp_path / "data"
    shutil.copytree(blocks, data)
    prometheus = Prometheus(
        require_binary("prometheus"),
        tmp_path,
        "global:\n  scrape_interval: 15s\n",
        data=data,
        retention="100y",
    )
    try:
        count = 'reval_hit_ratio_count{recommender="popular", k="10", r="10", job="reval-score"}'

        def at(expr: str, when: float) -> float:
            result = prometheus.api("query", query=expr, time=f"{when:.3f}")["result"]
            assert len(result) == 1, (expr, when, result)
            return float(result[0]["value"][1])

        end = datetime.fromisoformat(info["to"]).timestamp()
        assert at(count, end) == detection["scored_events"]
        # At the injection (2012-13: years before now), the count is the events before it.
        injected = datetime.fromisoformat(detection["effects"]["vocab:1"]["injected_at"]).timestamp()
        before = detection["scored_events"] - detection["effects"]["vocab:1"]["events_after"]
        hour = info["interval_s"]
        grid = injected - injected % hour
        assert at(count, grid) <= before <= at(count, grid + hour)
        assert 0 < at(count, grid) < detection["scored_events"]
        unknown = 'reval_recommended_unknown_hashtags_total{{recommender="{}"}}'
        assert at(unknown.format("popular"), end) == 0
        recommended = 'reval_recommended_hashtags_total{{recommender="{}"}}'
        # Before the injection the drifted run is the control (nothing unknown); from it on,
        # every recommended hashtag is unknown: the unknown total is what was recommended since.
        drifted = "popular+vocab:1"
        since = [
            at(recommended.format(drifted), end) - at(recommended.format(drifted), t)
            for t in (grid, grid + hour)
        ]
        assert since[1] <= at(unknown.format(drifted), end) <= since[0]
        assert since[0] > 0
    finally:
        prometheus.stop()


def test_backtest_refuses_bad_options(tmp_path: Path) -> None:
    feed = str(sample_feed())
    for extra, message in (
        (["--inject", "random:7"], "fraction must be in"),
        (["--time-scale", "fast"], "--time-scale"),
        (["--set", "quality_window=2h"], "quality_window"),
        (["--recommender", "oracle"], "oracle"),
        (["--warmup", "1.5"], "warmup"),
    ):
        result = runner.invoke(app, ["backtest", feed, "--out", str(tmp_path / "x"), *extra])
        assert result.exit_code == 2 and message in result.output, (extra, result.output)
        assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_power_measures_what_each_signal_learns_per_event(
    tiny_bertweet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m workers.commands.backtest.power`: the per-event information of each signal
    under each drift, then the deployed rules' delays, on the bundled feed."""
    from workers.commands.backtest import power

    feed = str(sample_feed())
    argv = [feed, "--model", str(tiny_bertweet), "--ks", "5", "--inject", "synonyms:1", "--limit", "3000"]
    assert power.main(argv) == 0
    rows = {}
    for line in capsys.readouterr().out.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 8 and cells[0] == "5":
            rows[cells[2]] = float(cells[7])
    assert set(rows) == {
        "exact",
        "reval",
        "excess",
        "excess_weighted",
        "precision",
        "excess and precision, jointly",
    }
    # Every recommended hashtag swapped for a synonym: exact match learns much per event,
    # #REval next to nothing, and the joint reading at least what each part learns.
    assert rows["exact"] > 0.5 and rows["reval"] < 0.01
    assert rows["excess and precision, jointly"] >= max(rows["excess"], rows["precision"]) - 1e-9
    assert power.main([feed, "--ks", "five"]) == 2
    assert "'five' is not a whole number" in capsys.readouterr().err
