"""What ``reval backtest`` found: each alert signal evaluated over the control and the
drifted runs as Prometheus evaluates it (:mod:`stream.monitoring.backtest`), detection delays, false
alarms, effects, operating curves, slices, k-curves and the series for plots."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from stream.evaluation.chance import CorrectedSum
from stream.evaluation.experiment import ProgressFactory, no_progress
from stream.evaluation.slices import SLICES
from stream.monitoring import backtest as bt
from stream.monitoring.alert_params import rule_params
from workers.commands.backtest.detector import diagnose
from workers.commands.backtest.simulation import (
    DAY,
    EMBEDDING_ALPHA,
    EMBEDDING_SIGNAL,
    BacktestConfig,
    Feed,
    Scores,
    Walk,
    iso,
    load_feed,
    rules_for,
    scaled_rules,
)


@dataclass
class Backtest:
    """What one backtest found (what :func:`write_outputs` writes)."""

    config: BacktestConfig
    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    series: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    #: Per-event scores in event-time order: the control run and each drifted one (backfill).
    t_events: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    scores: dict[str, Scores] = field(default_factory=dict)
    ks: tuple[int, ...] = ()


def run_backtest(
    feeds: Sequence[str | Path], config: BacktestConfig, *, progress: ProgressFactory = no_progress
) -> Backtest:
    """Replay ``feeds`` with ``config``; see the package docstring."""
    started = time.perf_counter()
    timings: dict[str, float] = {}
    injections = config.parsed()
    params = rule_params(config.rules_profile, list(config.rules_set))
    _, k, r_text = rules_for(params, 1.0)
    feed = load_feed(feeds, config, injections, progress, timings)
    walk = Walk(feed, config, injections, k, int(r_text))
    walk.run(progress, timings)
    control, t_events = walk.control, feed.t_events
    scaled = scaled_rules(params, feed, control.reval, config.time_scale)
    rules, at, scale, scored = scaled.rules, scaled.at, scaled.scale, scaled.scored
    found = _Detections.of(walk, feed, rules, at)
    curves = bt.operating_curves(
        control.series(t_events),
        {label: col.series(t_events) for label, col in walk.runs.items()},
        feed.starts,
        at,
        rules,
        found.days,
    )
    timings["total"] = round(time.perf_counter() - started, 2)
    summary = {
        **_run_summary(feeds, config, feed, walk, scale, rules, scored),
        "instants_drop_rules_evaluable": round(float(found.can_fire.mean()), 4),
        "instants_with_enough_events": round(
            float(bt.enough_events(control.series(t_events), at, rules).mean()), 4
        ),
        "model_id": feed.model_id,
        "false_alarm_episodes": found.false_alarms,
        "effects": found.effects,
        "goal": goal(found.rows),
        "goal_matched": matched_goal(found.rows, curves),
        # per signal, detection delay against false alarms per day as its threshold sweeps
        "curves": curves,
        "slices": _slices(t_events, control, walk.runs, feed.starts),
        "embedding_drift": _embedding_summary(walk.embedding_tests, found.embedding_alarms),
        "k_curve": _k_curves(walk.ks, t_events, rules.quality_window, control, walk.runs, feed.starts),
        "thesaurus": {
            "refits": walk.health,
            "movers": [m.to_dict() for m in walk.movers],
        },
        # the change detector (stream.monitoring.cusum) at the budget config.arl0: "detector", "diagnosis"
        **diagnose(control, walk.runs, feed.starts, t_events, config.arl0),
    }
    series = _series(at, t_events, rules, control, walk.runs, found.control_firing)
    scores = {"": control, **walk.runs}
    return Backtest(config, summary, found.rows, series, timings, t_events, scores, walk.ks)


def _run_summary(
    feeds: Sequence[str | Path],
    config: BacktestConfig,
    feed: Feed,
    walk: Walk,
    scale: float,
    rules: bt.Rules,
    scored: int,
) -> dict[str, Any]:
    """What was run: the feed, the recommender, the alert and its rules."""
    return {
        "feeds": [str(f) for f in feeds],
        "recommender": config.recommender,
        "alert_k": walk.k,
        "alert_r": walk.r,
        "time_scale": round(scale, 3),
        "rules": {key: (list(v) if isinstance(v, tuple) else v) for key, v in asdict(rules).items()},
        "rules_profile": config.rules_profile,
        "rules_set": list(config.rules_set),
        "period": {
            "first_event": iso(feed.first),
            "last_event": iso(feed.last),
            "days": round((feed.last - feed.first) / DAY, 2),
        },
        "warmup_until": iso(feed.warm_end),
        "tweets": len(feed.prepared),
        "events": len(feed.events),
        "scored_events": scored,
        "refits": len(feed.points),
    }


@dataclass
class _Detections:
    """Every signal over the control run and each drifted one: the rows of ``detection.json``
    (a delay per drift and signal), the control's false alarms, each drift's effects."""

    rows: list[dict[str, Any]]
    effects: dict[str, dict[str, Any]]
    false_alarms: dict[str, int]
    control_firing: dict[str, npt.NDArray[np.bool_]]
    can_fire: npt.NDArray[np.bool_]
    embedding_alarms: int
    days: float

    @classmethod
    def of(cls, walk: Walk, feed: Feed, rules: bt.Rules, at: npt.NDArray[np.float64]) -> _Detections:
        control, t_events = walk.control, feed.t_events
        control_firing = bt.signals(control.series(t_events), at, rules)
        found = cls(
            rows=[],
            effects={},
            false_alarms={name: bt.episodes(f) for name, f in control_firing.items()},
            control_firing=control_firing,
            can_fire=bt.evaluable(control.series(t_events), at, rules),
            embedding_alarms=sum(1 for e in walk.embedding_tests if e["p_value"] <= EMBEDDING_ALPHA),
            days=(feed.last - feed.first) / DAY,
        )
        for inj in walk.injections:
            start, drifted = feed.starts[inj.label], walk.runs[inj.label]
            delays = bt.detect(
                bt.signals(drifted.series(t_events), at, rules), control_firing, at, start, bt.holds(rules)
            )
            found.rows += [
                found._row(name, inj.label, delay, start, t_events) for name, delay in delays.items()
            ]
            # The injected drifts change recommendations, not tweets: the embedding test sees the
            # same tweets in both runs, so any alarm of it is one the control raises too.
            found.rows.append(
                {
                    "signal": EMBEDDING_SIGNAL,
                    "drift": inj.label,
                    "delay_s": None,
                    "delay_events": None,
                    "false_alarms_per_day": round(found.embedding_alarms / found.days, 4),
                    "fired": False,
                    "injected_at": iso(start),
                }
            )
            found.effects[inj.label] = found._effect(control, drifted, start, t_events, at, rules)
        return found

    def _row(
        self, name: str, drift: str, delay: float | None, start: float, t_events: npt.NDArray[np.float64]
    ) -> dict[str, Any]:
        return {
            "signal": name,
            "drift": drift,
            "delay_s": None if delay is None else round(delay, 1),
            # Bursty feeds: how many events the drift took to be caught, beside the time.
            "delay_events": None
            if delay is None
            else int(np.searchsorted(t_events, start + delay, side="right"))
            - int(np.searchsorted(t_events, start, side="left")),
            "false_alarms_per_day": round(self.false_alarms[name] / self.days, 4),
            "fired": delay is not None,
            "injected_at": iso(start),
        }

    def _effect(
        self,
        control: Scores,
        drifted: Scores,
        start: float,
        t_events: npt.NDArray[np.float64],
        at: npt.NDArray[np.float64],
        rules: bt.Rules,
    ) -> dict[str, Any]:
        after = t_events >= start
        # The earliest a drop alarm could fire after the injection even for a drift visible at
        # once: the rule must be evaluable (enough events, a baseline) at every instant of its
        # hold time.  A delay equal to it is bound by the feed's gaps, not by the signal.
        hold = min(rules.quality_for, rules.skill_loss_for)
        possible = np.flatnonzero(bt.hold(self.can_fire & (at >= start), at, hold))
        return {
            "injected_at": iso(start),
            "earliest_possible_drop_delay_s": None
            if not len(possible)
            else round(float(at[possible[0]] - start), 1),
            "events_after": int(np.count_nonzero(after)),
            **{
                f"{metric}_after": {
                    "control": _mean(getattr(control, metric)[after]),
                    "drifted": _mean(getattr(drifted, metric)[after]),
                }
                # The precision form: what the #REval alert tests (its loss, not #REval's).
                for metric in ("reval", "exact", "precision")
            },
            "corrected_after": {"control": _kappa(control, after), "drifted": _kappa(drifted, after)},
            "unknown_share_after": {
                "control": _ratio(control.unknown[after], control.recommended[after]),
                "drifted": _ratio(drifted.unknown[after], drifted.recommended[after]),
            },
        }


def _embedding_summary(tests: list[dict[str, Any]], alarms: int) -> dict[str, Any]:
    return {
        "alpha": EMBEDDING_ALPHA,
        "tests": tests,
        "alarms": alarms,
        "alarm_rate": _share(alarms, len(tests)),
        # The same test between two random halves of one interval: no drift by construction,
        # so its alarm rate is the test's own false-alarm rate (should be about alpha).
        "calibration_alarm_rate": _share(
            sum(e["calibration_p_value"] <= EMBEDDING_ALPHA for e in tests),
            len(tests),
        ),
    }


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _slices(
    t: npt.NDArray[np.float64], control: Scores, runs: dict[str, Scores], starts: dict[str, float]
) -> dict[str, Any]:
    """#REval at the alert (k, r) per popularity slice: the control over the whole period,
    and control and drifted run over the events after each injection."""
    out: dict[str, Any] = {}
    for label in SLICES:
        values = control.slices[label]
        out[label] = {
            "events": int(np.count_nonzero(~np.isnan(values))),
            "control": _mean(values),
            "drifts": {name: _mean(col.slices[label][t >= starts[name]]) for name, col in runs.items()},
            "control_after": {name: _mean(values[t >= starts[name]]) for name in runs},
        }
    return out


def _k_curves(
    ks: Sequence[int],
    t: npt.NDArray[np.float64],
    window: float,
    control: Scores,
    runs: dict[str, Scores],
    starts: dict[str, float],
) -> dict[str, Any]:
    """Mean #REval at every k over the last quality window of the feed (control and each
    drifted run) and, per drift, over every event after its injection."""

    def curve(col: Scores, mask: npt.NDArray[np.bool_]) -> list[float | None]:
        return [_mean(col.by_k[mask, i]) for i in range(len(ks))]

    last = t > t[-1] - window
    return {
        "ks": list(ks),
        "last_window": {"from": iso(float(t[-1] - window)), "events": int(last.sum())},
        "control": curve(control, last),
        "drifts": {name: curve(col, last) for name, col in runs.items()},
        "after_injection": {
            name: {"control": curve(control, t >= starts[name]), "drifted": curve(col, t >= starts[name])}
            for name, col in runs.items()
        },
    }


def _mean(values: npt.NDArray[np.float64]) -> float | None:
    ok = values[~np.isnan(values)]
    return round(float(ok.mean()), 4) if len(ok) else None


def _kappa(col: Scores, mask: npt.NDArray[np.bool_]) -> float | None:
    """The chance-corrected #REval of the events of ``mask``: the kappa of their sums."""
    sums = CorrectedSum()
    for o, e in zip(col.reval[mask].tolist(), col.expected[mask].tolist(), strict=True):
        if not (math.isnan(o) or math.isnan(e)):
            sums.update(o, e)
    value = sums.get()
    return None if value is None else round(value, 4)


