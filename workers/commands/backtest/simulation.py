"""The walk forward of ``reval backtest``: the feed read and embedded once, then at each
refit point the running means, the recommender refitted and the thesaurus rebuilt, and the
interval's events recommended, drifted and scored -- in the control run and in each drifted
run -- on the scorer's own path (:func:`stream.evaluation.scoring.score_event`)."""

from __future__ import annotations

import math
import time
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from stream.evaluation.experiment import ProgressFactory, labelled, load_corpus
from stream.evaluation.metrics import ExactScores
from stream.evaluation.neighbours import NeighbourCache
from stream.evaluation.recommenders import BaseRecommender, MoweRecommender, make_recommender
from stream.evaluation.scoring import DEFAULT_KS, r_label, score_batch
from stream.evaluation.signals import SIGNALS
from stream.evaluation.slices import SLICES
from stream.intake.cleaning import Prepared
from stream.intake.records import Recommendation
from stream.monitoring import backtest as bt
from stream.monitoring import drift_injection as di
from stream.monitoring.alert_params import EVALUATION_INTERVAL, Params, seconds
from stream.monitoring.cusum import DEFAULT_ARL0, units_of
from stream.monitoring.mmd import mmd_test
from stream.synonyms.drift import Mover
from stream.synonyms.hubness import DEFAULT_METHOD
from stream.synonyms.means import HashtagMeans
from workers.adapters.files.annoy_thesaurus import (
    AnnoyThesaurus,
    build_from_means,
    neighbour_cache,
    thesaurus_drift,
)
from workers.adapters.files.feeds import read_tweets
from workers.commands.coherence import RefitAudit
from workers.commands.evaluate import bertag_vectors

DEFAULT_INJECTIONS = ("random:0.5", "swap:least-popular", "synonyms:1", "stale:60", "vocab:0.5")
DAY = 86_400.0
#: The embedding drift test (stream.monitoring.mmd) between the tweets of the last refit interval and
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
    #: Factor on every rule duration; None: :func:`stream.monitoring.backtest.auto_time_scale`.
    time_scale: float | None = None
    rules_profile: str = "default"
    rules_set: tuple[str, ...] = ()
    limit: int | None = None
    language_filter: bool = True
    n_trees: int = 50
    vector_size: int = 100
    #: An audit's events (the ``votes`` topic as JSON lines): each refit's agreement with them.
    audit_votes: Path | None = None
    #: The change detector's false-alarm budget: in-control average run length, in events.
    arl0: float = DEFAULT_ARL0

    def parsed(self) -> list[di.Injection]:
        if not self.injections:
            raise ValueError("at least one --inject is needed")
        return [di.parse_injection(text) for text in self.injections]

    def __post_init__(self) -> None:
        if not 0.0 < self.warmup < 1.0:
            raise ValueError(f"warmup is a share of the tweets in (0, 1), got {self.warmup}")
        if not self.train_days > 0:
            raise ValueError(f"train days must be positive, got {self.train_days}")
        if not self.refit_days > 0:
            raise ValueError(f"refit days must be positive, got {self.refit_days}")
        if self.time_scale is not None and not self.time_scale > 0:
            raise ValueError(f"time scale must be positive, got {self.time_scale}")
        if not self.arl0 >= 10:
            raise ValueError(f"arl0 is an average run length in events (>= 10), got {self.arl0}")
        if self.limit is not None and self.limit < 10:
            raise ValueError("limit must be at least 10 tweets")
        make_recommender(self.recommender, trainer=lambda docs: None)  # a known name
        self.parsed()


def _seconds(when: datetime) -> float:
    return when.timestamp()


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


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
        skill_loss_for=d(params.skill_loss_for),
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


class Scores:
    """Per-event columns of one run, filled in event order."""

    def __init__(self, n: int, n_ks: int) -> None:
        self.by_k = np.full((n, n_ks), np.nan)  # #REval at every k of DEFAULT_KS (the k-curve)
        #: every signal of stream.evaluation.signals.SIGNALS at the alert (k, r), by key
        self.values = {signal.key: np.full(n, np.nan) for signal in SIGNALS}
        #: #REval at the alert (k, r) on each popularity slice's ground truths (stream.evaluation.slices)
        self.slices = {label: np.full(n, np.nan) for label in SLICES}
        #: the null recommender's expectation at the alert (k, r) (stream.evaluation.chance): with ``reval``,
        #: the sums the chance-corrected score of any window is the kappa of
        self.expected = np.full(n, np.nan)
        self.exact = np.full(n, np.nan)
        self.recommended = np.zeros(n)
        self.unknown = np.zeros(n)
        #: min(|R_r|, |G|): the units the alert (k, r)'s hit ratios are shares of (stream.monitoring.cusum)
        self.units = np.zeros(n, dtype=np.int64)

    @property
    def reval(self) -> npt.NDArray[np.float64]:
        return self.values["reval_hit_ratio"]

    @property
    def precision(self) -> npt.NDArray[np.float64]:
        """#REval's precision form at the alert (k, r): what the #REval alert tests."""
        return self.values["reval_hit_ratio_precision"]

    def series(self, t: npt.NDArray[np.float64]) -> bt.Series:
        return bt.Series(
            t, self.reval, self.expected, self.exact, self.recommended, self.unknown, self.precision
        )


@dataclass
class Feed:
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


