"""How much each alert signal learns per event about a drift: the bound on its detection delay.

A sequential test needs about ``2 log(1 / alpha) / (shift / sigma)^2`` events to tell a
shifted mean from an unshifted one at false-alarm probability alpha, whatever its
thresholds: the per-event *information* ``(shift / sigma)^2`` of a signal under a drift
bounds how early any rule built on it can fire at a given false-alarm rate.  This tool
measures it for the signals an alert can watch, over the events after each injection of a
backtest (drifted run against the control run, per event):

* ``exact``: the exact hit ratio;
* ``reval``: #REval at k;
* ``excess``: the chance-corrected residual ``o - e`` (observed minus the null
  recommender's expected #REval, :mod:`stream.evaluation.chance`): what the #REval alert's test sums;
* ``excess_weighted``: the same with each event weighted by its room over its variance,
  ``(1 - e) / (p (1 - p))`` with ``p = e + kappa (1 - e)`` (the optimal weights of a
  per-event likelihood-ratio test of the kappa: events with more room above chance carry
  more information);
* ``precision``: #REval's precision form, what the #REval alert tests
  (:func:`stream.evaluation.metrics.reval_precision_by_k`: the share of the top-r recommended hashtags
  with a ground truth among their k synonyms) -- unlike #REval (which counts the ground
  truths caught, once each, when |R| > |G|) it does not saturate: a list with several
  hashtags near one truth loses a share per hashtag replaced, where #REval loses nothing
  until the last one goes.

and, read together, the information of ``excess`` and ``precision`` (``shift' cov^-1 shift``:
what a test on their best linear combination learns per event).  Then, per alert k, the
deployed ``reval_drop`` and ``exact_drop`` rules of :mod:`stream.monitoring.backtest` (the time scale as
``reval backtest`` picks it): false alarms per day of the control run and each drift's
detection delay.  The feed is embedded once; one walk per k (the ``synonyms`` drift takes its
synonyms from the thesaurus at that k).

    python -m workers.commands.backtest.power FEED [--limit N] [--inject KIND:AMOUNT ...]
                                      [--ks 1,5,10] [--model minilm]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stream.evaluation.experiment import no_progress
from stream.evaluation.scoring import parse_ints
from stream.monitoring import backtest as bt
from stream.monitoring.alert_params import rule_params
from workers.commands.backtest.simulation import (
    DAY,
    BacktestConfig,
    Feed,
    Walk,
    load_feed,
    scaled_rules,
)

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Information:
    """One signal under one drift, over the events after the injection."""

    control: float
    drifted: float
    sd: float  # of the control's per-event values (weighted where the signal is)

    @property
    def shift(self) -> float:
        return self.control - self.drifted

    @property
    def per_event(self) -> float:
        """``(shift / sd)^2``: the information one event carries about the drift."""
        return (self.shift / self.sd) ** 2 if self.sd > 0 else 0.0


def information(control: Floats, drifted: Floats, weights: Floats | None = None) -> Information:
    """Mean of each run and the control's standard deviation over the events both scored.

    >>> round(information(np.array([1.0, 0.0, 1.0, 0.0]), np.zeros(4)).per_event, 3)
    1.0
    """
    ok = ~np.isnan(control) & ~np.isnan(drifted)
    w = np.ones(int(ok.sum())) if weights is None else np.nan_to_num(weights[ok])
    c, d = control[ok], drifted[ok]
    mean = float(np.average(c, weights=w))
    sd = float(np.sqrt(np.average((c - mean) ** 2, weights=w)))
    return Information(mean, float(np.average(d, weights=w)), sd)


def joint_information(
    control: Sequence[Floats], drifted: Sequence[Floats], after: npt.NDArray[np.bool_]
) -> float:
    """The per-event information ``shift' cov^-1 shift`` of several signals read together
    (the control's covariance over the events after the injection where every signal of both
    runs is defined): what a test on their best linear combination learns per event, at least
    the largest of the signals' own.

    >>> a = np.array([1.0, 0.0, 1.0, 0.0]); b = np.array([0.0, 1.0, 1.0, 0.0])
    >>> round(joint_information([a, b], [a - 0.5, b], np.ones(4, bool)), 3)
    1.0
    """
    c, d = np.stack(control, axis=1), np.stack(drifted, axis=1)
    ok = after & ~np.isnan(c).any(axis=1) & ~np.isnan(d).any(axis=1)
    shift = c[ok].mean(axis=0) - d[ok].mean(axis=0)
    cov = np.cov(c[ok], rowvar=False, bias=True)
    return float(shift @ np.linalg.solve(cov, shift))


def signal_information(
    control: bt.Series, drifted: bt.Series, after: npt.NDArray[np.bool_]
) -> dict[str, Information]:
    """The four signals of the module docstring over the events where ``after``.

    >>> t, e, hits = np.arange(4.0), np.full(4, 0.2), np.array([1.0, 0.0, 1.0, 0.0])
    >>> control = bt.Series(t, hits, e, hits, np.ones(4), np.zeros(4), hits)
    >>> drifted = bt.Series(t, np.array([1.0, 0.0, 0.0, 0.0]), e, np.zeros(4), np.ones(4), np.zeros(4), hits)
    >>> found = signal_information(control, drifted, t >= 2)
    >>> {name: round(f.per_event, 2) for name, f in found.items()}
    {'exact': 1.0, 'reval': 1.0, 'excess': 1.0, 'excess_weighted': 1.0}
    """

    def cut(values: Floats) -> Floats:
        return np.where(after, values, np.nan)

    ok = ~np.isnan(control.reval) & ~np.isnan(control.expected)  # the control's kappa: all scored events
    room = 1.0 - control.expected
    kappa = float(np.sum((control.reval - control.expected)[ok]) / np.sum(room[ok]))
    p = np.clip(control.expected + kappa * room, 0.02, 0.98)  # a 0/1 outcome's mean, kept off 0 and 1
    return {
        "exact": information(cut(control.exact), cut(drifted.exact)),
        "reval": information(cut(control.reval), cut(drifted.reval)),
        "excess": information(cut(control.reval - control.expected), cut(drifted.reval - drifted.expected)),
        "excess_weighted": information(
            cut(control.reval - control.expected),
            cut(drifted.reval - drifted.expected),
            room / (p * (1.0 - p)),
        ),
    }


def rule_delays(
    feed: Feed, control: bt.Series, drifted: dict[str, bt.Series], signals: Sequence[str]
) -> tuple[dict[str, float], dict[str, dict[str, float | None]]]:
    """The deployed rules on these runs: false alarms per day (control), delay in days per drift."""
    params = rule_params("default", [])
    scaled = scaled_rules(params, feed, control.reval)
    rules, at = scaled.rules, scaled.at
    base = {s: f for s, f in bt.signals(control, at, rules).items() if s in signals}
    days = (feed.last - feed.first) / DAY
    alarms = {s: bt.episodes(f) / days for s, f in base.items()}
    delays: dict[str, dict[str, float | None]] = {}
    for label, series in drifted.items():
        fired = {s: f for s, f in bt.signals(series, at, rules).items() if s in signals}
        found = bt.detect(fired, base, at, feed.starts[label], bt.holds(rules))
        delays[label] = {s: None if v is None else v / DAY for s, v in found.items()}
    return alarms, delays


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workers.commands.backtest.power", description=__doc__.split("\n")[0]
    )
    parser.add_argument("feed")
    parser.add_argument("--limit", type=int, default=None, help="the first N tweets only")
    parser.add_argument("--inject", action="append", default=None, help="KIND:AMOUNT[@TIME], repeatable")
    parser.add_argument("--ks", default="1,5,10", help="alert k values, comma-separated")
    parser.add_argument("--model", default="minilm")
    args = parser.parse_args(argv)
    try:
        ks = [k for k in parse_ints(args.ks) if k is not None]
        config = BacktestConfig(
            model=args.model,
            injections=tuple(args.inject or ("random:0.5", "swap:least-popular", "synonyms:1", "stale:60")),
            limit=args.limit,
        )
    except ValueError as exc:
        print(f"workers.commands.backtest.power: --ks or --inject: {exc}", file=sys.stderr)
        return 2
    feed = load_feed([args.feed], config, config.parsed(), no_progress, {})
    print(f"feed {args.feed}: {len(feed.events):,} events, {(feed.last - feed.first) / DAY:.1f} days\n")
    print("| k | drift | signal | control | drifted | shift | sd | (shift/sd)^2 per event |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for k in ks:
        walk = Walk(feed, config, config.parsed(), k, 10)
        walk.run(no_progress, {})
        control = walk.control.series(feed.t_events)
        drifted = {label: col.series(feed.t_events) for label, col in walk.runs.items()}
        for label, series in drifted.items():
            after = feed.t_events >= feed.starts[label]
            found_all = signal_information(control, series, after)
            found_all["precision"] = information(
                np.where(after, control.precision, np.nan), np.where(after, series.precision, np.nan)
            )
            joint = joint_information(
                [control.reval - control.expected, control.precision],
                [series.reval - series.expected, series.precision],
                after,
            )
            for name, found in found_all.items():
                print(
                    f"| {k} | {label} | {name} | {found.control:.4f} | {found.drifted:.4f} | "
                    f"{found.shift:.4f} | {found.sd:.4f} | {found.per_event:.4f} |"
                )
            print(f"| {k} | {label} | excess and precision, jointly | | | | | {joint:.4f} |")
        alarms, delays = rule_delays(feed, control, drifted, ("reval_drop", "exact_drop"))
        rows.append((k, alarms, delays))
    rules = ("reval_drop", "exact_drop")
    print("\n| k | drift | reval_drop delay (d) | exact_drop delay (d) |")
    print("|---|---|---|---|")
    for k, alarms, delays in rows:
        for label, delay in delays.items():
            cells = " | ".join("—" if delay[s] is None else f"{delay[s]:.2f}" for s in rules)
            print(f"| {k} | {label} | {cells} |")
        print(f"| {k} | false alarms / day | {' | '.join(f'{alarms[s]:.4f}' for s in rules)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
