"""The drift-detection backtest as pure steps: drifts injected into recommendation lists,
and the alert rules of ``deploy/prometheus`` replayed over event time.

``reval backtest`` (:mod:`workers.commands.backtest`) replays a feed, scores every event
with :func:`stream.scoring.score_event` (the scorer's path) once undisturbed (the
*control*) and once per injected drift, and asks of each alert signal: how long after
the drift began did it fire (an alarm the control run does not raise), and how often
does it fire on the control run (false alarms per day of event time)?

The rules are evaluated as Prometheus evaluates them: at regular instants, a window
mean is (sum of values)/(number of values) over the events of ``(t - window, t]`` (the
``rate(x_sum) / rate(x_count)`` of the recording rules), a baseline is the mean of that
window at each offset that has events, and an alert fires once its condition has held
at every instant for its ``for`` duration.

>>> at = np.arange(0.0, 10.0)
>>> hold(np.array([0, 1, 1, 1, 0, 1, 1, 1, 1, 1], bool), at, 2.0).astype(int).tolist()
[0, 0, 0, 1, 0, 0, 0, 1, 1, 1]
>>> episodes(np.array([0, 1, 1, 0, 1, 0], bool))
2
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import numpy.typing as npt

from stream.chance import MIN_ROOM

__all__ = [
    "KINDS",
    "SIGNALS",
    "Injection",
    "Rules",
    "Series",
    "auto_time_scale",
    "baseline",
    "detect",
    "duration_text",
    "enough_events",
    "episodes",
    "evaluable",
    "hold",
    "inject",
    "mutual_synonym",
    "parse_injection",
    "signals",
    "window_kappa",
    "window_mean",
]

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

#: Drift kinds: what each does to a recommendation list from the injection time on.
KINDS = {
    "random": "a fraction F of each list replaced by random known hashtags",
    "swap": "the recommender replaced by another (swap:least-popular: the canary)",
    "synonyms": "a fraction F of the recommended hashtags replaced by their nearest mutual thesaurus synonym",
    "stale": "recommendations from the model of D days before (stale:D)",
    "vocab": "a fraction F of the recommended hashtags respelled (unknown to the thesaurus)",
}

#: Alert signals, each one rule of deploy/prometheus (``exact_drop`` is the quality-drop
#: rule applied to the exact hit ratio: what a monitor without synonyms would alert on).
SIGNALS = {
    "reval_drop": "RevalRecommenderQualityDrop (#REval at the alert k, r)",
    "corrected_at_chance": "RevalRecommenderAtChance (chance-corrected #REval)",
    "exact_drop": "the quality-drop rule on the exact hit ratio at r",
    "semantic_gap": "RevalSemanticGapWidening (exact falls, #REval holds)",
    "unknown_rising": "RevalUnknownHashtagsRising (share of recommended hashtags unknown)",
}

_INJECTION = re.compile(r"^(?P<kind>[a-z-]+):(?P<amount>[^@]+)(?:@(?P<at>.+))?$")


@dataclass(frozen=True)
class Injection:
    """One drift: ``kind`` from ``at`` on (None: the middle of the scored period).
    ``amount`` is the fraction F, the days D of ``stale`` or the recommender of ``swap``."""

    kind: str
    amount: str
    at: datetime | None = None

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.amount}"

    @property
    def fraction(self) -> float:
        return float(self.amount)


def parse_injection(text: str) -> Injection:
    """``KIND:AMOUNT[@TIME]`` → :class:`Injection`; TIME is ISO 8601 (UTC if no zone).

    >>> parse_injection("random:0.5@2013-01-01").at.isoformat()
    '2013-01-01T00:00:00+00:00'
    >>> parse_injection("stale:30").label
    'stale:30'
    >>> parse_injection("random:2")
    Traceback (most recent call last):
    ...
    ValueError: --inject random:2: the fraction must be in (0, 1]
    """
    match = _INJECTION.match(text.strip())
    if not match:
        raise ValueError(f"--inject {text!r}: expected KIND:AMOUNT[@TIME], e.g. random:0.5@2013-01-01")
    kind, amount, at_text = match["kind"], match["amount"].strip(), match["at"]
    if kind not in KINDS:
        raise ValueError(f"--inject {text}: unknown kind {kind!r}; one of {', '.join(KINDS)}")
    if kind in ("random", "synonyms", "vocab"):
        try:
            value = float(amount)
        except ValueError:
            raise ValueError(f"--inject {text}: the fraction must be a number") from None
        if not 0.0 < value <= 1.0:
            raise ValueError(f"--inject {text}: the fraction must be in (0, 1]")
    elif kind == "stale":
        try:
            days = float(amount)
        except ValueError:
            raise ValueError(f"--inject {text}: stale needs a number of days") from None
        if not days > 0:
            raise ValueError(f"--inject {text}: stale needs a positive number of days")
    elif kind == "swap" and amount != "least-popular":
        raise ValueError(f"--inject {text}: swap supports least-popular")
    at = None
    if at_text:
        try:
            at = datetime.fromisoformat(at_text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"--inject {text}: {at_text!r} is not an ISO 8601 time") from None
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
    return Injection(kind, amount, at)


# --------------------------------------------------------------------------- drifts


def _positions(n: int, fraction: float, rng: np.random.Generator) -> list[int]:
    """``round(fraction * n)`` distinct positions of a list of ``n`` (at least one when n > 0)."""
    if n == 0:
        return []
    count = min(n, max(1, round(fraction * n)))
    return sorted(int(i) for i in rng.choice(n, size=count, replace=False))


def respell(hashtag: str, known: Callable[[str], bool]) -> str:
    """A new spelling of ``hashtag`` that ``known`` does not know (its last letter doubled,
    else a numbered suffix): the way fresh variants of a hashtag appear in a feed.

    >>> respell("flood", lambda h: h == "floodd")
    'flood_2'
    """
    candidate = hashtag + hashtag[-1:]
    suffix = 2
    while known(candidate):
        candidate = f"{hashtag}_{suffix}"
        suffix += 1
    return candidate


def mutual_synonym(hashtag: str, taken: set[str], neighbours: Callable[[str], Sequence[str]]) -> str | None:
    """The nearest neighbour ``s`` of ``hashtag`` (not in ``taken``) that has ``hashtag``
    among its own neighbours: #REval then credits ``s`` wherever it credited ``hashtag``
    as a ground truth (a hit needs the truth among the *recommended* hashtag's synonyms).

    >>> table = {"flood": ["fire", "floods"], "fire": ["smoke"], "floods": ["flood"]}
    >>> mutual_synonym("flood", set(), lambda h: table.get(h, []))
    'floods'
    """
    for candidate in neighbours(hashtag):
        if candidate not in taken and hashtag in neighbours(candidate):
            return candidate
    return None


def inject(
    kind: str,
    fraction: float,
    recs: Sequence[str],
    rng: np.random.Generator,
    *,
    vocabulary: Sequence[str] = (),
    synonym: Callable[[str, set[str]], str | None] = lambda h, taken: None,
    known: Callable[[str], bool] = lambda h: False,
) -> list[str]:
    """One list after a ``random``, ``synonyms`` or ``vocab`` drift (``swap`` and ``stale``
    replace whole lists: the caller takes them from another model).  ``synonym(h, taken)``
    is a synonym of ``h`` not in ``taken`` (None: ``h`` stays).

    >>> rng = np.random.default_rng(0)
    >>> inject("synonyms", 1.0, ["flood", "fire"], rng, synonym=lambda h, taken: {"flood": "floods"}.get(h))
    ['floods', 'fire']
    >>> inject("vocab", 1.0, ["flood"], rng)
    ['floodd']
    """
    out = list(recs)
    for i in _positions(len(out), fraction, rng):
        if kind == "random":
            taken = set(out)
            choices = [h for h in rng.choice(vocabulary, size=min(len(vocabulary), 8)) if h not in taken]
            if choices:
                out[i] = str(choices[0])
        elif kind == "synonyms":
            found = synonym(out[i], set(out))
            if found is not None:
                out[i] = found
        elif kind == "vocab":
            out[i] = respell(out[i], lambda h: known(h) or h in out)
        else:
            raise ValueError(f"{kind} drifts replace whole lists, not hashtags")
    return out


# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class Rules:
    """The alert rules' thresholds and durations (seconds of event time), taken from
    ``deploy/prometheus/render.py``'s parameters and multiplied by the time scale."""

    step: float
    quality_window: float
    baseline_offsets: tuple[float, ...]
    quality_drop_fraction: float
    quality_for: float
    min_events: int
    chance_margin: float
    chance_for: float
    gap_exact_drop_fraction: float
    gap_reval_tolerance: float
    gap_for: float
    unknown_window: float
    unknown_baseline_window: float
    unknown_share_max: float
    unknown_share_rise: float
    unknown_for: float


@dataclass(frozen=True)
class Series:
    """Per-event scores of one run in event-time order (NaN: unscorable).  ``reval`` is
    #REval at the alert (k, r), ``exact`` the exact hit ratio at r; ``recommended`` and
    ``unknown`` count each event's recommended hashtags and those the thesaurus lacks."""

    t: Floats
    reval: Floats
    expected: Floats
    exact: Floats
    recommended: Floats
    unknown: Floats


def _window_sums(t: Floats, values: Floats, at: Floats, window: float) -> tuple[Floats, Floats]:
    """Sum and number of the non-NaN ``values`` with event time in ``(at - window, at]``."""
    ok = ~np.isnan(values)
    sums = np.concatenate([[0.0], np.cumsum(np.where(ok, values, 0.0))])
    counts = np.concatenate([[0.0], np.cumsum(ok.astype(np.float64))])
    hi = np.searchsorted(t, at, side="right")
    lo = np.searchsorted(t, at - window, side="right")
    return sums[hi] - sums[lo], counts[hi] - counts[lo]


def window_mean(t: Floats, values: Floats, at: Floats, window: float) -> Floats:
    """The mean of ``values`` over ``(at - window, at]`` at each instant; NaN when empty.

    >>> t = np.array([1.0, 2.0, 3.0]); v = np.array([1.0, np.nan, 0.0])
    >>> window_mean(t, v, np.array([0.0, 1.0, 3.0]), 2.5).tolist()
    [nan, 1.0, 0.5]
    """
    total, count = _window_sums(t, values, at, window)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def window_kappa(t: Floats, observed: Floats, expected: Floats, at: Floats, window: float) -> Floats:
    """The chance-corrected score over ``(at - window, at]`` at each instant: the kappa of the
    window's sums (:func:`stream.chance.corrected_of_sums`, best = 1 per event) over the events
    with an expectation; NaN where the window is empty or leaves no room above chance.

    >>> t = np.array([1.0, 2.0, 3.0]); o = np.array([1.0, 0.0, 0.5]); e = np.array([0.2, 0.2, np.nan])
    >>> window_kappa(t, o, e, np.array([0.0, 2.0, 3.0]), 5.0).round(4).tolist()
    [nan, 0.375, 0.375]
    """
    both = np.where(np.isnan(expected), np.nan, observed)
    sum_o, n = _window_sums(t, both, at, window)
    sum_e, _ = _window_sums(t, np.where(np.isnan(observed), np.nan, expected), at, window)
    room = n - sum_e
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(room > MIN_ROOM, (sum_o - sum_e) / np.where(room > MIN_ROOM, room, 1.0), np.nan)


def baseline(t: Floats, values: Floats, at: Floats, window: float, offsets: Sequence[float]) -> Floats:
    """The mean of the window means at each offset before ``at`` that has events
    (PromQL ``avg`` over the ``offset`` series: a missing one is skipped)."""
    past = np.stack([window_mean(t, values, at - o, window) for o in offsets])
    present = ~np.isnan(past)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(
            present.any(axis=0), np.nansum(past, axis=0) / np.maximum(present.sum(axis=0), 1), np.nan
        )


def hold(condition: Bools, at: Floats, for_s: float) -> Bools:
    """Firing instants of an alert whose ``condition`` must hold for ``for_s`` seconds:
    pending from the first true instant, firing once ``for_s`` has passed since then."""
    firing = np.zeros(len(condition), dtype=bool)
    since = math.nan
    for i, (true, now) in enumerate(zip(condition.tolist(), at.tolist(), strict=True)):
        if not true:
            since = math.nan
            continue
        if math.isnan(since):
            since = now
        firing[i] = now - since >= for_s
    return firing


def episodes(firing: Bools) -> int:
    """How many separate times an alert started firing."""
    if not len(firing):
        return 0
    return int(firing[0]) + int(np.count_nonzero(firing[1:] & ~firing[:-1]))


def enough_events(series: Series, at: Floats, rules: Rules) -> Bools:
    """Instants whose quality window holds the rules' minimum of scored events (the
    quality alerts are silent elsewhere)."""
    scored = np.where(np.isnan(series.reval), np.nan, 1.0)
    return _window_sums(series.t, scored, at, rules.quality_window)[1] >= rules.min_events


def evaluable(series: Series, at: Floats, rules: Rules) -> Bools:
    """Instants at which the drop rules can fire at all: enough events now and a baseline
    (some offset's window with events).  On a sparse feed these, not the signals, bound
    the detection delays."""
    past = baseline(series.t, series.reval, at, rules.quality_window, rules.baseline_offsets)
    return enough_events(series, at, rules) & ~np.isnan(past)


def _below(a: Floats, b: Floats) -> Bools:
    with np.errstate(invalid="ignore"):
        return np.nan_to_num(a, nan=np.inf) < np.nan_to_num(b, nan=-np.inf)


def signals(series: Series, at: Floats, rules: Rules) -> dict[str, Bools]:
    """Every signal's firing instants on one run."""
    t, qw, offsets = series.t, rules.quality_window, rules.baseline_offsets
    enough = enough_events(series, at, rules)
    reval_now = window_mean(t, series.reval, at, qw)
    reval_base = baseline(t, series.reval, at, qw, offsets)
    exact_now = window_mean(t, series.exact, at, qw)
    exact_base = baseline(t, series.exact, at, qw, offsets)
    corrected_now = window_kappa(t, series.reval, series.expected, at, qw)

    def share(window: float) -> Floats:
        unknown, _ = _window_sums(t, series.unknown, at, window)
        total, _ = _window_sums(t, series.recommended, at, window)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(total > 0, unknown / np.maximum(total, 1), np.nan)

    share_now, share_base = share(rules.unknown_window), share(rules.unknown_baseline_window)
    share_known = np.nan_to_num(share_now, nan=-np.inf)
    drop, gap = 1.0 - rules.quality_drop_fraction, 1.0 - rules.gap_exact_drop_fraction
    with np.errstate(invalid="ignore"):
        conditions = {
            "reval_drop": (_below(reval_now, drop * reval_base) & enough, rules.quality_for),
            "corrected_at_chance": (
                (np.nan_to_num(corrected_now, nan=np.inf) <= rules.chance_margin) & enough,
                rules.chance_for,
            ),
            "exact_drop": (_below(exact_now, drop * exact_base) & enough, rules.quality_for),
            "semantic_gap": (
                _below(exact_now, gap * exact_base)
                & (np.nan_to_num(reval_now, nan=-np.inf) >= (1.0 - rules.gap_reval_tolerance) * reval_base)
                & enough,
                rules.gap_for,
            ),
            "unknown_rising": (
                (share_known > rules.unknown_share_max)
                & (share_known > np.nan_to_num(share_base, nan=np.inf) + rules.unknown_share_rise),
                rules.unknown_for,
            ),
        }
    return {name: hold(cond, at, for_s) for name, (cond, for_s) in conditions.items()}


def detect(
    drifted: Mapping[str, Bools], control: Mapping[str, Bools], at: Floats, start: float
) -> dict[str, float | None]:
    """Seconds from ``start`` to each signal's first alarm at or after it that the control
    run does not raise at the same instant (None: it never fires)."""
    out: dict[str, float | None] = {}
    after = at >= start
    for name, firing in drifted.items():
        hits = np.flatnonzero(firing & ~control[name] & after)
        out[name] = float(at[hits[0]] - start) if len(hits) else None
    return out


def duration_text(seconds: float | None) -> str:
    """A delay as people read it (— for none).

    >>> duration_text(None), duration_text(600), duration_text(5400 * 2), duration_text(86400 * 3)
    ('—', '10 min', '3.0 h', '3.0 d')
    """
    if seconds is None:
        return "—"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def auto_time_scale(
    n_events: int,
    span_s: float,
    quality_window_s: float,
    min_events: int,
    *,
    room_s: float,
    lookback_s: float,
) -> float:
    """The factor that stretches the rules' durations so that the quality window holds,
    on average, twice the rules' minimum number of events -- at least 1 (a feed as dense
    as production keeps the production durations), and at most what lets the first
    baseline (``lookback_s`` = the first offset plus the window, unscaled) exist within
    ``room_s`` (the scored time before the injection): without a baseline no drop can fire.

    >>> auto_time_scale(8_640, 86_400.0, 3_600.0, 50, room_s=1e9, lookback_s=90_000.0)  # 360 an hour
    1.0
    >>> auto_time_scale(240, 86_400.0, 3_600.0, 50, room_s=1e9, lookback_s=90_000.0)  # 10 an hour
    10.0
    >>> auto_time_scale(240, 86_400.0, 3_600.0, 50, room_s=450_000.0, lookback_s=90_000.0)
    5.0
    """
    if n_events <= 0 or span_s <= 0:
        return 1.0
    per_window = n_events / span_s * quality_window_s
    return max(1.0, min(2.0 * min_events / per_window, room_s / lookback_s))
