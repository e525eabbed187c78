"""The change detector of ``reval backtest`` (:mod:`stream.cusum`): calibrated on the control
run before the first drift, run from each drift's start on the drifted run, beside the two
single-signal charts at the same ARL0; the ``diagnosis`` rows of ``detection.json``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from stream import cusum
from workers.commands.backtest.simulation import Scores

Floats = npt.NDArray[np.float64]


def _outcomes(col: Scores, rows: npt.NDArray[np.bool_]) -> cusum.Outcomes:
    return cusum.Outcomes.of(units=col.units[rows], exact_ratio=col.exact[rows], reval_ratio=col.reval[rows])


def diagnose(
    control: Scores,
    runs: Mapping[str, Scores],
    starts: Mapping[str, float],
    t_events: Floats,
    arl0: float,
) -> dict[str, Any]:
    """``{"detector": its design and calibration, "diagnosis": one row per drift}``.

    The in-control law is the control run's scored events before the earliest drift; each
    chart starts at zero when its drift starts (the delay of a chart that was quiet then);
    ``delay_events`` counts scored events from the start to the alarm, the alarm's included.
    """
    first = min(starts.values())
    scorable = ~np.isnan(control.reval) & (control.units > 0)
    reference = scorable & (t_events < first)
    if np.count_nonzero(reference) < 20:
        raise ValueError(f"only {np.count_nonzero(reference)} scored events before the first drift")
    outcomes = _outcomes(control, reference)
    p0 = cusum.in_control(outcomes)
    units = outcomes.units
    expected = control.expected[reference]
    known = ~np.isnan(expected)
    # The null recommender's hit chance per unit: its expected hit ratios, weighted by units.
    chance = float(np.average(expected[known], weights=units[known])) if known.any() else 0.0
    charts = cusum.design(p0, chance_hit=chance)
    thresholds, overlap = cusum.calibrate(p0, units, charts, arl0)
    singles = {"exact": cusum.exact_chart(p0), "synonym": cusum.synonym_chart(p0, chance_hit=chance)}
    single_thresholds = {
        name: cusum.calibrate(p0, units, {name: llr}, arl0)[0][name] for name, llr in singles.items()
    }

    def delays(col: Scores, start: float) -> tuple[dict[str, int | None], npt.NDArray[np.int64]]:
        rows = ~np.isnan(col.reval) & (col.units > 0) & (t_events >= start)
        counts = _outcomes(col, rows).counts
        found = {}
        for name, llr in {**charts, **singles}.items():
            limit = thresholds.get(name, single_thresholds.get(name))
            assert limit is not None
            found[name] = cusum.first_alarm(counts @ llr, limit)
        return found, np.flatnonzero(rows)

    rows_out = []
    for label, col in runs.items():
        start = starts[label]
        found, at = delays(col, start)
        by_alternative: dict[str, int] = {}
        for name in charts:
            index = found[name]
            key = cusum.alternative_of(name)
            if index is not None and (key not in by_alternative or index < by_alternative[key]):
                by_alternative[key] = index
        # The first alternative to cross; a tie pages (quality_lost first in ALTERNATIVES).
        alternative = (
            min(by_alternative, key=lambda n: (by_alternative[n], cusum.ALTERNATIVES.index(n)))
            if by_alternative
            else None
        )
        hit = by_alternative[alternative] if alternative is not None else None

        rows_out.append(
            {
                "drift": label,
                "arl0_events": arl0,
                "alternative": alternative,
                "delay_events": None if hit is None else hit + 1,
                "delay_s": None if hit is None else round(float(t_events[at[hit]] - start), 1),
                "exact_cusum_delay_events": _events(found["exact"]),
                "synonym_cusum_delay_events": _events(found["synonym"]),
                "quality_lost_delay_events": _events(by_alternative.get("quality_lost")),
                "wording_changed_delay_events": _events(by_alternative.get("wording_changed")),
            }
        )
    # The control run from the earliest drift on, with restarts: its false alarms.
    _, at = delays(control, first)
    counts = _outcomes(control, np.isin(np.arange(len(t_events)), at)).counts
    alarms = _union_alarms({n: counts @ llr for n, llr in charts.items()}, thresholds)
    return {
        "detector": {
            "design": "multi-chart CUSUM on (exact, synonym-only, miss) per unit (stream.cusum)",
            "arl0_events": arl0,
            "in_control": {"exact": p0[0], "synonym_only": p0[1], "miss": p0[2]},
            "reference_events": int(np.count_nonzero(reference)),
            "chance_hit": round(chance, 6),
            "llr": {name: [round(float(x), 6) for x in llr] for name, llr in {**charts, **singles}.items()},
            "thresholds": {
                **{n: round(h, 4) for n, h in thresholds.items()},
                **{n: round(h, 4) for n, h in single_thresholds.items()},
            },
            "overlap": round(overlap, 4),
            "control_events_after_first_drift": len(at),
            "control_false_alarms": alarms,
        },
        "diagnosis": rows_out,
    }


def _events(index: int | None) -> int | None:
    """Scored events until the alarm, the alarm's included."""
    return None if index is None else index + 1


def _union_alarms(increments: Mapping[str, Floats], thresholds: Mapping[str, float]) -> int:
    """How many times the union of charts alarms over a run, every chart restarting at zero
    after each alarm."""
    alarms, begin, n = 0, 0, len(next(iter(increments.values()), np.zeros(0)))
    while begin < n:
        hits = [
            h
            for name, inc in increments.items()
            if (h := cusum.first_alarm(inc[begin:], thresholds[name])) is not None
        ]
        if not hits:
            break
        alarms += 1
        begin += min(hits) + 1
    return alarms
