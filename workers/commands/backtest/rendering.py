"""The files of ``reval backtest``: ``detection.json`` (the contract), ``detection.md``,
``series.json``, and the Prometheus TSDB blocks of ``--backfill``."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from stream.evaluation import signals
from stream.monitoring import backtest as bt
from workers.adapters.prometheus.backfill import Family, Series, counter_at, create_blocks, write_openmetrics
from workers.adapters.prometheus.exporter import CORRECTED_COUNTERS
from workers.commands.backtest.analysis import Backtest
from workers.commands.backtest.simulation import EMBEDDING_ALPHA, EMBEDDING_SIGNAL, iso
from workers.commands.evaluate_outputs import check_results_dir
from workers.commands.report_values import NO_MATCH

#: A run directory's files; the detector benchmark's (``python -m workers.commands.backtest.grid
#: FEED --out DIR``) may sit beside them, for ``reval report`` to show.
RESULT_FILES = frozenset(
    {"detection.json", "detection.md", "series.json", "report.html", "grid.json", "grid.md"}
)


def markdown(result: Backtest) -> str:
    """The detection table: one row per drift, one column per signal."""
    s = result.summary
    names = [*bt.SIGNALS, EMBEDDING_SIGNAL]
    header = "| drift | " + " | ".join(names) + " |"
    lines = [
        f"# Drift-detection backtest: {s['recommender']}, alert k={s['alert_k']}, r={s['alert_r']}",
        "",
        f"Feed: {', '.join(s['feeds'])}; {s['events']:,} events ({s['scored_events']:,} scored) from "
        f"{s['period']['first_event'][:10]} to {s['period']['last_event'][:10]} "
        f"({s['period']['days']} days); "
        f"{s['refits']} refits; rule durations x{s['time_scale']:g} "
        f"(quality window {bt.duration_text(s['rules']['quality_window'])}, holding at least "
        f"{s['rules']['min_events']} events at {s['instants_with_enough_events']:.0%} of the instants).",
        "",
        "Detection delay: event time from the injection to the first alarm the control run does not "
        "raise within the signal's hold time either side (the runs share every event before the drift: "
        "a threshold the control crosses a moment later is its own alarm), and (in brackets) the events "
        "scored meanwhile; — = never fired.",
        "",
        header,
        "|" + "---|" * (len(names) + 1),
    ]
    delay = {(row["drift"], row["signal"]): row["delay_s"] for row in result.rows}
    count = {(row["drift"], row["signal"]): row["delay_events"] for row in result.rows}

    def cell(drift: str, name: str) -> str:
        if delay[drift, name] is None:
            return "—"
        return f"{bt.duration_text(delay[drift, name])} ({count[drift, name]:,} ev)"

    for drift in dict.fromkeys(row["drift"] for row in result.rows):
        lines.append(f"| {drift} | " + " | ".join(cell(drift, n) for n in names) + " |")
    fa = {row["signal"]: row["false_alarms_per_day"] for row in result.rows}
    lines.append("| false alarms / day (control) | " + " | ".join(f"{fa[n]:.3f}" for n in names) + " |")
    lines += _diagnosis_lines(s)
    lines += [
        "",
        f"The drop rules (reval_drop, exact_drop, semantic_gap) can fire only where the quality window "
        "holds enough events and some baseline offset's window has events "
        f"({s['instants_drop_rules_evaluable']:.0%} of the instants), and fire only once that held "
        "for the whole hold time: the earliest possible drop alarm after each injection (below) "
        "bounds its drop delays from below, whatever the drift.",
        "",
        "Means after the injection (control → drifted):",
        "",
    ]
    lines += [
        "| drift | events | earliest possible drop alarm | #REval | precision form | corrected | exact "
        "| unknown share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for drift, e in s["effects"].items():
        cells = [bt.duration_text(e["earliest_possible_drop_delay_s"])] + [
            f"{e[m]['control']} → {e[m]['drifted']}" for m in bt.EFFECTS
        ]
        lines.append(f"| {drift} | {e['events_after']:,} | " + " | ".join(cells) + " |")
    lines += kept_meaning(s["effects"], s["rules"]["skill_loss_fraction"])
    e = s["embedding_drift"]
    if e["tests"]:
        lines += [
            "",
            f"Embedding drift (MMD on tweet embeddings, the last refit interval against the one before, "
            f"at each of {len(e['tests'])} refits): p <= {e['alpha']} at {e['alarms']} "
            f"({e['alarm_rate']:.0%}); the same test between two random halves of one interval (no drift "
            f"by construction) alarms at {e['calibration_alarm_rate']:.0%}. The injected drifts change "
            "recommendations, not tweets: this test cannot see them, and its alarms are the feed's own "
            "changes of topic.",
        ]
    lines += _curves_markdown(s["curves"])
    lines += ["", "Goal (#REval no later than exact with no more false alarms; quiet on synonyms):", ""]
    for kind, met in s["goal"].items():
        lines.append(f"- {kind}: {GOAL_WORDS[met]}")
    lines += _matched_markdown(s.get("goal_matched") or {}, s["curves"])
    return "\n".join(lines) + "\n"


def _matched_markdown(matched: dict[str, Any], curves: dict[str, Any]) -> list[str]:
    """The goal at one false-alarm rate (:func:`workers.commands.backtest.analysis.matched_goal`)."""
    if not matched:
        return []
    parameter = curves["exact_drop"]["parameter"]
    lines = [
        "",
        "At matched false alarms (exact match's fastest threshold whose control raises no more false "
        "alarms a day than the #REval alert):",
        "",
    ]
    for m in matched.values():
        exact = (
            f"{bt.duration_text(m['exact_delay_s'])} ({parameter} {m['exact_threshold']:g})"
            if m["exact_delay_s"] is not None
            else NO_MATCH
        )
        lines.append(
            f"- {m['drift']} (<= {m['false_alarms_per_day']:.3f} a day): #REval alert "
            f"{bt.duration_text(m['reval_delay_s'])}, exact match {exact}: {GOAL_WORDS[m['met']]}"
        )
    return lines


#: How the goal line reads each outcome (None: neither alert fired on the drift).
GOAL_WORDS = {True: "met", False: "not met", None: "not decided (neither alert fired)"}


def kept_meaning(effects: dict[str, Any], fraction: float) -> list[str]:
    """A note naming the drifts whose precision form (what the #REval alert tests) fell by
    less than half the loss the alert tests for: each of their events is more likely under
    "kept its baseline" than under "lost ``fraction``", so the alert gathers no evidence
    from them however long they last.  By #REval such a drift keeps most of the meaning,
    whatever exact match says (a synonym drift; or a random one where random hashtags earn
    as much synonym credit as the recommender's own misses).

    >>> effects = {"random:0.5": {"precision_after": {"control": 0.06, "drifted": 0.03}},
    ...            "synonyms:1": {"precision_after": {"control": 0.06, "drifted": 0.057}}}
    >>> kept_meaning(effects, 0.5)[1].rsplit(": ", 1)[1]
    'synonyms:1 (-5%).'
    """
    kept = []
    for drift, e in effects.items():
        control, drifted = e["precision_after"]["control"], e["precision_after"]["drifted"]
        if control and drifted is not None and 1.0 - drifted / control < fraction / 2.0:
            kept.append(f"{drift} ({drifted / control - 1.0:+.0%})")
    if not kept:
        return []
    return [
        "",
        f"The #REval alert tests for a loss of {fraction:.0%} of the precision form; a drift that "
        f"costs less than {fraction / 2:.0%} of it adds no evidence however long it lasts (by #REval it "
        f"keeps most of the meaning): {', '.join(kept)}.",
    ]


def _curves_markdown(curves: dict[str, Any]) -> list[str]:
    """One table per signal: each threshold's false alarms per day and delay per drift."""
    lines = [
        "",
        "Operating curves: each signal at other thresholds (the deployed one in bold), false alarms "
        "per day of the control run against the delay per drift (— = never fired):",
    ]
    for signal, curve in curves.items():
        drifts = list(curve["points"][0]["delays"]) if curve["points"] else []
        lines += [
            "",
            f"`{signal}` by `{curve['parameter']}`:",
            "",
            "| " + " | ".join([curve["parameter"], "false alarms / day", *drifts]) + " |",
            "|" + "---|" * (2 + len(drifts)),
        ]
        for point in curve["points"]:
            value = f"{point['value']:g}"
            if point.get("deployed"):
                value = f"**{value}**"
            cells = [bt.duration_text(point["delays"][d]) for d in drifts]
            lines.append(f"| {value} | {point['false_alarms_per_day']:.3f} | " + " | ".join(cells) + " |")
    return lines


def _diagnosis_lines(s: dict[str, Any]) -> list[str]:
    """The change detector's table (stream.monitoring.cusum): which alternative, how many events."""
    d = s["detector"]

    def ev(value: int | None) -> str:
        return "—" if value is None else f"{value:,}"

    lines = [
        "",
        f"## Change detector (multi-chart CUSUM, ARL0 = {d['arl0_events']:,.0f} events)",
        "",
        f"In control (the control run's {d['reference_events']:,} events before the first drift), per "
        f"unit: exact {d['in_control']['exact']:.3f}, synonym-only {d['in_control']['synonym_only']:.3f}, "
        f"miss {d['in_control']['miss']:.3f}; chance hit {d['chance_hit']:.3f}. The control run raised "
        f"{d['control_false_alarms']} alarms over its {d['control_events_after_first_drift']:,} events "
        "after the first drift.",
        "",
        "| drift | alternative | delay (events) | delay | the control's own alarm | exact-only CUSUM | "
        "synonym-only CUSUM | the live detector |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in s["diagnosis"]:
        when = "—" if row["delay_s"] is None else bt.duration_text(row["delay_s"])
        live = (
            f"{row['live_alternative']} after {ev(row['live_delay_events'])}"
            if row.get("live_alternative")
            else "—"
        )
        lines.append(
            f"| {row['drift']} | {row['alternative'] or '—'} | {ev(row['delay_events'])} | {when} | "
            f"{ev(row['control_delay_events'])} | {ev(row['exact_cusum_delay_events'])} | "
            f"{ev(row['synonym_cusum_delay_events'])} | {live} |"
        )
    live_block = d.get("live")
    if live_block is not None:
        lines += [
            "",
            "The live detector (`stream.monitoring.cusum.Detector`, as the score workers run it: "
            "calibrated on the "
            f"same {live_block['reference_events']:,} events, fed the worker's batches, never restarted at a "
            f"drift's start) raised {live_block['control_alarms']} alarms on the control run after the first "
            "drift.",
        ]
    cf = d.get("counterfactual")
    if cf is not None and all("counterfactual_alternative" in row for row in s["diagnosis"]):
        lines += [
            "",
            f"Against the counterfactual (each event judged by what the control run did on the "
            f"{cf['half_window_events']} events either side of it: the drift alone, without the feed's own "
            f"swings; a backtest's look ahead, not a live chart): the control run raises "
            f"{cf['control_false_alarms']} alarms.",
            "",
            "| drift | alternative | delay (events) | exact-only CUSUM | synonym-only CUSUM |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {row['drift']} | {row['counterfactual_alternative'] or '—'} | "
            f"{ev(row['counterfactual_delay_events'])} | "
            f"{ev(row['counterfactual_exact_cusum_delay_events'])} | "
            f"{ev(row['counterfactual_synonym_cusum_delay_events'])} |"
            for row in s["diagnosis"]
        ]
    return lines


def write_outputs(result: Backtest, out_dir: Path) -> Path:
    """``detection.json`` (the contract: ``signals`` rows), ``detection.md``, ``series.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    detection = {
        "signals": result.rows,
        **result.summary,
        "config": asdict(result.config),
        "timings": result.timings,
        "signal_rules": {
            **bt.SIGNALS,
            EMBEDDING_SIGNAL: f"MMD test on tweet embeddings, last refit interval vs the one before, "
            f"p <= {EMBEDDING_ALPHA} (stream.monitoring.mmd)",
        },
    }
    (out_dir / "detection.json").write_text(json.dumps(detection, indent=2) + "\n")
    (out_dir / "detection.md").write_text(markdown(result))
    (out_dir / "series.json").write_text(json.dumps(result.series) + "\n")
    return out_dir


def _families() -> dict[str, Family]:
    """The metric families the scoring workers export, empty."""
    return {
        **{signal.key: Family(signal.key, "summary", signal.help, []) for signal in signals.SIGNALS},
        **{
            f"{signal.key}_squares": Family(f"{signal.key}_squares", "counter", signal.squares, [])
            for signal in signals.SIGNALS
            if signal.squares is not None
        },
        **{
            f"reval_corrected_{what}": Family(f"reval_corrected_{what}", "counter", help_text, [])
            for what, help_text in CORRECTED_COUNTERS.items()
        },
        "reval_exact_match": Family(
            "reval_exact_match", "summary", "Exact-match metric of scored events", []
        ),
        "reval_events": Family("reval_events", "counter", "Recommendation events by outcome", []),
        "reval_recommended_hashtags": Family(
            "reval_recommended_hashtags", "counter", "Recommended hashtags scored", []
        ),
        "reval_recommended_unknown_hashtags": Family(
            "reval_recommended_unknown_hashtags", "counter", "Recommended hashtags the thesaurus lacks", []
        ),
    }


def backfill(result: Backtest, out_dir: Path, *, interval_s: float = 900.0) -> dict[str, Any]:
    """What the scoring workers would have exported, at event time, as Prometheus TSDB
    blocks in ``out_dir`` (:mod:`workers.adapters.prometheus.backfill`): one sample every
    ``interval_s`` of event time from the first event to the last.  The control run is
    recommender ``<name>``, each drifted run ``<name>+<drift>``; every k for the control,
    the alert k for the drifted runs (the size stays in the low millions of samples)."""
    if not interval_s > 0:
        raise ValueError(f"the backfill interval must be positive, got {interval_s}")
    t = result.t_events
    at = np.arange(np.floor(t[0] / interval_s) * interval_s, t[-1] + interval_s, interval_s)
    s = result.summary
    k, r = s["alert_k"], str(s["alert_r"])
    base = {"job": "reval-score", "instance": "backtest"}
    families = _families()

    def add(family: str, labels: dict[str, str], values: npt.NDArray[np.float64], summary: bool) -> None:
        ok = (~np.isnan(values)).astype(np.float64)
        if summary:
            families[family].series.append(Series(labels, at, counter_at(t, values, at), "_sum"))
            families[family].series.append(Series(labels, at, counter_at(t, ok, at), "_count"))
        else:
            families[family].series.append(Series(labels, at, counter_at(t, values, at), "_total"))

    for drift, col in result.scores.items():
        name = s["recommender"] if not drift else f"{s['recommender']}+{drift}"
        who = {**base, "recommender": name}
        for i, kk in enumerate(result.ks):
            if drift and kk != k:
                continue
            add("reval_hit_ratio", {**who, "k": str(kk), "r": r}, col.by_k[:, i], True)
        for signal in signals.SIGNALS:  # #REval itself above, at every k
            values = col.values[signal.key]
            if signal.key != "reval_hit_ratio":
                add(signal.key, {**who, "k": str(k), "r": r}, values, True)
            if signal.squares is not None:
                squares = np.where(np.isnan(values), 0.0, values**2)
                add(f"{signal.key}_squares", {**who, "k": str(k), "r": r}, squares, False)
        with_chance = ~np.isnan(col.reval) & ~np.isnan(col.expected)
        for what, values in (
            ("observed", col.reval),
            ("expected", col.expected),
            ("events", np.ones_like(col.reval)),
        ):
            add(
                f"reval_corrected_{what}",
                {**who, "k": str(k), "r": r},
                np.where(with_chance, values, 0.0),
                False,
            )
        add("reval_exact_match", {**who, "metric": "hit_ratio", "r": r}, col.exact, True)
        scored = np.where(np.isnan(col.reval), 0.0, 1.0)
        add("reval_events", {**who, "outcome": "scored"}, scored, False)
        add("reval_events", {**who, "outcome": "unscorable"}, 1.0 - scored, False)
        add("reval_recommended_hashtags", who, np.where(scored > 0, col.recommended, 0.0), False)
        add("reval_recommended_unknown_hashtags", who, np.where(scored > 0, col.unknown, 0.0), False)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = out_dir / "backfill.om.txt"
    with text.open("w", encoding="utf-8") as fh:
        samples = write_openmetrics(families.values(), fh)
    try:
        blocks = create_blocks(text, out_dir)
    finally:
        text.unlink()
    return {
        "dir": str(out_dir),
        "blocks": [b.name for b in blocks],
        "samples": samples,
        "series": sum(len(f.series) for f in families.values()),
        "interval_s": interval_s,
        "from": iso(float(at[0])),
        "to": iso(float(at[-1])),
    }


def check_out(out_dir: Path, *, replace: bool) -> None:
    check_results_dir(out_dir, replace=replace, files=RESULT_FILES, command="reval backtest")
