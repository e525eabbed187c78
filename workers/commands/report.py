"""``reval report``: one self-contained HTML page that explains a ``reval backtest`` run.

Reads ``detection.json`` (required) and ``series.json`` (the plots over event time) from
the run's directory and writes ``report.html``: no server, no network, no scripts, no
external CSS or fonts -- every plot is an inline SVG drawn by matplotlib
(:mod:`workers.commands.report_plots`), so the file can be mailed, attached to a ticket or
opened from disk years later and look the same.

The page is the Jinja2 template ``templates/report.html.j2`` with autoescape on: this
module turns the run's JSON into the template's context (text, :class:`~.report_values.Table`,
:class:`~.report_plots.Plot`); nothing from the JSON reaches the page unescaped.  Every value
may be null (a signal that never fired, a metric with no events in its window, a refit with
nothing to compare): nulls become gaps in plots and ``—`` in tables.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from stream.monitoring.backtest import EFFECTS, duration_text
from workers.commands import report_plots as plots
from workers.commands import report_values as rv
from workers.commands.report_values import Note, Table

__all__ = ["render", "write_report"]


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the report of the backtest in ``run_dir`` to ``out`` (default
    ``run_dir / "report.html"``) and return its path.  Raises ``ValueError`` when
    ``detection.json`` (or a present ``series.json``) is missing or malformed."""
    run_dir = Path(run_dir)
    detection = _load_detection(run_dir / "detection.json")
    series = _load_series(run_dir / "series.json")
    grid = _read_json(run_dir / "grid.json") if (run_dir / "grid.json").exists() else None
    out = run_dir / "report.html" if out is None else Path(out)
    out.write_text(render(detection, series, run_name=str(run_dir), grid=grid), encoding="utf-8")
    return out


@cache
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("workers.commands", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    return env.get_template("report.html.j2")


def render(d: dict[str, Any], series: dict[str, Any] | None, run_name: str = "", grid: Any = None) -> str:
    """The whole HTML page for a loaded ``detection.json`` and ``series.json`` (and the
    detector benchmark's ``grid.json`` where it sits beside them)."""
    heading = (
        f"Drift-detection backtest: {rv.text(d.get('recommender'))}, "
        f"alert k={rv.text(d.get('alert_k'))}, r={rv.text(d.get('alert_r'))}"
    )
    return (
        _template().render(
            heading=heading,
            run=_run(d, run_name),
            metrics=_metrics(d, series),
            k_curve=_k_curve(d),
            detection=_detection(d),
            thesaurus=_thesaurus(d),
            slices=_slices(d),
            audit=_audit(d),
            detector=_detector(d),
            grid=_grid(grid),
        )
        + "\n"
    )


# --- input ----------------------------------------------------------------------------


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{path}: not found (write it with `reval backtest FEED --out DIR`)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot be read ({e})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None


def _load_detection(path: Path) -> dict[str, Any]:
    """The one thing the report cannot do without: an object with a list of signal rows."""
    data = _read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    signals = data.get("signals")
    if not isinstance(signals, list):
        raise ValueError(f"{path}: 'signals' must be a list of rows, got {type(signals).__name__}")
    for i, row in enumerate(signals):
        if not isinstance(row, dict) or not isinstance(row.get("signal"), str):
            raise ValueError(f"{path}: signals[{i}] must be an object with a string 'signal'")
        if not isinstance(row.get("drift"), str):
            raise ValueError(f"{path}: signals[{i}] must have a string 'drift'")
    return data


def _load_series(path: Path) -> dict[str, Any] | None:
    """Only the plots over event time need it, so a run without one still gets a report."""
    if not path.exists():
        return None
    data = _read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("t"), list):
        raise ValueError(f"{path}: expected an object with a list 't' of times")
    return data


# --- the sections ----------------------------------------------------------------------


def _drifts(d: dict[str, Any], series: dict[str, Any] | None) -> list[str]:
    """Every drift the run knows of, in the order it was injected."""
    names = [row["drift"] for row in d["signals"]]
    for more in (rv.get_in(d, "effects"), rv.get_in(series, "drifts")):
        names += list(more) if isinstance(more, dict) else []
    return list(dict.fromkeys(str(n) for n in names))