@dataclass(frozen=True)
class Scaled:
    """The deployed rules on one feed's time scale: the rules, the evaluation instants from
    the feed's first event to its last, the scale and the control run's scored events it
    was derived from."""

    rules: bt.Rules
    at: npt.NDArray[np.float64]
    scale: float
    scored: int


def scaled_rules(
    params: Params, feed: Feed, control_reval: npt.NDArray[np.float64], time_scale: float | None = None
) -> Scaled:
    """``params``' rules with every duration times ``time_scale``, or the automatic scale
    (:func:`stream.monitoring.backtest.auto_time_scale`) from the control run's scored events (those
    with a #REval, ``control_reval`` not NaN)."""
    unscaled, _, _ = rules_for(params, 1.0)
    scored = int(np.count_nonzero(~np.isnan(control_reval)))
    scale = time_scale or bt.auto_time_scale(
        scored,
        feed.last - feed.first,
        unscaled.quality_window,
        unscaled.min_events,
        room_s=min(feed.starts.values()) - feed.first,
        lookback_s=min(unscaled.baseline_offsets) + unscaled.quality_window,
    )
    rules, _, _ = rules_for(params, scale)
    return Scaled(rules, np.arange(feed.first, feed.last + rules.step, rules.step), scale, scored)


def load_feed(
    feeds: Sequence[str | Path],
    config: BacktestConfig,
    injections: list[di.Injection],
    progress: ProgressFactory,
    timings: dict[str, float],
) -> Feed:
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
                f"--inject {inj.label}@{iso(starts[inj.label])} is outside the scored period "
                f"{iso(first)} .. {iso(last)}"
            )
    return Feed(prepared, times, vectors, model_id, events, t_events, warm_end, points, starts)


class Walk:
    """Walks the feed forward: at each refit point, the means so far, the recommender
    refitted, the thesaurus rebuilt; then the interval's events recommended, drifted and
    scored, in the control run and in each drifted run."""

    def __init__(
        self, feed: Feed, config: BacktestConfig, injections: list[di.Injection], k: int, r: int
    ) -> None:
        self.feed, self.config, self.injections, self.k, self.r = feed, config, injections, k, r
        self.ks = tuple(sorted({*DEFAULT_KS, k}))
        self.label = r_label(r)
        n = len(feed.events)
        self.control = Scores(n, len(self.ks))
        self.runs = {inj.label: Scores(n, len(self.ks)) for inj in injections}
        self.health: list[dict[str, Any]] = []  # the thesaurus at each refit: size, hubness, drift
        self.movers: tuple[Mover, ...] = ()  # the last refit's
        self.embedding_tests: list[dict[str, Any]] = []  # the MMD test at each refit (stream.monitoring.mmd)
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
            from workers.adapters.encoding.word_vectors import (
                train_word_vectors,  # gensim: the experiment extra
            )

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
                found = embedding_test(feed.times, feed.vectors, point, refit, seed=config.seed + index)
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
                    raise ValueError(f"no hashtag embedded before {iso(point)}: lower --warmup")
                row, self.movers = thesaurus_health(point, thesaurus, previous)
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
            return di.mutual_synonym(h, taken, lambda x: thesaurus.neighbours(x, k) if x in thesaurus else [])

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
                else di.inject(
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

    def _score(self, col: Scores, lo: int, lists: list[list[str]], cache: NeighbourCache) -> None:
        """The scorer's path (:func:`stream.evaluation.scoring.score_batch`) for events ``lo:``."""
        feed = self.feed
        events = []
        for j, recs in enumerate(lists, start=lo):
            p = feed.prepared[feed.events[j]]
            event = Recommendation(
                p.tweet.id, tuple(recs), p.hashtags, self.config.recommender, p.tweet.created_at
            )
            events.append((event, p.hashtags))
        batch = score_batch(events, cache, self.ks, (self.r,))
        rows = np.arange(lo, lo + len(events))
        col.recommended[rows], col.unknown[rows] = batch.n_recommended, batch.unknown_recommended
        ok = batch.scorable
        at = batch.ks.index(self.k)
        col.by_k[rows[ok]] = batch.values["reval_hit_ratio"][ok, 0][:, [batch.ks.index(x) for x in self.ks]]
        for key, values in col.values.items():
            values[rows[ok]] = batch.values[key][ok, 0, at]
        for name, (present, values) in batch.slices.items():
            col.slices[name][rows[ok & present]] = values[ok & present, 0, at]
        if batch.expected is not None:
            col.expected[rows[ok]] = batch.expected[ok, 0, at]
        col.exact[rows[ok]] = batch.exact[ok, 0, ExactScores.NAMES.index("hit_ratio")]
        col.units[rows] = [units_of(e.recommended, truth, self.r) for e, truth in events]


def embedding_test(
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
        "at": iso(point),
        **{key: round(v, 6) if isinstance(v, float) else v for key, v in found.to_dict().items()},
        "calibration_p_value": round(calibration.p_value, 6),
    }


def thesaurus_health(
    point: float, thesaurus: AnnoyThesaurus, previous: AnnoyThesaurus | None
) -> tuple[dict[str, Any], tuple[Mover, ...]]:
    """One refit's thesaurus: size, hubness (this round's N_k report) and drift from the
    previous refit (:func:`workers.adapters.files.annoy_thesaurus.thesaurus_drift`)."""
    hub = thesaurus.metadata.hubness or {}
    out: dict[str, Any] = {
        "at": iso(point),
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
