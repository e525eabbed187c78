"""``reval backtest``: does an alert catch a drifted recommender, and how soon?

The feed is replayed in event time, walking forward the way the live system does:

* the first ``warmup`` share of the tweets only trains (recommender, thesaurus means);
* from then on, every ``refit_days`` of event time, the recommender is refitted on every
  labelled tweet so far and the thesaurus is rebuilt from the running means of every
  tweet so far (the index job's all-time means, with this round's hubness method);
* every labelled tweet after the warm-up is a recommendation event, recommended by the
  current model and scored with :func:`stream.scoring.score_event` -- the scorer's path
  -- against the current thesaurus.

That undisturbed run is the *control*.  Each ``--inject`` is a second run whose lists
are changed from its time on (:mod:`stream.backtest`).  Every alert signal is evaluated
over both runs with the thresholds of ``deploy/prometheus`` (:mod:`stream.alert_params`),
its durations stretched by the time scale when the feed is sparser than production.

MOWE's word vectors are trained once, on the warm-up tweets (gensim's Word2Vec); refits
index the new tweets with them.  Writes ``detection.json``, ``detection.md`` and
``series.json`` (per-instant window means of every run, for plots).
"""

from __future__ import annotations

import json
import math
import time
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from stream import alert_params
from stream import backtest as bt
from stream.alert_params import EVALUATION_INTERVAL, Params, rule_params, seconds
from stream.chance import CorrectedSum
from stream.cleaning import Prepared
from stream.drift import Mover
from stream.experiment import ProgressFactory, labelled, load_corpus, no_progress
from stream.hubness import DEFAULT_METHOD
from stream.means import HashtagMeans
from stream.mmd import mmd_test
from stream.recommenders import BaseRecommender, MoweRecommender, make_recommender
from stream.records import Recommendation
from stream.scoring import DEFAULT_KS, NeighbourCache, r_label, score_event
from stream.slices import SLICES
from workers.adapters.annoy_thesaurus import (
    AnnoyThesaurus,
    build_from_means,
    neighbour_cache,
    thesaurus_drift,
)
from workers.adapters.backfill import Family, Series, counter_at, create_blocks, write_openmetrics
from workers.adapters.exporter import CORRECTED_COUNTERS
from workers.adapters.feeds import read_tweets
from workers.commands.coherence import RefitAudit
from workers.commands.evaluate import bertag_vectors, check_results_dir

__all__ = [
    "DEFAULT_INJECTIONS",
    "RESULT_FILES",
    "Backtest",
    "BacktestConfig",
    "backfill",
    "check_out",
    "markdown",
    "run_backtest",
    "write_outputs",
]

DEFAULT_INJECTIONS = ("random:0.5", "swap:least-popular", "synonyms:1", "stale:60", "vocab:0.5")
RESULT_FILES = frozenset({"detection.json", "detection.md", "series.json", "report.html"})
DAY = 86_400.0
#: The embedding drift test (stream.mmd) between the tweets of the last refit interval and
#: of the one before, at every refit: an alarm is a p-value at or below this.
EMBEDDING_SIGNAL = "embedding_mmd"
EMBEDDING_ALPHA = 0.01
EMBEDDING_MIN_TWEETS = 20


@dataclass(frozen=True)
class BacktestConfig:
    """The options of one backtest (all of them end up in ``detection.json``)."""

    recommender: str = "mowe"
    injections: tuple[str, ...] = DEFAULT_INJECTIONS
    seed: int = 1
    model: str = "vinai/bertweet-base"
    dtype: str = "float32"
    batch_size: int = 32
    warmup: float = 0.3
    refit_days: float = 7.0
    #: The recommender learns from the labelled tweets of the last ``train_days`` (a live
    #: recommender follows the feed; all history would make a 60-day-old model no worse).
    train_days: float = 30.0
    hubness: str = DEFAULT_METHOD
    #: Factor on every rule duration; None: :func:`stream.backtest.auto_time_scale`.
    time_scale: float | None = None
    rules_profile: str = "default"
    rules_set: tuple[str, ...] = ()
    limit: int | None = None
    language_filter: bool = True
    n_trees: int = 50
    vector_size: int = 100
    #: An audit's events (the ``votes`` topic as JSON lines): each refit's agreement with them.
    audit_votes: Path | None = None

    def parsed(self) -> list[bt.Injection]:
        if not self.injections:
            raise ValueError("at least one --inject is needed")
        return [bt.parse_injection(text) for text in self.injections]

    def __post_init__(self) -> None:
        if not 0.0 < self.warmup < 1.0:
            raise ValueError(f"warmup is a share of the tweets in (0, 1), got {self.warmup}")
        if not self.train_days > 0:
            raise ValueError(f"train days must be positive, got {self.train_days}")
        if not self.refit_days > 0:
            raise ValueError(f"refit days must be positive, got {self.refit_days}")
        if self.time_scale is not None and not self.time_scale > 0:
            raise ValueError(f"time scale must be positive, got {self.time_scale}")
        if self.limit is not None and self.limit < 10:
            raise ValueError("limit must be at least 10 tweets")
        make_recommender(self.recommender, trainer=lambda docs: None)  # a known name
        self.parsed()


