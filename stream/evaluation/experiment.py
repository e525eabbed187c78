"""The paper's experiment (section 4.2) as pure steps: its configuration, the 90/10
split and the per-hashtag means of embedded training tweets.

``reval evaluate`` (:mod:`workers.commands.evaluate`) runs it with the encoder,
gensim and the thesaurus store.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from stream.evaluation.chance import MIN_ROOM
from stream.evaluation.cores import p_core
from stream.evaluation.recommenders import DEFAULT_THRESHOLD
from stream.evaluation.scoring import DEFAULT_KS
from stream.intake.cleaning import Cleaner, Dropped, Prepared
from stream.intake.records import ErrorLog, Parsed, Tweet
from stream.synonyms.hubness import DEFAULT_METHOD, METHODS
from stream.synonyms.means import HashtagMeans

VARIANTS = ("bertag", "word2vec", "fasttext")
Split = Literal["time", "random"]

#: ``progress(description, total)`` opens a progress task and returns its ``advance(n)``.
ProgressFactory = Callable[[str, int | None], Callable[[int], None]]


def no_progress(description: str, total: int | None) -> Callable[[int], None]:
    del description, total
    return lambda n: None


RECOMMENDERS = ("mowe", "popular", "least-popular", "random")
BASELINES = ("popular", "popular-users", "least-popular", "random")


@dataclass(frozen=True)
class ExperimentConfig:
    """The options of one run (all of them end up in ``results.json``).

    Each (split, seed) gets its own 90/10 split (``time``: the same for every seed),
    Word2Vec / FastText models, random draws and thesauri; every recommender is scored
    on the same thesauri, and every thesaurus is built with each of ``hubness``.
    """

    splits: tuple[Split, ...] = ("time",)
    seeds: tuple[int, ...] = (1, 2, 3)
    #: Core levels (paper 002, :mod:`stream.evaluation.cores`): every cell is computed on each p-core of
    #: the cleaned data; 1 is the data itself.
    cores: tuple[int, ...] = (1,)
    train_fraction: float = 0.9
    embeddings: tuple[str, ...] = VARIANTS
    recommenders: tuple[str, ...] = RECOMMENDERS
    hubness: tuple[str, ...] = (DEFAULT_METHOD,)
    mowe_thresholds: tuple[float, ...] = (DEFAULT_THRESHOLD,)
    model: str = "vinai/bertweet-base"
    #: Encoder dtype.  float32 by default: the reference numbers, the same on any CPU;
    #: ``"auto"`` is the core's fast choice (bf16 / int8 where the CPU has them).
    dtype: str = "float32"
    rs: tuple[int, ...] = (1, 5, 10)
    ks: tuple[int, ...] = DEFAULT_KS
    limit: int | None = None
    language_filter: bool = True
    vector_size: int = 100
    window: int = 2
    epochs: int = 30
    fasttext_bucket: int = 2_000_000
    batch_size: int = 32
    n_trees: int = 50
    bootstrap: int = 1000
    top_hashtags: int = 8
    n_synonyms: int = 5

    def __post_init__(self) -> None:
        if not self.splits or any(s not in ("time", "random") for s in self.splits):
            raise ValueError(f"splits must be among time, random, got {', '.join(self.splits) or 'none'}")
        for name, values, allowed in (
            ("embeddings", self.embeddings, VARIANTS),
            ("recommenders", self.recommenders, (*RECOMMENDERS, "popular-users")),
            ("hubness", self.hubness, METHODS),
        ):
            unknown = [v for v in values if v not in allowed]
            if unknown or not values:
                raise ValueError(
                    f"{name} must be among {', '.join(allowed)}, got {', '.join(values) or 'none'}"
                )
            if len(set(values)) != len(values):
                raise ValueError(f"{name}: a value is listed twice")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must be distinct and at least one")
        if not self.cores or len(set(self.cores)) != len(self.cores) or min(self.cores) < 1:
            raise ValueError(
                f"cores must be distinct levels >= 1, got {', '.join(map(str, self.cores)) or 'none'}"
            )
        if not self.rs or any(r < 1 for r in self.rs):
            raise ValueError("r values must be positive")
        if not self.ks or any(k < 0 for k in self.ks):
            raise ValueError("k values must be non-negative")
        if not 0.0 < self.train_fraction < 1.0:
            raise ValueError("train_fraction must be between 0 and 1")
        if not self.mowe_thresholds or any(not 0.0 < t <= 1.0 for t in self.mowe_thresholds):
            raise ValueError(f"mowe thresholds are cosine similarities in (0, 1], got {self.mowe_thresholds}")
        if self.limit is not None and self.limit < 2:
            raise ValueError("limit must be at least 2 (a training and a test tweet)")
        if self.bootstrap < 100:
            raise ValueError("bootstrap needs at least 100 resamples")

    @property
    def recommender_names(self) -> list[str]:
        """The recommenders as they are labelled: ``mowe`` at the first threshold,
        ``mowe@T`` at the others."""
        out = []
        for name in self.recommenders:
            if name == "mowe":
                out += [mowe_label(t, self.mowe_thresholds[0]) for t in self.mowe_thresholds]
            else:
                out.append(name)
        return out

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for name in (
            "splits",
            "seeds",
            "cores",
            "embeddings",
            "recommenders",
            "hubness",
            "mowe_thresholds",
            "rs",
            "ks",
        ):
            out[name] = list(getattr(self, name))
        return out


def mowe_label(threshold: float, default: float) -> str:
    """``mowe`` at the default threshold, ``mowe@0.8`` at another.

    >>> mowe_label(0.5, 0.5), mowe_label(0.8, 0.5)
    ('mowe', 'mowe@0.8')
    """
    return "mowe" if threshold == default else f"mowe@{threshold:g}"


# --------------------------------------------------------------------------- data


@dataclass
class Corpus:
    """The pre-processed feed: kept tweets in feed order and what was dropped."""

    prepared: list[Prepared]
    lines_read: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    errors: ErrorLog = field(default_factory=ErrorLog)


def load_corpus(
    items: Iterable[Parsed[Tweet]],
    *,
    limit: int | None = None,
    language_filter: bool = True,
    progress: ProgressFactory = no_progress,
) -> Corpus:
    """Pre-process parsed feed lines; stop after ``limit`` kept tweets."""
    cleaner = Cleaner(language_filter=language_filter)
    corpus = Corpus([])
    advance = progress("reading + cleaning", None)
    for item in items:
        corpus.lines_read += 1
        advance(1)
        if item.error is not None:
            corpus.errors.add(item)
            continue
        assert item.value is not None
        result = cleaner(item.value)
        if isinstance(result, Dropped):
            corpus.dropped[result.reason] += 1
            continue
        corpus.prepared.append(result)
        if limit is not None and len(corpus.prepared) >= limit:
            break
    return corpus


def split_corpus(
    prepared: Sequence[Prepared], how: Split, *, seed: int = 0, train_fraction: float = 0.9
) -> tuple[list[Prepared], list[Prepared]]:
    """90/10 (``train_fraction``) split.  ``time``: the earliest tweets train (ties and
    tweets without a time keep feed order); ``random``: a shuffle seeded by ``seed``.

    >>> from stream.intake.cleaning import prepare
    >>> from stream.intake.records import parse_tweet
    >>> ps = [prepare(parse_tweet({"id": str(i), "text": f"w{i} #t", "lang": "en",
    ...       "created_at": 1_350_000_000 - i})) for i in range(10)]
    >>> train, test = split_corpus(ps, "time")
    >>> [p.tweet.id for p in test]
    ['0']
    """
    n = len(prepared)
    if n < 2:
        raise ValueError(f"need at least 2 pre-processed tweets to split, got {n}")
    if how == "time":
        if any(p.tweet.created_at is None for p in prepared):
            warnings.warn(
                "some tweets have no created_at: the time split keeps feed order",
                UserWarning,
                stacklevel=2,
            )
            order = list(range(n))
        else:
            order = sorted(range(n), key=lambda i: (prepared[i].tweet.created_at, i))
    elif how == "random":
        order = [int(i) for i in np.random.default_rng(seed).permutation(n)]
    else:
        raise ValueError(f"split must be 'time' or 'random', got {how!r}")
    cut = min(max(int(n * train_fraction), 1), n - 1)
    return [prepared[i] for i in order[:cut]], [prepared[i] for i in order[cut:]]


def at_core(prepared: Sequence[Prepared], p: int) -> tuple[list[Prepared], list[int]]:
    """The p-core of the cleaned tweets (:func:`stream.evaluation.cores.p_core`, users where the feed
    names them): the kept tweets with only their kept hashtags, and their positions.

    >>> from stream.intake.records import Tweet
    >>> tags = [("a", "b"), ("a",), ("c",)]
    >>> tweets = [Prepared(Tweet(str(i), ""), "", t, t) for i, t in enumerate(tags)]
    >>> kept, where = at_core(tweets, 2)
    >>> [(k.tweet.id, k.hashtags, k.dedup_keys) for k in kept], where
    ([('0', ('a',), ('a',)), ('1', ('a',), ('a',))], [0, 1])
    """
    core = p_core([x.hashtags for x in prepared], p, [x.tweet.user_id for x in prepared])
    out = []
    for i, tags in zip(core.tweets, core.hashtags, strict=True):
        x = prepared[i]
        keys = tuple(key for h, key in zip(x.hashtags, x.dedup_keys, strict=True) if h in tags)
        out.append(x if tags == x.hashtags else dataclasses.replace(x, hashtags=tags, dedup_keys=keys))
    return out, list(core.tweets)


def labelled(p: Prepared) -> Tweet:
    """The tweet with the hashtags pre-processing kept (a re-retweet may lose some)."""
    return dataclasses.replace(p.tweet, hashtags=p.hashtags)


# --------------------------------------------------------------------------- thesauri


def hashtag_means(prepared: Sequence[Prepared], vectors: npt.NDArray[np.floating]) -> HashtagMeans:
    """BERTag's per-hashtag running means over tweets embedded as ``vectors``."""
    means = HashtagMeans(dim=int(vectors.shape[1]))
    means.update_batch([p.hashtags for p in prepared], vectors)
    return means


