"""A change detector that says *what* changed: CUSUM charts on the joint outcome of #REval and
exact match, calibrated to a false-alarm budget.

**The outcome of an event.**  At the alert's (k, r) an event has ``n = min(|R_r|, |G|)``
units (the denominator of Eq. 3-4).  Each is an *exact* hit (counted by the hit ratio), a
*synonym-only* hit (counted by #REval, not by exact match: #REval's hits contain the exact
ones, since ``h ∈ Syn_k(h)``), or a *miss*.  So an event is the count vector
``(e, s, m)`` -- one categorical draw per unit, the 3-cell outcome of the change-detection
literature's multinomial CUSUM (Höhle 2010, R ``surveillance::categoricalCUSUM``).

**In control** the unit outcome has probabilities ``p0 = (pe, ps, pm)``, estimated on a
reference stretch (+0.5 per cell).  **Two alternatives**, one chart each (a multi-chart
CUSUM: alarm on the first chart that crosses, report which -- Nikiforov 1995; Han & Tsung
2007):

* ``quality_lost``, two charts: a share ``λ`` of the recommendations turns into chance
  recommendations, ``p1 = (1 - λ) p0 + λ (0, q, 1 - q)`` where ``q`` is the null
  recommender's per-unit hit chance (:mod:`stream.evaluation.chance`; a chance recommendation is never
  an exact hit to first order) -- exact hits are what chance rarely gives, so they weigh
  most; and a share ``λ`` of every kind of hit turns into a miss, ``p1 = ((1 - λ) pe,
  (1 - λ) ps, pm + λ (pe + ps))`` -- what respelled or unknown hashtags do (``vocab``);
* ``wording_changed``: a share ``δ`` of the exact hits becomes synonym-only hits, the
  synonym-aware rate holding, ``p1 = (pe (1 - δ), ps + δ pe, pm)``: the recommender uses
  other words for the same meaning.  Only #REval tells the two apart.

Each chart is Page's CUSUM of the log-likelihood ratio, ``S_t = max(0, S_{t-1} + Σ_c
n_c log(p1_c / p0_c))``, zero at its start.  By Moustakides (1986) the CUSUM of the true
likelihood ratio minimises the worst-case delay among all rules with the same ARL0, so a
chart on one signal alone (:func:`exact_chart`, :func:`synonym_chart`) can be faster only
where the designed alternative is wrong.

**Which alternative: isolated, not raced.**  The first chart to cross is a poor witness of
*what* changed: each chart is designed for one size of shift, a real rewording moves a share of
the exact hits that is not the design's, and a chart for one alternative climbs under the other
too (losing exact hits raises the chance chart).  So a crossing is a *detection*; the alarm
names its alternative by the generalised likelihood ratio between the two families on the
crossing chart's segment (its events since it last stood at zero: the CUSUM's estimate of the
change), each family fitted over its share (``δ`` or ``λ`` on a grid): the alarm is raised
when one family beats the other by :data:`ISOLATION_NATS`, the charts running on until it
does -- the sequential detection-and-isolation of Nikiforov (1995), whose price is a little
delay where the two are hard to tell apart.  :func:`scan` runs the charts this way, for the
backtest and the live :class:`Detector` alike.

**Calibrated, not tuned.**  A false-alarm budget is an in-control average run length
``ARL0`` in events.  The charts' thresholds are set so that their *union* has in-control
ARL ``ARL0`` (:func:`calibrate`: each chart's own ARL from the Markov-chain approximation of
Brook & Evans (1972) over the exact law of one event's increment -- units drawn from the
observed ones, outcomes from ``p0`` -- and the charts' overlap measured by simulating the
in-control model; the price of two charts is at most ~log 2 on the threshold).
:func:`simulate_run_lengths` measures the result.

>>> p0 = np.array([0.2, 0.3, 0.5])
>>> charts = design(p0, chance_hit=0.3)
>>> sorted(charts), charts["wording_changed"].round(3).tolist()
(['quality_lost:chance', 'quality_lost:miss', 'wording_changed'], [-1.609, 0.427, 0.0])
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from stream.evaluation.metrics import ExactScores

if TYPE_CHECKING:
    from stream.evaluation.scoring import ScoredBatch

__all__ = [
    "ALTERNATIVES",
    "DEFAULT_ARL0",
    "Alarm",
    "Detector",
    "Outcomes",
    "alternative_of",
    "arl",
    "batch_outcomes",
    "calibrate",
    "centred_laws",
    "design",
    "exact_chart",
    "first_alarm",
    "in_control",
    "increment_law",
    "increments",
    "isolate",
    "run_alarms",
    "scan",
    "simulate_run_lengths",
    "synonym_chart",
    "threshold_for",
    "trailing_laws",
    "units_of",
]

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]

ALTERNATIVES = ("quality_lost", "wording_changed")
#: The default budget: one false alarm per 100,000 events of a recommender, on average.
DEFAULT_ARL0 = 100_000.0
#: Design shifts: half the lists turned to chance; most exact hits reworded (as `synonyms:1`
#: does: a smaller design shift makes the wording chart answer a loss of exact hits too).
QUALITY_SHARE = 0.5
WORDING_SHARE = 0.8
#: An alarm names the alternative whose family's profile likelihood beats the other's by this
#: many nats on the crossing chart's segment (a likelihood ratio of e^4, about 55).  On the
#: detector benchmark's streams at the bundled feed's law (``python -m
#: workers.commands.backtest.grid``) it misnames 9.6% of the detections, against 22% named
#: by the first chart to cross, at up to ~1.5x the delay where the two families are close.
ISOLATION_NATS = 4.0
#: The shares each family is fitted over.
_SHARES = np.linspace(0.0, 1.0, 101)


@dataclass(frozen=True)
class Outcomes:
    """Per event, how many of its units were exact hits, synonym-only hits and misses.

    >>> o = Outcomes.of(units=[2, 4], exact_ratio=[0.5, 0.0], reval_ratio=[1.0, 0.25])
    >>> o.counts.tolist()
    [[1, 1, 0], [0, 1, 3]]
    """

    counts: Ints  # (events, 3): exact, synonym-only, miss

    @classmethod
    def of(
        cls,
        *,
        units: Sequence[int] | Ints,
        exact_ratio: Sequence[float] | Floats,
        reval_ratio: Sequence[float] | Floats,
    ) -> Outcomes:
        """From the per-event hit ratios at one (k, r) and the units ``min(|R_r|, |G|)``."""
        n = np.asarray(units, dtype=np.int64)
        exact = np.rint(np.asarray(exact_ratio, dtype=np.float64) * n).astype(np.int64)
        hits = np.maximum(np.rint(np.asarray(reval_ratio, dtype=np.float64) * n).astype(np.int64), exact)
        return cls(np.asarray(np.stack([exact, hits - exact, n - hits], axis=1), dtype=np.int64))

    @property
    def units(self) -> Ints:
        return np.asarray(self.counts.sum(axis=1), dtype=np.int64)


def units_of(recommended: Sequence[str], truth: Sequence[str], r: int | None) -> int:
    """An event's units at ``r``: ``min(|R_r|, |G|)`` over distinct hashtags (the denominator
    of Eq. 3-4; ``r`` None: the whole list).

    >>> units_of(["a", "b", "a", "c"], ["x", "y"], 5), units_of(["a", "b"], ["x", "y", "z"], 1)
    (2, 1)
    """
    n = len(dict.fromkeys(recommended))
    return min(n if r is None else min(n, r), len(dict.fromkeys(truth)))


def batch_outcomes(batch: ScoredBatch, units: Sequence[int], *, k: int, r: str) -> tuple[Outcomes, Floats]:
    """The outcomes at (k, r) of a scored batch's events (:func:`units_of` each), and the null
    model's hit chance of each (NaN where the thesaurus has no null model); an unscorable
    event has none (zero units), like an event with no unit."""
    at_k, at_r = batch.ks.index(k), batch.rs.index(r)
    n = np.where(batch.scorable, np.asarray(units, dtype=np.int64), 0)
    outcomes = Outcomes.of(
        units=n,
        exact_ratio=batch.exact[:, at_r, ExactScores.NAMES.index("hit_ratio")],
        reval_ratio=batch.values["reval_hit_ratio"][:, at_r, at_k],
    )
    chance = np.full(len(n), np.nan) if batch.expected is None else batch.expected[:, at_r, at_k]
    return outcomes, np.asarray(chance, dtype=np.float64)


def in_control(outcomes: Outcomes) -> Floats:
    """``p0``: the share of units of each outcome, +0.5 per cell (no zero probability).

    >>> in_control(Outcomes(np.array([[1, 1, 0], [0, 1, 3]]))).round(3).tolist()
    [0.2, 0.333, 0.467]
    """
    totals = outcomes.counts.sum(axis=0).astype(np.float64) + 0.5
    return np.asarray(totals / totals.sum(), dtype=np.float64)


def _llr(p1: Floats, p0: Floats) -> Floats:
    return np.asarray(np.log(np.maximum(p1, 1e-12) / p0), dtype=np.float64)


def design(
    p0: Floats,
    *,
    chance_hit: float,
    quality_share: float = QUALITY_SHARE,
    wording_share: float = WORDING_SHARE,
) -> dict[str, Floats]:
    """The log-likelihood ratio per unit of each outcome, for each alternative (module doc).
    ``p0`` is one law (3,) or one per event (n, 3): the ratios follow its shape."""
    pe, ps, pm = p0[..., 0], p0[..., 1], p0[..., 2]
    q = min(max(chance_hit, 0.0), 1.0)
    to_chance = (1 - quality_share) * p0 + quality_share * np.array([0.0, q, 1.0 - q])
    to_miss = np.stack(
        [pe * (1 - quality_share), ps * (1 - quality_share), pm + quality_share * (pe + ps)], -1
    )
    reworded = np.stack([pe * (1 - wording_share), ps + wording_share * pe, pm], -1)
    return {
        "quality_lost:chance": _llr(to_chance, p0),
        "quality_lost:miss": _llr(to_miss, p0),
        "wording_changed": _llr(reworded, p0),
    }


def alternative_of(chart: str) -> str:
    """The alternative a chart stands for (``quality_lost:miss`` -> ``quality_lost``)."""
    return chart.split(":", 1)[0]


def exact_chart(p0: Floats, *, quality_share: float = QUALITY_SHARE) -> Floats:
    """A CUSUM on exact match alone (hit or not) for the same "quality lost" shift."""
    pe = p0[..., 0]
    hit = np.full_like(pe, np.log(1 - quality_share))
    other = np.log((1 - (1 - quality_share) * pe) / (1 - pe))
    return np.asarray(np.stack([hit, other, other], -1), dtype=np.float64)


def synonym_chart(p0: Floats, *, chance_hit: float, quality_share: float = QUALITY_SHARE) -> Floats:
    """A CUSUM on the synonym-aware hit alone (#REval hit or not) for the same shift."""
    h = p0[..., 0] + p0[..., 1]
    h1 = (1 - quality_share) * h + quality_share * min(max(chance_hit, 0.0), 1.0)
    hit, miss = np.log(h1 / h), np.log((1 - h1) / (1 - h))
    return np.asarray(np.stack([hit, hit, miss], -1), dtype=np.float64)


def trailing_laws(counts: Ints, *, window: int, lag: int, start: Floats | None = None) -> Floats:
    """Per event, the in-control law estimated on the ``window`` events that end ``lag``
    events before it (+0.5 per cell): a baseline that follows a feed's slow wander but not a
    change younger than ``lag`` events.  Events with fewer than ``window`` before their lag
    take ``start`` (the reference law), or what there is.

    >>> c = np.array([[1, 0, 0]] * 4 + [[0, 0, 1]] * 4)
    >>> trailing_laws(c, window=2, lag=1).round(2)[[3, 7]].tolist()
    [[0.71, 0.14, 0.14], [0.14, 0.14, 0.71]]
    """
    n = len(counts)
    cum = np.vstack([np.zeros((1, 3)), np.cumsum(counts, axis=0, dtype=np.float64)])
    end = np.clip(np.arange(n) - lag, 0, n)
    begin = np.clip(end - window, 0, n)
    totals = cum[end] - cum[begin] + 0.5
    laws = totals / totals.sum(axis=1, keepdims=True)
    if start is not None:
        short = (end - begin) < window
        laws[short] = start
    return np.asarray(laws, dtype=np.float64)


def centred_laws(counts: Ints, *, half: int) -> Floats:
    """Per event, the law of the ``2 half + 1`` events centred on it (+0.5 per cell): a
    backtest's *counterfactual* reference -- applied to the control run, what the recommender
    did around each event without the drift (a look ahead no live chart has).

    >>> c = np.array([[1, 0, 0]] * 4 + [[0, 0, 1]] * 4)
    >>> centred_laws(c, half=1).round(2)[[0, 3, 7]].tolist()
    [[0.71, 0.14, 0.14], [0.56, 0.11, 0.33], [0.14, 0.14, 0.71]]
    """
    n = len(counts)
    cum = np.vstack([np.zeros((1, 3)), np.cumsum(counts, axis=0, dtype=np.float64)])
    at = np.arange(n)
    totals = cum[np.minimum(at + half + 1, n)] - cum[np.maximum(at - half, 0)] + 0.5
    return np.asarray(totals / totals.sum(axis=1, keepdims=True), dtype=np.float64)


def increments(counts: Ints, llr: Floats) -> Floats:
    """One chart's increment per event: ``counts · llr`` (one ratio vector, or one per event)."""
    return np.asarray((counts * llr).sum(axis=-1) if llr.ndim == 2 else counts @ llr, dtype=np.float64)


def increment_law(p0: Floats, units: Sequence[int] | Ints, llr: Floats) -> tuple[Floats, Floats]:
    """The exact law of one in-control event's increment ``counts · llr``: (values, probs),
    units drawn from ``units`` (their empirical law), outcomes multinomial from ``p0``."""
    from math import comb

    sizes, freq = np.unique(np.asarray(units, dtype=np.int64), return_counts=True)
    values: list[float] = []
    probs: list[float] = []
    for n, f in zip(sizes.tolist(), (freq / freq.sum()).tolist(), strict=True):
        for e in range(n + 1):
            for s in range(n - e + 1):
                m = n - e - s
                p = comb(n, e) * comb(n - e, s) * p0[0] ** e * p0[1] ** s * p0[2] ** m
                values.append(e * llr[0] + s * llr[1] + m * llr[2])
                probs.append(f * p)
    v, p = np.array(values), np.array(probs)
    order = np.argsort(v)
    return v[order], p[order] / p.sum()


def arl(values: Floats, probs: Floats, threshold: float, *, cells: int = 600) -> float:
    """In-control average run length of a zero-start CUSUM with this increment law and
    threshold (Brook & Evans 1972: the chart's state on ``cells`` intervals of [0, h))."""
    if threshold <= 0:
        return 1.0
    width = threshold / cells
    mids = (np.arange(cells) + 0.5) * width
    # From the middle of cell i, an increment v lands in cell floor((mid + v) / width),
    # below 0 in cell 0 (the reflection), at h or above outside (the alarm).
    target = np.floor((mids[:, None] + values[None, :]) / width).astype(np.int64)
    target = np.maximum(target, 0)
    inside = target < cells
    transition = np.zeros((cells, cells))
    rows = np.broadcast_to(np.arange(cells)[:, None], target.shape)
    np.add.at(transition, (rows[inside], target[inside]), np.broadcast_to(probs, target.shape)[inside])
    # The chart starts at 0: in cell 0, whose middle stands for it.
    lengths = np.linalg.solve(np.eye(cells) - transition, np.ones(cells))
    return float(lengths[0])


def threshold_for(values: Floats, probs: Floats, target_arl: float, *, cells: int = 600) -> float:
    """The threshold whose in-control ARL is ``target_arl`` (bisection on :func:`arl`)."""
    if float(np.dot(values, probs)) >= 0:
        raise ValueError("the chart drifts upwards in control: the alternative is not a change")
    lo, hi = 0.0, 1.0
    while arl(values, probs, hi, cells=cells) < target_arl:
        lo, hi = hi, hi * 2
        if hi > 1e4:
            raise ValueError(f"no threshold reaches an ARL of {target_arl:g}")
    for _ in range(40):
        mid = (lo + hi) / 2
        if arl(values, probs, mid, cells=cells) < target_arl:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-3 * hi:
            break
    return hi


#: Where the union's overlap is measured by simulation (module doc): at the budget itself up
#: to this (the overlap changes with the thresholds: measured at 2,000 it left the union at
#: 13,100 events for a budget of 10,000), and past the small run lengths where the Markov
#: chain's discretisation shows.  A run costs its length: 500 of them, ~5 million events.
PROBE_ARL = 10_000.0
#: In-control runs per measurement of the union (each mean within ~4.5%).
CALIBRATION_RUNS = 500


def calibrate(
    p0: Floats,
    units: Sequence[int] | Ints,
    charts: Mapping[str, Floats],
    arl0: float,
    *,
    seed: int = 0,
    chance_hit: float | None = None,
    margin: float = ISOLATION_NATS,
) -> tuple[dict[str, float], float]:
    """Thresholds for ``charts`` run together, whose union's in-control ARL is ``arl0``; and
    the overlap factor used.

    One chart alone: the threshold of ARL ``arl0``.  Several: their alarm rates would add if
    the charts were independent (each at ``len(charts) * arl0``); they are not -- they read
    the same events, so their alarms coincide in part and the union alarms less often.  The
    factor ``ρ`` (union ARL over the independent charts' ``arl0``) is measured by simulating
    the in-control model at :data:`PROBE_ARL` events -- twice, to follow how it changes with
    the thresholds -- and each chart is set to ``len(charts) * arl0 / ρ``.  With
    ``chance_hit`` the union is the detector's (a crossing raises an alarm once its
    alternative is isolated by ``margin`` nats: rarer than a crossing, so ``ρ`` may pass
    ``len(charts)``).
    """
    laws = {name: increment_law(p0, units, llr) for name, llr in charts.items()}
    if len(charts) == 1:
        return {name: threshold_for(*law, arl0) for name, law in laws.items()}, 1.0
    probe = min(arl0, PROBE_ARL)

    def union(per_chart: float) -> float:
        """The union's mean run length with every chart at ARL ``per_chart`` (the same
        streams each time: common random numbers, a less noisy ratio)."""
        trial = {name: threshold_for(*law, per_chart) for name, law in laws.items()}
        runs = simulate_run_lengths(
            p0,
            units,
            charts,
            trial,
            runs=CALIBRATION_RUNS,
            horizon=int(probe * 12),
            seed=seed,
            chance_hit=chance_hit,
            margin=margin,
        )
        return float(runs.mean())

    # The union's run length grows about as a power of the charts' (log-log linear; the power
    # is below 1 -- 0.75-0.85 measured -- because the charts overlap less as they rise): two
    # measurements four-fold apart give the power, the budget is read off the line.
    x1 = probe * len(charts)
    m1 = union(x1)
    m0 = union(x1 / 4)
    slope = float(np.clip(np.log(m1 / m0) / np.log(4.0), 0.5, 1.5)) if m1 > m0 else 1.0
    per_chart = float(x1 * (arl0 / m1) ** (1 / slope))
    if per_chart <= x1:  # the budget is within reach of the probe: check it there, correct once
        per_chart *= (arl0 / union(per_chart)) ** (1 / slope)
    overlap = arl0 * len(charts) / per_chart
    return {name: threshold_for(*law, per_chart) for name, law in laws.items()}, overlap


def _families(laws: Floats, chance_hit: float) -> dict[str, Floats]:
    """Log-probabilities of the outcomes under each alternative's family at every share of
    :data:`_SHARES`: for ``laws`` (m, 3), arrays (m, shares, 3) per curve of the family."""
    q = min(max(chance_hit, 0.0), 1.0)
    p = laws[:, None, :]
    pe, ps, pm = p[..., 0], p[..., 1], p[..., 2]
    x = _SHARES[None, :]
    curves = {
        "wording_changed": np.stack([pe * (1 - x), ps + x * pe, pm + 0 * x], -1),
        "quality_lost:chance": (1 - x[..., None]) * p + x[..., None] * np.array([0.0, q, 1.0 - q]),
        "quality_lost:miss": np.stack([pe * (1 - x), ps * (1 - x), pm + x * (pe + ps)], -1),
    }
    return {name: np.log(np.maximum(c, 1e-12)) for name, c in curves.items()}


def isolate(segments: Ints | Floats, laws: Floats, chance_hit: float) -> tuple[list[str], Floats]:
    """For each segment's outcome counts (m, 3) against its in-control law (m, 3): the
    alternative whose family fits it best (profile likelihood over the share) and by how many
    nats it beats the other.

    >>> p0 = np.array([[0.2, 0.1, 0.7]] * 2)
    >>> names, margin = isolate(np.array([[2, 28, 70], [2, 8, 90]]), p0, 0.1)
    >>> names, (margin > 4).tolist()
    (['wording_changed', 'quality_lost'], [True, True])
    """
    seg = np.asarray(segments, dtype=np.float64).reshape(-1, 3)
    laws = np.broadcast_to(np.asarray(laws, dtype=np.float64), seg.shape)
    best: dict[str, Floats] = {}
    for name, logp in _families(np.ascontiguousarray(laws), chance_hit).items():
        fit = np.einsum("mc,msc->ms", seg, logp).max(axis=1)
        key = alternative_of(name)
        best[key] = np.maximum(best[key], fit) if key in best else fit
    lost, reworded = best["quality_lost"], best["wording_changed"]
    names = [
        "quality_lost" if a >= b else "wording_changed"
        for a, b in zip(lost.tolist(), reworded.tolist(), strict=True)
    ]
    return names, np.abs(lost - reworded)


@dataclass(frozen=True)
class Scan:
    """What :func:`scan` found on a stretch of events: the first alarm (its index in the
    stretch, the chart that crossed, the alternative named) or none, and the charts' values
    and segments after the stretch (zero and empty after an alarm: every chart restarts).
    A segment is six numbers: the outcome counts since the chart last stood at zero, and
    the sum of those events' in-control laws weighted by their units (the families of the
    isolation are fitted against the segment's mean law)."""

    alarm: int | None
    chart: str | None
    alternative: str | None
    values: dict[str, float]
    segments: dict[str, list[float]]


EMPTY_SEGMENT = (0.0,) * 6


def scan(
    counts: Ints,
    steps: Mapping[str, Floats],
    thresholds: Mapping[str, float],
    laws: Floats,
    chance_hit: float,
    *,
    values: Mapping[str, float] | None = None,
    segments: Mapping[str, Sequence[float]] | None = None,
    margin: float = ISOLATION_NATS,
) -> Scan:
    """The charts over ``counts`` (n, 3) with their per-event ``steps``, from ``values`` (zero)
    and ``segments`` (empty), up to the first alarm: a chart at or above its threshold whose
    segment isolates an alternative by ``margin`` nats (module doc).  ``laws`` is the
    in-control law of each event (n, 3), or one law.

    >>> p0 = np.array([0.2, 0.1, 0.7])
    >>> charts = design(p0, chance_hit=0.1)
    >>> lost = np.array([[0, 0, 2]] * 40)
    >>> steps = {n: increments(lost, r) for n, r in charts.items()}
    >>> found = scan(lost, steps, dict.fromkeys(charts, 5.0), p0, 0.1)
    >>> found.alarm, found.alternative
    (12, 'quality_lost')
    """
    counts = np.asarray(counts, dtype=np.int64).reshape(-1, 3)
    n = len(counts)
    laws = np.broadcast_to(np.asarray(laws, dtype=np.float64), (n, 3)) if n else np.zeros((0, 3))
    # per position (after that many events): the outcome counts and unit-weighted laws so far
    cum = np.vstack(
        [np.zeros((1, 6)), np.cumsum(np.hstack([counts, laws * counts.sum(axis=1)[:, None]]), axis=0)]
    )
    first: tuple[int, int, str, str] | None = None  # (index, alternative's rank, chart, alternative)
    paths: dict[str, tuple[Floats, Ints]] = {}

    def segment(name: str, position: Ints, start: Ints) -> Floats:
        carried = np.asarray((segments or {}).get(name, EMPTY_SEGMENT), dtype=np.float64)
        return np.asarray(
            cum[position] - cum[np.maximum(start, 0)] + np.where(start[:, None] < 0, carried, 0.0)
        )

    for name, inc in steps.items():
        v0 = 0.0 if values is None else float(values.get(name, 0.0))
        c = np.concatenate([[v0], v0 + np.cumsum(inc)])
        s = c - np.minimum(np.minimum.accumulate(c), 0.0)
        # the last position where the chart stood at zero; -1: not in this stretch (the
        # segment began before it: the chart starts at v0 > 0)
        last = np.maximum.accumulate(np.where(s <= 0.0, np.arange(n + 1), -1))
        paths[name] = (s, last)
        over = np.flatnonzero(s[1:] >= thresholds[name]) + 1  # positions after the crossing event
        if first is not None:
            over = over[over <= first[0] + 1]
        if not len(over):
            continue
        seg = segment(name, over, last[over])
        units = seg[:, :3].sum(axis=1, keepdims=True)
        mean_law = np.where(units > 0, seg[:, 3:] / np.maximum(units, 1e-12), laws[over - 1])
        named, gap = isolate(seg[:, :3], mean_law, chance_hit)
        ok = np.flatnonzero(gap >= margin)
        if len(ok):
            at, alternative = int(over[ok[0]]) - 1, named[ok[0]]
            key = (at, ALTERNATIVES.index(alternative), name, alternative)
            if first is None or key < first:
                first = key
    if first is not None:
        return Scan(
            first[0], first[2], first[3], dict.fromkeys(steps, 0.0), {k: list(EMPTY_SEGMENT) for k in steps}
        )
    ends = np.array([n])
    return Scan(
        None,
        None,
        None,
        {name: float(s[n]) for name, (s, _) in paths.items()},
        {name: segment(name, ends, last[ends])[0].tolist() for name, (_, last) in paths.items()},
    )


def run_alarms(
    counts: Ints,
    steps: Mapping[str, Floats],
    thresholds: Mapping[str, float],
    laws: Floats,
    chance_hit: float,
) -> list[tuple[int, str]]:
    """Every alarm of the charts over a whole run, all restarting at zero after each: (index
    of the alarm's event, the alternative it names)."""
    counts = np.asarray(counts, dtype=np.int64).reshape(-1, 3)
    laws = np.broadcast_to(np.asarray(laws, dtype=np.float64), counts.shape)
    found: list[tuple[int, str]] = []
    begin = 0
    while begin < len(counts):
        at = scan(
            counts[begin:], {n: x[begin:] for n, x in steps.items()}, thresholds, laws[begin:], chance_hit
        )
        if at.alarm is None or at.alternative is None:
            break
        found.append((begin + at.alarm, at.alternative))
        begin += at.alarm + 1
    return found


def first_alarm(increments: Floats, threshold: float) -> int | None:
    """Index of the first event at which a zero-start CUSUM of ``increments`` reaches
    ``threshold`` (None: never).  Vectorised: ``S_t = C_t - min(0, min_{j<=t} C_j)``.

    >>> first_alarm(np.array([1.0, -5.0, 2.0, 2.0, 2.0]), 5.0)
    4
    """
    if not len(increments):
        return None
    c = np.cumsum(increments)
    s = c - np.minimum(np.minimum.accumulate(c), 0.0)
    crossed = np.flatnonzero(s >= threshold)
    return int(crossed[0]) if len(crossed) else None


def simulate_run_lengths(
    p0: Floats,
    units: Sequence[int] | Ints,
    charts: Mapping[str, Floats],
    thresholds: Mapping[str, float],
    *,
    runs: int,
    horizon: int,
    seed: int = 0,
    chance_hit: float | None = None,
    margin: float = ISOLATION_NATS,
) -> Ints:
    """In-control run lengths of ``charts`` run together, each run ``horizon`` events at most
    (a run that never alarms counts as ``horizon``: censored): the first chart to cross, or
    with ``chance_hit`` the detector's alarms (a crossing whose alternative is isolated by
    ``margin`` nats, :func:`scan`).  Each run is drawn in chunks until its alarm, so it costs its length."""
    rng = np.random.default_rng(seed)
    pool = np.asarray(units, dtype=np.int64)
    lengths = np.full(runs, horizon, dtype=np.int64)
    chunk = max(min(horizon, 20_000), 1)
    for i in range(runs):
        done, values, segments = 0, None, None
        while done < horizon:
            counts = rng.multinomial(rng.choice(pool, size=min(chunk, horizon - done)), p0)
            steps = {name: counts @ llr for name, llr in charts.items()}
            found = scan(
                counts,
                steps,
                thresholds,
                p0,
                0.0 if chance_hit is None else chance_hit,
                values=values,
                segments=segments,
                margin=0.0 if chance_hit is None else margin,
            )
            if found.alarm is not None:
                lengths[i] = done + found.alarm + 1
                break
            done, values, segments = done + len(counts), found.values, found.segments
    return lengths


@dataclass(frozen=True)
class Alarm:
    """A chart crossed its threshold: which alternative, at the detector's ``event`` (its
    count of events seen, the alarm's included)."""

    alternative: str
    chart: str
    event: int


class Detector:
    """One recommender's change detector, live: the charts of :func:`design` over its scored
    events in order, each event judged against its trailing law (:func:`trailing_laws`, as
    ``reval backtest`` does), the thresholds calibrated to ``arl0`` (:func:`calibrate`) once
    its first ``reference`` events are in -- their law is the in-control one until then.
    After an alarm every chart restarts at zero.  The state is plain JSON
    (:meth:`to_state`), so it can live outside the process: a detector rebuilt from it goes
    on as if it had never stopped.

    >>> rng = np.random.default_rng(0)
    >>> d = Detector(arl0=5_000, reference=400, window=400, lag=100)
    >>> calm = rng.multinomial(1, [0.4, 0.1, 0.5], size=600)
    >>> d.update(calm, np.full(600, 0.1)), d.events, sorted(d.thresholds) == sorted(d.charts)
    ([], 600, True)
    >>> lost = rng.multinomial(1, [0.05, 0.05, 0.9], size=300)   # most hits gone
    >>> d.update(lost, np.full(300, 0.1))[0]
    Alarm(alternative='quality_lost', chart='quality_lost:miss', event=614)
    >>> Detector.from_state(d.to_state()).to_state() == d.to_state()
    True
    """

    def __init__(
        self,
        arl0: float = DEFAULT_ARL0,
        *,
        reference: int = 1000,
        window: int = 1000,
        lag: int = 300,
        seed: int = 0,
    ) -> None:
        if reference < 20:
            raise ValueError(f"the reference needs at least 20 events, got {reference}")
        self.arl0, self.reference, self.window, self.lag, self.seed = arl0, reference, window, lag, seed
        self.events = 0
        #: The last ``window + lag`` events' outcome counts (the trailing laws' input); until
        #: the thresholds are set, every event so far (the reference).
        self.history = np.zeros((0, 3), dtype=np.int64)
        #: The reference's chance of each event (until calibrated: averaged once, whatever the
        #: batches were).
        self.reference_chance: list[float] = []
        self.p0: Floats | None = None
        self.chance = 0.0
        self.thresholds: dict[str, float] = {}
        self.values: dict[str, float] = {}
        #: Each chart's segment since it last stood at zero (what names an alarm; :class:`Scan`).
        self.segments: dict[str, list[float]] = {}
        self.alarms: dict[str, int] = {name: 0 for name in ALTERNATIVES}

    @property
    def charts(self) -> dict[str, Floats]:
        """The charts' log-likelihood ratios per unit at the in-control law (none before it)."""
        return {} if self.p0 is None else design(self.p0, chance_hit=self.chance)

    def update(self, counts: Ints | npt.ArrayLike, chance: Floats | npt.ArrayLike) -> list[Alarm]:
        """Add events in order: their outcome counts ``(exact, synonym-only, miss)`` and the
        null model's hit chance of each (NaN: unknown).  Returns the alarms they raised."""
        counts = np.asarray(counts, dtype=np.int64).reshape(-1, 3)
        chance = np.asarray(chance, dtype=np.float64).reshape(-1)
        alarms: list[Alarm] = []
        if self.p0 is None:
            take = min(len(counts), self.reference - self.events)
            self.history = np.vstack([self.history, counts[:take]])
            self.reference_chance += chance[:take].tolist()
            self.events += take
            counts, chance = counts[take:], chance[take:]
            if self.events == self.reference:
                self._calibrate()
        if len(counts) and self.p0 is not None:
            alarms = self._run(counts)
        return alarms

    def _calibrate(self) -> None:
        outcomes = Outcomes(self.history)
        self.p0 = in_control(outcomes)
        # The null recommender's hit chance per unit: the events' chances weighted by units.
        chance = np.asarray(self.reference_chance, dtype=np.float64)
        weights = outcomes.units.astype(np.float64)
        known = ~np.isnan(chance) & (weights > 0)
        self.chance = float(np.average(chance[known], weights=weights[known])) if known.any() else 0.0
        self.reference_chance = []
        units = outcomes.units
        self.thresholds, _ = calibrate(
            self.p0, units[units > 0], self.charts, self.arl0, seed=self.seed, chance_hit=self.chance
        )
        self.values = {name: 0.0 for name in self.thresholds}
        self.segments = {name: list(EMPTY_SEGMENT) for name in self.thresholds}

    def _run(self, counts: Ints) -> list[Alarm]:
        assert self.p0 is not None
        start = len(self.history)
        both = np.vstack([self.history, counts])
        # The laws of the new events, each from the events before it (the same arithmetic as
        # over a whole run: the history holds at least window + lag events, or all of them).
        laws = trailing_laws(both, window=self.window, lag=self.lag, start=self.p0)[start:]
        if self.events < self.window + self.lag:  # an event without a full window takes p0
            short = np.arange(self.events, self.events + len(counts)) - self.lag < self.window
            laws[short] = self.p0
        ratios = design(laws, chance_hit=self.chance)
        steps = {name: increments(counts, ratios[name]) for name in self.thresholds}
        alarms: list[Alarm] = []
        begin = 0
        while begin < len(counts):
            found = scan(
                counts[begin:],
                {name: inc[begin:] for name, inc in steps.items()},
                self.thresholds,
                laws[begin:],
                self.chance,
                values=self.values,
                segments=self.segments,
            )
            self.values, self.segments = found.values, found.segments
            if found.alarm is None or found.alternative is None or found.chart is None:
                break
            alarms.append(Alarm(found.alternative, found.chart, self.events + begin + found.alarm + 1))
            self.alarms[found.alternative] += 1
            begin += found.alarm + 1  # every chart restarts after an alarm
        self.events += len(counts)
        self.history = both[-(self.window + self.lag) :]
        return alarms

    def to_state(self) -> dict[str, Any]:
        """The whole detector as JSON-able values."""
        return {
            "arl0": self.arl0,
            "reference": self.reference,
            "window": self.window,
            "lag": self.lag,
            "seed": self.seed,
            "events": self.events,
            # int32 bytes, not a list: a score worker writes this after every batch
            "history": base64.b64encode(self.history.astype("<i4").tobytes()).decode(),
            "reference_chance": [c if c == c else None for c in self.reference_chance],  # NaN: null
            "p0": None if self.p0 is None else self.p0.tolist(),
            "chance": self.chance,
            "thresholds": dict(self.thresholds),
            "values": dict(self.values),
            "segments": dict(self.segments),
            "alarms": dict(self.alarms),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Detector:
        d = cls(
            state["arl0"],
            reference=state["reference"],
            window=state["window"],
            lag=state["lag"],
            seed=state["seed"],
        )
        d.events = int(state["events"])
        raw = base64.b64decode(state["history"])
        d.history = np.frombuffer(raw, dtype="<i4").astype(np.int64).reshape(-1, 3)
        d.reference_chance = [float("nan") if c is None else float(c) for c in state["reference_chance"]]
        d.p0 = None if state["p0"] is None else np.asarray(state["p0"], dtype=np.float64)
        d.chance = float(state["chance"])
        d.thresholds = {k: float(v) for k, v in state["thresholds"].items()}
        d.values = {k: float(v) for k, v in state["values"].items()}
        # a state written before alarms were isolated has none: the charts' segments start now
        d.segments = {k: [float(x) for x in v] for k, v in state.get("segments", {}).items()}
        d.alarms = {k: int(v) for k, v in state["alarms"].items()}
        return d