@dataclass
class Backtest:
    """What one backtest found (what :func:`write_outputs` writes)."""

    config: BacktestConfig
    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    series: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    #: Per-event scores in event-time order: the control run and each drifted one (backfill).
    t_events: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    scores: dict[str, _Scores] = field(default_factory=dict)
    ks: tuple[int, ...] = ()


def _seconds(when: datetime) -> float:
    return when.timestamp()


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


def load_render() -> ModuleType:
    """The module with the rules' parameters and ``seconds``.

    Only for ``cli.py``'s ``bk.load_render().seconds``: once cli.py is split, it calls
    :func:`stream.alert_params.seconds` and this goes.
    """
    return alert_params


def rules_for(params: Params, scale: float) -> tuple[bt.Rules, int, str]:
    """The rules' thresholds with every duration in event seconds times ``scale``, and the
    alert (k, r)."""

    def d(duration: str) -> float:
        return seconds(duration) * scale

    rules = bt.Rules(
        step=d(EVALUATION_INTERVAL),
        quality_window=d(params.quality_window),
        baseline_offsets=tuple(d(o) for o in params.baseline_offsets),
        quality_drop_fraction=params.quality_drop_fraction,
        quality_for=d(params.quality_for),
        min_events=params.min_events,
        skill_loss_fraction=params.skill_loss_fraction,
        skill_loss_bound=math.log(1.0 / params.false_alarm_probability),
        chance_margin=params.chance_margin,
        chance_for=d(params.chance_for),
        gap_exact_drop_fraction=params.gap_exact_drop_fraction,
        gap_reval_tolerance=params.gap_reval_tolerance,
        gap_for=d(params.gap_for),
        unknown_window=d(params.unknown_window),
        unknown_baseline_window=d(params.unknown_baseline_window),
        unknown_share_max=params.unknown_share_max,
        unknown_share_rise=params.unknown_share_rise,
        unknown_for=d(params.unknown_for),
    )
    if not str(params.alert_r).isdigit():
        raise ValueError(f"the backtest needs a numeric alert_r, got {params.alert_r!r}")
    return rules, int(params.alert_k), str(params.alert_r)


class _Scores:
    """Per-event columns of one run, filled in event order."""

    def __init__(self, n: int, n_ks: int) -> None:
        self.by_k = np.full((n, n_ks), np.nan)  # #REval at every k of DEFAULT_KS (the k-curve)
        self.reval = np.full(n, np.nan)
        #: #REval at the alert (k, r) on each popularity slice's ground truths (stream.slices)
        self.slices = {label: np.full(n, np.nan) for label in SLICES}
        #: the null recommender's expectation at the alert (k, r) (stream.chance): with ``reval``,
        #: the sums the chance-corrected score of any window is the kappa of
        self.expected = np.full(n, np.nan)
        self.exact = np.full(n, np.nan)
        self.recommended = np.zeros(n)
        self.unknown = np.zeros(n)

    def series(self, t: npt.NDArray[np.float64]) -> bt.Series:
        return bt.Series(t, self.reval, self.expected, self.exact, self.recommended, self.unknown)


