"""Did a hashtag change meaning between two periods?  A two-sample test of its tweets' mean
that knows the hashtag's own spread, from the running sums the store already keeps.

A hashtag's tweets in a period are unit-length embeddings x_1..x_n (the encoder pools and
normalises every tweet), so their count n and sum s give, besides the mean m = s / n, their
spread: the trace of their covariance is ``E||x - m||^2 = 1 - ||m||^2``, unbiasedly
``v = n (1 - ||m||^2) / (n - 1)``.  No sum of squares is needed -- the sums of the window
means are sufficient -- so the index job tests every hashtag without re-reading a tweet.

Between a period before (n1, m1, v1) and a recent one (n2, m2, v2), the squared distance of
the means ``D2 = ||m1 - m2||^2`` has, when nothing changed, the expectation
``noise = v1 / n1 + v2 / n2`` (the high-dimensional two-sample statistic of Bai & Saranadasa,
1996, whose numerator is ``D2 - noise``).  So:

* **effect** -- the bias-corrected shift of the mean in units of the hashtag's own spread,
  ``sqrt(max(D2 - noise, 0) / v_pooled)``: 0 when the means differ no more than their noise,
  about 1.4 when the two periods' tweets are as far apart as two random tweets of either.  A
  generic hashtag (#love, #breaking) is spread wide, so the same move of its mean is a small
  effect; a focused hashtag whose mean moves has taken a new sense.
* an approximate 95% **interval** of the effect from the variance of D2 under the null
  law's scaled chi-square (below).  Movers are ranked by its **lower end** (:func:`mover_key`),
  the shift the hashtag's own tweets make sure of: the effect of a hashtag with 5 tweets a side
  is a noisy estimate that the point value would rank as high as a certain one.
* **p** -- how surprising ``D2 / noise`` is when nothing changed.  Its null law is a weighted
  sum of chi-squares over the embedding's directions, approximated by ``chi2_k / k`` with
  ``k`` the effective dimension of a hashtag's tweet covariance (Satterthwaite's
  approximation); a small ``k`` is the conservative choice (heavier tail), so the default is
  :data:`DEFAULT_EFFECTIVE_DIM`.  The chi-square tail uses the Wilson-Hilferty cube-root
  normal approximation (stdlib only).

``significant`` counts the hashtags whose shift survives the Benjamini-Hochberg procedure at
false-discovery rate ``fdr`` over all hashtags compared: the number a gauge can carry.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> def tweets(centre, n):
...     x = centre + 0.3 * rng.normal(size=(n, 16))
...     return x / np.linalg.norm(x, axis=1, keepdims=True)
>>> a, b = np.eye(16)[0], np.eye(16)[1]
>>> before = [tweets(a, 40), tweets(a, 40)]           # hijacked: a then b; stable: a then a
>>> after = [tweets(b, 40), tweets(a, 40)]
>>> t = shift_test([40, 40], np.array([x.sum(0) for x in before]),
...                [40, 40], np.array([x.sum(0) for x in after]))
>>> t.effect.round(1).tolist(), (t.p < 0.001).tolist()
([1.2, 0.1], [True, False])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

#: Effective dimension of a hashtag's tweet covariance assumed by the null law of the test
#: (smaller = heavier tail = fewer false alarms).  Tweet embeddings are anisotropic; 10 is
#: below what a hashtag's tweet covariance shows on the sample feed (14-46, MiniLM:
#: ``python -m bench.bench_hijack``).
DEFAULT_EFFECTIVE_DIM = 10.0
#: False-discovery rate of the count of significantly shifted hashtags.
DEFAULT_FDR = 0.01
#: The smallest spread taken (a hashtag whose tweets are all one text has none).
_MIN_SPREAD = 1e-6

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class ShiftTest:
    """Per hashtag (aligned with the inputs): the effect, its interval, the p-value, and
    whether it is a discovery at the procedure's false-discovery rate."""

    effect: Floats
    effect_low: Floats
    effect_high: Floats
    p: Floats
    discovered: npt.NDArray[np.bool_]

    @property
    def significant(self) -> int:
        return int(self.discovered.sum())


def mover_key(effect: float, effect_low: float, hashtag: str) -> tuple[float, float, str]:
    """How movers are ranked (first = smallest key): the lower end of the effect's interval,
    then the effect, then the name.  Ranking by the lower end puts a hashtag whose few tweets
    might have moved below one whose many tweets surely did (``python -m bench.bench_hijack``:
    hijacked probes of 60 and 200 tweets a side all rank in the top 10%, against 4 of 5 by the
    point effect).  Values equal up to float noise tie.

    >>> sorted(["few", "many"], key=lambda h: mover_key(*{"few": (0.9, 0.1), "many": (0.6, 0.5)}[h], h))
    ['many', 'few']
    """
    return (-round(effect_low, 9), -round(effect, 9), hashtag)