def _time_scale(d: dict[str, Any]) -> str:
    """What the time scale means: a sparse feed needs longer windows to hold enough events."""
    scale = rv.num(d.get("time_scale"))
    window = rv.num(rv.get_in(d, "rules", "quality_window"))
    if scale is None or scale <= 0:
        return "—"
    if scale == 1:
        return "×1: the alert rules' durations as in production"
    how = "sparser" if scale > 1 else "denser"
    text = (
        f"×{scale:g}: the feed is {how} than production traffic, so every duration in the alert "
        "rules (windows, baselines, 'for' clauses) is multiplied by this factor"
    )
    if window is not None:
        text += (
            f" — the {duration_text(window / scale)} quality window becomes "
            f"{duration_text(window)} of event time"
        )
    return text


def _run(d: dict[str, Any], run_name: str) -> list[tuple[str, str]]:
    """What was run, in words, for someone who did not run it."""
    share = rv.num(d.get("instants_with_enough_events"))
    feeds = d.get("feeds")
    feed = ", ".join(map(str, feeds)) if isinstance(feeds, list) else feeds
    enough = (
        "—"
        if share is None
        else f"{share:.0%} of the evaluation instants hold at least "
        f"{rv.get_in(d, 'rules', 'min_events') or '?'} events in the quality window (elsewhere the "
        "quality rules cannot fire)"
    )
    injections = rv.get_in(d, "config", "injections")
    period = rv.get_in(d, "period")
    items = [
        ("recommender", d.get("recommender")),
        ("feed", feed),
        (
            "period",
            f"{rv.day(rv.get_in(period, 'first_event'))} to {rv.day(rv.get_in(period, 'last_event'))} "
            f"({rv.fmt(rv.get_in(period, 'days'), 'g')} days of event time)",
        ),
        (
            "events",
            f"{rv.count(d.get('events'))} recommendation events, {rv.count(d.get('scored_events'))} "
            f"scored; {rv.count(d.get('refits'))} refits",
        ),
        (
            "alert",
            f"#REval at k={rv.text(d.get('alert_k'))} synonyms, r={rv.text(d.get('alert_r'))} recommended",
        ),
        ("time scale", _time_scale(d)),
        ("enough events", enough),
        ("drifts injected", ", ".join(map(str, injections)) if isinstance(injections, list) else None),
        ("model", d.get("model_id")),
        ("run directory", run_name or None),
    ]
    return [(key, rv.text(value)) for key, value in items]


def _metrics(d: dict[str, Any], series: dict[str, Any] | None) -> dict[str, Any]:
    """(a): the window means over event time, one plot per drift."""
    if series is None:
        return {"note": "no series.json in this run: no plots over event time"}
    parsed = [rv.when(t) for t in series["t"]]
    times = [t for t in parsed if t is not None]
    if not times or len(times) != len(parsed):
        return {"note": "series.json has no usable times: no plots over event time"}
    return {
        "note": None,
        "window": duration_text(rv.num(series.get("window_s"))),
        "plots": [plots.metric_plot(d, series, drift, times) for drift in _drifts(d, series)],
    }


def _k_curve(d: dict[str, Any]) -> dict[str, Any]:
    """(b): mean #REval against k, over the last window and after each injection."""
    curve = rv.get_in(d, "k_curve")
    ks = rv.nums(rv.get_in(curve, "ks"))
    if not ks:
        return {"note": "no k-curve in this run"}
    parts = [plots.k_last_window(curve, ks), plots.k_after_injection(curve, ks)]
    return {"note": None, "alert_r": rv.text(d.get("alert_r")), "parts": parts}