@dataclass
class _Feed:
    """The replayed feed: tweets in event-time order, their embeddings, the scored events
    (labelled tweets after the warm-up), the refit points and each drift's start."""

    prepared: list[Prepared]
    times: npt.NDArray[np.float64]
    vectors: npt.NDArray[np.float32]
    model_id: str
    events: list[int]  # indices into prepared
    t_events: npt.NDArray[np.float64]
    warm_end: float
    points: list[float]
    starts: dict[str, float]

    @property
    def first(self) -> float:
        return float(self.t_events[0])

    @property
    def last(self) -> float:
        return float(self.t_events[-1])


def _load(
    feeds: Sequence[str | Path],
    config: BacktestConfig,
    injections: list[bt.Injection],
    progress: ProgressFactory,
    timings: dict[str, float],
) -> _Feed:
    """Read, clean and embed the feed; place the warm-up, the refits and the injections."""
    started = time.perf_counter()
    corpus = load_corpus(
        read_tweets(feeds), limit=config.limit, language_filter=config.language_filter, progress=progress
    )
    prepared = sorted(
        (p for p in corpus.prepared if p.tweet.created_at is not None),
        key=lambda p: p.tweet.created_at,  # type: ignore[arg-type,return-value]
    )
    if len(prepared) < 10:
        raise ValueError(f"only {len(prepared)} tweets with a created_at time: nothing to backtest")
    times = np.array([_seconds(p.tweet.created_at) for p in prepared])  # type: ignore[arg-type]
    timings["read"] = round(time.perf_counter() - started, 2)
    started = time.perf_counter()
    vectors, model_id = bertag_vectors(
        prepared, config.model, dtype=config.dtype, batch_size=config.batch_size, progress=progress
    )
    timings["embed"] = round(time.perf_counter() - started, 2)
    warm_end = float(times[int(len(prepared) * config.warmup)])
    refit = config.refit_days * DAY
    points = list(np.arange(warm_end, float(times[-1]) + refit, refit))
    events = [i for i in range(len(prepared)) if times[i] >= warm_end and prepared[i].hashtags]
    if len(events) < 2:
        raise ValueError("fewer than 2 labelled tweets after the warm-up: lower --warmup")
    t_events = times[events]
    first, last = float(t_events[0]), float(t_events[-1])
    middle = float(np.median(t_events))  # half the events on each side: bursty feeds
    starts = {inj.label: (_seconds(inj.at) if inj.at is not None else middle) for inj in injections}
    for inj in injections:
        if not first < starts[inj.label] <= last:
            raise ValueError(
                f"--inject {inj.label}@{_iso(starts[inj.label])} is outside the scored period "
                f"{_iso(first)} .. {_iso(last)}"
            )
    return _Feed(prepared, times, vectors, model_id, events, t_events, warm_end, points, starts)


