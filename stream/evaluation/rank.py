"""Rank-aware #REval-hit-ratio: a hit's credit decays with the recommended hashtag's rank
and with the synonym's rank (the #REval paper's future work, section 5).

Eq. 4 counts a unit -- a recommended hashtag when |R| <= |G|, a ground-truth hashtag
otherwise -- as 1 when a synonym link joins it to the other side, whatever the ranks.
Here the link from the recommended hashtag at rank i (1-based, in the order of the
deduplicated list R) to ground truth g, when g is at synonym rank j <= k among its
synonyms (j = 0: g is the hashtag itself; the same matrix of synonym ranks as
:func:`stream.evaluation.metrics.reval_by_k`, so Syn_k(r) is expanded for R only, as in Eq. 4),
is worth ``w_rec(i) * w_syn(j)``::

    v_u      = max over the links of unit u with j <= k of w_rec(i) * w_syn(j)   (0 if none)
    n        = min(|R|, |G|)
    ranked   = sum_{t=1..n} min(v_(t), w_rec(t)) / sum_{t=1..n} w_rec(t)

where v_(1) >= v_(2) >= ... are the unit values sorted (ties do not matter: the sum
of a sorted list is the same whichever equal value comes first).  The denominator is
the ideal list's credit (its n hits exact, at ranks 1..n), as in nDCG, so a perfect
list scores 1 whatever the weights.  The cap min(., w_rec(t)) says the t-th best hit
can earn at most what rank t earns in the ideal list: without it, one recommended
hashtag whose synonyms cover several ground-truth hashtags (possible only when
|R| > |G| and k >= 1) could push the score above 1.  When |R| <= |G|, or k = 0, every
v_(t) <= w_rec(t) already and the cap changes nothing.

Weights: w_rec on ranks i >= 1 and w_syn on synonym ranks j >= 0, non-increasing,
in (0, 1], with w_rec(1) = w_syn(0) = 1 (an exact hit at the top is worth 1).

* flat weights (w = 1): every v is 0 or 1, the cap never binds, the sum is rho and
  the denominator n: exactly Eq. 4 (:data:`FLAT`);
* :data:`DCG` (the default): w_rec(i) = 1 / log2(1 + i), w_syn(j) = 1 / log2(2 + j),
  the DCG discount on both ranks; at k = 0 the score is nDCG with binary relevance,
  cut at min(|R|, |G|);
* :data:`TOP`: the top-rank weights f(n) = 1 / (n + n0)^2, n0 = 2, of Dell'Anna et
  al. (``papers/001_…``), scaled so f(1) = 1: w_rec(i) = (3 / (i + 2))^2 and
  w_syn(j) = (3 / (j + 3))^2; it leans on the first ranks much harder.

Properties (tests/test_rank_reval.py): in [0, 1]; flat weights give Eq. 4 bit for
bit; never lower when a synonym rank falls, when k grows, or when a recommended
hashtag with a link swaps places with a higher one that has none; an empty R or G is
unscorable (``None``), as in Eq. 4.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain

from stream.evaluation.metrics import FAR, Synonyms, as_set, rank_matrix

Weight = Callable[[int], float]


@dataclass(frozen=True)
class RankWeights:
    """w_rec (rank i >= 1 in the recommended list) and w_syn (synonym rank j >= 0).

    Values are cached per rank: the scorer asks for the same few ranks millions of times.

    >>> DCG.rec(3), DCG.syn(1)
    (0.5, 0.6309297535714575)
    """

    name: str
    rec_weight: Weight
    syn_weight: Weight
    _rec: list[float] = field(default_factory=list, repr=False, compare=False)
    _syn: list[float] = field(default_factory=list, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Anything else breaks "a perfect list scores 1" and the reduction to Eq. 4.
        if self.rec_weight(1) != 1.0 or self.syn_weight(0) != 1.0:
            raise ValueError(f"{self.name}: w_rec(1) and w_syn(0) must be 1")

    def rec(self, i: int) -> float:
        """w_rec(i), i >= 1."""
        return self.rec_table(i)[i - 1]

    def syn(self, j: int) -> float:
        """w_syn(j), j >= 0."""
        return self.syn_table(j + 1)[j]

    def rec_table(self, n: int) -> list[float]:
        """[w_rec(1), ..., w_rec(n)] (a cached list: do not modify)."""
        while len(self._rec) < n:
            self._rec.append(self.rec_weight(len(self._rec) + 1))
        return self._rec

    def syn_table(self, n: int) -> list[float]:
        """[w_syn(0), ..., w_syn(n - 1)] (a cached list: do not modify)."""
        while len(self._syn) < n:
            self._syn.append(self.syn_weight(len(self._syn)))
        return self._syn


def _top(n: int, n0: int = 2) -> float:
    """Dell'Anna et al.'s f(n) = 1 / (n + n0)^2, scaled so f(1) = 1."""
    return ((1 + n0) / (n + n0)) ** 2


FLAT = RankWeights("flat", lambda i: 1.0, lambda j: 1.0)
DCG = RankWeights("dcg", lambda i: 1.0 / math.log2(1 + i), lambda j: 1.0 / math.log2(2 + j))
TOP = RankWeights("top", _top, lambda j: _top(j + 1))
SCHEMES = {w.name: w for w in (FLAT, DCG, TOP)}


def ranked_by_k(
    matrix: Sequence[Sequence[int]], n_truth: int, ks: Sequence[int], weights: RankWeights = DCG
) -> list[float]:
    """The rank-aware #REval-hit-ratio for every k of ``ks``, from a non-empty |R| x |G|
    matrix of synonym ranks (:func:`stream.evaluation.metrics.rank_matrix`; row i = R's rank i + 1).

    The links within reach of the largest k are sorted by synonym rank once and swept
    in step with the ks (in increasing order), so each k only adds the links it newly
    reaches, as :func:`stream.evaluation.metrics.reval_by_k` bisects one sorted list: the scorer
    calls this for every (r, k) of every event.

    the worked example of docs/concepts.md (Table 2's first row, k = 3; |R| = |G| = 2, so units are
    rows; hockey, at rank 2, has sport at synonym rank 3):

    >>> far = 1 << 30
    >>> [round(v, 4) for v in ranked_by_k([[far, far], [far, 3]], 2, [0, 3])]
    [0.0, 0.1666]
    >>> ranked_by_k([[far, far], [far, 3]], 2, [0, 3], FLAT)  # Eq. 4
    [0.0, 0.5]
    """
    n_rec = len(matrix)
    top_k = min(max(ks), FAR - 1)  # a k beyond any real rank: every synonym, never a FAR link
    rec = weights.rec_table(n_rec)
    if min(chain.from_iterable(matrix), default=FAR) > top_k:
        return [0.0] * len(ks)  # the common case on a live feed: nothing within reach
    # Units as in Eq. 4: rows when |R| <= |G|, columns otherwise.  Links: (j, unit, row).
    by_row = n_rec <= n_truth
    links = sorted(
        (j, i if by_row else g, i)
        for i, row in enumerate(matrix)
        if min(row, default=FAR) <= top_k  # most rows have no link: skip them whole
        for g, j in enumerate(row)
        if j <= top_k
    )
    syn = weights.syn_table(links[-1][0] + 1)  # the ranks that occur, not top_k: k may be huge
    n = min(n_rec, n_truth)
    ideal = rec[:n]
    total_ideal = sum(ideal)
    values = [0.0] * n  # each unit's best credit so far
    out: dict[int, float] = {}
    at, score = 0, 0.0
    for k in sorted(set(ks)):
        if at < len(links) and links[at][0] <= k:
            while at < len(links) and links[at][0] <= k:
                j, unit, i = links[at]
                values[unit] = max(values[unit], rec[i] * syn[j])
                at += 1
            if by_row:
                # v_i <= w_rec(i) for every row, so the t-th largest is <= w_rec(t): no cap.
                score = sum(values) / total_ideal
            else:
                ranked = sorted(values, reverse=True)
                score = sum(map(min, ranked, ideal)) / total_ideal  # len(ranked) == len(ideal) == n
        out[k] = score
    return [out[k] for k in ks]


def reval_ranked(
    recommended: Iterable[str], truth: Iterable[str], synonyms: Synonyms, weights: RankWeights = DCG
) -> float | None:
    """Rank-aware #REval-hit-ratio for the Syn_k that ``synonyms`` gives, nearest first
    (the hashtag itself has rank 0, the others 1, 2, ... in list order); ``None`` when
    R or G is empty.  R keeps its order: the first occurrence of a hashtag is its rank.

    Paper Table 2's fourth row (k = 3), and the same list upside down:

    >>> syn = {"swim": ["swim", "dive", "paddle", "sport"],
    ...        "exercise": ["exercise", "keeepfit", "yoga", "walking"]}
    >>> round(reval_ranked(["swim", "exercise"], ["sport"], lambda h: syn.get(h, [h])), 4)
    0.4307
    >>> round(reval_ranked(["exercise", "swim"], ["sport"], lambda h: syn.get(h, [h])), 4)
    0.2717
    >>> reval_ranked(["exercise", "swim"], ["sport"], lambda h: syn.get(h, [h]), FLAT)
    1.0
    """
    r, g = as_set(recommended), as_set(truth)
    if not r or not g:
        return None

    def ranks(h: str) -> dict[str, int]:
        found = {h: 0}
        for j, name in enumerate((s for s in synonyms(h) if s != h), start=1):
            found.setdefault(name, j)
        return found

    matrix = rank_matrix(r, g, ranks)
    # Every listed synonym is in Syn_k, so k is the largest synonym rank in the matrix.
    k = max((j for row in matrix for j in row if j < FAR), default=0)
    return ranked_by_k(matrix, len(g), [k], weights)[0]
