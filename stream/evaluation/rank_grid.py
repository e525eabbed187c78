"""A batch's rank matrices and every quantity the per-event signals read from them, in numpy
passes over the whole batch (:class:`RankGrid`).

The matrix of event b holds the synonym rank of each ground truth (column) among each
recommended hashtag's synonyms (row, in list order, duplicates dropped):
:meth:`stream.evaluation.neighbours.NeighbourCache.matrices`.  Events are padded with
:data:`~stream.evaluation.metrics.FAR` to the batch's largest |R| x |G|.  A cut-off r keeps the first
``m = min(|R|, r)`` rows of each event; every method takes that ``m`` (one per event) and
answers every k of the grid at once (|B| x K).

The values are the definitional functions' to the last bit (:func:`stream.evaluation.metrics.reval_by_k`,
:func:`stream.evaluation.rank.ranked_by_k`, :func:`stream.evaluation.metrics.exact_from_counts`,
...): ratios of the
same integers, and sums added in the order those functions add them (a running sum, never
numpy's pairwise ``sum``).  ``tests/oracle.py`` holds those one-event definitions and the tests
compare.

>>> far = FAR
>>> grid = RankGrid(np.array([[[3, 0], [far, 7]]]), np.array([2]), np.array([2]), [0, 5], FLAT)
>>> m = np.array([2])
>>> grid.reval(m).tolist(), grid.precision(m).tolist(), grid.reciprocal_rank(m).tolist()
([[0.5, 0.5]], [[0.5, 0.5]], [[1.0, 1.0]])
>>> grid.reciprocal_rank(np.array([1])).tolist(), grid.exact(m).tolist()
([[1.0, 1.0]], [[1.0, 0.5, 0.5, 0.5, 0.5]])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stream.evaluation.metrics import FAR, ExactScores
from stream.evaluation.rank import FLAT, RankWeights

__all__ = ["FLAT", "RankGrid"]

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Flags = npt.NDArray[np.bool_]


class RankGrid:
    """A batch's rank matrices (|B| x max|R| x max|G|, FAR-padded), the number of recommended
    and true hashtags of each event, and what every r and k of every signal reads from them,
    computed once for the batch."""

    def __init__(
        self, matrix: Ints, n_rec: Ints, n_truth: Ints, ks: Sequence[int], weights: RankWeights
    ) -> None:
        self.matrix = matrix
        self.batch = np.arange(matrix.shape[0])
        self.n_rec = n_rec
        self.n_truth = n_truth
        self.weights = weights
        #: Each k, capped below FAR: a k beyond every real rank means every synonym.
        self.caps = np.array([min(k, FAR - 1) for k in ks], dtype=np.int64)
        #: The smallest rank of each row, and of each column over rows 0..i (Eq. 4's units).
        self.row_min = matrix.min(axis=2)
        self.col_min = np.minimum.accumulate(matrix, axis=1)
        #: Whether each row reaches G within each k (B x R x K), and how many of rows 0..i do.
        self.row_reaches = self.row_min[:, :, None] <= self.caps
        self.row_hits = np.cumsum(self.row_reaches, axis=1)
        #: Exact matches in rows 0..i.
        self.zeros = np.cumsum((matrix == 0).sum(axis=2), axis=1)
        self._credit: Floats | None = None
        self._units: tuple[Floats, Floats] | None = None

    def rows(self, r: int | None) -> Ints:
        """How many rows each event's top r has: ``len(matrix[:r])`` (None: every row)."""
        return self.n_rec if r is None else np.minimum(self.n_rec, r)

    def reval(self, m: Ints) -> Floats:
        """Eq. 4 at each k on the first ``m`` rows: rows that reach G when |R| <= |G|, else
        columns that the rows reach, over min(|R|, |G|)."""
        last = m - 1
        by_rows = self.row_hits[self.batch, last]
        by_columns = (self.col_min[self.batch, last][:, :, None] <= self.caps).sum(axis=1)
        count = np.where((m <= self.n_truth)[:, None], by_rows, by_columns)
        values: Floats = count / np.minimum(m, self.n_truth)[:, None]
        return values

    def precision(self, m: Ints) -> Floats:
        """#REval's precision form (:func:`stream.evaluation.metrics.reval_precision_by_k`): the rows
        within k over the rows."""
        values: Floats = self.row_hits[self.batch, m - 1] / m[:, None]
        return values

    def reciprocal_rank(self, m: Ints) -> Floats:
        """1 / i for the first of the first ``m`` rows whose synonyms within k reach G (i from
        1, in list order), 0 where none does."""
        n_r = self.matrix.shape[1]
        inside = np.arange(n_r)[None, :, None] < m[:, None, None]
        reaches = self.row_reaches & inside
        first = reaches.argmax(axis=1)
        values: Floats = np.where(reaches.any(axis=1), 1.0 / (first + 1), 0.0)
        return values

    def exact(self, m: Ints) -> Floats:
        """The exact-match metrics (|B| x 5, :attr:`stream.evaluation.metrics.ExactScores.NAMES`) of the
        first ``m`` rows: :func:`stream.evaluation.metrics.exact_from_counts` of their zeros."""
        hits = self.zeros[self.batch, m - 1].astype(np.float64)
        precision = hits / m
        recall = hits / self.n_truth
        with np.errstate(divide="ignore", invalid="ignore"):
            f1 = np.where(hits > 0, 2 * precision * recall / (precision + recall), 0.0)
        out = np.empty((len(m), len(ExactScores.NAMES)))
        out[:, 0] = hits > 0
        out[:, 1] = precision
        out[:, 2] = recall
        out[:, 3] = f1
        out[:, 4] = hits / np.minimum(m, self.n_truth)
        return out

    def _credits(self) -> Floats:
        """The rank-aware credit of each link, w_rec(i) * w_syn(j), within each k (0 past it):
        B x R x G x K, made on first use."""
        if self._credit is None:
            matrix, weights = self.matrix, self.weights
            n_r, n_g = matrix.shape[1:]
            reachable = matrix[matrix <= self.caps.max(initial=0)]
            top = int(reachable.max()) if reachable.size else 0
            syn = np.array([*weights.syn_table(top + 1)[: top + 1], 0.0])
            rec = np.array(weights.rec_table(max(n_r, n_g))[: max(n_r, n_g)])
            credit = rec[None, :n_r, None] * syn[np.minimum(matrix, top + 1)]
            self._credit = np.where(matrix[..., None] <= self.caps, credit[..., None], 0.0)
        return self._credit

    def _ranked_units(self) -> tuple[Floats, Floats]:
        """For every m at once: the running sum over rows of each row's best link (B x R x K,
        added row after row as ``ranked_by_k`` adds them: 0 + the first + ...), and each
        column's best link over rows 0..i (B x R x G x K; credits are >= 0, so rows past m
        would add nothing)."""
        if self._units is None:
            credit = self._credits()
            self._units = (np.cumsum(credit.max(axis=2), axis=1), np.maximum.accumulate(credit, axis=1))
        return self._units

    def ranked(self, m: Ints) -> Floats:
        """:func:`stream.evaluation.rank.ranked_by_k` at each k on the first ``m`` rows."""
        n_b, n_r, n_g = self.matrix.shape
        n_rec_table = max(n_r, n_g)
        rec = np.array(self.weights.rec_table(n_rec_table)[:n_rec_table])
        ideal = self.weights.rec_table(n_rec_table)
        # sum(w_rec(1..n)) for each n, added as ranked_by_k adds them.
        ideal_total = np.array([sum(ideal[:n]) if n else 1.0 for n in range(n_rec_table + 1)])
        row_sums, column_best = self._ranked_units()
        # Units are rows (|R| <= |G|): the sum of the first m rows' best links.
        by_rows = row_sums[self.batch, m - 1]
        # Units are columns: each column's best link in the first m rows, best first, capped by
        # the ideal list's credit at that place; summed place after place (past |G|: zeros,
        # adding nothing).
        best = -np.sort(-column_best[self.batch, m - 1], axis=1)
        np.minimum(best, rec[None, :n_g, None], out=best)
        by_columns = np.zeros((n_b, len(self.caps)))
        for t in range(n_g):
            by_columns += np.where((t < self.n_truth)[:, None], best[:, t], 0.0)
        total = np.where((m <= self.n_truth)[:, None], by_rows, by_columns)
        ranked: Floats = total / ideal_total[np.minimum(m, self.n_truth)][:, None]
        return ranked

    def slice(self, cols: Flags) -> SliceUnits:
        """What :meth:`slice_reval` reads of one slice whose ground truths are the columns
        ``cols`` (|B| x max|G| flags), for every cut-off r at once."""
        row_min = np.where(cols[:, None, :], self.matrix, FAR).min(axis=2)
        return SliceUnits(cols, cols.sum(axis=1), np.cumsum(row_min[:, :, None] <= self.caps, axis=1))

    def slice_reval(self, m: Ints, units: SliceUnits, whole: Floats) -> Floats:
        """:func:`stream.evaluation.slices.slice_scores` of one slice (:meth:`slice`): Eq. 4 on
        its columns (|B| x K; rows of events without a ground truth in the slice are not
        used); ``whole`` is Eq. 4 on all of G."""
        last = m - 1
        n_s = units.n_truth
        columns = np.where(units.cols, self.col_min[self.batch, last], FAR)
        by_columns = (columns[:, :, None] <= self.caps).sum(axis=1)
        by_rows = units.row_hits[self.batch, last]
        rows_are_units = m <= n_s
        count = np.where(rows_are_units[:, None], by_rows, by_columns)
        with np.errstate(divide="ignore", invalid="ignore"):
            values = count / np.where(rows_are_units, m, n_s)[:, None]
        out: Floats = np.where((n_s == self.n_truth)[:, None], whole, values)
        return out


@dataclass(frozen=True)
class SliceUnits:
    """One slice's ground-truth columns of a :class:`RankGrid` (|B| x max|G| flags), how many
    each event has, and how many of rows 0..i reach them within each k (B x R x K)."""

    cols: Flags
    n_truth: Ints
    row_hits: Ints