class _Walk:
    """Walks the feed forward: at each refit point, the means so far, the recommender
    refitted, the thesaurus rebuilt; then the interval's events recommended, drifted and
    scored, in the control run and in each drifted run."""

    def __init__(
        self, feed: _Feed, config: BacktestConfig, injections: list[bt.Injection], k: int, r: int
    ) -> None:
        self.feed, self.config, self.injections, self.k, self.r = feed, config, injections, k, r
        self.ks = tuple(sorted({*DEFAULT_KS, k}))
        self.label = r_label(r)
        n = len(feed.events)
        self.control = _Scores(n, len(self.ks))
        self.runs = {inj.label: _Scores(n, len(self.ks)) for inj in injections}
        self.health: list[dict[str, Any]] = []  # the thesaurus at each refit: size, hubness, drift
        self.movers: tuple[Mover, ...] = ()  # the last refit's
        self.embedding_tests: list[dict[str, Any]] = []  # the MMD test at each refit (stream.mmd)
        self.rng = np.random.default_rng(config.seed)
        self.fitted: dict[int, BaseRecommender] = {}  # refit index -> model (stale drifts)
        self.words: Any = None

    def fit(self, method: str, upto: int) -> BaseRecommender:
        """``method`` trained on the labelled tweets of the ``train_days`` before index ``upto``."""
        times, prepared = self.feed.times, self.feed.prepared
        since = int(np.searchsorted(times, times[upto - 1] - self.config.train_days * DAY, side="left"))
        train = [labelled(p) for p in prepared[since:upto] if p.hashtags]
        if method == "mowe":
            return MoweRecommender(word_vectors=self.words).fit(train)
        return make_recommender(method, seed=self.config.seed).fit(train)

    def run(self, progress: ProgressFactory, timings: dict[str, float]) -> None:
        feed, config = self.feed, self.config
        if config.recommender == "mowe":
            from workers.adapters.word_vectors import train_word_vectors  # gensim: the experiment extra

            started = time.perf_counter()
            n_warm = int(np.searchsorted(feed.times, feed.warm_end, side="left"))
            docs = [p.text.split() for p in feed.prepared[:n_warm]]
            self.words = train_word_vectors(
                docs, "word2vec", vector_size=config.vector_size, seed=config.seed
            )
            timings["word2vec"] = round(time.perf_counter() - started, 2)
        started = time.perf_counter()
        means = HashtagMeans(dim=int(feed.vectors.shape[1]))
        segment = np.searchsorted(np.array(feed.points), feed.t_events, side="right") - 1
        refit = config.refit_days * DAY
        lookback = max((float(i.amount) * DAY for i in self.injections if i.kind == "stale"), default=0.0)
        previous: AnnoyThesaurus | None = None
        audit = RefitAudit(config.audit_votes)  # coherence (and agreement) of each refit's thesaurus
        before = lo = 0
        advance = progress(
            f"walking forward ({len(feed.points)} refits, {len(self.injections) + 1} runs)", len(feed.points)
        )
        for index, point in enumerate(feed.points):
            upto = int(np.searchsorted(feed.times, point, side="left"))  # the tweets before this refit
            means.update_batch([p.hashtags for p in feed.prepared[before:upto]], feed.vectors[before:upto])
            audit.update(feed.prepared[before:upto])
            before = upto
            hi = int(np.searchsorted(segment, index, side="right"))
            if hi > lo:
                found = _embedding_test(feed.times, feed.vectors, point, refit, seed=config.seed + index)
                if found is not None:
                    self.embedding_tests.append(found)
            model = self.fitted[index] = self.fit(config.recommender, upto)
            for old in [q for q in self.fitted if feed.points[q] < point - lookback - refit]:
                del self.fitted[old]  # older than any stale drift looks back
            if hi > lo:
                thesaurus = build_from_means(
                    means,
                    model_id=feed.model_id,
                    method=config.hubness,
                    depth=max(self.ks),
                    n_trees=config.n_trees,
                    seed=config.seed,
                )
                if thesaurus is None:
                    raise ValueError(f"no hashtag embedded before {_iso(point)}: lower --warmup")
                row, self.movers = _health(point, thesaurus, previous)
                row["audit"] = audit.row(
                    thesaurus, {h: m.count for h, m in means.states.items()}, config.seed
                )
                self.health.append(row)
                previous = thesaurus
                self._interval(index, point, upto, lo, hi, model, thesaurus)
            lo = hi
            advance(1)
        timings["walk_forward"] = round(time.perf_counter() - started, 2)

    def _interval(
        self,
        index: int,
        point: float,
        upto: int,
        lo: int,
        hi: int,
        model: BaseRecommender,
        thesaurus: AnnoyThesaurus,
    ) -> None:
        """Events ``lo:hi`` (those since this refit): recommended, drifted from each start, scored."""
        feed, k, r = self.feed, self.k, self.r
        cache = neighbour_cache(thesaurus, max(self.ks))
        tweets = [feed.prepared[feed.events[j]].tweet for j in range(lo, hi)]
        base = model.recommend_many(tweets, r)
        self._score(self.control, lo, base, cache)
        vocabulary = list(thesaurus.hashtags)

        def synonym(h: str, taken: set[str]) -> str | None:
            return bt.mutual_synonym(h, taken, lambda x: thesaurus.neighbours(x, k) if x in thesaurus else [])

        for inj in self.injections:
            start = feed.starts[inj.label]
            whole: list[list[str]] | None = None
            if feed.t_events[hi - 1] >= start and inj.kind == "stale":
                stale = max(0, bisect_right(feed.points, point - float(inj.amount) * DAY) - 1)
                whole = self.fitted[stale].recommend_many(tweets, r)
            elif feed.t_events[hi - 1] >= start and inj.kind == "swap":
                whole = self.fit(inj.amount, upto).recommend_many(tweets, r)
            lists = [
                recs
                if feed.t_events[j] < start
                else whole[j - lo]
                if whole is not None
                else bt.inject(
                    inj.kind,
                    inj.fraction,
                    recs,
                    self.rng,
                    vocabulary=vocabulary,
                    synonym=synonym,
                    known=thesaurus.__contains__,
                )
                for j, recs in zip(range(lo, hi), base, strict=True)
            ]
            self._score(self.runs[inj.label], lo, lists, cache)

    def _score(self, col: _Scores, lo: int, lists: list[list[str]], cache: NeighbourCache) -> None:
        """The scorer's path (:func:`stream.scoring.score_event`) for events ``lo:``."""
        feed, k, label = self.feed, self.k, self.label
        for j, recs in enumerate(lists, start=lo):
            p = feed.prepared[feed.events[j]]
            event = Recommendation(
                p.tweet.id, tuple(recs), p.hashtags, self.config.recommender, p.tweet.created_at
            )
            s = score_event(event, p.hashtags, cache, self.ks, (self.r,))
            col.recommended[j], col.unknown[j] = s.n_recommended, s.unknown_recommended
            if s.unscorable is None:
                col.by_k[j] = [s.reval[label][x] for x in self.ks]
                col.reval[j] = s.reval[label][k]
                for name, by_k in s.slices.get(label, {}).items():
                    col.slices[name][j] = by_k[k]
                col.expected[j] = s.expected.get(label, {}).get(k, math.nan)
                col.exact[j] = s.exact[label].hit_ratio