# --------------------------------------------------------------------------- statistics


def resample_counts(
    n: int, strata: npt.NDArray[np.int64] | None, draws: int, seed: int
) -> npt.NDArray[np.float64]:
    """How often each of ``n`` events is drawn in each of ``draws`` bootstrap resamples
    (``draws x n``); with ``strata`` the events are resampled within each stratum (a
    seed's split), so pooled seeds keep their sizes.

    >>> counts = resample_counts(4, None, 3, seed=0)
    >>> counts.shape, counts.sum(axis=1).tolist()
    ((3, 4), [4.0, 4.0, 4.0])
    """
    rng = np.random.default_rng(seed)
    out = np.zeros((draws, n))
    groups = [np.arange(n)] if strata is None else [np.flatnonzero(strata == s) for s in np.unique(strata)]
    for members in groups:
        if len(members):
            out[:, members] = rng.multinomial(
                len(members), np.full(len(members), 1.0 / len(members)), size=draws
            )
    return out


@dataclass(frozen=True)
class Estimate:
    """A mean over events with its percentile-bootstrap 95% interval."""

    mean: float | None
    low: float | None
    high: float | None
    events: int
    unscorable: int


def bootstrap_means(values: npt.NDArray[np.float64], counts: npt.NDArray[np.float64]) -> list[Estimate]:
    """Means of the columns of ``values`` (events x cells; NaN = unscorable) with 95%
    intervals from the resamples ``counts`` (:func:`resample_counts`).

    >>> values = np.array([[1.0], [0.0], [np.nan], [1.0]])
    >>> e = bootstrap_means(values, resample_counts(4, None, 500, seed=1))[0]
    >>> round(e.mean, 3), e.events, e.unscorable, 0.0 <= e.low <= e.mean <= e.high <= 1.0
    (0.667, 4, 1, True)
    """
    scorable = ~np.isnan(values)
    filled = np.where(scorable, values, 0.0)
    n_scored = scorable.sum(axis=0)
    out = []
    sums, kept = counts @ filled, counts @ scorable.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        resampled = sums / kept
    for j in range(values.shape[1]):
        if not n_scored[j]:
            out.append(Estimate(None, None, None, len(values), int(len(values) - n_scored[j])))
            continue
        finite = resampled[:, j][np.isfinite(resampled[:, j])]
        low, high = np.percentile(finite, [2.5, 97.5])
        out.append(
            Estimate(
                float(filled[:, j].sum() / n_scored[j]),
                float(low),
                float(high),
                len(values),
                int(len(values) - n_scored[j]),
            )
        )
    return out


