"""Meaning drift between two thesaurus versions: which hashtags moved, and how much.

A hashtag's embedding is the mean of the tweets that used it (BERTag), so when a hashtag
starts being used for something else -- the meaning shift of social media that TempoWiC
(Loureiro et al., 2022) documents for words -- its mean moves and its nearest hashtags
change.  Two views, because each misses what the other sees:

* the **cosine** between the hashtag's vector then and now (1 = unchanged); it needs
  both versions in one embedding space, so versions of different models, dimensions or
  vector spaces are refused (:class:`IncomparableVersionsError`);
* the **Jaccard overlap** of its top-10 neighbours then and now (1 = the same ten): what
  a scorer sees, since #REval counts hits among the nearest synonyms.

Hashtags averaging few tweets move by chance (a mean of 2 tweets jumps with the third),
so only those with at least ``min_support`` tweets in *both* versions are ranked as movers;
the summary covers every hashtag in both versions.  A version without counts has unknown
support, which filters nothing: its movers may then be rare hashtags.

>>> import numpy as np
>>> old = Snapshot(["flood", "rain", "vote"], np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]]),
...                [["rain"], ["flood"], ["rain"]], counts=[9, 9, 9], model_id="m")
>>> new = Snapshot(["flood", "rain", "vote"], np.array([[1.0, 0.0], [0.9, 0.1], [1.0, 0.1]]),
...                [["vote"], ["vote"], ["flood"]], counts=[9, 9, 9], model_id="m")
>>> drift = compare(old, new, min_support=5)
>>> [(m.hashtag, round(m.cosine, 3), m.jaccard) for m in drift.movers]
[('vote', 0.1, 0.0), ('flood', 1.0, 0.0), ('rain', 1.0, 0.0)]
>>> drift.compared, drift.share_top10_changed_over_half
(3, 1.0)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from stream.synonyms.shift_test import DEFAULT_EFFECTIVE_DIM, mover_key, shift_test

#: How many nearest neighbours the overlap compares (a scorer's usual k).
TOP_NEIGHBOURS = 10
#: Default minimum support (tweets averaged, in both versions) of a hashtag ranked as a mover.
DEFAULT_MIN_SUPPORT = 5
#: Default number of movers reported.
DEFAULT_TOP = 20
#: The quantiles of the summary, as (key, q).
QUANTILES: tuple[tuple[str, float], ...] = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
# A rebuild from the same means gives the same float32 vectors, whose cosine in float64
# is 1 up to rounding (~1e-16); a shift below this is no movement.
_SAME = 1e-9


class IncomparableVersionsError(ValueError):
    """The two versions are not in one embedding space: cosines between them mean nothing."""


@dataclass(frozen=True, eq=False)  # holds arrays: identity, not element-wise, equality
class Snapshot:
    """One thesaurus version as drift sees it.

    ``vectors[i]`` is hashtag ``names[i]``'s mean (any length: rows are normalised here),
    ``neighbours[i]`` its nearest hashtags, nearest first (only the first
    :data:`TOP_NEIGHBOURS` count), ``counts[i]`` how many tweets its mean averages
    (``None``: unknown).  ``space`` names how the vectors and neighbours were made (e.g.
    the hubness method: centred vectors are not comparable with raw ones); it must match.
    ``means[i]``, when the version records them, is the raw mean of hashtag i's unit tweet
    embeddings (length < 1: its tweets' spread), which lets :func:`compare` test each
    hashtag's shift against that spread (:mod:`stream.synonyms.shift_test`).

    >>> s = Snapshot(["a", "b"], np.eye(2), [["b"], ["a"]], model_id="m")
    >>> s.dimension, s.support("a"), "b" in s.index
    (2, None, True)
    """

    names: Sequence[str]
    vectors: npt.NDArray[np.floating[Any]]
    neighbours: Sequence[Sequence[str]]
    counts: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None
    model_id: str = ""
    space: str = ""
    means: npt.NDArray[np.floating[Any]] | None = None
    index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        matrix = np.asarray(self.vectors, dtype=np.float64)
        if matrix.ndim != 2 or matrix.shape[0] != len(self.names):
            raise ValueError(f"{len(self.names)} hashtags but vectors of shape {matrix.shape}")
        if len(self.neighbours) != len(self.names):
            raise ValueError(f"{len(self.names)} hashtags but {len(self.neighbours)} neighbour lists")
        if self.counts is not None and len(self.counts) != len(self.names):
            raise ValueError(f"{len(self.names)} hashtags but {len(self.counts)} counts")
        if self.means is not None and np.shape(self.means) != matrix.shape:
            raise ValueError(f"means of shape {np.shape(self.means)} for vectors of shape {matrix.shape}")
        index = {name: i for i, name in enumerate(self.names)}
        if len(index) != len(self.names):
            raise ValueError("hashtag names must be unique")
        object.__setattr__(self, "vectors", matrix)
        object.__setattr__(self, "index", index)

    @property
    def dimension(self) -> int:
        return int(self.vectors.shape[1])

    def support(self, hashtag: str) -> int | None:
        """Tweets averaged by ``hashtag``'s mean; ``None`` when this version has no counts."""
        return None if self.counts is None else int(self.counts[self.index[hashtag]])

    def top(self, hashtag: str) -> tuple[str, ...]:
        return tuple(self.neighbours[self.index[hashtag]][:TOP_NEIGHBOURS])


@dataclass(frozen=True)
class Quantiles:
    """p50, p90 and p99 of a per-hashtag quantity (numpy's linear interpolation).

    >>> Quantiles.of(np.arange(101.0)).to_dict()
    {'p50': 50.0, 'p90': 90.0, 'p99': 99.0}
    """

    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: npt.NDArray[np.float64]) -> Quantiles | None:
        """``None`` for no values (nothing was compared)."""
        if values.size == 0:
            return None
        found = np.quantile(values, [q for _, q in QUANTILES])
        return cls(*(float(v) for v in found))

    def to_dict(self) -> dict[str, float]:
        return {"p50": self.p50, "p90": self.p90, "p99": self.p99}


