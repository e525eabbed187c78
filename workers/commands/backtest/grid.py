"""The detector benchmark: at one calibrated false-alarm budget, how soon each detector finds
each drift, how often, and whether the joint detector names the right alternative.

    python -m workers.commands.backtest.grid FEED [--out DIR] [--arl0 10000] [--rate 3000]
        [--reps 200] [--window 500] [--inject KIND:AMOUNT ...] [--limit N] [--model minilm]

The feed is walked once as ``reval backtest`` walks it (the control run and one drifted run
per ``--inject``, alert k = 10, r = 10).  Two kinds of stream are read:

* **the feed itself**, sparse (the bundled feed scores ~20 events a day): the joint
  detector and the two single-signal CUSUMs on the trailing baseline, as the backtest's
  ``diagnosis`` rows (:func:`workers.commands.backtest.detector.diagnose`);
* **production-rate streams**: stationary before the change, at the feed's own outcome law
  and units (the control run's scored events from the earliest drift on), then at each
  drift's law (the drifted run's outcome shares over the same events, as a ratio to the
  control's, applied to it), simulated ``--reps`` times, read at ``--rate`` events an hour.
  Every detector reads the same streams (:data:`DETECTORS`).

**One budget.**  Every detector's threshold is set so that its in-control average run length
is ``--arl0`` events: the CUSUMs by the Markov chain of :func:`stream.monitoring.cusum.calibrate`; the
window rules and ADWIN by simulating the in-control stream and bisecting their line (or
``delta``); the dummy fires every ARL0 events.  Each one's run length is then measured on
fresh in-control streams, with its 95% interval -- a detector that misses its budget is
shown missing it.

**A stream** is ``PRE`` in-control events, the change, then up to ARL0 drifted events.
Detectors run from its first event and restart after each alarm (an alarm before the change
is a false one and is not counted); the delay is the events from the change to the first
alarm at or after it, the alarm's included.  A drift is *detected* in a stream when an alarm
comes within ARL0 events of the change (later than that, the dummy does as well).  Per drift
and detector: the share detected, the median delay (95% interval from the order statistics)
in events and minutes at the rate; for the joint detector the *isolation error*, the share
of its detections that name the wrong alternative (``synonyms`` is ``wording_changed``,
every other kind ``quality_lost``).

Writes ``grid.json`` and ``grid.md`` into ``--out`` (``reval report`` shows them when they
sit beside a backtest's ``detection.json``).  The simulation assumes what a production
stream is and a feed is not: stationary before the change, the in-control law known to
every detector (the design's ideal; the live detector learns it from a trailing window --
the feed rows show what that costs).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from river.drift import ADWIN

from stream.evaluation.experiment import ProgressFactory, no_progress
from stream.monitoring import cusum
from workers.commands.backtest.detector import diagnose, outcomes, scored
from workers.commands.backtest.simulation import BacktestConfig, Feed, Scores, Walk, load_feed

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]

#: Drift kinds and sizes: the chance share of a list (random), a recommender from the past
#: (stale), another recommender (swap), respelled hashtags (vocab), reworded lists (synonyms).
DEFAULT_DRIFTS = (
    "random:0.1",
    "random:0.25",
    "random:0.5",
    "random:1",
    "stale:60",
    "swap:least-popular",
    "vocab:0.5",
    "synonyms:0.5",
    "synonyms:0.8",
    "synonyms:1",
)
#: What each drift kind is: the alternative a detector should name.
EXPECTED = {"synonyms": "wording_changed"}
QUALITY_KINDS = ("random", "stale", "swap")
DETECTORS = (
    "joint",
    "exact_cusum",
    "synonym_cusum",
    "window_exact",
    "window_synonym",
    "adwin_exact",
    "adwin_synonym",
    "dummy",
)
#: What the grid keeps of the backtest's ``diagnosis`` rows on the feed itself.
FEED_KEYS = (
    "drift",
    "alternative",
    "delay_events",
    "delay_s",
    "control_delay_events",
    "exact_cusum_delay_events",
    "synonym_cusum_delay_events",
    "counterfactual_alternative",
    "counterfactual_delay_events",
    "counterfactual_exact_cusum_delay_events",
    "counterfactual_synonym_cusum_delay_events",
)
#: In-control events before the change (the window rules and ADWIN need a history).
PRE = 2000
#: In-control streams are this many ARL0s long at most (a longer run is censored: e^-6).
HORIZON = 6


def expected_alternative(drift: str) -> str:
    return EXPECTED.get(drift.split(":", 1)[0], "quality_lost")


@dataclass(frozen=True)
class Model:
    """A production-rate stream: per-unit outcome law (exact, synonym-only, miss), the units
    an event has (drawn from ``units``), the null recommender's hit chance per unit."""

    p0: Floats
    units: Ints
    chance: float

    def sample(self, rng: np.random.Generator, n: int, law: Floats | None = None) -> Ints:
        sizes = rng.choice(self.units, size=n)
        return np.asarray(rng.multinomial(sizes, self.p0 if law is None else law), dtype=np.int64)