def run_backtest(
    feeds: Sequence[str | Path], config: BacktestConfig, *, progress: ProgressFactory = no_progress
) -> Backtest:
    """Replay ``feeds`` with ``config``; see the module docstring."""
    started = time.perf_counter()
    timings: dict[str, float] = {}
    injections = config.parsed()
    params = rule_params(config.rules_profile, list(config.rules_set))
    _, k, r_text = rules_for(params, 1.0)
    feed = _load(feeds, config, injections, progress, timings)
    walk = _Walk(feed, config, injections, k, int(r_text))
    walk.run(progress, timings)
    control, runs, t_events, starts = walk.control, walk.runs, feed.t_events, feed.starts
    first, last, n, r, ks = feed.first, feed.last, len(feed.events), walk.r, walk.ks
    embedding_tests = walk.embedding_tests

    scored = int(np.count_nonzero(~np.isnan(control.reval)))
    unscaled, _, _ = rules_for(params, 1.0)
    scale = config.time_scale or bt.auto_time_scale(
        scored,
        last - first,
        unscaled.quality_window,
        unscaled.min_events,
        room_s=min(starts.values()) - first,
        lookback_s=min(unscaled.baseline_offsets) + unscaled.quality_window,
    )
    rules, _, _ = rules_for(params, scale)
    at = np.arange(first, last + rules.step, rules.step)
    control_firing = bt.signals(control.series(t_events), at, rules)
    days = (last - first) / DAY
    false_alarms = {name: bt.episodes(f) for name, f in control_firing.items()}
    rows: list[dict[str, Any]] = []
    effects: dict[str, dict[str, Any]] = {}
    embedding_alarms = sum(1 for e in embedding_tests if e["p_value"] <= EMBEDDING_ALPHA)
    can_fire = bt.evaluable(control.series(t_events), at, rules)
    for inj in injections:
        start = starts[inj.label]
        drifted = runs[inj.label]
        delays = bt.detect(
            bt.signals(drifted.series(t_events), at, rules), control_firing, at, start, bt.holds(rules)
        )
        for name, delay in delays.items():
            rows.append(
                {
                    "signal": name,
                    "drift": inj.label,
                    "delay_s": None if delay is None else round(delay, 1),
                    # Bursty feeds: how many events the drift took to be caught, beside the time.
                    "delay_events": None
                    if delay is None
                    else int(np.searchsorted(t_events, start + delay, side="right"))
                    - int(np.searchsorted(t_events, start, side="left")),
                    "false_alarms_per_day": round(false_alarms[name] / days, 4),
                    "fired": delay is not None,
                    "injected_at": _iso(start),
                }
            )
        # The injected drifts change recommendations, not tweets: the embedding test sees the
        # same tweets in both runs, so any alarm of it is one the control raises too.
        rows.append(
            {
                "signal": EMBEDDING_SIGNAL,
                "drift": inj.label,
                "delay_s": None,
                "delay_events": None,
                "false_alarms_per_day": round(embedding_alarms / days, 4),
                "fired": False,
                "injected_at": _iso(start),
            }
        )
        after = t_events >= start
        # The earliest a drop alarm could fire after the injection even for a drift visible at
        # once: the rule must be evaluable (enough events, a baseline) at every instant of its
        # hold time.  A delay equal to it is bound by the feed's gaps, not by the signal.
        possible = np.flatnonzero(bt.hold(can_fire & (at >= start), at, rules.quality_for))
        effects[inj.label] = {
            "injected_at": _iso(start),
            "earliest_possible_drop_delay_s": None
            if not len(possible)
            else round(float(at[possible[0]] - start), 1),
            "events_after": int(np.count_nonzero(after)),
            **{
                f"{metric}_after": {
                    "control": _mean(getattr(control, metric)[after]),
                    "drifted": _mean(getattr(drifted, metric)[after]),
                }
                for metric in ("reval", "exact")
            },
            "corrected_after": {"control": _kappa(control, after), "drifted": _kappa(drifted, after)},
            "unknown_share_after": {
                "control": _ratio(control.unknown[after], control.recommended[after]),
                "drifted": _ratio(drifted.unknown[after], drifted.recommended[after]),
            },
        }
    curves = bt.operating_curves(
        control.series(t_events),
        {inj.label: runs[inj.label].series(t_events) for inj in injections},
        starts,
        at,
        rules,
        days,
    )
    timings["total"] = round(time.perf_counter() - started, 2)
    summary = {
        "feeds": [str(f) for f in feeds],
        "recommender": config.recommender,
        "alert_k": k,
        "alert_r": r,
        "time_scale": round(scale, 3),
        "rules": {key: (list(v) if isinstance(v, tuple) else v) for key, v in asdict(rules).items()},
        "rules_profile": config.rules_profile,
        "rules_set": list(config.rules_set),
        "period": {"first_event": _iso(first), "last_event": _iso(last), "days": round(days, 2)},
        "warmup_until": _iso(feed.warm_end),
        "tweets": len(feed.prepared),
        "events": n,
        "scored_events": scored,
        "refits": len(feed.points),
        # Where the quality window holds fewer than min_events, the quality alerts cannot fire.
        "instants_drop_rules_evaluable": round(float(can_fire.mean()), 4),
        "instants_with_enough_events": round(
            float(bt.enough_events(control.series(t_events), at, rules).mean()), 4
        ),
        "model_id": feed.model_id,
        "false_alarm_episodes": false_alarms,
        "effects": effects,
        "goal": goal(rows),
        # per signal, detection delay against false alarms per day as its threshold sweeps
        "curves": curves,
        "slices": _slices(t_events, control, runs, starts),
        "embedding_drift": {
            "alpha": EMBEDDING_ALPHA,
            "tests": embedding_tests,
            "alarms": embedding_alarms,
            "alarm_rate": _share(embedding_alarms, len(embedding_tests)),
            # The same test between two random halves of one interval: no drift by construction,
            # so its alarm rate is the test's own false-alarm rate (should be about alpha).
            "calibration_alarm_rate": _share(
                sum(e["calibration_p_value"] <= EMBEDDING_ALPHA for e in embedding_tests),
                len(embedding_tests),
            ),
        },
        "k_curve": _k_curves(ks, t_events, rules.quality_window, control, runs, starts),
        "thesaurus": {
            "refits": walk.health,
            "movers": [m.to_dict() for m in walk.movers],
        },
    }
    series = _series(at, t_events, rules, control, runs, control_firing)
    return Backtest(config, summary, rows, series, timings, t_events, {"": control, **runs}, ks)


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _embedding_test(
    times: npt.NDArray[np.float64],
    vectors: npt.NDArray[np.float32],
    point: float,
    interval: float,
    *,
    seed: int,
) -> dict[str, Any] | None:
    """MMD between the tweets of ``[point - interval, point)`` and of the interval before,
    and, for calibration, between two random halves of the recent one; None when either
    interval has fewer than EMBEDDING_MIN_TWEETS tweets."""
    lo, mid, hi = np.searchsorted(times, [point - 2 * interval, point - interval, point], side="left")
    reference, recent = vectors[lo:mid], vectors[mid:hi]
    if min(len(reference), len(recent)) < EMBEDDING_MIN_TWEETS:
        return None
    found = mmd_test(reference, recent, seed=seed)
    halves = np.random.default_rng(seed).permutation(len(recent))
    calibration = mmd_test(recent[halves[::2]], recent[halves[1::2]], seed=seed)
    return {
        "at": _iso(point),
        **{key: round(v, 6) if isinstance(v, float) else v for key, v in found.to_dict().items()},
        "calibration_p_value": round(calibration.p_value, 6),
    }


