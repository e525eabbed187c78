"""The drift-detection backtest as pure steps: the alert rules of ``deploy/prometheus``
replayed over event time (the drifts it injects: :mod:`stream.monitoring.drift_injection`).

``reval backtest`` (:mod:`workers.commands.backtest`) replays a feed, scores every event
with :func:`stream.evaluation.scoring.score_event` (the scorer's path) once undisturbed (the
*control*) and once per injected drift, and asks of each alert signal: how long after
the drift began did it fire (an alarm the control run does not raise), and how often
does it fire on the control run (false alarms per day of event time)?

The rules are evaluated as Prometheus evaluates them: at regular instants, a window
mean is (sum of values)/(number of values) over the events of ``(t - window, t]`` (the
``rate(x_sum) / rate(x_count)`` of the recording rules), a baseline is the mean of that
window at each offset that has events, and an alert fires once its condition has held
at every instant for its ``for`` duration.

>>> at = np.arange(0.0, 10.0)
>>> hold(np.array([0, 1, 1, 1, 0, 1, 1, 1, 1, 1], bool), at, 2.0).astype(int).tolist()
[0, 0, 0, 1, 0, 0, 0, 1, 1, 1]
>>> episodes(np.array([0, 1, 1, 0, 1, 0], bool))
2
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypedDict

import numpy as np
import numpy.typing as npt

from stream.evaluation.chance import MIN_ROOM

__all__ = [
    "CURVES",
    "EFFECTS",
    "SIGNALS",
    "Rules",
    "Series",
    "Statistics",
    "auto_time_scale",
    "baseline",
    "conditions",
    "detect",
    "duration_text",
    "enough_events",
    "episodes",
    "evaluable",
    "hold",
    "holds",
    "operating_curves",
    "signals",
    "skill_loss",
    "statistics",
    "window_kappa",
    "window_mean",
    "with_threshold",
]

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

#: Alert signals, each one rule of deploy/prometheus (``exact_drop`` is a fixed-fraction drop
#: rule on the exact hit ratio: what a monitor without synonyms would alert on).
SIGNALS = {
    "reval_drop": "RevalRecommenderQualityDrop (sequential test of #REval's precision form)",
    "corrected_at_chance": "RevalRecommenderAtChance (chance-corrected #REval)",
    "exact_drop": "the exact hit ratio over the quality window falls a fixed fraction below its baseline",
    "semantic_gap": "RevalSemanticGapWidening (exact falls, #REval holds)",
    "unknown_rising": "RevalUnknownHashtagsRising (share of recommended hashtags unknown)",
}

# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class Rules:
    """The alert rules' thresholds and durations (seconds of event time), taken from
    :mod:`stream.monitoring.alert_params` and multiplied by the time scale."""

    step: float
    quality_window: float
    baseline_offsets: tuple[float, ...]
    quality_drop_fraction: float
    quality_for: float
    min_events: int
    #: The #REval alert's sequential test (:func:`skill_loss`): the share of the baseline's
    #: precision form whose loss it tests for, its bound log(1 / alpha) and its hold time.
    skill_loss_fraction: float
    skill_loss_bound: float
    skill_loss_for: float
    chance_margin: float
    chance_for: float
    gap_exact_drop_fraction: float
    gap_reval_tolerance: float
    gap_for: float
    unknown_window: float
    unknown_baseline_window: float
    unknown_share_max: float
    unknown_share_rise: float
    unknown_for: float


@dataclass(frozen=True)
class Series:
    """Per-event scores of one run in event-time order (NaN: unscorable).  ``reval`` is
    #REval at the alert (k, r), ``exact`` the exact hit ratio at r; ``recommended`` and
    ``unknown`` count each event's recommended hashtags and those the thesaurus lacks;
    ``precision`` is #REval's precision form at the alert (k, r)
    (:func:`stream.evaluation.metrics.reval_precision_by_k`: what the #REval alert tests)."""

    t: Floats
    reval: Floats
    expected: Floats
    exact: Floats
    recommended: Floats
    unknown: Floats
    precision: Floats


def _window_sums(t: Floats, values: Floats, at: Floats, window: float) -> tuple[Floats, Floats]:
    """Sum and number of the non-NaN ``values`` with event time in ``(at - window, at]``."""
    ok = ~np.isnan(values)
    sums = np.concatenate([[0.0], np.cumsum(np.where(ok, values, 0.0))])
    counts = np.concatenate([[0.0], np.cumsum(ok.astype(np.float64))])
    hi = np.searchsorted(t, at, side="right")
    lo = np.searchsorted(t, at - window, side="right")
    return sums[hi] - sums[lo], counts[hi] - counts[lo]


def window_mean(t: Floats, values: Floats, at: Floats, window: float) -> Floats:
    """The mean of ``values`` over ``(at - window, at]`` at each instant; NaN when empty.

    >>> t = np.array([1.0, 2.0, 3.0]); v = np.array([1.0, np.nan, 0.0])
    >>> window_mean(t, v, np.array([0.0, 1.0, 3.0]), 2.5).tolist()
    [nan, 1.0, 0.5]
    """
    total, count = _window_sums(t, values, at, window)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def window_kappa(t: Floats, observed: Floats, expected: Floats, at: Floats, window: float) -> Floats:
    """The chance-corrected score over ``(at - window, at]`` at each instant: the kappa of the
    window's sums (:func:`stream.evaluation.chance.corrected_of_sums`, best = 1 per event) over the events
    with an expectation; NaN where the window is empty or leaves no room above chance.

    >>> t = np.array([1.0, 2.0, 3.0]); o = np.array([1.0, 0.0, 0.5]); e = np.array([0.2, 0.2, np.nan])
    >>> window_kappa(t, o, e, np.array([0.0, 2.0, 3.0]), 5.0).round(4).tolist()
    [nan, 0.375, 0.375]
    """
    both = np.where(np.isnan(expected), np.nan, observed)
    sum_o, n = _window_sums(t, both, at, window)
    sum_e, _ = _window_sums(t, np.where(np.isnan(observed), np.nan, expected), at, window)
    room = n - sum_e
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(room > MIN_ROOM, (sum_o - sum_e) / np.where(room > MIN_ROOM, room, 1.0), np.nan)


def _offset_sums(t: Floats, values: Floats, at: Floats, window: float, offsets: Sequence[float]) -> Floats:
    """The mean over the offsets whose window has events of the window sums of ``values``
    (PromQL ``avg`` over the ``offset`` series of a rate: a missing one is skipped)."""
    sums, counts = zip(*(_window_sums(t, values, at - o, window) for o in offsets), strict=True)
    present = np.stack(counts) > 0
    total = np.where(present, np.stack(sums), 0.0).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(present.any(axis=0), total / np.maximum(present.sum(axis=0), 1), np.nan)


def skill_loss(
    t: Floats,
    values: Floats,
    at: Floats,
    window: float,
    offsets: Sequence[float],
    shift: float,
    min_events: float = 1.0,
) -> Floats:
    """The log-likelihood ratio, over the window ``(at - window, at]``, that the recommender
    lost ``shift`` of its baseline precision form of #REval rather than kept it.

    ``values`` is #REval's precision form per event (:func:`stream.evaluation.metrics.reval_precision_by_k`:
    the share of the recommended hashtags with a ground truth among their k synonyms).  It,
    not #REval itself, is what the test reads: #REval counts each ground truth once, so a list
    with several hashtags near one truth loses nothing until the last of them is replaced,
    while the precision form loses a share per hashtag replaced by an unrelated one and keeps
    it when a hashtag is replaced by its synonym (a drift that keeps meaning).

    Over the window: sum P and n events.  The baseline, from the same window at each offset
    (the mean sums): mean m0 = P0 / n0 and variance v0 = Q0 / n0 - m0^2 (Q: the sum of the
    squares; a share's variance is far below the m (1 - m) of a 0/1 outcome).  Testing m0
    against m1 = m0 - delta (delta = ``shift`` * m0) with Gaussian terms of variance v0 gives
    the log-likelihood ratio ``delta / v0 * ((m0 - delta / 2) n - P)``: the CUSUM (Page)
    increment summed over the window.  An alarm at ``log(1 / alpha)`` is one a recommender at
    its baseline reaches with probability at most alpha (Wald's bound).

    NaN where there is nothing to test: no events in the window, a baseline of 0 (nothing
    to lose), or no baseline of at least ``min_events`` events per window on average: a
    baseline of a handful of events has a variance near 0, and dividing by it turns any dip
    into an alarm (a young recommender's first window, a quiet night).

    >>> t = np.arange(400.0)
    >>> p = np.where(t < 200, (t % 2 == 0) * 0.4, (t % 10 == 0) * 0.4)  # mean 0.2, then 0.04
    >>> llr = skill_loss(t, p, np.array([199.0, 399.0]), 100.0, (200.0,), 0.5)
    >>> [round(float(x), 2) for x in llr]  # v0 = 0.08 - 0.04 = 0.04; 2.5 (15 - 4)
    [nan, 27.5]
    """
    ok = ~np.isnan(values)
    shares = np.where(ok, values, np.nan)
    total, n = _window_sums(t, shares, at, window)
    p0 = _offset_sums(t, shares, at, window, offsets)
    q0 = _offset_sums(t, shares * shares, at, window, offsets)
    n0 = _offset_sums(t, np.where(ok, 1.0, np.nan), at, window, offsets)
    with np.errstate(invalid="ignore", divide="ignore"):
        m0 = p0 / n0
        v0 = np.clip(q0 / n0 - m0 * m0, 1e-6, 0.25)
        delta = shift * m0
        llr = delta / v0 * ((m0 - delta / 2.0) * n - total)
    return np.where((n > 0) & (n0 >= max(min_events, 1.0)) & (m0 > 0), llr, np.nan)


def baseline(t: Floats, values: Floats, at: Floats, window: float, offsets: Sequence[float]) -> Floats:
    """The mean of the window means at each offset before ``at`` that has events
    (PromQL ``avg`` over the ``offset`` series: a missing one is skipped)."""
    past = np.stack([window_mean(t, values, at - o, window) for o in offsets])
    present = ~np.isnan(past)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(
            present.any(axis=0), np.nansum(past, axis=0) / np.maximum(present.sum(axis=0), 1), np.nan
        )


def hold(condition: Bools, at: Floats, for_s: float) -> Bools:
    """Firing instants of an alert whose ``condition`` must hold for ``for_s`` seconds:
    pending from the first true instant, firing once ``for_s`` has passed since then."""
    condition = np.asarray(condition, dtype=bool)
    if not len(condition):
        return condition.copy()
    begins = condition & ~np.concatenate([[False], condition[:-1]])
    since = np.where(begins, np.arange(len(condition)), 0)
    np.maximum.accumulate(since, out=since)  # each true instant: the start of its run
    return condition & (at - at[since] >= for_s)


def episodes(firing: Bools) -> int:
    """How many separate times an alert started firing."""
    if not len(firing):
        return 0
    return int(firing[0]) + int(np.count_nonzero(firing[1:] & ~firing[:-1]))


def enough_events(series: Series, at: Floats, rules: Rules) -> Bools:
    """Instants whose quality window holds the rules' minimum of scored events (the
    quality alerts are silent elsewhere)."""
    scored = np.where(np.isnan(series.reval), np.nan, 1.0)
    return _window_sums(series.t, scored, at, rules.quality_window)[1] >= rules.min_events


def evaluable(series: Series, at: Floats, rules: Rules) -> Bools:
    """Instants at which the drop rules can fire at all: enough events now and a baseline
    (some offset's window with events).  On a sparse feed these, not the signals, bound
    the detection delays."""
    past = baseline(series.t, series.reval, at, rules.quality_window, rules.baseline_offsets)
    return enough_events(series, at, rules) & ~np.isnan(past)


def _below(a: Floats, b: Floats) -> Bools:
    with np.errstate(invalid="ignore"):
        return np.nan_to_num(a, nan=np.inf) < np.nan_to_num(b, nan=-np.inf)


@dataclass(frozen=True, eq=False)
class Statistics:
    """What the rules compare with their thresholds, at each instant of one run: window
    means, baselines, the corrected score, the unknown shares and the #REval alert's
    log-likelihood ratio (they depend on the rules' windows, not on their thresholds)."""

    enough: Bools
    reval_now: Floats
    reval_base: Floats
    exact_now: Floats
    exact_base: Floats
    corrected_now: Floats
    share_now: Floats
    share_base: Floats
    llr: Floats


def statistics(series: Series, at: Floats, rules: Rules) -> Statistics:
    t, qw, offsets = series.t, rules.quality_window, rules.baseline_offsets

    def share(window: float) -> Floats:
        unknown, _ = _window_sums(t, series.unknown, at, window)
        total, _ = _window_sums(t, series.recommended, at, window)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(total > 0, unknown / np.maximum(total, 1), np.nan)

    return Statistics(
        enough=enough_events(series, at, rules),
        reval_now=window_mean(t, series.reval, at, qw),
        reval_base=baseline(t, series.reval, at, qw, offsets),
        exact_now=window_mean(t, series.exact, at, qw),
        exact_base=baseline(t, series.exact, at, qw, offsets),
        corrected_now=window_kappa(t, series.reval, series.expected, at, qw),
        share_now=share(rules.unknown_window),
        share_base=share(rules.unknown_baseline_window),
        llr=skill_loss(t, series.precision, at, qw, offsets, rules.skill_loss_fraction, rules.min_events),
    )


def conditions(
    series: Series, at: Floats, rules: Rules, found: Statistics | None = None
) -> dict[str, tuple[Bools, float]]:
    """Every signal's condition at each instant, and its hold time (``found``: the run's
    :func:`statistics` under the same windows, when already computed)."""
    f = found if found is not None else statistics(series, at, rules)
    enough, reval_now, reval_base, exact_now, exact_base = (
        f.enough,
        f.reval_now,
        f.reval_base,
        f.exact_now,
        f.exact_base,
    )
    corrected_now, share_base, llr = f.corrected_now, f.share_base, f.llr
    share_known = np.nan_to_num(f.share_now, nan=-np.inf)
    drop, gap = 1.0 - rules.quality_drop_fraction, 1.0 - rules.gap_exact_drop_fraction
    with np.errstate(invalid="ignore"):
        conditions = {
            "reval_drop": (
                (np.nan_to_num(llr, nan=-np.inf) > rules.skill_loss_bound) & enough,
                rules.skill_loss_for,
            ),
            "corrected_at_chance": (
                (np.nan_to_num(corrected_now, nan=np.inf) <= rules.chance_margin) & enough,
                rules.chance_for,
            ),
            "exact_drop": (_below(exact_now, drop * exact_base) & enough, rules.quality_for),
            "semantic_gap": (
                _below(exact_now, gap * exact_base)
                & (np.nan_to_num(reval_now, nan=-np.inf) >= (1.0 - rules.gap_reval_tolerance) * reval_base)
                & enough,
                rules.gap_for,
            ),
            "unknown_rising": (
                (share_known > rules.unknown_share_max)
                & (share_known > np.nan_to_num(share_base, nan=np.inf) + rules.unknown_share_rise),
                rules.unknown_for,
            ),
        }
    return conditions


def signals(series: Series, at: Floats, rules: Rules) -> dict[str, Bools]:
    """Every signal's firing instants on one run."""
    return {name: hold(cond, at, for_s) for name, (cond, for_s) in conditions(series, at, rules).items()}


def holds(rules: Rules) -> dict[str, float]:
    """Each signal's hold time (its rule's ``for``)."""
    return {
        "reval_drop": rules.skill_loss_for,
        "corrected_at_chance": rules.chance_for,
        "exact_drop": rules.quality_for,
        "semantic_gap": rules.gap_for,
        "unknown_rising": rules.unknown_for,
    }


def detect(
    drifted: Mapping[str, Bools],
    control: Mapping[str, Bools],
    at: Floats,
    start: float,
    guard: Mapping[str, float] | None = None,
) -> dict[str, float | None]:
    """Seconds from ``start`` to each signal's first alarm at or after it that the control
    run does not raise (None: it never fires).  With ``guard`` (seconds per signal, its hold
    time), an alarm counts only where the control raises none within ``guard`` either side:
    the two runs share every event before the drift, so a threshold the control crosses a
    little later or stops crossing a little earlier is the control's own alarm seen again,
    not a detection.

    >>> at = np.arange(10.0); control = {"x": np.array([0, 0, 0, 1, 1, 0, 0, 0, 0, 0], bool)}
    >>> drifted = {"x": np.array([0, 0, 1, 1, 1, 1, 0, 0, 1, 1], bool)}
    >>> detect(drifted, control, at, 0.0), detect(drifted, control, at, 0.0, {"x": 2.0})
    ({'x': 2.0}, {'x': 8.0})
    """
    out: dict[str, float | None] = {}
    after = at >= start
    for name, firing in drifted.items():
        quiet = ~control[name]
        margin = (guard or {}).get(name, 0.0)
        if margin > 0:
            fired = at[control[name]]
            lo = np.searchsorted(fired, at - margin, side="left")
            hi = np.searchsorted(fired, at + margin, side="right")
            quiet = hi == lo
        hits = np.flatnonzero(firing & quiet & after)
        out[name] = float(at[hits[0]] - start) if len(hits) else None
    return out


#: The means over the events after each injection (control → drifted) that ``detection.json``'s
#: ``effects`` hold and its tables show, in their order: #REval, its precision form (what the
#: #REval alert tests), the corrected score, the exact hit ratio, the unknown share.
EFFECTS = ("reval_after", "precision_after", "corrected_after", "exact_after", "unknown_share_after")

#: The threshold each signal's operating curve sweeps (a Rules field, or the false-alarm
#: probability alpha of the #REval alert's bound log(1 / alpha)) and the values it takes.
CURVES: dict[str, tuple[str, tuple[float, ...]]] = {
    "reval_drop": ("false_alarm_probability", (0.5, 0.2, 0.1, 0.05, 0.01, 1e-3, 1e-4, 1e-6)),
    "exact_drop": ("quality_drop_fraction", (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6)),
    "corrected_at_chance": ("chance_margin", (-0.1, -0.05, 0.0, 0.05, 0.1, 0.2)),
    "semantic_gap": ("gap_exact_drop_fraction", (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)),
    "unknown_rising": ("unknown_share_max", (0.05, 0.1, 0.2, 0.3, 0.5)),
}


def with_threshold(rules: Rules, signal: str, value: float) -> Rules:
    """``rules`` with ``signal``'s swept threshold (:data:`CURVES`) set to ``value``."""
    name = CURVES[signal][0]
    if name == "false_alarm_probability":
        return replace(rules, skill_loss_bound=math.log(1.0 / value))
    changes: dict[str, Any] = {name: value}
    return replace(rules, **changes)


class CurvePoint(TypedDict):
    """One threshold of a swept signal: the control's false alarms, each drift's delay."""

    value: float
    deployed: bool
    false_alarms_per_day: float
    delays: dict[str, float | None]


class Curve(TypedDict):
    parameter: str
    points: list[CurvePoint]


def operating_curves(
    control: Series,
    drifted: Mapping[str, Series],
    starts: Mapping[str, float],
    at: Floats,
    rules: Rules,
    days: float,
) -> dict[str, Curve]:
    """Per signal, detection delay against false alarms per day as its threshold sweeps
    :data:`CURVES`: for each value, the control run's alarm episodes per day and each drift's
    delay (:func:`detect` with the hold guard; None: never), so a user can pick an
    operating point.  The deployed threshold is among the points (``deployed``)."""
    out: dict[str, Curve] = {}
    base_stats = statistics(control, at, rules)
    drift_stats = {label: statistics(series, at, rules) for label, series in drifted.items()}
    for signal, (parameter, swept) in CURVES.items():
        current = (
            math.exp(-rules.skill_loss_bound)
            if parameter == "false_alarm_probability"
            else getattr(rules, parameter)
        )
        values = swept if any(math.isclose(v, current) for v in swept) else (*swept, current)
        points: list[CurvePoint] = []
        for value in values:
            changed = with_threshold(rules, signal, value)
            cond, for_s = conditions(control, at, changed, base_stats)[signal]
            base = hold(cond, at, for_s)
            delays: dict[str, float | None] = {}
            for label, series in drifted.items():
                cond_d, _ = conditions(series, at, changed, drift_stats[label])[signal]
                found = detect(
                    {signal: hold(cond_d, at, for_s)}, {signal: base}, at, starts[label], {signal: for_s}
                )[signal]
                delays[label] = None if found is None else round(found, 1)
            points.append(
                {
                    "value": value,
                    "deployed": math.isclose(value, current),
                    "false_alarms_per_day": round(episodes(base) / days, 4),
                    "delays": delays,
                }
            )
        out[signal] = {"parameter": parameter, "points": points}
    return out


def duration_text(seconds: float | None) -> str:
    """A delay as people read it (— for none).

    >>> duration_text(None), duration_text(600), duration_text(5400 * 2), duration_text(86400 * 3)
    ('—', '10 min', '3.0 h', '3.0 d')
    """
    if seconds is None:
        return "—"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def auto_time_scale(
    n_events: int,
    span_s: float,
    quality_window_s: float,
    min_events: int,
    *,
    room_s: float,
    lookback_s: float,
) -> float:
    """The factor that stretches the rules' durations so that the quality window holds,
    on average, twice the rules' minimum number of events -- at least 1 (a feed as dense
    as production keeps the production durations), and at most what lets the first
    baseline (``lookback_s`` = the first offset plus the window, unscaled) exist within
    ``room_s`` (the scored time before the injection): without a baseline no drop can fire.

    >>> auto_time_scale(8_640, 86_400.0, 3_600.0, 50, room_s=1e9, lookback_s=90_000.0)  # 360 an hour
    1.0
    >>> auto_time_scale(240, 86_400.0, 3_600.0, 50, room_s=1e9, lookback_s=90_000.0)  # 10 an hour
    10.0
    >>> auto_time_scale(240, 86_400.0, 3_600.0, 50, room_s=450_000.0, lookback_s=90_000.0)
    5.0
    """
    if n_events <= 0 or span_s <= 0:
        return 1.0
    per_window = n_events / span_s * quality_window_s
    return max(1.0, min(2.0 * min_events / per_window, room_s / lookback_s))