def bootstrap_difference(
    a: npt.NDArray[np.float64], b: npt.NDArray[np.float64], counts: npt.NDArray[np.float64]
) -> list[tuple[float | None, float | None, float | None]]:
    """Paired differences of column means, ``mean(a) - mean(b)``, over the same events and
    the same resamples: ``(difference, low, high)`` per column (None when either side has
    no scorable event).

    >>> a = np.array([[1.0], [1.0], [0.0], [1.0]]); b = np.array([[0.0], [1.0], [0.0], [0.0]])
    >>> d, low, high = bootstrap_difference(a, b, resample_counts(4, None, 500, seed=2))[0]
    >>> d, low <= d <= high
    (0.5, True)
    """
    out: list[tuple[float | None, float | None, float | None]] = []
    parts = []
    for values in (a, b):
        scorable = ~np.isnan(values)
        filled = np.where(scorable, values, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            parts.append(((counts @ filled) / (counts @ scorable.astype(np.float64)), filled, scorable))
    (ra, fa, sa), (rb, fb, sb) = parts
    for j in range(a.shape[1]):
        if not sa[:, j].any() or not sb[:, j].any():
            out.append((None, None, None))
            continue
        diff = ra[:, j] - rb[:, j]
        finite = diff[np.isfinite(diff)]
        point = fa[:, j].sum() / sa[:, j].sum() - fb[:, j].sum() / sb[:, j].sum()
        low, high = np.percentile(finite, [2.5, 97.5])
        out.append((float(point), float(low), float(high)))
    return out


def _kappas(
    observed: npt.NDArray[np.float64], expected: npt.NDArray[np.float64], counts: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The kappa of the sums (:func:`stream.evaluation.chance.corrected_of_sums`, best = 1 per event)
    of each column over the events with both an observed value and an expectation: the
    point values, the values on each resample of ``counts`` (NaN: no room), and the
    number of such events per column."""
    ok = ~np.isnan(observed) & ~np.isnan(expected)
    o, e, n = np.where(ok, observed, 0.0), np.where(ok, expected, 0.0), ok.astype(np.float64)

    def kappa(
        sum_o: npt.NDArray[np.float64], sum_e: npt.NDArray[np.float64], best: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        room = best - sum_e
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(room > MIN_ROOM, (sum_o - sum_e) / np.where(room > MIN_ROOM, room, 1.0), np.nan)

    point = kappa(o.sum(axis=0), e.sum(axis=0), n.sum(axis=0))
    return point, kappa(counts @ o, counts @ e, counts @ n), n.sum(axis=0)


def bootstrap_kappas(
    observed: npt.NDArray[np.float64], expected: npt.NDArray[np.float64], counts: npt.NDArray[np.float64]
) -> list[Estimate]:
    """The chance-corrected score of each column of ``observed`` (events x cells; NaN =
    unscorable) against ``expected`` (the null's expectation per event and cell; NaN: none):
    the kappa of the sums, never a mean of per-event values, with its percentile-bootstrap
    95% interval on the resamples ``counts`` (the ratio recomputed on each).  The mean is
    None where the expectations leave no room above chance.

    >>> o = np.array([[1.0], [0.0], [0.5], [np.nan]]); e = np.array([[0.2], [0.2], [0.6], [0.1]])
    >>> k = bootstrap_kappas(o, e, resample_counts(4, None, 500, seed=1))[0]
    >>> round(k.mean, 4), k.events, k.unscorable, k.low <= k.mean <= k.high
    (0.25, 4, 1, True)
    """
    point, resampled, n = _kappas(observed, expected, counts)
    out = []
    for j in range(observed.shape[1]):
        finite = resampled[:, j][np.isfinite(resampled[:, j])]
        if np.isnan(point[j]) or not len(finite):
            out.append(Estimate(None, None, None, len(observed), int(len(observed) - n[j])))
            continue
        low, high = np.percentile(finite, [2.5, 97.5])
        out.append(
            Estimate(float(point[j]), float(low), float(high), len(observed), int(len(observed) - n[j]))
        )
    return out


def bootstrap_kappa_difference(
    a: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]],
    b: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]],
    counts: npt.NDArray[np.float64],
) -> list[tuple[float | None, float | None, float | None]]:
    """:func:`bootstrap_difference` for the chance-corrected score: ``a`` and ``b`` are
    (observed, expected) over the same events; the paired difference of their kappas on
    the same resamples.

    >>> o = np.array([[1.0], [1.0], [0.0], [1.0]]); e = np.full((4, 1), 0.2)
    >>> counts = resample_counts(4, None, 500, seed=2)
    >>> d, low, high = bootstrap_kappa_difference((o, e), (1 - o, e), counts)[0]
    >>> round(d, 4), low <= d <= high
    (0.625, True)
    """
    pa, ra, _ = _kappas(*a, counts)
    pb, rb, _ = _kappas(*b, counts)
    out: list[tuple[float | None, float | None, float | None]] = []
    for j in range(len(pa)):
        diff = ra[:, j] - rb[:, j]
        finite = diff[np.isfinite(diff)]
        if np.isnan(pa[j]) or np.isnan(pb[j]) or not len(finite):
            out.append((None, None, None))
            continue
        low, high = np.percentile(finite, [2.5, 97.5])
        out.append((float(pa[j] - pb[j]), float(low), float(high)))
    return out