def _rows(col: Scores, t_events: Floats, start: float) -> npt.NDArray[np.bool_]:
    return scored(col) & (t_events >= start)


def model_of(
    control: Scores, runs: Mapping[str, Scores], starts: Mapping[str, float], t: Floats
) -> tuple[Model, dict[str, Floats]]:
    """The in-control model (the control's scored events from the earliest drift on) and
    each drift's law: the model's law times the drifted run's outcome shares over the control's
    on the events after its start (the drift's effect, without the feed's own change)."""
    rows = _rows(control, t, min(starts.values()))
    p0 = cusum.in_control(outcomes(control, rows))
    expected = control.expected[rows]
    units = control.units[rows]
    known = ~np.isnan(expected)
    chance = float(np.average(expected[known], weights=units[known])) if known.any() else 0.0
    laws: dict[str, Floats] = {}
    for label, col in runs.items():
        after = _rows(control, t, starts[label]) & _rows(col, t, starts[label])
        ratio = cusum.in_control(outcomes(col, after)) / cusum.in_control(outcomes(control, after))
        law = p0 * ratio
        laws[label] = law / law.sum()
    return Model(p0=p0, units=np.asarray(units, dtype=np.int64), chance=chance), laws


# --- the detectors ---------------------------------------------------------------------------

#: A detector on one stream: ``next_alarm(begin)`` is its first alarm from event ``begin`` on,
#: started afresh there (None: none), and the alternative it names.
NextAlarm = Callable[[int], tuple[int, str | None] | None]