def _health(
    point: float, thesaurus: AnnoyThesaurus, previous: AnnoyThesaurus | None
) -> tuple[dict[str, Any], tuple[Mover, ...]]:
    """One refit's thesaurus: size, hubness (this round's N_k report) and drift from the
    previous refit (:func:`workers.adapters.annoy_thesaurus.thesaurus_drift`)."""
    hub = thesaurus.metadata.hubness or {}
    out: dict[str, Any] = {
        "at": _iso(point),
        "hashtags": len(thesaurus),
        "hubness": {key: hub.get(key) for key in ("skewness", "max_share", "share_with_hub")},
        "drift": None,
    }
    if previous is None:
        return out, ()
    drift = thesaurus_drift(previous, thesaurus)
    out["drift"] = {
        "compared": drift.compared,
        "new_hashtags": drift.only_new,
        "shift": None if drift.shift_quantiles is None else drift.shift_quantiles.to_dict(),
        "top10_changed_share": drift.share_top10_changed_over_half,
    }
    return out, drift.movers


def _slices(
    t: npt.NDArray[np.float64], control: _Scores, runs: dict[str, _Scores], starts: dict[str, float]
) -> dict[str, Any]:
    """#REval at the alert (k, r) per popularity slice: the control over the whole period,
    and control and drifted run over the events after each injection."""
    out: dict[str, Any] = {}
    for label in SLICES:
        values = control.slices[label]
        out[label] = {
            "events": int(np.count_nonzero(~np.isnan(values))),
            "control": _mean(values),
            "drifts": {name: _mean(col.slices[label][t >= starts[name]]) for name, col in runs.items()},
            "control_after": {name: _mean(values[t >= starts[name]]) for name in runs},
        }
    return out


