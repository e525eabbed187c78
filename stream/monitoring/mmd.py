"""Did the tweets themselves change?  A kernel two-sample test on tweet embeddings.

The maximum mean discrepancy (Gretton et al., 2012) between a *reference* sample of tweet
embeddings and a *recent* one, with a Gaussian kernel whose bandwidth is the median
pairwise distance of the pooled sample, and a permutation p-value: the share of random
relabellings of the pooled sample whose MMD is at least the observed one.  Under "same
distribution" the p-value is uniform, so ``p <= alpha`` raises a false alarm in a share
``alpha`` of the tests -- a calibration ``tests/test_mmd.py`` checks.  Samples are
bounded (``max_samples`` each, drawn at random), so a test costs the same on any feed.

It watches the input: a recommender that drifts while the tweets do not is invisible to
it (that is what #REval's alerts are for), and a feed whose topics change is seen by it
even when every recommender keeps up.

>>> rng = np.random.default_rng(0)
>>> same = mmd_test(rng.normal(size=(80, 4)), rng.normal(size=(80, 4)), seed=1)
>>> shifted = mmd_test(rng.normal(size=(80, 4)), rng.normal(size=(80, 4)) + 1.0, seed=1)
>>> same.p_value > 0.05, shifted.p_value < 0.01
(True, True)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["MmdResult", "mmd_test"]

DEFAULT_PERMUTATIONS = 200
DEFAULT_MAX_SAMPLES = 400


@dataclass(frozen=True)
class MmdResult:
    """The unbiased MMD² estimate, its permutation p-value, the sample sizes and the
    kernel's squared bandwidth."""

    statistic: float
    p_value: float
    n_reference: int
    n_recent: int
    bandwidth2: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sample(x: npt.ArrayLike, size: int, rng: np.random.Generator) -> npt.NDArray[np.float64]:
    rows = np.asarray(x, dtype=np.float64)
    if rows.ndim != 2:
        raise ValueError(f"expected a 2-d array of embeddings, got shape {rows.shape}")
    if len(rows) > size:
        rows = rows[rng.choice(len(rows), size=size, replace=False)]
    return rows


def mmd_test(
    reference: npt.ArrayLike,
    recent: npt.ArrayLike,
    *,
    permutations: int = DEFAULT_PERMUTATIONS,
    max_samples: int = DEFAULT_MAX_SAMPLES,
    seed: int = 0,
) -> MmdResult:
    """Two-sample test of ``reference`` against ``recent`` (rows are embeddings)."""
    if permutations < 1:
        raise ValueError(f"permutations must be at least 1, got {permutations}")
    rng = np.random.default_rng(seed)
    x, y = _sample(reference, max_samples, rng), _sample(recent, max_samples, rng)
    n, m = len(x), len(y)
    if n < 2 or m < 2:
        raise ValueError(f"each sample needs at least 2 embeddings, got {n} and {m}")
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"embeddings of different dimensions: {x.shape[1]} and {y.shape[1]}")
    z = np.vstack([x, y])
    sq = np.einsum("ij,ij->i", z, z)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (z @ z.T), 0.0)
    bandwidth2 = float(np.median(d2[np.triu_indices(n + m, 1)])) or 1.0
    kernel = np.exp(-d2 / bandwidth2)
    np.fill_diagonal(kernel, 0.0)  # the unbiased estimate leaves out the i = j terms

    def statistic(members: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """MMD² for each row of ``members`` (1 = in the reference sample, 0 = recent)."""
        others = 1.0 - members
        k_members = members @ kernel
        within_x = np.einsum("pn,pn->p", k_members, members)
        within_y = np.einsum("pn,pn->p", others @ kernel, others)
        across = np.einsum("pn,pn->p", k_members, others)
        mmd2: npt.NDArray[np.float64] = (
            within_x / (n * (n - 1)) + within_y / (m * (m - 1)) - 2.0 * across / (n * m)
        )
        return mmd2

    observed = statistic(np.concatenate([np.ones(n), np.zeros(m)])[None, :])[0]
    relabelled = np.zeros((permutations, n + m))
    for row in relabelled:
        row[rng.permutation(n + m)[:n]] = 1.0
    exceed = int(np.count_nonzero(statistic(relabelled) >= observed - 1e-15))
    return MmdResult(float(observed), (1 + exceed) / (1 + permutations), n, m, bandwidth2)
