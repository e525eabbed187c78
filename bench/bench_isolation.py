"""The joint detector's price for naming the alternative: delay against isolation error, as the
isolation margin varies, at one calibrated budget (issue 37).

Why: the detector benchmark (``python -m workers.commands.backtest.grid``) finds the joint
detector 14-56% slower than a CUSUM on exact match alone on partly random lists, at an
isolation error of 9.6%.  Two things cost delay: several charts share one false-alarm budget
(each threshold is higher than one chart's alone), and an alarm waits until one family of
alternatives beats the other by ``margin`` nats (:data:`stream.monitoring.cusum.ISOLATION_NATS`).
This script measures the frontier: for each design and margin, the thresholds calibrated for
the same ``--arl0`` (:func:`stream.monitoring.cusum.calibrate` with that margin), the
in-control run length measured, then per drift the median delay beside the exact-match CUSUM's
on the same streams and the share of detections naming the wrong alternative.

Designs: ``deployed`` -- :func:`stream.monitoring.cusum.design`'s three charts;
``exact+wording`` -- the exact-match chart (:func:`~stream.monitoring.cusum.exact_chart`) as the
"quality lost" chart beside the wording chart, the isolation unchanged.

The streams are the grid's production-rate model read from its ``grid.json`` (in-control law,
the null recommender's hit chance, each drift's law); ``grid.json`` keeps the units' mean, not
their distribution, so an event here has 1 or 2 units in the mix with that mean.

    python -m bench.bench_isolation                       # docs/backtest/grid.json
    python -m bench.bench_isolation --margins 0,2,4 --reps 200 --out /tmp/isolation.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.results import bench_command, cpu_model, publish
from stream.monitoring import cusum
from workers.commands.backtest.grid import (
    PRE,
    Model,
    expected_alternative,
    first_after,
    joint_alarms,
    median_interval,
    single_alarms,
)

ROOT = Path(__file__).resolve().parents[1]
DRIFTS = "random:0.1,random:0.25,random:0.5,random:1,stale:60,swap:least-popular,synonyms:1"
Floats = np.ndarray
Median = tuple[float | None, float | None, float | None]


@dataclass
class Row:
    """One design and margin: its in-control ARL (mean, 95% half-width), and per drift the
    joint detector's and the exact CUSUM's median delays, the wrong names and detections."""

    design: str
    margin: float
    arl: tuple[float, float]
    drifts: dict[str, tuple[Median, Median, int, int]] = field(default_factory=dict)

    @property
    def isolation_error(self) -> float:
        wrong = sum(w for _, _, w, _ in self.drifts.values())
        return wrong / max(sum(n for _, _, _, n in self.drifts.values()), 1)


def model_of(grid: Mapping[str, object]) -> tuple[Model, dict[str, Floats]]:
    """The grid's in-control model and drift laws (units: 1 or 2, with the grid's mean)."""
    m = grid["model"]
    assert isinstance(m, dict)
    p0 = np.array([m["in_control"][k] for k in ("exact", "synonym_only", "miss")], dtype=np.float64)
    twos = round(100 * min(max(float(m["mean_units"]) - 1.0, 0.0), 1.0))
    units = np.array([1] * (100 - twos) + [2] * twos, dtype=np.int64)
    laws = {label: np.array(law, dtype=np.float64) for label, law in m["laws"].items()}
    return Model(p0=p0, units=units, chance=float(m["chance_hit"])), laws


def charts_of(design: str, model: Model) -> dict[str, Floats]:
    charts = cusum.design(model.p0, chance_hit=model.chance)
    if design == "deployed":
        return charts
    if design == "exact+wording":
        return {
            "quality_lost:exact": cusum.exact_chart(model.p0),
            "wording_changed": charts["wording_changed"],
        }
    raise ValueError(f"unknown design {design!r}")


def measure(
    design: str,
    margin: float,
    model: Model,
    laws: Mapping[str, Floats],
    drifts: list[str],
    *,
    arl0: float,
    reps: int,
    arl_reps: int,
    seed: int,
) -> Row:
    charts = charts_of(design, model)
    thresholds, _ = cusum.calibrate(
        model.p0, model.units, charts, arl0, seed=seed, chance_hit=model.chance, margin=margin
    )
    exact = cusum.exact_chart(model.p0)
    exact_threshold = cusum.calibrate(model.p0, model.units, {"exact": exact}, arl0)[0]["exact"]
    rng = np.random.default_rng(seed + 1)
    horizon = int(4 * arl0)
    lengths = []
    for _ in range(arl_reps):
        found = first_after(joint_alarms(model.sample(rng, horizon), charts, thresholds, model, margin), 1)
        lengths.append(horizon if found is None else found[0])
    x = np.array(lengths, dtype=np.float64)
    half = 1.96 * float(x.std(ddof=1)) / math.sqrt(len(x))
    row = Row(design, margin, (float(x.mean()), half))
    for drift in drifts:
        joint, single, wrong = [], [], 0
        for _ in range(reps):
            counts = np.vstack([model.sample(rng, PRE), model.sample(rng, int(arl0), laws[drift])])
            found = first_after(joint_alarms(counts, charts, thresholds, model, margin), PRE)
            if found is not None and found[0] - PRE < arl0:
                joint.append(found[0] - PRE + 1)
                wrong += found[1] != expected_alternative(drift)
            alone = first_after(single_alarms(cusum.increments(counts, exact), exact_threshold), PRE)
            if alone is not None and alone[0] - PRE < arl0:
                single.append(alone[0] - PRE + 1)
        row.drifts[drift] = (median_interval(joint), median_interval(single), wrong, len(joint))
    return row


def _median(cell: Median) -> str:
    m, lo, hi = cell
    return "—" if m is None else f"{m:,.0f} ({lo:,.0f}-{hi:,.0f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--grid", type=Path, default=ROOT / "docs" / "backtest" / "grid.json")
    p.add_argument("--designs", default="deployed,exact+wording")
    p.add_argument("--margins", default="0,1,2,3,4", help="isolation margins in nats")
    p.add_argument("--drifts", default=DRIFTS)
    p.add_argument("--arl0", type=float, default=10_000.0)
    p.add_argument("--reps", type=int, default=200, help="drifted streams per drift")
    p.add_argument("--arl-reps", type=int, default=100, help="in-control streams per setting")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    command = bench_command("bench_isolation")
    load = os.getloadavg()[0]
    model, laws = model_of(json.loads(args.grid.read_text())["streams"])
    drifts = [d for d in args.drifts.split(",") if d]
    rows = [
        measure(
            design,
            float(margin),
            model,
            laws,
            drifts,
            arl0=args.arl0,
            reps=args.reps,
            arl_reps=args.arl_reps,
            seed=args.seed,
        )
        for design in args.designs.split(",")
        for margin in args.margins.split(",")
    ]
    head = "| design | margin (nats) | in-control ARL (95%) | isolation error, all drifts |"
    lines = [
        "### Delay against isolation error (bench/bench_isolation.py)",
        "",
        f"Command: `{command}`. Machine: {cpu_model()}, {os.cpu_count()} cores, load {load:.1f}. "
        f"Budget ARL0 = {args.arl0:,.0f} events; {args.reps} drifted streams per drift "
        f"({PRE:,} in-control events, then the drift's law), the exact-match CUSUM on the same streams.",
        "",
        head + "".join(f" {d}: joint / exact (median events) [wrong] |" for d in drifts),
        "|---|---:|---|---:|" + "---|" * len(drifts),
    ]
    for row in rows:
        mean, half = row.arl
        cells = []
        for d in drifts:
            joint, single, wrong, n = row.drifts[d]
            ratio = f" = {joint[0] / single[0]:.2f}x" if joint[0] and single[0] else ""
            cells.append(f" {_median(joint)} / {_median(single)}{ratio} [{wrong}/{n}] |")
        lines.append(
            f"| {row.design} | {row.margin:g} | {mean:,.0f} ({mean - half:,.0f}-{mean + half:,.0f}) | "
            f"{row.isolation_error:.1%} |" + "".join(cells)
        )
    publish(lines, args.out)


if __name__ == "__main__":
    main()