def _k_curves(
    ks: Sequence[int],
    t: npt.NDArray[np.float64],
    window: float,
    control: _Scores,
    runs: dict[str, _Scores],
    starts: dict[str, float],
) -> dict[str, Any]:
    """Mean #REval at every k over the last quality window of the feed (control and each
    drifted run) and, per drift, over every event after its injection."""

    def curve(col: _Scores, mask: npt.NDArray[np.bool_]) -> list[float | None]:
        return [_mean(col.by_k[mask, i]) for i in range(len(ks))]

    last = t > t[-1] - window
    return {
        "ks": list(ks),
        "last_window": {"from": _iso(float(t[-1] - window)), "events": int(last.sum())},
        "control": curve(control, last),
        "drifts": {name: curve(col, last) for name, col in runs.items()},
        "after_injection": {
            name: {"control": curve(control, t >= starts[name]), "drifted": curve(col, t >= starts[name])}
            for name, col in runs.items()
        },
    }


def _mean(values: npt.NDArray[np.float64]) -> float | None:
    ok = values[~np.isnan(values)]
    return round(float(ok.mean()), 4) if len(ok) else None


def _kappa(col: _Scores, mask: npt.NDArray[np.bool_]) -> float | None:
    """The chance-corrected #REval of the events of ``mask``: the kappa of their sums."""
    sums = CorrectedSum()
    for o, e in zip(col.reval[mask].tolist(), col.expected[mask].tolist(), strict=True):
        if not (math.isnan(o) or math.isnan(e)):
            sums.update(o, e)
    value = sums.get()
    return None if value is None else round(value, 4)