def _detection(d: dict[str, Any]) -> dict[str, Any]:
    """(c): the delays, the rules, the effects, the operating curves and the goal."""
    rows = d["signals"]
    signals = list(dict.fromkeys(r["signal"] for r in rows))
    drifts = list(dict.fromkeys(r["drift"] for r in rows))
    cell = {(r["drift"], r["signal"]): r for r in rows}

    def delay(drift: str, signal: str) -> str:
        row = cell.get((drift, signal))
        seconds = None if row is None else rv.num(row.get("delay_s"))
        if row is None or seconds is None:
            return "—"
        return f"{duration_text(seconds)} ({rv.count(row.get('delay_events'))} events)"

    table = [[drift, *(delay(drift, s) for s in signals)] for drift in drifts]
    fa = {r["signal"]: r.get("false_alarms_per_day") for r in rows}
    episodes = rv.get_in(d, "false_alarm_episodes") or {}
    table.append(["false alarms / day (control)", *(rv.fmt(fa.get(s), ".3f") for s in signals)])
    table.append(["false-alarm episodes (control)", *(rv.count(rv.get_in(episodes, s)) for s in signals)])
    rules = rv.get_in(d, "signal_rules") or {}
    goal = rv.get_in(d, "goal")
    return {
        "delays": Table(["drift", *signals], table, [False, *([True] * len(signals))]),
        "legend": [(s, rv.text(rv.get_in(rules, s) or "no description")) for s in signals],
        "effects": _effects(d),
        "curves": plots.curves_plot(d),
        # None: neither alert fired on that drift (nothing to compare)
        "goal": [(str(kind), None if met is None else bool(met)) for kind, met in goal.items()]
        if isinstance(goal, dict)
        else [],
        "matched": _matched(d),
    }


