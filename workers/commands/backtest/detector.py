"""The change detector of ``reval backtest`` (:mod:`stream.monitoring.cusum`): calibrated on the control
run before the first drift, run from each drift's start on the drifted run, beside the two
single-signal charts at the same ARL0, on the trailing baseline (what a live chart has) and
against the counterfactual (the control run around each event: the drift alone); the
``diagnosis`` rows of ``detection.json``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from stream.monitoring import cusum
from workers.commands.backtest.simulation import Scores

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Laws = dict[str, Floats]

#: The in-control law of an event: the outcomes of the BASELINE_WINDOW scored events that end
#: BASELINE_LAG events before it (stream.monitoring.cusum.trailing_laws) -- a feed's hit rates wander
#: (topics come and go, the recommender is refitted), a change younger than the lag does not
#: leak into its own baseline; the first events take the reference law.
BASELINE_WINDOW = 1000
BASELINE_LAG = 300
#: The counterfactual reference (a backtest has one, live has none): each event of a drifted
#: run judged against the control run's outcomes on the PAIRED_HALF scored events either side
#: of it (stream.monitoring.cusum.centred_laws) -- what the same recommender did there without the drift.
#: It takes the feed's own swings out of the comparison (a recommender gone stale when a new
#: crisis starts is a real loss of quality, which the trailing baseline rightly alarms on,
#: in the control run as well), so the delays measure the drift alone.
PAIRED_HALF = 50


def scored(col: Scores) -> npt.NDArray[np.bool_]:
    """The events a chart reads: scored, with at least one unit."""
    return ~np.isnan(col.reval) & (col.units > 0)


def outcomes(col: Scores, rows: npt.NDArray[np.bool_]) -> cusum.Outcomes:
    return cusum.Outcomes.of(units=col.units[rows], exact_ratio=col.exact[rows], reval_ratio=col.reval[rows])


def diagnose(
    control: Scores,
    runs: Mapping[str, Scores],
    starts: Mapping[str, float],
    t_events: Floats,
    arl0: float,
) -> dict[str, Any]:
    """``{"detector": its design and calibration, "diagnosis": one row per drift}``.

    The reference law (the control run's scored events before the earliest drift) sets the
    thresholds; each event is judged against its trailing baseline (:data:`BASELINE_WINDOW`);
    each chart starts at zero when its drift starts (the delay of a chart that was quiet then);
    ``delay_events`` counts scored events from the start to the alarm, the alarm's included.
    """
    first = min(starts.values())
    scorable = scored(control)
    reference = scorable & (t_events < first)
    if np.count_nonzero(reference) < 20:
        raise ValueError(f"only {np.count_nonzero(reference)} scored events before the first drift")
    base = outcomes(control, reference)
    p0 = cusum.in_control(base)
    units = base.units
    expected = control.expected[reference]
    known = ~np.isnan(expected)
    # The null recommender's hit chance per unit: its expected hit ratios, weighted by units.
    chance = float(np.average(expected[known], weights=units[known])) if known.any() else 0.0
    charts = cusum.design(p0, chance_hit=chance)
    thresholds, overlap = cusum.calibrate(p0, units, charts, arl0, chance_hit=chance)
    singles = {"exact": cusum.exact_chart(p0), "synonym": cusum.synonym_chart(p0, chance_hit=chance)}
    single_thresholds = {
        name: cusum.calibrate(p0, units, {name: llr}, arl0)[0][name] for name, llr in singles.items()
    }

    # The counterfactual law of every event of the feed (the reference law where the control
    # scored nothing).
    control_rows = scorable  # the same rows: the control's scored events
    paired = np.tile(p0, (len(control.reval), 1))
    paired[control_rows] = cusum.centred_laws(outcomes(control, control_rows).counts, half=PAIRED_HALF)

    def delays(
        col: Scores, start: float, *, counterfactual: bool = False
    ) -> tuple[dict[str, int | None], list[tuple[int, str]], npt.NDArray[np.int64]]:
        """From ``start`` on (on the trailing baseline, or the counterfactual one): each
        single-signal chart's first alarm, the detector's alarms (index, alternative; the
        charts restarting after each) and the scored events' indices."""
        rows = scored(col)
        counts = outcomes(col, rows).counts
        at = np.flatnonzero(rows)
        laws = (
            paired[at]
            if counterfactual
            else cusum.trailing_laws(counts, window=BASELINE_WINDOW, lag=BASELINE_LAG, start=p0)
        )
        after = t_events[at] >= start
        counts, laws = counts[after], laws[after]
        ratios = cusum.design(laws, chance_hit=chance)
        steps = {name: cusum.increments(counts, ratios[name]) for name in charts}
        singles_found = {
            "exact": cusum.first_alarm(
                cusum.increments(counts, cusum.exact_chart(laws)), single_thresholds["exact"]
            ),
            "synonym": cusum.first_alarm(
                cusum.increments(counts, cusum.synonym_chart(laws, chance_hit=chance)),
                single_thresholds["synonym"],
            ),
        }
        return singles_found, cusum.run_alarms(counts, steps, thresholds, laws, chance), at[after]

    def first_of(alarms: list[tuple[int, str]]) -> dict[str, int]:
        """Each alternative's first alarm."""
        out: dict[str, int] = {}
        for index, alternative in alarms:
            out.setdefault(alternative, index)
        return out

    rows_out = []
    for label, col in runs.items():
        start = starts[label]
        found, alarms, at = delays(col, start)
        # The control run from the same start: an alarm it raises as early is the feed's own
        # change, not the drift's (the runs share every event before the start).
        _, own, _ = delays(control, start)
        by_alternative = first_of(alarms)
        hit, alternative = alarms[0] if alarms else (None, None)
        versus, versus_alarms, _ = delays(col, start, counterfactual=True)
        paired_hit, paired_alternative = versus_alarms[0] if versus_alarms else (None, None)

        rows_out.append(
            {
                "drift": label,
                "arl0_events": arl0,
                "alternative": alternative,
                "delay_events": _events(hit),
                "delay_s": None if hit is None else round(float(t_events[at[hit]] - start), 1),
                "control_delay_events": _events(own[0][0]) if own else None,
                "exact_cusum_delay_events": _events(found["exact"]),
                "synonym_cusum_delay_events": _events(found["synonym"]),
                "quality_lost_delay_events": _events(by_alternative.get("quality_lost")),
                "wording_changed_delay_events": _events(by_alternative.get("wording_changed")),
                "counterfactual_alternative": paired_alternative,
                "counterfactual_delay_events": _events(paired_hit),
                "counterfactual_exact_cusum_delay_events": _events(versus["exact"]),
                "counterfactual_synonym_cusum_delay_events": _events(versus["synonym"]),
            }
        )
    live = _live(control, runs, starts, t_events, arl0, int(np.count_nonzero(reference)))
    for row in rows_out:
        row.update(live["rows"][row["drift"]])
    # The control run from the earliest drift on, with restarts: its false alarms -- on the
    # trailing baseline, and against its own counterfactual (itself, around each event).
    _, control_alarms, at = delays(control, first)
    _, control_alarms_cf, _ = delays(control, first, counterfactual=True)
    return {
        "detector": {
            "design": "multi-chart CUSUM on (exact, synonym-only, miss) per unit (stream.monitoring.cusum)",
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
            "baseline": {"window_events": BASELINE_WINDOW, "lag_events": BASELINE_LAG},
            "control_events_after_first_drift": len(at),
            "control_false_alarms": len(control_alarms),
            "counterfactual": {
                "half_window_events": PAIRED_HALF,
                "control_false_alarms": len(control_alarms_cf),
            },
            "live": live["detector"],
        },
        "diagnosis": rows_out,
    }


#: A score worker's batch (``REVAL_SCORE_BATCH_SIZE``'s default; the live detector is fed batch
#: by batch; its alarms do not depend on the batches, only on the order of the events).
LIVE_BATCH = 1024


def _live(
    control: Scores,
    runs: Mapping[str, Scores],
    starts: Mapping[str, float],
    t_events: Floats,
    arl0: float,
    reference: int,
) -> dict[str, Any]:
    """What the live detector (:class:`stream.monitoring.cusum.Detector`, as the score workers run it)
    raises on each run: calibrated on the control's scored events before the first drift
    (the runs share them), then fed each run's scored events in order, never restarted at a
    drift's start.  Per drift: the first alarm at or after its start, its alternative and its
    delay in scored events; for the control: its alarms after the first drift."""

    def scored_of(col: Scores) -> tuple[npt.NDArray[np.int64], Ints, Floats]:
        rows = scored(col)
        return np.flatnonzero(rows), outcomes(col, rows).counts, col.expected[rows]

    _, counts, chance = scored_of(control)
    base = cusum.Detector(arl0, reference=reference)
    base.update(counts[:reference], chance[:reference])
    state = base.to_state()

    def alarms(col: Scores) -> tuple[npt.NDArray[np.int64], list[cusum.Alarm]]:
        where, c, q = scored_of(col)
        d = cusum.Detector.from_state(state)
        found = [
            a
            for lo in range(reference, len(c), LIVE_BATCH)
            for a in d.update(c[lo : lo + LIVE_BATCH], q[lo : lo + LIVE_BATCH])
        ]
        return where, found

    rows: dict[str, dict[str, Any]] = {}
    for label, col in runs.items():
        where, found = alarms(col)
        after = int(np.searchsorted(t_events[where], starts[label], side="left"))  # first scored at/after
        first = next((a for a in found if a.event - 1 >= after), None)
        rows[label] = {
            "live_alternative": None if first is None else first.alternative,
            "live_delay_events": None if first is None else first.event - after,
        }
    where, found = alarms(control)
    after = int(np.searchsorted(t_events[where], min(starts.values()), side="left"))
    return {
        "rows": rows,
        "detector": {
            "reference_events": reference,
            "thresholds": {n: round(h, 4) for n, h in base.thresholds.items()},
            "control_alarms": sum(1 for a in found if a.event - 1 >= after),
        },
    }


def _events(index: int | None) -> int | None:
    """Scored events until the alarm, the alarm's included."""
    return None if index is None else index + 1