def chi2_sf(x: Floats, k: float) -> Floats:
    """Upper tail of chi-square with ``k`` degrees of freedom at ``x`` (Wilson-Hilferty).

    >>> chi2_sf(np.array([10.0, 18.307]), 10.0).round(3).tolist()   # exact: 0.440, 0.050
    [0.441, 0.05]
    """
    c = 2.0 / (9.0 * k)
    z = (np.cbrt(np.maximum(x, 0.0) / k) - (1.0 - c)) / math.sqrt(c)
    return np.array([0.5 * math.erfc(v / math.sqrt(2.0)) for v in z.tolist()], dtype=np.float64)


def benjamini_hochberg(p: Floats, fdr: float) -> npt.NDArray[np.bool_]:
    """Which of ``p`` are discoveries at false-discovery rate ``fdr``.

    >>> benjamini_hochberg(np.array([0.001, 0.02, 0.03, 0.5]), 0.05).tolist()
    [True, True, True, False]
    """
    n = len(p)
    found = np.zeros(n, dtype=bool)
    if not n:
        return found
    order = np.argsort(p, kind="stable")
    below = p[order] <= fdr * np.arange(1, n + 1) / n
    if below.any():
        found[order[: int(np.flatnonzero(below)[-1]) + 1]] = True
    return found


def shift_test(
    counts_before: Sequence[int] | npt.NDArray[np.int64],
    sums_before: Floats,
    counts_recent: Sequence[int] | npt.NDArray[np.int64],
    sums_recent: Floats,
    *,
    effective_dim: float = DEFAULT_EFFECTIVE_DIM,
    fdr: float = DEFAULT_FDR,
) -> ShiftTest:
    """The test for every row: counts (each >= 2) and sums of unit-length tweet embeddings
    of the period before and the recent one."""
    if effective_dim <= 0:
        raise ValueError(f"effective_dim must be positive, got {effective_dim!r}")
    n1 = np.asarray(counts_before, dtype=np.float64)
    n2 = np.asarray(counts_recent, dtype=np.float64)
    if len(n1) and (n1.min() < 2 or n2.min() < 2):
        raise ValueError("every hashtag needs at least 2 tweets on each side")
    m1 = np.asarray(sums_before, dtype=np.float64) / n1[:, None]
    m2 = np.asarray(sums_recent, dtype=np.float64) / n2[:, None]
    v1 = np.maximum(n1 * (1.0 - np.einsum("ij,ij->i", m1, m1)) / (n1 - 1.0), _MIN_SPREAD)
    v2 = np.maximum(n2 * (1.0 - np.einsum("ij,ij->i", m2, m2)) / (n2 - 1.0), _MIN_SPREAD)
    delta = m1 - m2
    d2 = np.einsum("ij,ij->i", delta, delta)
    noise = v1 / n1 + v2 / n2
    pooled = ((n1 - 1.0) * v1 + (n2 - 1.0) * v2) / (n1 + n2 - 2.0)
    excess = d2 - noise
    # D2 / noise ~ chi2_k(lambda) / k; its variance, 2 (k + 2 lambda) / k^2, in D2's units
    sd = noise * np.sqrt(2.0 / effective_dim + 4.0 * np.maximum(excess, 0.0) / (noise * effective_dim))
    effect = np.sqrt(np.maximum(excess, 0.0) / pooled)
    low = np.sqrt(np.maximum(excess - 1.96 * sd, 0.0) / pooled)
    high = np.sqrt(np.maximum(excess + 1.96 * sd, 0.0) / pooled)
    p = chi2_sf(effective_dim * d2 / noise, effective_dim)
    return ShiftTest(effect, low, high, p, benjamini_hochberg(p, fdr))


def effective_dimension(samples: Floats) -> float | None:
    """``tr(S)^2 / tr(S^2)`` of the sample covariance of ``samples`` (rows): how many
    directions the spread really has (the dimension when isotropic, 1 when along a line).
    None with fewer than 3 rows.

    >>> rng = np.random.default_rng(1)
    >>> round(effective_dimension(rng.normal(size=(4000, 8))), 1)
    8.0
    """
    if len(samples) < 3:
        return None
    x = np.asarray(samples, dtype=np.float64)
    x = x - x.mean(axis=0)
    gram = x @ x.T
    trace = float(np.trace(gram))
    return trace * trace / float(np.sum(gram * gram)) if trace > 0 else None


__all__ = [
    "DEFAULT_EFFECTIVE_DIM",
    "DEFAULT_FDR",
    "ShiftTest",
    "benjamini_hochberg",
    "chi2_sf",
    "effective_dimension",
    "mover_key",
    "shift_test",
]
