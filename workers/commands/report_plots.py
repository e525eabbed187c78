"""The report's plots: matplotlib figures drawn into inline SVG (:class:`Plot`), never
pyplot (no backend is chosen, no display opened, no global figure list keeps them alive)."""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import matplotlib
import matplotlib.dates as mdates
from markupsafe import Markup
from matplotlib.figure import Figure

from stream.monitoring.backtest import duration_text
from workers.commands import report_values as rv
from workers.commands.report_values import Note

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


@dataclass(frozen=True)
class Plot:
    """A figure as inline SVG (trusted markup: matplotlib escapes the text it draws) with
    its name (``data-plot``) and caption (plain text)."""

    name: str
    svg: Markup
    caption: str


def _figure(name: str, fig: Figure, caption: str) -> Plot:
    """The figure as inline SVG.

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
    return Plot(name, Markup(svg), caption)


def _new(rows: int, cols: int, figsize: tuple[float, float], **kw: Any) -> tuple[Figure, Any]:
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.subplots(rows, cols, **kw)


def _time_axis(ax: Any) -> None:
    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))


def _label(value: Any) -> str:
    """Text from the data for a matplotlib label: ``$`` would start mathtext."""
    return str(value).replace("$", r"\$")


def detections(d: dict[str, Any], drift: str) -> list[tuple[datetime, list[str], float, Any]]:
    """(time, signals, delay_s, delay_events) of each distinct first detection of ``drift``."""
    by_time: dict[datetime, tuple[list[str], float, Any]] = {}
    for row in d["signals"]:
        start, delay = rv.when(row.get("injected_at")), rv.num(row.get("delay_s"))
        if row["drift"] != drift or start is None or delay is None:
            continue
        when = datetime.fromtimestamp(start.timestamp() + delay, start.tzinfo)
        by_time.setdefault(when, ([], delay, row.get("delay_events")))[0].append(row["signal"])
    return sorted((when, *rest) for when, rest in by_time.items())


def metric_plot(d: dict[str, Any], series: dict[str, Any], drift: str, times: list[datetime]) -> Plot:
    n = len(times)
    control, drifted = rv.get_in(series, "control") or {}, rv.get_in(series, "drifts", drift) or {}
    start = rv.when(rv.get_in(d, "effects", drift, "injected_at")) or next(
        (rv.when(r.get("injected_at")) for r in d["signals"] if r["drift"] == drift), None
    )
    found = detections(d, drift)
    fig, axes = _new(3, 1, figsize=(9, 7.5), sharex=True)
    for ax, (key, name, scale) in zip(axes, METRICS, strict=True):
        ax.plot(times, rv.nums(rv.get_in(control, key), n), color=CONTROL_COLOUR, lw=1.1, label="control")
        ax.plot(times, rv.nums(rv.get_in(drifted, key), n), color=DRIFT_COLOUR, lw=1.1, label="drifted")
        if start is not None:
            ax.axvline(start, color="black", ls="--", lw=1, label="injection")
        for i, (when, signals, delay, events) in enumerate(found):
            colour = MARKER_COLOURS[i % len(MARKER_COLOURS)]
            label = f"{i + 1}: {', '.join(signals)} (+{duration_text(delay)}, {rv.count(events)} events)"
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


def _k_axes(title: str, ax: Any, fig: Figure) -> None:
    ax.set_xlabel("k (synonyms per hashtag; 0 = exact match)")
    ax.set_ylabel("mean #REval (0–1)")
    ax.set_title(_label(title))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")


def k_last_window(curve: Any, ks: list[float]) -> Plot:
    fig, ax = _new(1, 1, figsize=(9, 4.5))
    ax.plot(
        ks, rv.nums(rv.get_in(curve, "control"), len(ks)), "o-", color=CONTROL_COLOUR, lw=2, label="control"
    )
    drifts = rv.get_in(curve, "drifts")
    for name, values in (drifts if isinstance(drifts, dict) else {}).items():
        ax.plot(ks, rv.nums(values, len(ks)), "o-", ms=3, lw=1, label=_label(name))
    since, events = rv.day(rv.get_in(curve, "last_window", "from")), rv.get_in(curve, "last_window", "events")
    _k_axes(f"k-curve of the last quality window (from {since}, {rv.count(events)} events)", ax, fig)
    caption = "The feed's last quality window, control and every drifted run."
    if (rv.num(events) or 0) < 50:
        caption += " Few events: read it as an illustration, not a measurement."
    return _figure("k-curve-last-window", fig, caption)


def k_after_injection(curve: Any, ks: list[float]) -> Plot | Note:
    after = rv.get_in(curve, "after_injection")
    if not isinstance(after, dict) or not after:
        return Note("no k-curve after injection in this run")
    fig, ax = _new(1, 1, figsize=(9, 4.5))
    # Drifts injected at the same time share one control; draw it once.
    controls = {tuple(rv.nums(rv.get_in(v, "control"), len(ks))): name for name, v in after.items()}
    for values, name in controls.items():
        label = "control" if len(controls) == 1 else f"control (from {name})"
        ax.plot(ks, list(values), "o-", color=CONTROL_COLOUR, lw=2, label=_label(label))
    for name, v in after.items():
        ax.plot(
            ks, rv.nums(rv.get_in(v, "drifted"), len(ks)), "o-", ms=3, lw=1, label=_label(f"{name} drifted")
        )
    _k_axes("k-curve over every event after the injection", ax, fig)
    return _figure(
        "k-curve-after-injection", fig, "Every event from each drift's injection to the feed's end."
    )


def curves_plot(d: dict[str, Any]) -> Plot | Note:
    """Per drift, every signal's detection delay against its false alarms per day as its
    threshold sweeps (``detection.json``'s ``curves``): where to set each alert."""
    curves = rv.get_in(d, "curves")
    if not isinstance(curves, dict) or not curves:
        return Note("no operating curves in this run")
    drifts = list(
        dict.fromkeys(
            str(name)
            for c in curves.values()
            for point in (rv.get_in(c, "points") or [])
            for name in (rv.get_in(point, "delays") or {})
        )
    )
    if not drifts:
        return Note("no operating curves in this run")
    delays = [
        rv.num(rv.get_in(point, "delays", drift))
        for c in curves.values()
        for point in (rv.get_in(c, "points") or [])
        for drift in drifts
    ]
    top = max([x for x in delays if x is not None] or [DAY]) / DAY * 1.15  # where "never" goes
    cols = min(len(drifts), 3)
    rows = -(-len(drifts) // cols)
    fig, axes = _new(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)
    for i, drift in enumerate(drifts):
        ax = axes[i // cols][i % cols]
        for j, (signal, c) in enumerate(curves.items()):
            points = [p for p in (rv.get_in(c, "points") or []) if isinstance(p, dict)]
            xs = [rv.num(p.get("false_alarms_per_day")) for p in points]
            ys = [rv.num(rv.get_in(p, "delays", drift)) for p in points]
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
    return _figure("curves", fig, caption)


def _columns(
    rows: list[tuple[datetime, dict[str, Any]]],
) -> tuple[list[datetime], Callable[..., list[float]]]:
    """The times of ``rows`` and a function giving one value per row (NaN where missing)."""

    def col(*keys: str) -> list[float]:
        return rv.nums([rv.get_in(r, *keys) for _, r in rows])

    return [t for t, _ in rows], col


def thesaurus_plot(refits: list[tuple[datetime, dict[str, Any]]]) -> Plot:
    times, col = _columns(refits)

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


def audit_plot(rows: list[tuple[datetime, dict[str, Any]]]) -> Plot:
    times, col = _columns(rows)

    voted = any(a.get("agreement") for _, a in rows)
    fig, axes = _new(2 if voted else 1, 1, figsize=(9, 5.5 if voted else 3), sharex=True, squeeze=False)
    ax = axes[0][0]
    ax.fill_between(
        times, col("coherence", "tfidf", "lift_ci_low"), col("coherence", "tfidf", "lift_ci_high"), alpha=0.25
    )
    ax.plot(
        times, col("coherence", "tfidf", "lift"), "o-", ms=2.5, lw=1, label="coherence lift (TF-IDF), 95% CI"
    )
    ax.axhline(0.0, color="#555555", lw=0.8, ls="--", label="chance (random hashtags)")
    ax.set_ylabel("lift\n(synonyms − random)", fontsize=8)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    if voted:
        ax = axes[1][0]
        for key in ("tau_w", "rho_w"):
            ax.fill_between(
                times, col("agreement", f"{key}_ci_low"), col("agreement", f"{key}_ci_high"), alpha=0.2
            )
            ax.plot(times, col("agreement", key), "o-", ms=2.5, lw=1, label=f"{key}, 95% CI")
        ax.axhline(0.0, color="#555555", lw=0.8, ls="--", label="no agreement")
        ax.set_ylabel("agreement with votes\n(−1 .. 1)", fontsize=8)
        ax.legend(fontsize=7, loc="best")
        ax.grid(alpha=0.3)
    _time_axis(axes[-1][0])
    axes[-1][0].set_xlabel("refit time (event time, UTC)")
    fig.suptitle(
        "Each refit's thesaurus: coherence of its synonym sets" + (", agreement with people" if voted else "")
    )
    caption = (
        "Coherence over the tweets seen up to each refit (each hashtag's bottom-k sample, as the live "
        "reservoir keeps it). "
        + ("" if voted else "No audit votes were given (reval backtest --audit-votes).")
    )
    return _figure("audit", fig, caption)


def grid_plot(rows: list[dict[str, Any]], detectors: list[str]) -> Plot:
    """The detector benchmark (``grid.json``): per drift, each detector's median delay in
    events with its 95% interval; a cross on the dotted line: detected in under half the
    streams."""
    fig, ax = _new(1, 1, figsize=(10.5, 4.2))
    drifts = [str(r.get("drift")) for r in rows]
    delays = [
        x
        for r in rows
        for d in detectors
        if (x := rv.num(rv.get_in(r, d, "median_delay_events"))) is not None
    ]
    top = max(delays or [1.0]) * 2.0  # where "not detected" goes
    width = 0.8 / max(len(detectors), 1)
    for j, name in enumerate(detectors):
        colour = (DRIFT_COLOUR, CONTROL_COLOUR, *MARKER_COLOURS)[j % (len(MARKER_COLOURS) + 2)]
        xs, ys, lo, hi, never = [], [], [], [], []
        for i, r in enumerate(rows):
            x = i - 0.4 + width * (j + 0.5)
            median, share = (
                rv.num(rv.get_in(r, name, "median_delay_events")),
                rv.num(rv.get_in(r, name, "detected")),
            )
            if median is None or share is None or share < 0.5:
                never.append(x)
                continue
            low = rv.num(rv.get_in(r, name, "median_low")) or median
            high = rv.num(rv.get_in(r, name, "median_high")) or median
            xs.append(x)
            ys.append(median)
            lo.append(median - low)
            hi.append(high - median)
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", ms=3.5, lw=1, color=colour, label=_label(name))
        if never:
            ax.plot(never, [top] * len(never), "x", color=colour, label=None if xs else _label(name))
    ax.axhline(top, color="#bbbbbb", lw=0.8, ls=":")
    ax.set_yscale("log")
    ax.set_xticks(range(len(drifts)), [_label(d) for d in drifts], rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("median delay (events)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, ncol=4, loc="upper left")
    caption = (
        "Detector benchmark at one calibrated false-alarm budget: median detection delay in events "
        "(bars: 95% interval), production-rate streams; crosses on the dotted line: detected in under "
        "half the streams within ARL0 events. Lower is better."
    )
    return _figure("grid", fig, caption)
