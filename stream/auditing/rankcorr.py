"""Top-rank-weighted rank correlations ρ_w and τ_w (paper 001, Lombardo et al., section 3).

Two rankings a and b of the same items (rank 1 = the top) are compared with Kendall's
general form Γ = Σ a_ij b_ij / sqrt(Σ a_ij² Σ b_ij²) (001's Eq. 7) where every pair of
items is weighted by sqrt(w_i w_j):

* ρ_w: a_ij = sqrt(w_i w_j) (a_j − a_i), which is a weighted Pearson correlation of the
  ranks (Eq. 8):  ρ_w = Σ w_i (a_i − ā)(b_i − b̄) / (σ_a σ_b),  ā = Σ w_i a_i,
  σ_a² = Σ w_i (a_i² − ā²);
* τ_w: a_ij = sqrt(w_i w_j) sign(a_j − a_i):  τ_w = Σ_{i≠j} w_i w_j sign(a_j − a_i)
  sign(b_j − b_i) / Z, with Z = 1 − Σ w_i² without ties.  With ties Z is Eq. 7's
  denominator, sqrt(Σ_{a_i≠a_j} w_i w_j · Σ_{b_i≠b_j} w_i w_j) (as Kendall's τ_b),
  so a ranking always correlates 1 with itself.

Weights (Eq. 9, the *additive* scheme): w_i = (f(a_i) + f(b_i)) / Σ_j (f(a_j) + f(b_j)),
with f(n) = 1 / (n + n0)², n0 = 2 (the paper's choice: the first rank carries R(2) ≈ 0.28
of the weight of an infinite ranking).  An item high in *either* ranking weighs, so a
model that puts a human top pair at the bottom is punished as much as the reverse.

Ties (items with the same score) get the average of the ranks they span, for the sign
terms, the rank values and f alike.  Scores, not ranks, go in: higher = more related.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

#: The paper's offset n0 of the weights f(n) = 1/(n + n0)².
N0 = 2.0

FloatArray = npt.NDArray[np.float64]


def top_weight(ranks: npt.ArrayLike, n0: float = N0) -> FloatArray:
    """f(n) = 1/(n + n0)² at each rank.

    >>> top_weight([1, 2, 3]).round(4).tolist()
    [0.1111, 0.0625, 0.04]
    """
    return 1.0 / (np.asarray(ranks, dtype=np.float64) + n0) ** 2


def descending_ranks(scores: npt.ArrayLike) -> FloatArray:
    """Rank 1 for the highest score; ties share the average of their ranks.

    >>> descending_ranks([0.2, 0.9, 0.5, 0.9]).tolist()
    [4.0, 1.5, 3.0, 1.5]
    """
    x = np.asarray(scores, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"scores must be one-dimensional, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("scores must be finite numbers")
    order = np.argsort(-x, kind="stable")
    sorted_x = x[order]
    ranks = np.empty(len(x))
    start = 0
    for end in range(1, len(x) + 1):
        if end == len(x) or sorted_x[end] != sorted_x[start]:
            ranks[order[start:end]] = (start + 1 + end) / 2.0
            start = end
    return ranks


def pair_weights(a: FloatArray, b: FloatArray, n0: float = N0) -> FloatArray:
    """001's Eq. 9: w_i = (f(a_i) + f(b_i)) / Σ_j (f(a_j) + f(b_j)).

    >>> pair_weights(np.array([1.0, 2.0]), np.array([2.0, 1.0])).tolist()
    [0.5, 0.5]
    """
    w = top_weight(a, n0) + top_weight(b, n0)
    weights: npt.NDArray[np.float64] = w / w.sum()
    return weights


def _ranks(x: npt.ArrayLike, y: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
    a, b = descending_ranks(x), descending_ranks(y)
    if len(a) != len(b):
        raise ValueError(f"the two rankings have {len(a)} and {len(b)} items")
    if len(a) < 2:
        raise ValueError("a correlation needs at least two items")
    return a, b


def rho_w(x: npt.ArrayLike, y: npt.ArrayLike, n0: float = N0) -> float:
    """Weighted Spearman ρ_w of two score vectors (NaN when either ranking is constant).

    >>> rho_w([3, 2, 1], [3, 2, 1]), rho_w([3, 2, 1], [1, 2, 3])
    (1.0, -1.0)
    >>> round(rho_w([4, 3, 2, 1], [3, 4, 2, 1]), 4)  # the top two swapped
    0.6347
    >>> round(rho_w([4, 3, 2, 1], [4, 3, 1, 2]), 4)  # the bottom two swapped: costs less
    0.879
    """
    a, b = _ranks(x, y)
    w = pair_weights(a, b, n0)
    a_bar, b_bar = w @ a, w @ b
    var_a, var_b = w @ (a - a_bar) ** 2, w @ (b - b_bar) ** 2
    if var_a <= 0 or var_b <= 0:
        return float("nan")
    return float(w @ ((a - a_bar) * (b - b_bar)) / np.sqrt(var_a * var_b))


def tau_w(x: npt.ArrayLike, y: npt.ArrayLike, n0: float = N0) -> float:
    """Weighted Kendall τ_w of two score vectors (NaN when either ranking is constant).

    >>> tau_w([3, 2, 1], [3, 2, 1]), tau_w([3, 2, 1], [1, 2, 3])
    (1.0, -1.0)
    >>> round(tau_w([4, 3, 2, 1], [3, 4, 2, 1]), 4)  # one discordant pair, at the top
    0.2617
    >>> round(tau_w([4, 3, 2, 1], [4, 3, 1, 2]), 4)  # one discordant pair, at the bottom
    0.8843
    """
    a, b = _ranks(x, y)
    w = pair_weights(a, b, n0)
    ww = np.outer(w, w)
    sa = np.sign(a[None, :] - a[:, None])
    sb = np.sign(b[None, :] - b[:, None])
    za, zb = (ww * (sa != 0)).sum(), (ww * (sb != 0)).sum()
    if za <= 0 or zb <= 0:
        return float("nan")
    return float((ww * sa * sb).sum() / np.sqrt(za * zb))


def bootstrap_interval(
    values: Sequence[float], level: float = 0.95, estimate: float | None = None
) -> tuple[float | None, float | None]:
    """The percentile interval of bootstrap replicates (NaN replicates left out); given the
    ``estimate``, the *bias-corrected* percentile interval (Efron 1981): the percentiles at
    Φ(2 z0 ± z_(1+level)/2) with z0 = Φ⁻¹(share of replicates below the estimate).  Resampling
    votes with replacement loses comparisons and pulls a rank correlation's replicates down;
    the correction keeps the interval around the estimate.

    >>> [round(x, 4) for x in bootstrap_interval([0.1, 0.2, 0.3, float("nan")], level=0.5)]
    [0.15, 0.25]
    >>> low, high = bootstrap_interval(np.linspace(0.0, 0.6, 101), estimate=0.55)
    >>> round(low, 3), round(high, 3), low <= 0.55 <= high
    (0.461, 0.6, True)
    """
    finite = np.asarray([v for v in values if np.isfinite(v)], dtype=np.float64)
    if not len(finite):
        return None, None
    tails = np.array([(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    if estimate is not None and np.isfinite(estimate):
        normal = NormalDist()
        below = (np.sum(finite < estimate) + 0.5 * np.sum(finite == estimate)) / len(finite)
        z0 = normal.inv_cdf(min(max(below, 0.5 / len(finite)), 1.0 - 0.5 / len(finite)))
        tails = np.array([normal.cdf(2.0 * z0 + normal.inv_cdf(t)) for t in tails])
    low, high = np.percentile(finite, 100.0 * tails)
    return float(low), float(high)