def _ratio(part: npt.NDArray[np.float64], whole: npt.NDArray[np.float64]) -> float | None:
    total = float(whole.sum())
    return round(float(part.sum()) / total, 4) if total > 0 else None


def goal(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's goal, checked on the numbers: #REval's alert detects ``random`` and
    ``stale`` drifts no later than exact match with no more false alarms, and stays quiet
    on ``synonyms`` (a drift that keeps meaning).  Only the drift kinds that were injected;
    None where neither alert fired on a drift (nothing to compare: on a feed whose topics do
    not move, a stale model costs nothing).

    >>> def row(drift, signal, delay):
    ...     return {"drift": drift, "signal": signal, "delay_s": delay, "false_alarms_per_day": 0.0}
    >>> goal([row("random:0.5", "reval_drop", 60.0), row("random:0.5", "exact_drop", 90.0),
    ...       row("stale:15", "reval_drop", None), row("stale:15", "exact_drop", None),
    ...       row("synonyms:1", "reval_drop", None)])
    {'random': True, 'stale': None, 'synonyms': True}
    """
    by = {(row["drift"].split(":")[0], row["signal"]): row for row in rows}
    out: dict[str, Any] = {}
    for kind in ("random", "stale"):
        reval, exact = by.get((kind, "reval_drop")), by.get((kind, "exact_drop"))
        if reval is None or exact is None:
            continue
        if reval["delay_s"] is None and exact["delay_s"] is None:
            out[kind] = None
            continue
        sooner = reval["delay_s"] is not None and (
            exact["delay_s"] is None or reval["delay_s"] <= exact["delay_s"]
        )
        out[kind] = bool(sooner and reval["false_alarms_per_day"] <= exact["false_alarms_per_day"])
    reval = by.get(("synonyms", "reval_drop"))
    if reval is not None:
        out["synonyms"] = reval["delay_s"] is None
    return out


def matched_goal(rows: list[dict[str, Any]], curves: dict[str, Any]) -> dict[str, Any]:
    """The goal's ``random`` and ``stale`` at one false-alarm rate: the #REval alert as
    deployed against exact match's fastest threshold (its operating curve) whose control run
    raises no more false alarms a day.  :func:`goal` compares the two deployed rules, which
    may sit at different rates (a loose threshold fires early and often); this says whether
    the #REval alert is the earlier one where both alarm as rarely.  ``met`` as in
    :func:`goal`: None where neither fired.

    >>> rows = [{"drift": "random:0.5", "signal": "reval_drop", "delay_s": 90.0, "false_alarms_per_day": 0.0}]
    >>> curve = {"parameter": "quality_drop_fraction", "points": [
    ...     {"value": 0.2, "false_alarms_per_day": 0.2, "delays": {"random:0.5": 30.0}},
    ...     {"value": 0.4, "false_alarms_per_day": 0.0, "delays": {"random:0.5": 60.0}},
    ...     {"value": 0.6, "false_alarms_per_day": 0.0, "delays": {"random:0.5": None}}]}
    >>> found = matched_goal(rows, {"exact_drop": curve})["random"]
    >>> found["reval_delay_s"], found["exact_delay_s"], found["exact_threshold"], found["met"]
    (90.0, 60.0, 0.4, False)
    """
    curve = curves.get("exact_drop")
    out: dict[str, Any] = {}
    if curve is None:
        return out
    for row in rows:
        kind = row["drift"].split(":")[0]
        if row["signal"] != "reval_drop" or kind not in ("random", "stale"):
            continue
        rate, mine = row["false_alarms_per_day"], row["delay_s"]
        fired = [
            (p["delays"][row["drift"]], p["value"])
            for p in curve["points"]
            if p["false_alarms_per_day"] <= rate and p["delays"].get(row["drift"]) is not None
        ]
        exact, threshold = min(fired) if fired else (None, None)
        met = (
            None if mine is None and exact is None else mine is not None and (exact is None or mine <= exact)
        )
        out[kind] = {
            "drift": row["drift"],
            "false_alarms_per_day": rate,
            "reval_delay_s": mine,
            "exact_delay_s": exact,
            "exact_threshold": threshold,
            "met": met,
        }
    return out


def _series(
    at: npt.NDArray[np.float64],
    t: npt.NDArray[np.float64],
    rules: bt.Rules,
    control: Scores,
    runs: dict[str, Scores],
    firing: dict[str, npt.NDArray[np.bool_]],
    points: int = 600,
) -> dict[str, Any]:
    """Window means at (at most ``points``) instants of every run, for plots."""
    pick = np.unique(np.linspace(0, len(at) - 1, min(points, len(at))).astype(int))
    when = at[pick]

    def means(col: Scores) -> dict[str, list[float | None]]:
        out = {}
        for metric in ("reval", "corrected", "exact"):
            if metric == "corrected":  # the kappa of each window's sums
                values = bt.window_kappa(t, col.reval, col.expected, when, rules.quality_window)
            else:
                values = bt.window_mean(t, getattr(col, metric), when, rules.quality_window)
            out[metric] = [None if math.isnan(v) else round(float(v), 4) for v in values]
        return out

    return {
        "t": [iso(float(x)) for x in when],
        "window_s": rules.quality_window,
        "control": means(control),
        "drifts": {name: means(col) for name, col in runs.items()},
        "control_firing": {name: f[pick].astype(int).tolist() for name, f in firing.items()},
    }