def _matched(d: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """The goal at one false-alarm rate (``goal_matched``, absent from older runs): per drift,
    the rate, the #REval alert's delay, exact match's at its fastest threshold there, met."""
    matched = rv.get_in(d, "goal_matched")
    parameter = rv.text(rv.get_in(d, "curves", "exact_drop", "parameter") or "threshold")
    out = []
    for m in matched.values() if isinstance(matched, dict) else []:
        exact = rv.num(rv.get_in(m, "exact_delay_s"))
        exact_text = (
            rv.NO_MATCH
            if exact is None
            else f"{duration_text(exact)} ({parameter} {rv.fmt(m.get('exact_threshold'), 'g')})"
        )
        met = m.get("met")
        out.append(
            (
                f"{rv.text(m.get('drift'))} (≤ {rv.fmt(m.get('false_alarms_per_day'), '.3f')} a day)",
                duration_text(rv.num(rv.get_in(m, "reval_delay_s"))),
                exact_text,
                None if met is None else bool(met),
            )
        )
    return out


def _effects(d: dict[str, Any]) -> Table | None:
    effects = rv.get_in(d, "effects")
    if not isinstance(effects, dict) or not effects:
        return None

    def pair(e: Any, key: str) -> str:
        return f"{rv.fmt(rv.get_in(e, key, 'control'))} → {rv.fmt(rv.get_in(e, key, 'drifted'))}"

    rows = [
        [name, rv.count(rv.get_in(e, "events_after")), *(pair(e, k) for k in EFFECTS)]
        for name, e in effects.items()
    ]
    header = ["drift", "events after", "#REval", "precision form", "corrected", "exact", "unknown share"]
    return Table(header, rows, [False, True])


def _refits(d: dict[str, Any], block: str | None = None) -> list[tuple[datetime, dict[str, Any]]]:
    """(time, refit) of each refit with a readable time (and, with ``block``, that block)."""
    refits = rv.get_in(d, "thesaurus", "refits")
    out = []
    for r in refits if isinstance(refits, list) else []:
        if not isinstance(r, dict) or (at := rv.when(r.get("at"))) is None:
            continue
        if block is None:
            out.append((at, r))
        elif isinstance(r.get(block), dict):
            out.append((at, r[block]))
    return out


def _thesaurus(d: dict[str, Any]) -> dict[str, Any]:
    """(d): the thesaurus at each refit, and the movers of the last one."""
    kept = _refits(d)
    plot = plots.thesaurus_plot(kept) if kept else Note("no thesaurus refits in this run")
    movers = rv.get_in(d, "thesaurus", "movers")
    if not isinstance(movers, list) or not movers:
        return {"plot": plot, "movers": None}

    def words(value: Any) -> str:
        return ", ".join(map(str, value)) if isinstance(value, list) else "—"

    def effect(m: Any) -> str:  # the shift test's ranking value; versions without raw means: none
        if rv.num(rv.get_in(m, "effect")) is None:
            return "—"
        star = "*" if rv.get_in(m, "significant") else ""
        low, high = rv.fmt(rv.get_in(m, "effect_low"), ".2f"), rv.fmt(rv.get_in(m, "effect_high"), ".2f")
        return f"{rv.fmt(rv.get_in(m, 'effect'), '.2f')}{star} [{low}, {high}]"

    rows = [
        [
            rv.text(rv.get_in(m, "hashtag")),
            effect(m),
            rv.fmt(rv.get_in(m, "cosine"), ".3f"),
            rv.fmt(rv.get_in(m, "jaccard"), ".2f"),
            f"{rv.count(rv.get_in(m, 'support_old'))} → {rv.count(rv.get_in(m, 'support_new'))}",
            words(rv.get_in(m, "old_neighbours")),
            words(rv.get_in(m, "new_neighbours")),
        ]
        for m in movers
    ]
    header = ["hashtag", "effect [95%]", "cosine", "jaccard", "support", "old neighbours", "new neighbours"]
    return {"plot": plot, "movers": Table(header, rows, [False, True, True, True, True])}


def _slices(d: dict[str, Any]) -> Table | None:
    """(e): #REval per popularity slice, control and after each injection."""
    slices = d.get("slices")
    if not isinstance(slices, dict) or not slices:
        return None
    drifts = [k for s in slices.values() if isinstance(rv.get_in(s, "drifts"), dict) for k in s["drifts"]]
    drifts = list(dict.fromkeys(map(str, drifts)))

    def after(s: Any, drift: str) -> str:
        before = rv.get_in(s, "control_after", drift)
        now = rv.fmt(rv.get_in(s, "drifts", drift))
        return now if before is None else f"{rv.fmt(before)} → {now}"

    rows = [
        [
            str(label),
            rv.count(rv.get_in(s, "events")),
            rv.fmt(rv.get_in(s, "control")),
            *(after(s, x) for x in drifts),
        ]
        for label, s in slices.items()
    ]
    header = ["slice", "events", "control (whole period)", *(f"{x}: control → drifted" for x in drifts)]
    return Table(header, rows, [False, *([True] * (len(header) - 1))])


def _audit(d: dict[str, Any]) -> dict[str, Any] | None:
    """(f): each refit's coherence lift and agreement with people's votes."""
    rows = _refits(d, "audit")
    if not rows:
        return None

    def ci(block: Any, key: str) -> str:
        value = rv.get_in(block, key)
        if value is None:
            return "—"
        low, high = rv.get_in(block, f"{key}_ci_low"), rv.get_in(block, f"{key}_ci_high")
        return f"{rv.fmt(value, '.4f')} [{rv.fmt(low, '.4f')}, {rv.fmt(high, '.4f')}]"

    body = []
    for t, a in rows:
        c = rv.get_in(a, "coherence", "tfidf")
        agreement = rv.get_in(a, "agreement")
        body.append(
            [
                t.date().isoformat(),
                rv.fmt(rv.get_in(c, "hashtags"), ".0f"),
                rv.fmt(rv.get_in(c, "synonyms"), ".4f"),
                rv.fmt(rv.get_in(c, "random"), ".4f"),
                ci(c, "lift"),
                ci(agreement, "tau_w"),
                ci(agreement, "rho_w"),
            ]
        )
    header = ["refit", "hashtags", "synonyms", "random", "lift [95% CI]", "τ_w [95% CI]", "ρ_w [95% CI]"]
    return {"plot": plots.audit_plot(rows), "table": Table(header, body, [False, *([True] * 6)])}


def _detector(d: dict[str, Any]) -> dict[str, Any] | None:
    """(g): the change detector (stream.monitoring.cusum) -- which alternative, after how many events,
    beside exact-only and synonym-only CUSUMs at the same ARL0; on the trailing baseline (what
    a live chart has) and against the counterfactual (the drift alone)."""
    detector, rows = d.get("detector"), d.get("diagnosis")
    if not isinstance(detector, dict) or not isinstance(rows, list) or not rows:
        return None

    def ev(value: Any) -> str:
        return "—" if value is None else rv.count(value)

    numeric = [False, False, True, True, True]
    header = ["drift", "alternative", "delay (events)", "exact-only CUSUM", "synonym-only CUSUM"]

    def live(r: dict[str, Any]) -> str:
        return (
            f"{r['live_alternative']} after {ev(r.get('live_delay_events'))}"
            if r.get("live_alternative")
            else "—"
        )

    trailing = Table(
        [*header, "the live detector"],
        [
            [
                rv.text(r.get("drift")),
                rv.text(r.get("alternative") or "—"),
                ev(r.get("delay_events")),
                ev(r.get("exact_cusum_delay_events")),
                ev(r.get("synonym_cusum_delay_events")),
                rv.text(live(r)),
            ]
            for r in rows
        ],
        [*numeric, False],
    )
    cf = detector.get("counterfactual")
    paired = None
    if isinstance(cf, dict) and all("counterfactual_alternative" in r for r in rows):
        paired = Table(
            header,
            [
                [
                    rv.text(r.get("drift")),
                    rv.text(r.get("counterfactual_alternative") or "—"),
                    ev(r.get("counterfactual_delay_events")),
                    ev(r.get("counterfactual_exact_cusum_delay_events")),
                    ev(r.get("counterfactual_synonym_cusum_delay_events")),
                ]
                for r in rows
            ],
            numeric,
        )
    return {
        "arl0": rv.count(detector.get("arl0_events")),
        "false_alarms": rv.count(detector.get("control_false_alarms")),
        "control_events": rv.count(detector.get("control_events_after_first_drift")),
        "trailing": trailing,
        "half": rv.count(rv.get_in(cf, "half_window_events")) if paired else None,
        "paired_false_alarms": rv.count(rv.get_in(cf, "control_false_alarms")) if paired else None,
        "paired": paired,
    }


def _grid(g: Any) -> dict[str, Any] | None:
    """(h): the detector benchmark (``python -m workers.commands.backtest.grid``): every
    detector at one calibrated budget on production-rate streams, and the checks."""
    sim = rv.get_in(g, "streams")
    rows = rv.get_in(sim, "rows")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        return None
    detectors = [str(n) for n in (rv.get_in(sim, "in_control_run_length") or {})]

    def cell(v: Any) -> str:
        median, share = rv.num(rv.get_in(v, "median_delay_events")), rv.num(rv.get_in(v, "detected"))
        share_text = "—" if share is None else f"{share:.0%}"
        return f"— [{share_text}]" if median is None else f"{median:,.0f} [{share_text}]"

    delays = Table(
        ["drift", *detectors, "isolation error"],
        [
            [
                rv.text(r.get("drift")),
                *(cell(r.get(n)) for n in detectors),
                rv.text(
                    None if (e := rv.num(rv.get_in(r, "joint", "isolation_error"))) is None else f"{e:.1%}"
                ),
            ]
            for r in rows
        ],
        [False, *([True] * (len(detectors) + 1))],
    )
    arl = rv.get_in(sim, "in_control_run_length") or {}
    runs = Table(
        ["detector", "mean run length", "95% interval"],
        [
            [
                n,
                rv.count(rv.get_in(arl, n, "mean")),
                f"{rv.count(rv.get_in(arl, n, 'low'))}–{rv.count(rv.get_in(arl, n, 'high'))}",
            ]
            for n in detectors
        ],
        [False, True, True],
    )
    checks = rv.get_in(sim, "checks") or {}
    return {
        "arl0": rv.count(rv.get_in(sim, "arl0_events")),
        "rate": rv.count(rv.get_in(sim, "rate_per_hour")),
        "reps": rv.count(rv.get_in(sim, "reps")),
        "plot": plots.grid_plot(rows, detectors),
        "delays": delays,
        "runs": runs,
        "checks": [(str(name), bool(rv.get_in(c, "ok"))) for name, c in checks.items()],
    }