class Calibrated:
    """Every detector at the budget ``arl0`` on the in-control ``model``."""

    def __init__(
        self, model: Model, arl0: float, *, window: int, reps: int, seed: int, progress: ProgressFactory
    ) -> None:
        self.model, self.arl0, self.window = model, arl0, window
        p0, units = model.p0, model.units
        self.charts = cusum.design(p0, chance_hit=model.chance)
        self.thresholds, _ = cusum.calibrate(p0, units, self.charts, arl0, seed=seed, chance_hit=model.chance)
        self.singles = {
            "exact_cusum": cusum.exact_chart(p0),
            "synonym_cusum": cusum.synonym_chart(p0, chance_hit=model.chance),
        }
        self.single_thresholds = {
            name: cusum.calibrate(p0, units, {name: llr}, arl0)[0][name] for name, llr in self.singles.items()
        }
        rng = np.random.default_rng(seed)
        streams = [model.sample(rng, int(HORIZON * arl0)) for _ in range(reps)]
        tick = progress("calibrating the window rules and ADWIN", 4)
        self.lines = {}
        for signal in ("exact", "synonym"):
            self.lines[signal] = _calibrate_window(streams, signal, window, arl0)
            tick(1)
        self.deltas = {}
        for signal in ("exact", "synonym"):
            self.deltas[signal] = _calibrate_adwin(streams[: max(reps // 4, 20)], signal, arl0)
            tick(1)

    def settings(self) -> dict[str, Any]:
        return {
            "joint": {n: round(h, 4) for n, h in self.thresholds.items()},
            "exact_cusum": round(self.single_thresholds["exact_cusum"], 4),
            "synonym_cusum": round(self.single_thresholds["synonym_cusum"], 4),
            "window_exact": {"window_events": self.window, "line": round(self.lines["exact"], 5)},
            "window_synonym": {"window_events": self.window, "line": round(self.lines["synonym"], 5)},
            "adwin_exact": {"delta": self.deltas["exact"]},
            "adwin_synonym": {"delta": self.deltas["synonym"]},
            "dummy": {"every_events": int(self.arl0)},
        }

    def detectors(self, counts: Ints, rng: np.random.Generator) -> dict[str, NextAlarm]:
        """Every detector of :data:`DETECTORS` on one stream of outcome counts."""
        phase = int(rng.integers(int(self.arl0)))
        every = int(self.arl0)
        return {
            "joint": joint_alarms(counts, self.charts, self.thresholds, self.model),
            **{
                name: single_alarms(cusum.increments(counts, llr), self.single_thresholds[name])
                for name, llr in self.singles.items()
            },
            "window_exact": _window(counts, "exact", self.window, self.lines["exact"]),
            "window_synonym": _window(counts, "synonym", self.window, self.lines["synonym"]),
            "adwin_exact": _adwin(counts, "exact", self.deltas["exact"]),
            "adwin_synonym": _adwin(counts, "synonym", self.deltas["synonym"]),
            # at a random phase, then every ARL0 events after its last alarm (begin - 1)
            "dummy": lambda begin: (phase if begin == 0 else begin - 1 + every, None),
        }


def _hits(counts: Ints, signal: str) -> Ints:
    return counts[:, 0] if signal == "exact" else counts[:, 0] + counts[:, 1]


def joint_alarms(
    counts: Ints,
    charts: Mapping[str, Floats],
    thresholds: Mapping[str, float],
    model: Model,
    margin: float = cusum.ISOLATION_NATS,
) -> NextAlarm:
    """The detector as the score workers run it (:func:`stream.monitoring.cusum.scan`: a crossing,
    then the alternative isolated by ``margin`` nats), the in-control law known."""
    steps = {n: cusum.increments(counts, llr) for n, llr in charts.items()}

    def next_alarm(begin: int) -> tuple[int, str | None] | None:
        tail = {n: x[begin:] for n, x in steps.items()}
        found = cusum.scan(counts[begin:], tail, thresholds, model.p0, model.chance, margin=margin)
        return None if found.alarm is None else (begin + found.alarm, found.alternative)

    return next_alarm


def single_alarms(increments: Floats, threshold: float) -> NextAlarm:
    """One CUSUM on one signal: it detects, it names nothing."""

    def next_alarm(begin: int) -> tuple[int, str | None] | None:
        at = cusum.first_alarm(increments[begin:], threshold)
        return None if at is None else (begin + at, None)

    return next_alarm


def _rolling_rate(counts: Ints, signal: str, window: int) -> Floats:
    """The hit rate per unit over the ``window`` events ending at each event (NaN before a
    full window; an empty window counts as no drop)."""
    hits = np.concatenate([[0], np.cumsum(_hits(counts, signal))])
    units = np.concatenate([[0], np.cumsum(counts.sum(axis=1))])
    out = np.full(len(counts), np.nan)
    if len(counts) >= window:
        h = hits[window:] - hits[:-window]
        u = units[window:] - units[:-window]
        out[window - 1 :] = np.where(u > 0, h / np.maximum(u, 1), np.inf)
    return out


def _window(counts: Ints, signal: str, window: int, line: float) -> NextAlarm:
    """The deployed rules' shape: the hit rate of the last ``window`` events below ``line``,
    checked at every event; after an alarm, a fresh window."""
    rate = _rolling_rate(counts, signal, window)

    def next_alarm(begin: int) -> tuple[int, str | None] | None:
        below = np.flatnonzero(rate[begin + window - 1 :] < line)
        return (begin + window - 1 + int(below[0]), None) if len(below) else None

    return next_alarm


def _adwin(counts: Ints, signal: str, delta: float) -> NextAlarm:
    """river's ADWIN on the per-event hit ratio, started afresh at ``begin``."""
    ratio = (_hits(counts, signal) / np.maximum(counts.sum(axis=1), 1)).tolist()

    def next_alarm(begin: int) -> tuple[int, str | None] | None:
        detector = ADWIN(delta=delta)
        for i in range(begin, len(ratio)):
            detector.update(ratio[i])
            if detector.drift_detected:
                return i, None
        return None

    return next_alarm


def _calibrate_window(streams: Sequence[Ints], signal: str, window: int, arl0: float) -> float:
    """The line whose first crossing comes after ``arl0`` events on average (bisection over
    the in-control streams' running minima of the window's rate)."""
    minima = [
        np.minimum.accumulate(np.nan_to_num(_rolling_rate(c, signal, window), nan=np.inf)) for c in streams
    ]

    def mean_run(line: float) -> float:
        return float(
            np.mean([min(int(np.searchsorted(-m, -line, side="right")) + 1, len(m)) for m in minima])
        )

    lo, hi = 0.0, 1.0  # mean_run falls as the line rises
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_run(mid) >= arl0 else (lo, mid)
    return lo


def _adwin_run(ratio: list[float], delta: float) -> int:
    detector = ADWIN(delta=delta)
    for i, value in enumerate(ratio):
        detector.update(value)
        if detector.drift_detected:
            return i + 1
    return len(ratio)


def _calibrate_adwin(streams: Sequence[Ints], signal: str, arl0: float) -> float:
    """ADWIN's ``delta`` whose in-control mean run length is ``arl0`` (bisection on its
    logarithm; the largest ``delta`` tried, 0.5, where ADWIN never alarms that often)."""
    ratios = [(_hits(c, signal) / np.maximum(c.sum(axis=1), 1)).tolist() for c in streams]

    def mean_run(log_delta: float) -> float:
        return float(np.mean([_adwin_run(r, 10**log_delta) for r in ratios]))

    lo, hi = -12.0, math.log10(0.5)  # mean_run falls as delta rises
    if mean_run(hi) >= arl0:
        return 0.5
    for _ in range(12):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_run(mid) >= arl0 else (lo, mid)
    return float(f"{10**lo:.3g}")


# --- the streams ------------------------------------------------------------------------------


def first_after(next_alarm: NextAlarm, change: int) -> tuple[int, str | None] | None:
    """The first alarm at or after ``change``, the detector restarting after every earlier one."""
    begin = 0
    while (found := next_alarm(begin)) is not None:
        if found[0] >= change:
            return found
        begin = found[0] + 1
    return None


def median_interval(values: Sequence[int]) -> tuple[float | None, float | None, float | None]:
    """The median and its 95% interval from the order statistics (a binomial(n, 1/2) count).

    >>> median_interval(list(range(1, 101)))
    (50.5, 41, 61)
    """
    if not values:
        return None, None, None
    v = sorted(values)
    n = len(v)
    half = 1.96 * math.sqrt(n) / 2
    lo, hi = max(math.floor(n / 2 - half), 0), min(math.ceil(n / 2 + half), n - 1)
    return float(np.median(v)), v[lo], v[hi]


def run_length(calibrated: Calibrated, reps: int, seed: int) -> dict[str, dict[str, float]]:
    """Each detector's in-control run length on fresh streams: mean and its 95% interval.
    Each is started as after an alarm at event 0 (the dummy's next comes ARL0 events later;
    the others start afresh), so a run length is the index of the next alarm."""
    rng = np.random.default_rng(seed)
    horizon = int(HORIZON * calibrated.arl0)
    lengths: dict[str, list[int]] = {name: [] for name in DETECTORS}
    for _ in range(reps):
        counts = calibrated.model.sample(rng, horizon)
        for name, next_alarm in calibrated.detectors(counts, rng).items():
            found = next_alarm(1)
            lengths[name].append(horizon if found is None else found[0])
    out = {}
    for name, values in lengths.items():
        x = np.array(values, dtype=np.float64)
        half = 1.96 * float(x.std(ddof=1)) / math.sqrt(len(x)) if len(x) > 1 else float("nan")
        out[name] = {
            "mean": round(float(x.mean()), 1),
            "low": round(float(x.mean()) - half, 1),
            "high": round(float(x.mean()) + half, 1),
        }
    return out


def delays(
    calibrated: Calibrated, law: Floats, reps: int, seed: int
) -> dict[str, list[tuple[int, str | None] | None]]:
    """Per detector, per stream: (delay in events, alternative) of the first alarm within
    ARL0 events of the change, or None."""
    rng = np.random.default_rng(seed)
    after = int(calibrated.arl0)
    found: dict[str, list[tuple[int, str | None] | None]] = {name: [] for name in DETECTORS}
    for _ in range(reps):
        counts = np.vstack([calibrated.model.sample(rng, PRE), calibrated.model.sample(rng, after, law)])
        for name, next_alarm in calibrated.detectors(counts, rng).items():
            alarm = first_after(next_alarm, PRE)
            found[name].append(None if alarm is None else (alarm[0] - PRE + 1, alarm[1]))
    return found


def summarise(
    drift: str, found: Mapping[str, Sequence[tuple[int, str | None] | None]], rate: float
) -> dict[str, Any]:
    """One drift's row: per detector the share detected and the median delay; the joint
    detector's alternatives and isolation error."""
    row: dict[str, Any] = {"drift": drift, "expected": expected_alternative(drift)}
    for name, results in found.items():
        hits = [r for r in results if r is not None]
        median, low, high = median_interval([d for d, _ in hits])
        row[name] = {
            "detected": round(len(hits) / len(results), 3),
            "median_delay_events": median,
            "median_low": low,
            "median_high": high,
            "median_delay_minutes": None if median is None else round(median / rate * 60, 1),
        }
        if name == "joint":
            named = [a for _, a in hits]
            row[name]["alternatives"] = {a: named.count(a) for a in cusum.ALTERNATIVES}
            row[name]["isolation_error"] = (
                round(sum(a != row["expected"] for a in named) / len(named), 3) if named else None
            )
    return row


def checks(
    rows: Sequence[Mapping[str, Any]], arl: Mapping[str, Mapping[str, float]], arl0: float
) -> dict[str, Any]:
    """The issue's criteria, read off the rows (True/False, and where each fails)."""
    slower = [
        r["drift"]
        for r in rows
        if r["drift"].split(":", 1)[0] in QUALITY_KINDS
        and r["joint"]["median_delay_events"] is not None
        and (best := _faster_single(r)) is not None
        and r["joint"]["median_delay_events"] > best["median_high"]
    ]
    missed = [
        r["drift"]
        for r in rows
        if max(r["exact_cusum"]["detected"], r["synonym_cusum"]["detected"]) >= 0.5
        and r["joint"]["detected"] < 0.5
    ]
    paged = [
        r["drift"]
        for r in rows
        if r["drift"] == "synonyms:1" and r["joint"]["alternatives"]["quality_lost"] > 0
    ]
    named = sum(sum(r["joint"]["alternatives"].values()) for r in rows)
    wrong = sum(r["joint"]["alternatives"][a] for r in rows for a in cusum.ALTERNATIVES if a != r["expected"])
    joint_arl = arl["joint"]
    return {
        "joint_not_slower_than_faster_single": {"ok": not slower, "slower_on": slower},
        "joint_detects_what_a_single_detects": {"ok": not missed, "missed": missed},
        "synonyms_1_never_pages": {"ok": not paged, "paged_on": paged},
        "isolation_error": {
            "ok": named > 0 and wrong / named <= 0.10,
            "value": round(wrong / named, 3) if named else None,
        },
        "in_control_run_length": {
            "ok": joint_arl["low"] <= arl0 <= joint_arl["high"],
            "measured": joint_arl,
            "budget": arl0,
        },
    }


def _faster_single(row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    singles = [row[n] for n in ("exact_cusum", "synonym_cusum") if row[n]["median_delay_events"] is not None]
    return min(singles, key=lambda s: s["median_delay_events"]) if singles else None


# --- the command ------------------------------------------------------------------------------


@dataclass(frozen=True)
class GridConfig:
    arl0: float = 10_000.0
    rate_per_hour: float = 3000.0
    reps: int = 200
    window: int = 500
    seed: int = 7

    def __post_init__(self) -> None:
        if not self.arl0 >= 100:
            raise ValueError(f"--arl0 is a run length in events (>= 100), got {self.arl0:g}")
        if not self.rate_per_hour > 0:
            raise ValueError(f"--rate is events an hour (> 0), got {self.rate_per_hour:g}")
        if self.reps < 10:
            raise ValueError(f"--reps: at least 10 streams, got {self.reps}")
        if not 10 <= self.window <= PRE:
            raise ValueError(f"--window: 10 to {PRE} events, got {self.window}")


def simulate(
    model: Model, laws: Mapping[str, Floats], config: GridConfig, progress: ProgressFactory = no_progress
) -> dict[str, Any]:
    """The production-rate part: calibration, in-control run lengths, one row per drift."""
    calibrated = Calibrated(
        model, config.arl0, window=config.window, reps=config.reps, seed=config.seed, progress=progress
    )
    arl = run_length(calibrated, config.reps, config.seed + 1)
    tick = progress("drifted streams", len(laws))
    rows = []
    for i, (label, law) in enumerate(laws.items()):
        rows.append(
            summarise(label, delays(calibrated, law, config.reps, config.seed + 2 + i), config.rate_per_hour)
        )
        tick(1)
    return {
        "model": {
            "in_control": {
                "exact": round(float(model.p0[0]), 5),
                "synonym_only": round(float(model.p0[1]), 5),
                "miss": round(float(model.p0[2]), 5),
            },
            "mean_units": round(float(model.units.mean()), 3),
            "chance_hit": round(model.chance, 5),
            "laws": {label: [round(float(x), 5) for x in law] for label, law in laws.items()},
        },
        "arl0_events": config.arl0,
        "rate_per_hour": config.rate_per_hour,
        "reps": config.reps,
        "pre_change_events": PRE,
        "settings": calibrated.settings(),
        "in_control_run_length": arl,
        "rows": rows,
        "checks": checks(rows, arl, config.arl0),
    }


def markdown(result: Mapping[str, Any]) -> str:
    sim = result["streams"]
    lines = [
        f"# The detector benchmark at ARL0 = {sim['arl0_events']:,.0f} events",
        "",
        f"Feed: {result['feed']}; production-rate streams: {sim['reps']} per drift, "
        f"{sim['pre_change_events']:,} in-control events then the drift, "
        f"{sim['rate_per_hour']:,.0f} events an hour; "
        f"in-control law (exact, synonym-only, miss) = {tuple(sim['model']['in_control'].values())}, "
        f"{sim['model']['mean_units']} units an event.",
        "",
        f"In-control run length (mean, 95% interval), budget {sim['arl0_events']:,.0f}:",
        "",
        "| detector | mean | interval |",
        "|---|---|---|",
    ]
    for name, v in sim["in_control_run_length"].items():
        lines.append(f"| {name} | {v['mean']:,.0f} | {v['low']:,.0f}-{v['high']:,.0f} |")
    lines += [
        "",
        "Median delay in events (95% interval) [share detected within ARL0 events]; the joint "
        "detector's alternatives and isolation error:",
        "",
        "| drift | " + " | ".join(DETECTORS) + " | joint names | isolation error |",
        "|---|" + "---|" * (len(DETECTORS) + 2),
    ]
    for row in sim["rows"]:
        cells = [_cell(row[name]) for name in DETECTORS]
        names = ", ".join(f"{a} {n}" for a, n in row["joint"]["alternatives"].items() if n)
        err = row["joint"]["isolation_error"]
        lines.append(
            f"| {row['drift']} | "
            + " | ".join(cells)
            + f" | {names or '—'} | {'—' if err is None else f'{err:.1%}'} |"
        )
    lines += ["", "Checks:", ""]
    for name, check in sim["checks"].items():
        detail = {k: v for k, v in check.items() if k != "ok"}
        lines.append(f"- {name}: {'yes' if check['ok'] else 'NO'} {json.dumps(detail)}")
    lines += [
        "",
        "On the feed itself (sparse), delay in scored events (— = never): on the trailing baseline, "
        "as live (the control's own first alarm beside it: the feed's change, not the drift's), and "
        "against the counterfactual (each event judged by the control run around it: the drift alone).",
        "",
        "| drift | alternative | joint | control's own | exact_cusum | synonym_cusum "
        "| counterfactual: alternative | joint | exact_cusum | synonym_cusum |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["feed_rows"]:
        cells = [
            r[k] if k.endswith("alternative") or k == "drift" else _n(r[k])
            for k in FEED_KEYS
            if k != "delay_s"
        ]
        lines.append("| " + " | ".join(str(c or "—") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _n(value: Any) -> str:
    return "—" if value is None else f"{value:,.0f}"


def _cell(v: Mapping[str, Any]) -> str:
    if v["median_delay_events"] is None:
        return f"— [{v['detected']:.0%}]"
    return f"{v['median_delay_events']:,.0f} ({v['median_low']:,}-{v['median_high']:,}) [{v['detected']:.0%}]"


def run_grid(
    feed_path: str, backtest: BacktestConfig, config: GridConfig, progress: ProgressFactory = no_progress
) -> dict[str, Any]:
    """The walk, the feed's own rows and the production-rate streams (module doc)."""
    injections = backtest.parsed()
    feed: Feed = load_feed([feed_path], backtest, injections, progress, {})
    walk = Walk(feed, backtest, injections, 10, 10)
    walk.run(progress, {})
    feed_rows = diagnose(walk.control, walk.runs, feed.starts, feed.t_events, config.arl0)["diagnosis"]
    model, laws = model_of(walk.control, walk.runs, feed.starts, feed.t_events)
    return {
        "feed": feed_path,
        "feed_events": len(feed.events),
        "feed_rows": [{k: r[k] for k in FEED_KEYS} for r in feed_rows],
        "streams": simulate(model, laws, config, progress),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workers.commands.backtest.grid", description=__doc__.split("\n")[0]
    )
    parser.add_argument("feed")
    parser.add_argument("--out", type=Path, default=Path("grid"), help="directory for grid.json and grid.md")
    parser.add_argument("--arl0", type=float, default=GridConfig.arl0, help="in-control run length, events")
    parser.add_argument("--rate", type=float, default=GridConfig.rate_per_hour, help="events an hour")
    parser.add_argument("--reps", type=int, default=GridConfig.reps, help="streams per drift")
    parser.add_argument("--window", type=int, default=GridConfig.window, help="the window rules' events")
    parser.add_argument("--inject", action="append", default=None, help="KIND:AMOUNT[@TIME], repeatable")
    parser.add_argument("--limit", type=int, default=None, help="the first N tweets only")
    parser.add_argument("--model", default="minilm")
    args = parser.parse_args(argv)
    from workers.commands.console import with_progress

    try:
        config = GridConfig(arl0=args.arl0, rate_per_hour=args.rate, reps=args.reps, window=args.window)
        backtest = BacktestConfig(
            model=args.model,
            injections=tuple(args.inject or DEFAULT_DRIFTS),
            limit=args.limit,
            arl0=args.arl0,
        )
    except ValueError as exc:
        print(f"workers.commands.backtest.grid: {exc}", file=sys.stderr)
        return 2
    result = with_progress(lambda track: run_grid(args.feed, backtest, config, track))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "grid.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    text = markdown(result)
    (args.out / "grid.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