@dataclass(frozen=True)
class Mover:
    """A hashtag whose meaning moved: its cosine then/now, top-10 overlap and neighbours;
    where both versions record their raw means, the shift test of the tweets added since the
    old version against the tweets before (:mod:`stream.synonyms.shift_test`: effect, its interval,
    p-value, discovery), else ``None`` there."""

    hashtag: str
    cosine: float
    jaccard: float
    support_old: int | None
    support_new: int | None
    old_neighbours: tuple[str, ...]
    new_neighbours: tuple[str, ...]
    effect: float | None = None
    effect_low: float | None = None
    effect_high: float | None = None
    p: float | None = None
    significant: bool | None = None
    #: A few of its tweets first seen up to the old version and since (the index job fills
    #: them in from the reservoir, :func:`with_examples`; empty where nobody did).
    examples_before: tuple[str, ...] = ()
    examples_since: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The fields by name, in their order; the neighbours and examples as JSON lists."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True, eq=False)
class Shifts:
    """Per hashtag in both versions (sorted by name): cosine then/now and top-10 Jaccard."""

    hashtags: tuple[str, ...]
    cosines: npt.NDArray[np.float64]
    jaccards: npt.NDArray[np.float64]


@dataclass(frozen=True)
class ThesaurusDrift:
    """How far two versions' hashtags moved: the summary over all shared hashtags, and the
    largest movers among the well-supported ones.

    ``shift_quantiles`` are of ``1 - cosine``, ``jaccard_quantiles`` of ``1 - Jaccard``
    (both 0 = unchanged); ``share_top10_changed_over_half`` is the share with Jaccard
    below 0.5.  Quantiles and share are ``None`` when no hashtag is in both versions.
    """

    compared: int
    only_old: int
    only_new: int
    shift_quantiles: Quantiles | None
    jaccard_quantiles: Quantiles | None
    share_top10_changed_over_half: float | None
    movers: tuple[Mover, ...]
    #: How the movers are ranked: "effect_low" (the shift test: the lower end of the effect's
    #: interval, :func:`stream.synonyms.shift_test.mover_key`) or "cosine" (versions without raw means).
    ranked_by: str = "cosine"
    #: Hashtags tested whose shift is a discovery at 1% false-discovery rate (None: not tested).
    significant: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON contract of ``reval thesaurus diff --json``."""
        return {
            "ranked_by": self.ranked_by,
            "significant": self.significant,
            "compared": self.compared,
            "only_old": self.only_old,
            "only_new": self.only_new,
            "shift_quantiles": None if self.shift_quantiles is None else self.shift_quantiles.to_dict(),
            "jaccard_quantiles": None if self.jaccard_quantiles is None else self.jaccard_quantiles.to_dict(),
            "share_top10_changed_over_half": self.share_top10_changed_over_half,
            "movers": [m.to_dict() for m in self.movers],
        }


def jaccard(a: Sequence[str], b: Sequence[str]) -> float:
    """Overlap of two neighbour lists as sets; two empty lists are the same (1).

    >>> jaccard(["a", "b", "c"], ["b", "c", "d"]), jaccard([], [])
    (0.5, 1.0)
    """
    sa, sb = set(a), set(b)
    union = sa | sb
    return 1.0 if not union else len(sa & sb) / len(union)


def check_comparable(old: Snapshot, new: Snapshot) -> None:
    """Refuse versions whose vectors live in different spaces.

    >>> a = Snapshot(["x"], np.ones((1, 3)), [[]], model_id="bertweet")
    >>> b = Snapshot(["x"], np.ones((1, 2)), [[]], model_id="minilm")
    >>> try:
    ...     check_comparable(a, b)
    ... except IncomparableVersionsError as exc:
    ...     print(exc)  # doctest: +ELLIPSIS
    cannot compare versions of different models: old 'bertweet' (3-d), new 'minilm' (2-d): ...
    """
    if old.model_id != new.model_id or old.dimension != new.dimension:
        raise IncomparableVersionsError(
            f"cannot compare versions of different models: old {old.model_id!r} ({old.dimension}-d), "
            f"new {new.model_id!r} ({new.dimension}-d): cosines across embedding spaces are meaningless"
        )
    if old.space != new.space:
        raise IncomparableVersionsError(
            f"cannot compare versions built differently: old {old.space!r}, new {new.space!r} "
            "(their vectors and neighbour rankings differ by construction, not by meaning)"
        )


def hashtag_shifts(old: Snapshot, new: Snapshot) -> Shifts:
    """Cosine then/now and top-10 Jaccard of every hashtag in both versions.

    >>> old = Snapshot(["a", "b"], np.array([[1.0, 0.0], [0.0, 1.0]]), [["b"], ["a"]])
    >>> new = Snapshot(["b", "a"], np.array([[0.0, 2.0], [1.0, 1.0]]), [["a"], []])
    >>> s = hashtag_shifts(old, new)
    >>> s.hashtags, s.cosines.round(3).tolist(), s.jaccards.tolist()
    (('a', 'b'), [0.707, 1.0], [0.0, 1.0])
    """
    check_comparable(old, new)
    shared = tuple(sorted(old.index.keys() & new.index.keys()))
    rows_old = np.array([old.index[h] for h in shared], dtype=np.int64)
    rows_new = np.array([new.index[h] for h in shared], dtype=np.int64)
    a = old.vectors[rows_old] if shared else np.zeros((0, old.dimension))
    b = new.vectors[rows_new] if shared else np.zeros((0, new.dimension))
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    bad = ~np.isfinite(na) | ~np.isfinite(nb) | (na == 0.0) | (nb == 0.0)
    if bad.any():
        # A zero vector has no direction: its cosine with anything is undefined.
        raise ValueError(f"vector of hashtag {shared[int(np.flatnonzero(bad)[0])]!r} is zero or not finite")
    cosines = np.clip(np.einsum("ij,ij->i", a, b) / (na * nb), -1.0, 1.0)
    jaccards = np.array([jaccard(old.top(h), new.top(h)) for h in shared], dtype=np.float64)
    return Shifts(shared, cosines, jaccards)


def compare(
    old: Snapshot, new: Snapshot, *, min_support: int = DEFAULT_MIN_SUPPORT, top: int = DEFAULT_TOP
) -> ThesaurusDrift:
    """The drift from ``old`` to ``new``: a summary over every shared hashtag and the ``top``
    movers (lowest cosine first, ties by lowest Jaccard, then name) among hashtags with at
    least ``min_support`` tweets in both versions that moved at all: a hashtag with the same
    top-10 neighbours and either the same vector or the same number of tweets (a mean of the
    same tweets, shifted only with the space) is no mover.

    >>> same = Snapshot(["a", "b"], np.eye(2), [["b"], ["a"]], counts=[5, 5])
    >>> d = compare(same, same)
    >>> d.movers, d.shift_quantiles, d.only_old
    ((), Quantiles(p50=0.0, p90=0.0, p99=0.0), 0)
    """
    if isinstance(min_support, bool) or not isinstance(min_support, int) or min_support < 0:
        raise ValueError(f"min_support must be a non-negative integer, got {min_support!r}")
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise ValueError(f"top must be a non-negative integer, got {top!r}")
    shifts = hashtag_shifts(old, new)
    changed = 1.0 - shifts.cosines
    candidates = []
    for i, hashtag in enumerate(shifts.hashtags):
        support = (old.support(hashtag), new.support(hashtag))
        if shifts.jaccards[i] == 1.0 and (
            changed[i] <= _SAME or (None not in support and support[0] == support[1])
        ):
            # Did not move: the same neighbours, and the same vector -- or the same tweets
            # (its mean is unchanged; what shifted is the space, e.g. the centring of a
            # hubness method moving every vector a little when other hashtags get tweets).
            continue
        if any(s is not None and s < min_support for s in support):
            continue
        candidates.append((float(shifts.cosines[i]), float(shifts.jaccards[i]), hashtag, support))
    tested = _tested_since(old, new, [c[2] for c in candidates], min_support)
    if tested is not None:
        # The shift test ranks: only hashtags with enough tweets since the old version.
        candidates = [c for c in candidates if c[2] in tested]
        candidates.sort(key=lambda c: mover_key(tested[c[2]][0], tested[c[2]][1], c[2]))
    else:
        # Cosines equal up to rounding are ties (a vector's cosine with itself may come out as
        # 1 - 1e-16), so that the Jaccard, not float noise, orders them.
        candidates.sort(key=lambda c: (round(c[0], 9), c[1], c[2]))
    movers = tuple(
        Mover(
            hashtag,
            cos,
            jac,
            sup[0],
            sup[1],
            old.top(hashtag),
            new.top(hashtag),
            *(tested[hashtag] if tested is not None else (None,) * 5),
        )
        for cos, jac, hashtag, sup in candidates[:top]
    )
    compared = len(shifts.hashtags)
    share = float(np.mean(shifts.jaccards < 0.5)) if compared else None
    return ThesaurusDrift(
        compared=compared,
        only_old=len(old.index) - compared,
        only_new=len(new.index) - compared,
        shift_quantiles=Quantiles.of(changed),
        jaccard_quantiles=Quantiles.of(1.0 - shifts.jaccards),
        share_top10_changed_over_half=share,
        movers=movers,
        ranked_by="cosine" if tested is None else "effect_low",
        significant=None if tested is None else sum(1 for t in tested.values() if t[4]),
    )


def _tested_since(
    old: Snapshot, new: Snapshot, hashtags: Sequence[str], min_support: int
) -> dict[str, tuple[float, float, float, float, bool]] | None:
    """The shift test of each hashtag's tweets added since ``old`` against its tweets up to
    ``old`` -- recovered from the two versions' raw means and counts, since a version's sums
    include the older one's -- as (effect, low, high, p, discovered); None when a version
    lacks raw means or counts.  Hashtags with fewer than ``min_support`` (at least 2) new
    tweets are not tested."""
    if old.means is None or new.means is None or old.counts is None or new.counts is None:
        return None
    least = max(min_support, 2)
    rows = []
    for hashtag in hashtags:
        i, j = old.index[hashtag], new.index[hashtag]
        n_old, n_new = int(old.counts[i]), int(new.counts[j])
        if n_old >= least and n_new - n_old >= least:
            rows.append((hashtag, i, j, n_old, n_new))
    if not rows:
        return {}
    n_before = np.array([r[3] for r in rows], dtype=np.int64)
    n_all = np.array([r[4] for r in rows], dtype=np.int64)
    sums_before = np.asarray(old.means, dtype=np.float64)[[r[1] for r in rows]] * n_before[:, None]
    sums_all = np.asarray(new.means, dtype=np.float64)[[r[2] for r in rows]] * n_all[:, None]
    test = shift_test(n_before, sums_before, n_all - n_before, sums_all - sums_before)
    return {
        r[0]: (
            float(test.effect[k]),
            float(test.effect_low[k]),
            float(test.effect_high[k]),
            float(test.p[k]),
            bool(test.discovered[k]),
        )
        for k, r in enumerate(rows)
    }


@dataclass(frozen=True)
class RecentMover:
    """A hashtag whose recent use moved away from its earlier use: the spread-aware test's
    effect (with its 95% interval) and p-value (:mod:`stream.synonyms.shift_test`), and the cosine
    of the two means."""

    hashtag: str
    effect: float
    effect_low: float
    effect_high: float
    p: float
    significant: bool
    cosine: float
    support_recent: int
    support_before: int
    #: What a person reads to see the two senses (filled in by the index job, which has
    #: them: :func:`with_context`): the hashtag's nearest hashtags in the new version and in
    #: the one before, and a few of its tweets first seen before and within the recent window.
    neighbours: tuple[str, ...] = ()
    old_neighbours: tuple[str, ...] = ()
    examples_before: tuple[str, ...] = ()
    examples_recent: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class RecentShift:
    """Recent use against earlier use, per hashtag: the mean of its tweets in the recent
    event-time window against the mean of its tweets before it, tested against the spread
    of its own tweets (:func:`stream.synonyms.shift_test.shift_test`).

    Unlike :class:`ThesaurusDrift` (version against version, both all-time means, so a
    shift is diluted by all history), this measures the current window on its own.
    ``compared`` counts hashtags with at least ``min_support`` tweets on both sides;
    ``significant`` those whose shift is a discovery at the test's false-discovery rate;
    ``shift_quantiles`` are of ``1 - cosine`` over them.  Movers ranked by
    :func:`stream.synonyms.shift_test.mover_key` (the effect's lower end first).
    """

    compared: int
    significant: int
    shift_quantiles: Quantiles | None
    movers: tuple[RecentMover, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "compared": self.compared,
            "significant": self.significant,
            "shift_quantiles": None if self.shift_quantiles is None else self.shift_quantiles.to_dict(),
            "movers": [m.to_dict() for m in self.movers],
        }


def recent_shift(
    names: Sequence[str],
    totals: npt.NDArray[np.float64],
    counts: Sequence[int],
    recent_totals: npt.NDArray[np.float64],
    recent_counts: Sequence[int],
    *,
    min_support: int = DEFAULT_MIN_SUPPORT,
    top: int = DEFAULT_TOP,
    effective_dim: float = DEFAULT_EFFECTIVE_DIM,
) -> RecentShift:
    """Recent against earlier use from running sums of unit-length tweet embeddings:
    all-time ``totals``/``counts`` and the recent window's (a part of them); "before" is
    their difference, so it is exact for sums and needs no second store.  Movers ranked by
    :func:`stream.synonyms.shift_test.mover_key`.

    >>> unit = lambda *v: np.array(v) / np.linalg.norm(v)
    >>> before = {"flood": 5 * unit(1, 0.1), "rain": 5 * unit(1, 1)}      # tight clusters
    >>> recent = {"flood": 5 * unit(0.1, 1), "rain": 5 * unit(1, 0.9)}
    >>> totals = np.array([before[h] + recent[h] for h in ("flood", "rain")]) * 0.98
    >>> recent_totals = np.array([recent[h] for h in ("flood", "rain")]) * 0.98
    >>> s = recent_shift(["flood", "rain"], totals, [10, 10], recent_totals, [5, 5], min_support=5)
    >>> [(m.hashtag, m.significant, round(m.cosine, 2)) for m in s.movers], s.compared, s.significant
    ([('flood', True, 0.2), ('rain', False, 1.0)], 2, 1)
    """
    counts_all = np.asarray(counts, dtype=np.int64)
    counts_recent = np.asarray(recent_counts, dtype=np.int64)
    before = np.asarray(totals, dtype=np.float64) - np.asarray(recent_totals, dtype=np.float64)
    recent = np.asarray(recent_totals, dtype=np.float64)
    counts_before = counts_all - counts_recent
    keep = (counts_recent >= max(min_support, 2)) & (counts_before >= max(min_support, 2))
    nb, nr = np.linalg.norm(before, axis=1), np.linalg.norm(recent, axis=1)
    keep &= (nb > 0) & (nr > 0)
    rows = np.flatnonzero(keep)
    kept = [names[int(i)] for i in rows]
    cosines = np.clip(np.einsum("ij,ij->i", before[rows], recent[rows]) / (nb[rows] * nr[rows]), -1.0, 1.0)
    test = shift_test(
        counts_before[rows], before[rows], counts_recent[rows], recent[rows], effective_dim=effective_dim
    )
    order = sorted(
        range(len(rows)),
        key=lambda i: mover_key(float(test.effect[i]), float(test.effect_low[i]), kept[i]),
    )
    movers = tuple(
        RecentMover(
            kept[i],
            float(test.effect[i]),
            float(test.effect_low[i]),
            float(test.effect_high[i]),
            float(test.p[i]),
            bool(test.discovered[i]),
            float(cosines[i]),
            int(counts_recent[rows[i]]),
            int(counts_before[rows[i]]),
        )
        for i in order[:top]
    )
    return RecentShift(len(rows), test.significant, Quantiles.of(1.0 - cosines), movers)


#: Example tweets shown per side of a mover.
EXAMPLES = 3


def split_examples(
    dated: Sequence[tuple[str, float]], since: float, n: int = EXAMPLES
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Up to ``n`` texts first seen before ``since`` and ``n`` from ``since`` on, from a
    sample of (text, first seen) in a random order that does not depend on time (the
    reservoir's bottom-k order): the first of each side are a uniform sample of that side.

    >>> split_examples([("a", 1.0), ("b", 9.0), ("c", 2.0), ("d", 3.0)], since=5.0, n=2)
    (('a', 'c'), ('b',))
    """
    before = tuple(text for text, when in dated if when < since)[:n]
    recent = tuple(text for text, when in dated if when >= since)[:n]
    return before, recent


def with_examples(
    drift: ThesaurusDrift, samples: Mapping[str, Sequence[tuple[str, float]]], since: float
) -> ThesaurusDrift:
    """``drift`` with each mover's example tweets first seen before ``since`` (the event time
    the old version covered) and from it on (:func:`split_examples` of its sample)."""
    movers = []
    for m in drift.movers:
        before, after = split_examples(samples.get(m.hashtag, ()), since)
        movers.append(replace(m, examples_before=before, examples_since=after))
    return replace(drift, movers=tuple(movers))


def recorded_examples(
    drift: ThesaurusDrift, recorded: Mapping[str, Any] | None, old_version: str
) -> ThesaurusDrift:
    """``drift`` (of ``old_version`` against a newer version) with the examples the newer
    version's metadata ``recorded`` for the same movers, when the index job wrote it as the
    drift from ``old_version`` (its ``from_version``); unchanged otherwise.

    >>> d = ThesaurusDrift(1, 0, 0, None, None, None, (Mover("flood", 0.2, 0.0, 9, 19, (), ()),))
    >>> note = {"from_version": "v1", "movers": [{"hashtag": "flood", "examples_before": ["rain"],
    ...                                           "examples_since": ["vote"]}]}
    >>> recorded_examples(d, note, "v1").movers[0].examples_since, recorded_examples(d, note, "v0") == d
    (('vote',), True)
    """
    if not recorded or recorded.get("from_version") != old_version:
        return drift
    found = {
        m.get("hashtag"): (tuple(m.get("examples_before") or ()), tuple(m.get("examples_since") or ()))
        for m in recorded.get("movers") or ()
        if isinstance(m, Mapping)
    }
    movers = tuple(
        replace(m, examples_before=found[m.hashtag][0], examples_since=found[m.hashtag][1])
        if m.hashtag in found
        else m
        for m in drift.movers
    )
    return replace(drift, movers=movers)


def with_context(
    shift: RecentShift,
    neighbours: Callable[[str], Sequence[str]],
    old_neighbours: Callable[[str], Sequence[str]],
    samples: Mapping[str, Sequence[tuple[str, float]]],
    since: float,
) -> RecentShift:
    """``shift`` with each mover's neighbours now and before (top :data:`TOP_NEIGHBOURS`)
    and example tweets of each side (:func:`split_examples` of its sample)."""
    movers = []
    for m in shift.movers:
        before, recent = split_examples(samples.get(m.hashtag, ()), since)
        movers.append(
            replace(
                m,
                neighbours=tuple(neighbours(m.hashtag))[:TOP_NEIGHBOURS],
                old_neighbours=tuple(old_neighbours(m.hashtag))[:TOP_NEIGHBOURS],
                examples_before=before,
                examples_recent=recent,
            )
        )
    return replace(shift, movers=tuple(movers))
