"""#REval-hit-ratio and the exact-match metrics (paper 2.1 and 3.3, Eq. 3-4, Algorithm 2).

R is the set of recommended hashtags, G the set of ground-truth hashtags, both
normalised and without duplicates.  Synonyms are expanded for R only::

    #REval-hit-ratio(R, G) = rho / min(|R|, |G|)
      |R| <= |G|: rho = #{r in R : Syn_k(r) ∩ G ≠ ∅}
      otherwise:  rho = #{g in G : g in Syn_k(R)}

With k = 0 (Syn_0(h) = {h}) it is the plain hit ratio (Eq. 3).  An event with an
empty R or G has no defined score: the functions return ``None`` and the
aggregates count it as unscorable, never as 0.

Eq. 4 is computed in exactly one place, :func:`reval_by_k`, from the |R| x |G|
matrix of *synonym ranks*: entry (i, j) is the rank of g_j among r_i's synonyms
(0 when g_j is r_i itself, i when it is r_i's i-th nearest hashtag, :data:`FAR`
when it is none of them), so g_j is in Syn_k(r_i) exactly when the entry is
<= k and one matrix answers every k.  The exact-match metrics are computed in
exactly one place too, :func:`exact_from_ranks`, from the same matrix (rank 0
is an exact match).  :func:`reval_hit_ratio` and :func:`exact_scores` are the
definitional entry points for a given Syn_k; they build the matrix and call
those two.

References
----------
Alsini, Huynh, Datta: "#REval: a semantic evaluation framework for hashtag
recommendation", section 3.3, Eq. 3-4 and Algorithm 2 (``papers/000_…``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
from operator import countOf

from stream.intake.hashtags import normalise_all

Synonyms = Callable[[str], Iterable[str]]
"""Syn(h): the hashtag itself and its synonyms."""

RankTable = Mapping[str, int]
"""Synonym -> rank among a hashtag's synonyms (0 for the hashtag itself)."""

FAR = 1 << 30
"""The rank of a hashtag that is no synonym at all."""


def rank_matrix(
    recommended: Sequence[str], truth: Sequence[str], ranks: Callable[[str], RankTable]
) -> list[list[int]]:
    """Row i, column j: the rank of ``truth[j]`` among ``recommended[i]``'s synonyms.

    >>> rank_matrix(["swim", "golf"], ["sport", "swim"], lambda h: {h: 0, "sport": 3})
    [[3, 0], [3, 1073741824]]
    """
    return [[table.get(g, FAR) for g in truth] for table in map(ranks, recommended)]


def reval_by_k(matrix: Sequence[Sequence[int]], n_truth: int, ks: Sequence[int]) -> list[float]:
    """Eq. 4 for every k of ``ks``, from a non-empty |R| x |G| rank matrix.

    rho(k) counts the rows (|R| <= |G|) or the columns (otherwise) whose smallest
    rank is <= k, so every k is a bisection of the same sorted minima.

    >>> reval_by_k([[3, 0], [3, 1 << 30]], 2, [0, 2, 3])  # |R| = |G| = 2
    [0.5, 0.5, 1.0]
    >>> reval_by_k([[1 << 30]], 1, [10**12])  # no synonym at all is no hit at any k
    [0.0]
    """
    n_rec = len(matrix)
    # The units' smallest ranks: rows when |R| <= |G|, columns otherwise.
    units = matrix if n_rec <= n_truth else zip(*matrix, strict=True)
    minima = sorted(map(min, units))
    return reval_from_minima(minima, min(n_rec, n_truth), ks)


def reval_precision_by_k(matrix: Sequence[Sequence[int]], ks: Sequence[int]) -> list[float]:
    """Eq. 4's |R| <= |G| branch whatever the sizes, for every k of ``ks``: the share of the
    recommended hashtags (rows) with a ground truth among their k synonyms.

    #REval counts the ground truths caught, once each, when |R| > |G| (10 recommended, 1-3
    truths: the usual event), so a list with several hashtags near one truth loses nothing
    until the last of them goes; this *precision form* loses a share per hashtag replaced by
    one unrelated to the truth, and keeps it when a hashtag is replaced by a synonym. It is
    what the #REval alert tests (:func:`stream.monitoring.backtest.skill_loss`).

    >>> reval_precision_by_k([[3, 0], [12, 40], [2, 1 << 30]], [0, 10])  # 3 rows, 2 truths
    [0.3333333333333333, 0.6666666666666666]
    >>> reval_by_k([[3, 0], [12, 40], [2, 1 << 30]], 2, [0, 10])  # #REval: both truths caught at 10
    [0.5, 1.0]
    """
    return reval_from_minima(sorted(map(min, matrix)), len(matrix), ks)


