"""``reval report``: one self-contained HTML page that explains a ``reval backtest`` run.

Reads ``detection.json`` (required) and ``series.json`` (the plots over event time) from
the run's directory and writes ``report.html``: no server, no network, no scripts, no
external CSS or fonts -- every plot is an inline SVG drawn by matplotlib, so the file can
be mailed, attached to a ticket or opened from disk years later and look the same.

Every value may be null (a signal that never fired, a metric with no events in its
window, a refit with nothing to compare): nulls become gaps in plots and ``—`` in tables.
"""

from __future__ import annotations

import hashlib
import html
import io
import json
import math
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.dates as mdates

# Figures are built with matplotlib.figure.Figure, never pyplot: no backend is chosen, so no
# display is ever opened (headless like Agg), and no global figure list keeps them alive.
from matplotlib.figure import Figure

from stream.backtest import duration_text

DAY = 86400.0
#: The three window means plotted over event time: (series.json key, label, scale).
METRICS = (
    ("reval", "raw #REval", "0–1"),
    ("corrected", "chance-corrected #REval", "0 = chance, 1 = best"),
    ("exact", "exact hit ratio", "0–1"),
)
#: Colours that stay distinct for the detection markers (tab10 minus the run colours).
MARKER_COLOURS = ("#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#ff7f0e")
CONTROL_COLOUR = "#555555"
DRIFT_COLOUR = "#1f77b4"

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 1000px; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
dl.run { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; }
dl.run dt { font-weight: 600; } dl.run dd { margin: 0; }
figure.plot { margin: 1.5em 0; } figure.plot svg { width: 100%; height: auto; }
figcaption { font-size: 0.9em; color: #444; }
.met { color: #1a7f37; } .unmet { color: #b42318; } .note { color: #666; font-style: italic; }
"""


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the report of the backtest in ``run_dir`` to ``out`` (default
    ``run_dir / "report.html"``) and return its path.  Raises ``ValueError`` when
    ``detection.json`` (or a present ``series.json``) is missing or malformed."""
    run_dir = Path(run_dir)
    detection = _load_detection(run_dir / "detection.json")
    series = _load_series(run_dir / "series.json")
    out = run_dir / "report.html" if out is None else Path(out)
    out.write_text(render(detection, series, run_name=str(run_dir)), encoding="utf-8")
    return out


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


# --- small helpers ---------------------------------------------------------------------


def _get(data: Any, *keys: str) -> Any:
    """``data[k1][k2]...`` or None when any step is missing or not an object."""
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _num(value: Any) -> float | None:
    # bool is an int in Python; a stray true must not plot as 1.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return None if math.isnan(value) or math.isinf(value) else float(value)


def _nums(values: Any, n: int | None = None) -> list[float]:
    """A plottable list: nulls and junk become NaN (a gap), padded or cut to ``n``."""
    items = values if isinstance(values, list) else []
    out = [math.nan if (x := _num(v)) is None else x for v in items]
    if n is not None:
        out = (out + [math.nan] * n)[:n]
    return out


def _when(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _day(value: Any) -> str:
    """The date part of an ISO time, or — ."""
    when = _when(value)
    return "—" if when is None else when.date().isoformat()


def _str(value: Any) -> str:
    return "—" if value is None else str(value)


def _esc(value: Any) -> str:
    return html.escape(_str(value))


def _label(value: Any) -> str:
    """Text from the data for a matplotlib label: ``$`` would start mathtext."""
    return str(value).replace("$", r"\$")


def _fmt(value: Any, spec: str = ".4g") -> str:
    x = _num(value)
    return "—" if x is None else format(x, spec)


def _count(value: Any) -> str:
    x = _num(value)
    return "—" if x is None else f"{x:,.0f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[bool] = ()) -> str:
    """Cells are escaped here, once; ``numeric`` right-aligns columns."""
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            cls = ' class="num"' if i < len(numeric) and numeric[i] else ""
            cells.append(f"<td{cls}>{_esc(cell)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _figure(name: str, fig: Figure, caption: str) -> str:
    """The figure as inline SVG inside ``<figure class="plot">``.

    Text stays text (``svg.fonttype: none``): smaller, selectable, no glyph definitions.
    A fixed hash salt and no date keep the file reproducible.  Every SVG numbers its ids
    from 1 (``axes_1``...), so each gets a prefix: ids must be unique on the page, and a
    ``url(#id)`` that resolved to another plot's clip path would draw in the wrong box.
    """
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": name}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    svg = svg[svg.find("<svg") :]  # drop the XML prolog and DOCTYPE: invalid inside HTML
    prefix = "p" + hashlib.sha1(name.encode()).hexdigest()[:8] + "-"
    svg = re.sub(r'\bid="', f'id="{prefix}', svg)
    svg = re.sub(r'(href="#|url\(#)', rf"\g<1>{prefix}", svg)
    return (
        f'<figure class="plot" data-plot="{html.escape(name, quote=True)}">{svg}'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def _new(rows: int, cols: int, figsize: tuple[float, float], **kw: Any) -> tuple[Figure, Any]:
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.subplots(rows, cols, **kw)


def _note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def _time_axis(ax: Any) -> None:
    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))


def _drifts(d: dict[str, Any], series: dict[str, Any] | None) -> list[str]:
    """Every drift the run knows of, in the order it was injected."""
    names = [row["drift"] for row in d["signals"]]
    for more in (_get(d, "effects"), _get(series, "drifts")):
        names += list(more) if isinstance(more, dict) else []
    return list(dict.fromkeys(str(n) for n in names))


# --- the page --------------------------------------------------------------------------


def render(d: dict[str, Any], series: dict[str, Any] | None, run_name: str = "") -> str:
    """The whole HTML page for a loaded ``detection.json`` and ``series.json``."""
    from workers.commands.report_audit import audit_section  # it builds on this module's helpers

    heading = (
        f"Drift-detection backtest: {_str(d.get('recommender'))}, "
        f"alert k={_str(d.get('alert_k'))}, r={_str(d.get('alert_r'))}"
    )
    sections = [
        _header(d, run_name),
        _metric_section(d, series),
        _k_curve_section(d),
        _detection_section(d),
        _thesaurus_section(d),
        _slices_section(d),
        audit_section(d),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(heading)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{html.escape(heading)}</h1>" + "\n".join(sections) + "</body></html>\n"
    )


def _time_scale(d: dict[str, Any]) -> str:
    """What the time scale means: a sparse feed needs longer windows to hold enough events."""
    scale = _num(d.get("time_scale"))
    window = _num(_get(d, "rules", "quality_window"))
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


def _header(d: dict[str, Any], run_name: str) -> str:
    """What was run, in words, for someone who did not run it."""
    share = _num(d.get("instants_with_enough_events"))
    feeds = d.get("feeds")
    feed = ", ".join(map(str, feeds)) if isinstance(feeds, list) else feeds
    enough = (
        "—"
        if share is None
        else f"{share:.0%} of the evaluation instants hold at least "
        f"{_get(d, 'rules', 'min_events') or '?'} events in the quality window (elsewhere the "
        "quality rules cannot fire)"
    )
    injections = _get(d, "config", "injections")
    items = [
        ("recommender", d.get("recommender")),
        ("feed", feed),
        (
            "period",
            f"{_day(_get(d, 'period', 'first_event'))} to {_day(_get(d, 'period', 'last_event'))} "
            f"({_fmt(_get(d, 'period', 'days'), 'g')} days of event time)",
        ),
        (
            "events",
            f"{_count(d.get('events'))} recommendation events, {_count(d.get('scored_events'))} "
            f"scored; {_count(d.get('refits'))} refits",
        ),
        ("alert", f"#REval at k={_str(d.get('alert_k'))} synonyms, r={_str(d.get('alert_r'))} recommended"),
        ("time scale", _time_scale(d)),
        ("enough events", enough),
        ("drifts injected", ", ".join(map(str, injections)) if isinstance(injections, list) else None),
        ("model", d.get("model_id")),
        ("run directory", run_name or None),
    ]
    rows = "".join(f"<dt>{html.escape(k)}</dt><dd>{_esc(v)}</dd>" for k, v in items)
    return (
        '<section id="run"><h2>What was run</h2>'
        "<p>A walk-forward replay of the feed in event time: the undisturbed run is the "
        "<em>control</em>; each drift is a second run whose recommendations are changed from "
        "its injection time on. The alert rules are evaluated over both runs; a detection is "
        "the first alarm the control run does not raise.</p>"
        f'<dl class="run">{rows}</dl></section>'
    )


def _detections(d: dict[str, Any], drift: str) -> list[tuple[datetime, list[str], float, Any]]:
    """(time, signals, delay_s, delay_events) of each distinct first detection of ``drift``."""
    by_time: dict[datetime, tuple[list[str], float, Any]] = {}
    for row in d["signals"]:
        start, delay = _when(row.get("injected_at")), _num(row.get("delay_s"))
        if row["drift"] != drift or start is None or delay is None:
            continue
        when = datetime.fromtimestamp(start.timestamp() + delay, start.tzinfo)
        by_time.setdefault(when, ([], delay, row.get("delay_events")))[0].append(row["signal"])
    return sorted((when, *rest) for when, rest in by_time.items())


def _metric_section(d: dict[str, Any], series: dict[str, Any] | None) -> str:
    head = '<section id="metrics"><h2>(a) Quality over event time</h2>'
    if series is None:
        return head + _note("no series.json in this run: no plots over event time") + "</section>"
    parsed = [_when(t) for t in series["t"]]
    times = [t for t in parsed if t is not None]
    if not times or len(times) != len(parsed):
        return head + _note("series.json has no usable times: no plots over event time") + "</section>"
    window = _num(series.get("window_s"))
    intro = (
        f"<p>Means over a sliding {html.escape(duration_text(window))} window (the alert's quality window) "
        "of each metric, control (grey) against drifted (blue). The dashed line is the injection; "
        "each numbered dotted line is the first detection of the signals listed for it in the "
        "legend.</p>"
    )
    plots = [_metric_plot(d, series, drift, times) for drift in _drifts(d, series)]
    return head + intro + "".join(plots) + "</section>"


def _metric_plot(d: dict[str, Any], series: dict[str, Any], drift: str, times: list[datetime]) -> str:
    n = len(times)
    control, drifted = _get(series, "control") or {}, _get(series, "drifts", drift) or {}
    start = _when(_get(d, "effects", drift, "injected_at")) or next(
        (_when(r.get("injected_at")) for r in d["signals"] if r["drift"] == drift), None
    )
    found = _detections(d, drift)
    fig, axes = _new(3, 1, figsize=(9, 7.5), sharex=True)
    for ax, (key, name, scale) in zip(axes, METRICS, strict=True):
        ax.plot(times, _nums(_get(control, key), n), color=CONTROL_COLOUR, lw=1.1, label="control")
        ax.plot(times, _nums(_get(drifted, key), n), color=DRIFT_COLOUR, lw=1.1, label="drifted")
        if start is not None:
            ax.axvline(start, color="black", ls="--", lw=1, label="injection")
        for i, (when, signals, delay, events) in enumerate(found):
            colour = MARKER_COLOURS[i % len(MARKER_COLOURS)]
            label = f"{i + 1}: {', '.join(signals)} (+{duration_text(delay)}, {_count(events)} events)"
            ax.axvline(when, color=colour, ls=":", lw=1.6, label=_label(label))
        ax.set_ylabel(f"{name}\n(window mean, {scale})", fontsize=8)
        ax.grid(alpha=0.3)
    # Numbers, staggered down the top panel: detections days apart would overwrite full names.
    for i, (when, *_rest) in enumerate(found):
        axes[0].annotate(
            str(i + 1), xy=(when, 0.92 - 0.14 * (i % 6)), xycoords=("data", "axes fraction"),
            xytext=(3, 0), textcoords="offset points", fontsize=8, fontweight="bold",
            color=MARKER_COLOURS[i % len(MARKER_COLOURS)],
        )  # fmt: skip
    _time_axis(axes[-1])
    axes[-1].set_xlabel("event time (UTC)")
    fig.suptitle(_label(f"{drift}: control vs drifted window means"))
    # Above the top panel, not in it (it would hide data) nor as a figure legend (constrained
    # layout then overlaps it with the x label).
    axes[0].legend(loc="lower center", bbox_to_anchor=(0.5, 1.02), ncol=2, fontsize=7, frameon=False)
    caption = f"Drift {drift}: " + (
        "no signal fired." if not found else f"{len(found)} distinct first detection time(s)."
    )
    return _figure(f"metric-{drift}", fig, caption)


def _k_curve_section(d: dict[str, Any]) -> str:
    head = '<section id="k-curve"><h2>(b) The k-curve</h2>'
    curve = _get(d, "k_curve")
    ks = _nums(_get(curve, "ks"))
    if not ks:
        return head + _note("no k-curve in this run") + "</section>"
    intro = (
        "<p>Mean #REval as the number k of thesaurus synonyms a hashtag may match grows "
        f"(k=0 is an exact match), at r={_esc(d.get('alert_r'))} recommended hashtags. A drift "
        "that only renames hashtags closes its gap as k grows; one that recommends unrelated "
        "hashtags does not.</p>"
    )
    plots = [_k_last_window(d, curve, ks), _k_after_injection(curve, ks)]
    return head + intro + "".join(p for p in plots if p) + "</section>"


def _k_axes(title: str, ax: Any, fig: Figure) -> None:
    ax.set_xlabel("k (synonyms per hashtag; 0 = exact match)")
    ax.set_ylabel("mean #REval (0–1)")
    ax.set_title(_label(title))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")


def _k_last_window(d: dict[str, Any], curve: Any, ks: list[float]) -> str:
    fig, ax = _new(1, 1, figsize=(9, 4.5))
    ax.plot(ks, _nums(_get(curve, "control"), len(ks)), "o-", color=CONTROL_COLOUR, lw=2, label="control")
    drifts = _get(curve, "drifts")
    for name, values in (drifts if isinstance(drifts, dict) else {}).items():
        ax.plot(ks, _nums(values, len(ks)), "o-", ms=3, lw=1, label=_label(name))
    since, events = _day(_get(curve, "last_window", "from")), _get(curve, "last_window", "events")
    _k_axes(f"k-curve of the last quality window (from {since}, {_count(events)} events)", ax, fig)
    caption = "The feed's last quality window, control and every drifted run."
    if (_num(events) or 0) < 50:
        caption += " Few events: read it as an illustration, not a measurement."
    return _figure("k-curve-last-window", fig, caption)


def _k_after_injection(curve: Any, ks: list[float]) -> str:
    after = _get(curve, "after_injection")
    if not isinstance(after, dict) or not after:
        return _note("no k-curve after injection in this run")
    fig, ax = _new(1, 1, figsize=(9, 4.5))
    # Drifts injected at the same time share one control; draw it once.
    controls = {tuple(_nums(_get(v, "control"), len(ks))): name for name, v in after.items()}
    for values, name in controls.items():
        label = "control" if len(controls) == 1 else f"control (from {name})"
        ax.plot(ks, list(values), "o-", color=CONTROL_COLOUR, lw=2, label=_label(label))
    for name, v in after.items():
        ax.plot(ks, _nums(_get(v, "drifted"), len(ks)), "o-", ms=3, lw=1, label=_label(f"{name} drifted"))
    _k_axes("k-curve over every event after the injection", ax, fig)
    return _figure(
        "k-curve-after-injection", fig, "Every event from each drift's injection to the feed's end."
    )


def _detection_section(d: dict[str, Any]) -> str:
    rows = d["signals"]
    signals = list(dict.fromkeys(r["signal"] for r in rows))
    drifts = list(dict.fromkeys(r["drift"] for r in rows))
    cell = {(r["drift"], r["signal"]): r for r in rows}

    def delay(drift: str, signal: str) -> str:
        row = cell.get((drift, signal))
        seconds = None if row is None else _num(row.get("delay_s"))
        if row is None or seconds is None:
            return "—"
        return f"{duration_text(seconds)} ({_count(row.get('delay_events'))} events)"

    table = [[drift, *(delay(drift, s) for s in signals)] for drift in drifts]
    fa = {r["signal"]: r.get("false_alarms_per_day") for r in rows}
    episodes = _get(d, "false_alarm_episodes") or {}
    table.append(["false alarms / day (control)", *(_fmt(fa.get(s), ".3f") for s in signals)])
    table.append(["false-alarm episodes (control)", *(_count(_get(episodes, s)) for s in signals)])
    rules = _get(d, "signal_rules") or {}
    legend = "".join(
        f"<li><code>{_esc(s)}</code>: {_esc(_get(rules, s) or 'no description')}</li>" for s in signals
    )
    return (
        '<section id="detection"><h2>(c) Detection delays</h2>'
        "<p>Event time from the injection to the first alarm the control run does not raise within "
        "the signal's hold time either side, and the events scored meanwhile; — = never fired. False "
        "alarms are the control run's alarms per day of event time.</p>"
        + _table(["drift", *signals], table, [False, *([True] * len(signals))])
        + f"<ul>{legend}</ul>"
        + _effects(d)
        + _curves(d)
        + _goal(d)
        + "</section>"
    )


def _curves(d: dict[str, Any]) -> str:
    """Per drift, every signal's detection delay against its false alarms per day as its
    threshold sweeps (``detection.json``'s ``curves``): where to set each alert."""
    curves = _get(d, "curves")
    if not isinstance(curves, dict) or not curves:
        return _note("no operating curves in this run")
    drifts = list(
        dict.fromkeys(
            str(name)
            for c in curves.values()
            for point in (_get(c, "points") or [])
            for name in (_get(point, "delays") or {})
        )
    )
    if not drifts:
        return _note("no operating curves in this run")
    delays = [
        _num(_get(point, "delays", drift))
        for c in curves.values()
        for point in (_get(c, "points") or [])
        for drift in drifts
    ]
    top = max([x for x in delays if x is not None] or [DAY]) / DAY * 1.15  # where "never" goes
    cols = min(len(drifts), 3)
    rows = -(-len(drifts) // cols)
    fig, axes = _new(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)
    for i, drift in enumerate(drifts):
        ax = axes[i // cols][i % cols]
        for j, (signal, c) in enumerate(curves.items()):
            points = [p for p in (_get(c, "points") or []) if isinstance(p, dict)]
            xs = [_num(p.get("false_alarms_per_day")) for p in points]
            ys = [_num(_get(p, "delays", drift)) for p in points]
            colour = MARKER_COLOURS[j % len(MARKER_COLOURS)]
            seen = [(x, y / DAY) for x, y in zip(xs, ys, strict=True) if x is not None and y is not None]
            never = [x for x, y in zip(xs, ys, strict=True) if x is not None and y is None]
            if seen:
                ax.plot(
                    *zip(*sorted(seen), strict=True), "o-", ms=3, lw=1, color=colour, label=_label(signal)
                )
            if never:
                ax.plot(never, [top] * len(never), "x", color=colour, label=None if seen else _label(signal))
            for p, x, y in zip(points, xs, ys, strict=True):
                if p.get("deployed") and x is not None:
                    ax.plot([x], [top if y is None else y / DAY], "s", ms=8, mfc="none", color=colour)
        ax.axhline(top, color="#bbbbbb", lw=0.8, ls=":")
        ax.set_title(_label(drift))
        ax.set_xlabel("false alarms / day (control)")
        ax.set_ylabel("detection delay (days)")
        ax.grid(alpha=0.3)
    for i in range(len(drifts), rows * cols):
        axes[i // cols][i % cols].set_visible(False)
    axes[0][0].legend(fontsize=7, loc="best")
    caption = (
        "Operating curves: each signal with its threshold swept, false alarms per day of the control "
        "run against the detection delay of each drift; squares are the deployed thresholds, crosses on "
        "the dotted line never fired. Lower left is better."
    )
    return "<h3>Delay against false alarms, across thresholds</h3>" + _figure("curves", fig, caption)


def _effects(d: dict[str, Any]) -> str:
    effects = _get(d, "effects")
    if not isinstance(effects, dict) or not effects:
        return ""

    def pair(e: Any, key: str) -> str:
        return f"{_fmt(_get(e, key, 'control'))} → {_fmt(_get(e, key, 'drifted'))}"

    keys = ("reval_after", "corrected_after", "exact_after", "unknown_share_after")
    rows = [
        [name, _count(_get(e, "events_after")), *(pair(e, k) for k in keys)] for name, e in effects.items()
    ]
    header = ["drift", "events after", "#REval", "corrected", "exact", "unknown share"]
    return "<h3>Means after the injection (control → drifted)</h3>" + _table(header, rows, [False, True])


def _goal(d: dict[str, Any]) -> str:
    goal = _get(d, "goal")
    if not isinstance(goal, dict) or not goal:
        return _note("no goal checked in this run")
    lines = "".join(
        f'<li>{_esc(kind)}: <span class="{"met" if met else "unmet"}">{"met" if met else "not met"}</span>'
        "</li>"
        for kind, met in goal.items()
    )
    return (
        "<h3>Goal</h3><p>#REval's alert detects <code>random</code> and <code>stale</code> drifts no "
        "later than exact match, with no more false alarms, and stays quiet on <code>synonyms</code> "
        f"(a renaming that exact match mistakes for a drop).</p><ul>{lines}</ul>"
    )


def _thesaurus_section(d: dict[str, Any]) -> str:
    head = '<section id="thesaurus"><h2>(d) Thesaurus health over refits</h2>'
    refits = _get(d, "thesaurus", "refits")
    refits = [r for r in refits if isinstance(r, dict)] if isinstance(refits, list) else []
    at = [_when(r.get("at")) for r in refits]
    kept = [(t, r) for t, r in zip(at, refits, strict=True) if t is not None]
    plot = _thesaurus_plot(kept) if kept else _note("no thesaurus refits in this run")
    return head + plot + _movers(d) + "</section>"


def _thesaurus_plot(refits: list[tuple[datetime, dict[str, Any]]]) -> str:
    times = [t for t, _ in refits]

    def col(*keys: str) -> list[float]:
        return _nums([_get(r, *keys) for _, r in refits])

    panels: list[tuple[str, list[tuple[str, list[float]]]]] = [
        ("hashtags\n(count)", [("hashtags in the thesaurus", col("hashtags"))]),
        ("hubness skewness\n(unitless)", [("skewness of k-occurrence", col("hubness", "skewness"))]),
        (
            "shift 1−cosine\n(0 = unchanged)",
            [("shift p50", col("drift", "shift", "p50")), ("shift p90", col("drift", "shift", "p90"))],
        ),
        (
            "top-10 changed\n(share, 0–1)",
            [("share with top-10 Jaccard < 0.5", col("drift", "top10_changed_share"))],
        ),
    ]
    fig, axes = _new(len(panels), 1, figsize=(9, 8), sharex=True)
    for ax, (ylabel, lines) in zip(axes, panels, strict=True):
        for label, values in lines:
            ax.plot(times, values, "o-", ms=2.5, lw=1, label=label)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    _time_axis(axes[-1])
    axes[-1].set_xlabel("refit time (event time, UTC)")
    fig.suptitle("Thesaurus at each refit: size, hubness, drift from the previous refit")
    caption = (
        "Shift is 1 − cosine between a hashtag's mean vectors at consecutive refits (hashtags in "
        "both); a rising p90 or top-10 changed share means neighbours are moving under the metric."
    )
    return _figure("thesaurus", fig, caption)


def _movers(d: dict[str, Any]) -> str:
    movers = _get(d, "thesaurus", "movers")
    if not isinstance(movers, list) or not movers:
        return "<h3>Movers</h3>" + _note("no hashtag moved at the last refit")

    def words(value: Any) -> str:
        return ", ".join(map(str, value)) if isinstance(value, list) else "—"

    rows = [
        [
            _get(m, "hashtag"),
            _fmt(_get(m, "cosine"), ".3f"),
            _fmt(_get(m, "jaccard"), ".2f"),
            f"{_count(_get(m, 'support_old'))} → {_count(_get(m, 'support_new'))}",
            words(_get(m, "old_neighbours")),
            words(_get(m, "new_neighbours")),
        ]
        for m in movers
    ]
    header = ["hashtag", "cosine", "jaccard", "support", "old neighbours", "new neighbours"]
    return (
        "<h3>Movers at the last refit</h3><p>Hashtags whose meaning moved most: cosine of their "
        "mean vectors then/now, Jaccard overlap of their top-10 neighbours, tweets supporting them. "
        "Only hashtags that got tweets or changed neighbours: with a centring hubness method every "
        "vector shifts a little when any hashtag gets tweets, which is no move of its own.</p>"
        + _table(header, rows, [False, True, True, True])
    )


def _slices_section(d: dict[str, Any]) -> str:
    head = '<section id="slices"><h2>(e) Slices</h2>'
    slices = d.get("slices")
    if not isinstance(slices, dict) or not slices:
        return head + _note("no slices in this run") + "</section>"
    drifts = [k for s in slices.values() if isinstance(_get(s, "drifts"), dict) for k in s["drifts"]]
    drifts = list(dict.fromkeys(map(str, drifts)))

    def after(s: Any, drift: str) -> str:
        before = _get(s, "control_after", drift)
        now = _fmt(_get(s, "drifts", drift))
        return now if before is None else f"{_fmt(before)} → {now}"

    rows = [
        [label, _count(_get(s, "events")), _fmt(_get(s, "control")), *(after(s, x) for x in drifts)]
        for label, s in slices.items()
    ]
    header = ["slice", "events", "control (whole period)", *(f"{x}: control → drifted" for x in drifts)]
    note = (
        "<p>#REval at the alert k and r on the ground-truth hashtags of each popularity band of "
        "the thesaurus: <em>head</em> = the most used hashtags carrying the first half of all uses, "
        "<em>torso</em> = the next 30%, <em>tail</em> = the rest, <em>novel</em> = unknown to the "
        "thesaurus (only an exact recommendation can hit). Drift columns: the events after the "
        "injection.</p>"
    )
    return head + note + _table(header, rows, [False, *([True] * (len(header) - 1))]) + "</section>"