def _ratio(part: npt.NDArray[np.float64], whole: npt.NDArray[np.float64]) -> float | None:
    total = float(whole.sum())
    return round(float(part.sum()) / total, 4) if total > 0 else None


def goal(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's goal, checked on the numbers: #REval's alert detects ``random`` and
    ``stale`` drifts no later than exact match with no more false alarms, and stays quiet
    on ``synonyms`` (a drift that keeps meaning).  Only the drift kinds that were injected."""
    by = {(row["drift"].split(":")[0], row["signal"]): row for row in rows}
    out: dict[str, Any] = {}
    for kind in ("random", "stale"):
        reval, exact = by.get((kind, "reval_drop")), by.get((kind, "exact_drop"))
        if reval is None or exact is None:
            continue
        sooner = reval["delay_s"] is not None and (
            exact["delay_s"] is None or reval["delay_s"] <= exact["delay_s"]
        )
        out[kind] = bool(sooner and reval["false_alarms_per_day"] <= exact["false_alarms_per_day"])
    reval = by.get(("synonyms", "reval_drop"))
    if reval is not None:
        out["synonyms"] = reval["delay_s"] is None
    return out


def _series(
    at: npt.NDArray[np.float64],
    t: npt.NDArray[np.float64],
    rules: bt.Rules,
    control: _Scores,
    runs: dict[str, _Scores],
    firing: dict[str, npt.NDArray[np.bool_]],
    points: int = 600,
) -> dict[str, Any]:
    """Window means at (at most ``points``) instants of every run, for plots."""
    pick = np.unique(np.linspace(0, len(at) - 1, min(points, len(at))).astype(int))
    when = at[pick]

    def means(col: _Scores) -> dict[str, list[float | None]]:
        out = {}
        for metric in ("reval", "corrected", "exact"):
            if metric == "corrected":  # the kappa of each window's sums
                values = bt.window_kappa(t, col.reval, col.expected, when, rules.quality_window)
            else:
                values = bt.window_mean(t, getattr(col, metric), when, rules.quality_window)
            out[metric] = [None if math.isnan(v) else round(float(v), 4) for v in values]
        return out

    return {
        "t": [_iso(float(x)) for x in when],
        "window_s": rules.quality_window,
        "control": means(control),
        "drifts": {name: means(col) for name, col in runs.items()},
        "control_firing": {name: f[pick].astype(int).tolist() for name, f in firing.items()},
    }


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
        "| drift | events | earliest possible drop alarm | #REval | corrected | exact | unknown share |",
        "|---|---|---|---|---|---|---|",
    ]
    for drift, e in s["effects"].items():
        cells = [bt.duration_text(e["earliest_possible_drop_delay_s"])] + [
            f"{e[m]['control']} → {e[m]['drifted']}"
            for m in ("reval_after", "corrected_after", "exact_after", "unknown_share_after")
        ]
        lines.append(f"| {drift} | {e['events_after']:,} | " + " | ".join(cells) + " |")
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
        lines.append(f"- {kind}: {'met' if met else 'not met'}")
    return "\n".join(lines) + "\n"


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
            f"p <= {EMBEDDING_ALPHA} (stream.mmd)",
        },
    }
    (out_dir / "detection.json").write_text(json.dumps(detection, indent=2) + "\n")
    (out_dir / "detection.md").write_text(markdown(result))
    (out_dir / "series.json").write_text(json.dumps(result.series) + "\n")
    return out_dir


def backfill(result: Backtest, out_dir: Path, *, interval_s: float = 900.0) -> dict[str, Any]:
    """What the scoring workers would have exported, at event time, as Prometheus TSDB
    blocks in ``out_dir`` (:mod:`workers.adapters.backfill`): one sample every
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
    families: dict[str, Family] = {
        "reval_hit_ratio": Family("reval_hit_ratio", "summary", "#REval-hit-ratio of scored events", []),
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
        "from": _iso(float(at[0])),
        "to": _iso(float(at[-1])),
    }


def check_out(out_dir: Path, *, replace: bool) -> None:
    check_results_dir(out_dir, replace=replace, files=RESULT_FILES, command="reval backtest")