def reval_from_minima(minima: Sequence[int], denominator: int, ks: Sequence[int]) -> list[float]:
    """Eq. 4 for every k of ``ks`` from the sorted smallest ranks of its units (rows when
    |R| <= |G|, columns otherwise) and min(|R|, |G|): the end of :func:`reval_by_k`.

    >>> reval_from_minima([0, 3], 2, [0, 2, 3])
    [0.5, 0.5, 1.0]
    """
    if minima and minima[0] > max(ks, default=FAR):  # no hit at any k (most events)
        return [0.0] * len(ks)
    # A k beyond any real rank means "every synonym", never "FAR too": cap it below FAR.
    return [bisect_right(minima, min(k, FAR - 1)) / denominator for k in ks]


@dataclass(frozen=True)
class ExactScores:
    """Exact-match metrics of one event (paper 2.1)."""

    hit_rate: float
    precision: float
    recall: float
    f1: float
    hit_ratio: float

    NAMES = ("hit_rate", "precision", "recall", "f1", "hit_ratio")

    def as_dict(self) -> dict[str, float]:
        """The scores by name, in the order of :attr:`NAMES`."""
        return {name: getattr(self, name) for name in self.NAMES}


def exact_from_ranks(matrix: Sequence[Sequence[int]], n_truth: int) -> ExactScores:
    """Hit rate, precision, recall, F1 and hit ratio (Eq. 3) from a non-empty rank matrix.

    Rank 0 means "the same hashtag", so the hits are the zeros of the matrix.

    >>> exact_from_ranks([[5, 0], [1 << 30, 7], [9, 9]], 2)
    ExactScores(hit_rate=1.0, precision=0.3333333333333333, recall=0.5, f1=0.4, hit_ratio=0.5)
    """
    return exact_from_counts(sum(map(countOf, matrix, repeat(0))), len(matrix), n_truth)


@lru_cache(maxsize=4096)
def exact_from_counts(hits: int, n_rec: int, n_truth: int) -> ExactScores:
    """The scores of ``hits`` exact matches among n_rec recommended and n_truth true hashtags
    (they depend on these three counts only; immutable, so one instance serves every event)."""
    precision, recall = hits / n_rec, hits / n_truth
    return ExactScores(
        hit_rate=1.0 if hits else 0.0,
        precision=precision,
        recall=recall,
        f1=2 * precision * recall / (precision + recall) if hits else 0.0,
        hit_ratio=hits / min(n_rec, n_truth),
    )


def as_set(hashtags: Iterable[str]) -> list[str]:
    """Normalised hashtags without duplicates, in their original order (rank kept)."""
    return normalise_all(hashtags)


def reval_hit_ratio(recommended: Iterable[str], truth: Iterable[str], synonyms: Synonyms) -> float | None:
    """#REval-hit-ratio (Eq. 4) for the Syn_k that ``synonyms`` gives; ``None`` when
    R or G is empty (unscorable).

    Paper Table 2, first row (k = 3):

    >>> syn = {"hockey": ["hockey", "bowling", "golf", "sport"],
    ...        "championship": ["championship", "champion", "winner", "tournament"]}
    >>> reval_hit_ratio(["hockey", "championship"], ["football", "sport"],
    ...                 lambda h: syn.get(h, [h]))
    0.5
    """
    r, g = as_set(recommended), as_set(truth)
    if not r or not g:
        return None
    matrix = rank_matrix(r, g, lambda h: dict.fromkeys(synonyms(h), 0))
    return reval_by_k(matrix, len(g), [0])[0]


def exact_scores(recommended: Iterable[str], truth: Iterable[str]) -> ExactScores | None:
    """Hit rate, precision, recall, F1 and hit ratio by exact match; ``None`` if unscorable.

    >>> exact_scores(["flood", "help", "nsw"], ["flood", "qldflood"])
    ExactScores(hit_rate=1.0, precision=0.3333333333333333, recall=0.5, f1=0.4, hit_ratio=0.5)
    """
    r, g = as_set(recommended), as_set(truth)
    if not r or not g:
        return None
    return exact_from_ranks(rank_matrix(r, g, lambda h: {h: 0}), len(g))


class Mean:
    """Running mean of scores, river style; ``None`` values count as unscorable.

    >>> m = Mean()
    >>> for x in (1.0, 0.0, None, 0.5):
    ...     _ = m.update(x)
    >>> m
    Mean: 0.5000 (3 scored, 1 unscorable)
    >>> m.get(), m.n, m.unscorable
    (0.5, 3, 1)
    """

    def __init__(self) -> None:
        self.total = 0.0
        self.n = 0
        self.unscorable = 0

    def update(self, value: float | None) -> Mean:
        if value is None:
            self.unscorable += 1
        else:
            self.total += value
            self.n += 1
        return self

    def revert(self, value: float | None) -> Mean:
        """Undo an :meth:`update` with the same value."""
        if value is None:
            self.unscorable -= 1
        else:
            self.total -= value
            self.n -= 1
        return self

    def get(self) -> float | None:
        return self.total / self.n if self.n else None

    def __iadd__(self, other: Mean) -> Mean:
        self.total += other.total
        self.n += other.n
        self.unscorable += other.unscorable
        return self

    def __repr__(self) -> str:
        value = self.get()
        shown = "-" if value is None else f"{value:.4f}"
        return f"Mean: {shown} ({self.n} scored, {self.unscorable} unscorable)"
