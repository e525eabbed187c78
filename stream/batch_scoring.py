"""Scoring a batch of events at once, in numpy: :func:`score_events`, the same results as
:func:`stream.scoring.score_event` for each event to the last bit -- what the score worker runs
on each batch it takes from Kafka.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from stream.chance import MIN_ROOM, ChanceModel
from stream.metrics import (
    FAR,
    ExactScores,
    exact_from_counts,
)
from stream.rank import DCG, RankWeights
from stream.records import Recommendation
from stream.scoring import ALL, DEFAULT_KS, EventScore, NeighbourCache, Ranks, r_label, score_event, str_keys
from stream.slices import SLICES, Bands


def score_events(
    events: Sequence[tuple[Recommendation, Sequence[str]]],
    cache: NeighbourCache,
    ks: Sequence[int] = DEFAULT_KS,
    rs: Sequence[int | None] = (ALL,),
    weights: RankWeights = DCG,
) -> list[EventScore]:
    """:func:`score_event` for each ``(event, truth)`` of a batch, with the same results to the
    last bit, computed for the whole batch at once: one array of rank matrices (one gather of
    the recommended hashtags' neighbour rows, :meth:`NeighbourCache.matrices`), every (r, k)
    cell of every signal -- Eq. 4, exact matches, the rank-aware score, the slices, the
    chance correction (its expectations asked together,
    :meth:`stream.chance.ChanceModel.expected_many`) -- in numpy passes over the batch
    (:class:`_Grid`), then one :class:`EventScore` per event.

    The same floats, not merely close ones: ratios of the same integers; the rank-aware sums
    added in the order :func:`stream.rank.ranked_by_k` adds them (a running sum over the
    units, never numpy's pairwise ``sum``; Python 3.11's ``sum`` of floats adds in order);
    ``tests/test_scoring.py`` compares the two paths on random batches.  Events are padded to
    the batch's largest |R| x |G| within groups of similar sizes (:func:`_shape_group`), so one
    event of 100 hashtags does not make every other one cost as much.
    """
    out: list[EventScore | None] = [None] * len(events)
    ks = list(dict.fromkeys(ks))  # a k twice is one key of the scores' dicts
    groups: dict[tuple[int, int], list[tuple[int, list[str], list[str]]]] = {}
    for b, (event, truth) in enumerate(events):
        recommended = list(dict.fromkeys(event.recommended))
        distinct = list(dict.fromkeys(truth))
        if not recommended or not distinct or not ks or not rs:  # unscorable, or no grid
            out[b] = score_event(event, truth, cache, ks, rs, weights)
            continue
        shape = (_shape_group(len(recommended)), _shape_group(len(distinct)))
        groups.setdefault(shape, []).append((b, recommended, distinct))
    for members in groups.values():
        batch = [b for b, _, _ in members]
        recs = [rec for _, rec, _ in members]
        truths = [truth for _, _, truth in members]
        scored = _score_group([events[b][0] for b in batch], recs, truths, cache, ks, rs, weights)
        for b, score in zip(batch, scored, strict=True):
            out[b] = score
    return out  # type: ignore[return-value]


def _shape_group(n: int) -> int:
    """The group of a list of ``n`` hashtags in the batch path: lists up to 16 long are one
    group (the usual event), longer ones go by the next power of two.

    >>> [_shape_group(n) for n in (1, 10, 16, 17, 100)]
    [16, 16, 16, 32, 128]
    """
    return max(16, 1 << (n - 1).bit_length())


def _score_group(
    events: Sequence[Recommendation],
    recs: Sequence[list[str]],
    truths: Sequence[list[str]],
    cache: NeighbourCache,
    ks: Sequence[int],
    rs: Sequence[int | None],
    weights: RankWeights,
) -> list[EventScore]:
    """:func:`score_events` of scorable events (de-duplicated R and G, both non-empty)."""
    grid = _Grid(cache.matrices(recs, truths), recs, truths, ks, weights)
    expected = _expectations(cache.chance, grid, truths, ks, rs)
    slice_columns = grid.slice_columns(cache.bands) if cache.bands is not None else None
    by_rows: dict[bytes, _Lists] = {}  # one set per distinct row count, shared by its r labels
    labels = []
    for r in rs:
        m = grid.rows(r)
        key = m.tobytes()
        if key not in by_rows:
            by_rows[key] = grid.lists(m, expected.get(key), slice_columns)
        labels.append((r_label(r), by_rows[key]))
    version = cache.version
    known = cache.known
    keys = str_keys(dict.fromkeys(ks, 0.0)).keys()  # the k as JSON keys, in order
    out = []
    for i, event in enumerate(events):
        score = EventScore(
            tweet_id=event.tweet_id,
            recommender=event.recommender,
            thesaurus_version=version,
            n_recommended=len(recs[i]),
            unknown_recommended=sum(1 for h in recs[i] if not known(h)),
            json_cells={name: {} for name in _JSON_CELLS},
        )
        # The score's cells are filled in place (its dicts are its own, made empty above).
        cells = cast(dict[str, dict[str, Any]], score.json_cells)
        for label, found in labels:
            values = found.observed[i]
            score.reval[label] = dict(zip(ks, values, strict=True))
            cells["reval_hit_ratio"][label] = dict(zip(keys, values, strict=True))
            if found.expected is not None and found.corrected is not None:
                values = found.expected[i]
                score.expected[label] = dict(zip(ks, values, strict=True))
                cells["reval_hit_ratio_expected"][label] = dict(zip(keys, values, strict=True))
                cells["reval_hit_ratio_corrected"][label] = dict(zip(keys, found.corrected[i], strict=True))
            score.exact[label] = found.exact[i]
            cells["exact"][label] = _exact_json(found.exact[i])
            values = found.precision[i]
            score.precision[label] = dict(zip(ks, values, strict=True))
            cells["reval_hit_ratio_precision"][label] = dict(zip(keys, values, strict=True))
            values = found.ranked[i]
            score.ranked[label] = dict(zip(ks, values, strict=True))
            cells["reval_hit_ratio_ranked"][label] = dict(zip(keys, values, strict=True))
            if found.slices is not None:
                score.slices[label] = {
                    name: dict(zip(ks, values, strict=True)) for name, values in found.slices[i]
                }
                cells["reval_hit_ratio_slices"][label] = {
                    name: dict(zip(keys, values, strict=True)) for name, values in found.slices[i]
                }
        out.append(score)
    return out


#: The score cells of :meth:`EventScore.to_json` that the batch path makes beside the fields.
_JSON_CELLS = (
    "reval_hit_ratio",
    "reval_hit_ratio_corrected",
    "exact",
    "reval_hit_ratio_ranked",
    "reval_hit_ratio_slices",
    "reval_hit_ratio_expected",
    "reval_hit_ratio_precision",
)


@lru_cache(maxsize=4096)
def _exact_json(scores: ExactScores) -> dict[str, float]:
    """``scores.as_dict()``, one per distinct scores (shared by the outputs: never modified)."""
    return scores.as_dict()


def _expectations(
    chance: ChanceModel | None,
    grid: _Grid,
    truths: Sequence[Sequence[str]],
    ks: Sequence[int],
    rs: Sequence[int | None],
) -> dict[bytes, npt.NDArray[np.float64]]:
    """The null model's expectations for each distinct row count of ``rs`` (|B| x |ks| each),
    asked of :meth:`~stream.chance.ChanceModel.expected_many` at once for the batch."""
    if chance is None:
        return {}
    keys: dict[bytes, npt.NDArray[np.int64]] = {}
    for r in rs:
        m = grid.rows(r)
        keys.setdefault(m.tobytes(), m)
    requests = [(int(m[i]), truth) for m in keys.values() for i, truth in enumerate(truths)]
    values = np.array(chance.expected_many(requests, ks), dtype=np.float64)
    return dict(zip(keys, values.reshape(len(keys), len(truths), -1), strict=True))


@dataclass
class _Lists:
    """The cells of one row count (the top r of each event), as the lists an
    :class:`EventScore` holds, one per event."""

    observed: list[list[float]]
    #: The null model's expectations, and the one-event corrected scores made of them
    #: (:attr:`EventScore.corrected`: None where no room); both None without a null model.
    expected: list[list[float]] | None
    corrected: list[list[float | None]] | None
    exact: list[ExactScores]
    ranked: list[list[float]]
    slices: list[list[tuple[str, list[float]]]] | None
    precision: list[list[float]]


class _Grid:
    """A batch's rank matrices (|B| x max|R| x max|G|, FAR-padded) and what every r and k of
    every signal reads from them, computed once for the batch."""

    def __init__(
        self,
        matrix: Ranks,
        recs: Sequence[Sequence[str]],
        truths: Sequence[Sequence[str]],
        ks: Sequence[int],
        weights: RankWeights,
    ) -> None:
        self.matrix = matrix
        self.truths = truths
        n_b, n_r, n_g = matrix.shape
        self.batch = np.arange(n_b)
        self.n_rec = np.fromiter(map(len, recs), np.int64, n_b)
        self.n_truth = np.fromiter(map(len, truths), np.int64, n_b)
        #: Each k, capped below FAR: a k beyond every real rank means every synonym.
        self.caps = np.array([min(k, FAR - 1) for k in ks], dtype=np.int64)
        #: The smallest rank of each row, and of each column over rows 0..i (Eq. 4's units).
        self.row_min = matrix.min(axis=2)
        self.col_min = np.minimum.accumulate(matrix, axis=1)
        #: Rows 0..i whose smallest rank is within each k; exact matches in rows 0..i.
        self.row_hits = np.cumsum(self.row_min[:, :, None] <= self.caps, axis=1)
        self.zeros = np.cumsum((matrix == 0).sum(axis=2), axis=1)
        # The rank-aware credit of each link, w_rec(i) * w_syn(j) (0 past the largest k), and
        # whether it is within each k: B x R x G x K.
        reachable = matrix[matrix <= self.caps.max()]
        top = int(reachable.max()) if reachable.size else 0
        syn = np.array([*weights.syn_table(top + 1)[: top + 1], 0.0])
        rec = np.array(weights.rec_table(max(n_r, n_g))[: max(n_r, n_g)])
        self.rec = rec
        credit = rec[None, :n_r, None] * syn[np.minimum(matrix, top + 1)]
        self.credit = np.where(matrix[..., None] <= self.caps, credit[..., None], 0.0)
        ideal = weights.rec_table(max(n_r, n_g))
        #: sum(w_rec(1..n)) for each n, added as :func:`stream.rank.ranked_by_k` adds them.
        self.ideal_total = np.array([sum(ideal[:n]) if n else 1.0 for n in range(max(n_r, n_g) + 1)])

    def rows(self, r: int | None) -> npt.NDArray[np.int64]:
        """How many rows each event's top r has: ``len(matrix[:r])``."""
        return self.n_rec if r is None else np.minimum(self.n_rec, r)

    def lists(
        self,
        m: npt.NDArray[np.int64],
        expected: npt.NDArray[np.float64] | None,
        slice_columns: list[tuple[str, npt.NDArray[np.bool_]]] | None,
    ) -> _Lists:
        """Every cell on the first ``m`` rows of each event's matrix; ``expected``: the null
        model's expectations for them (None: no chance correction)."""
        observed = self.reval(m)
        expected_ = corrected_ = None
        if expected is not None:
            # stream.chance.corrected_of_sums(observed, expected, 1.0) elementwise: the same
            # operations on the same floats, None where the room is below MIN_ROOM.
            room = 1.0 - expected
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = (observed - expected) / room
            expected_ = expected.tolist()
            corrected_ = [
                [value if ok else None for value, ok in zip(values, oks, strict=True)]
                for values, oks in zip(ratio.tolist(), (room > MIN_ROOM).tolist(), strict=True)
            ]
        exact = list(
            map(exact_from_counts, self.zeros[self.batch, m - 1].tolist(), m.tolist(), self.n_truth.tolist())
        )
        slices = None
        if slice_columns is not None:
            found: list[tuple[str, list[bool], list[list[float]]]] = []
            for name, columns in slice_columns:
                present = cast(list[bool], columns.any(axis=1).tolist())
                found.append((name, present, self.slice_reval(m, columns, observed).tolist()))
            slices = [
                [(name, values[i]) for name, present, values in found if present[i]] for i in range(len(m))
            ]
        # The precision form (stream.metrics.reval_precision_by_k): rows within k over the rows.
        precision = (self.row_hits[self.batch, m - 1] / m[:, None]).tolist()
        return _Lists(
            observed.tolist(), expected_, corrected_, exact, self.ranked(m).tolist(), slices, precision
        )

    def reval(self, m: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """Eq. 4 at each k (|B| x K) on the first ``m`` rows: rows that reach G when
        |R| <= |G|, else columns that the rows reach, over min(|R|, |G|)."""
        last = m - 1
        by_rows = self.row_hits[self.batch, last]
        by_columns = (self.col_min[self.batch, last][:, :, None] <= self.caps).sum(axis=1)
        count = np.where((m <= self.n_truth)[:, None], by_rows, by_columns)
        return count / np.minimum(m, self.n_truth)[:, None]

    def ranked(self, m: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """:func:`stream.rank.ranked_by_k` at each k (|B| x K) on the first ``m`` rows."""
        n_b, n_r, n_g = self.matrix.shape
        inside = (np.arange(n_r)[None, :] < m[:, None])[:, :, None, None]
        credit = np.where(inside, self.credit, 0.0)
        # Units are rows (|R| <= |G|): each row's best link; their sum, row after row.
        best = credit.max(axis=2)
        by_rows = np.zeros((n_b, len(self.caps)))
        for i in range(n_r):
            by_rows += best[:, i]
        # Units are columns: each column's best link, best first, capped by the ideal list's
        # credit at that place; summed place after place (past |G|: zeros, adding nothing).
        best = -np.sort(-credit.max(axis=1), axis=1)
        np.minimum(best, self.rec[None, :n_g, None], out=best)
        by_columns = np.zeros((n_b, len(self.caps)))
        for t in range(n_g):
            by_columns += np.where((t < self.n_truth)[:, None], best[:, t], 0.0)
        total = np.where((m <= self.n_truth)[:, None], by_rows, by_columns)
        ranked: npt.NDArray[np.float64] = total / self.ideal_total[np.minimum(m, self.n_truth)][:, None]
        return ranked

    def slice_columns(self, bands: Bands) -> list[tuple[str, npt.NDArray[np.bool_]]]:
        """Each slice's columns (|B| x max|G| flags): :func:`stream.slices.columns_by_slice`."""
        labels = np.full(self.matrix.shape[::2], -1, dtype=np.int64)
        index = {name: s for s, name in enumerate(SLICES)}
        for b, truth in enumerate(self.truths):
            labels[b, : len(truth)] = [index[bands.of(g)] for g in truth]
        return [(name, labels == s) for s, name in enumerate(SLICES) if (labels == s).any()]

    def slice_reval(
        self, m: npt.NDArray[np.int64], cols: npt.NDArray[np.bool_], whole: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """:func:`stream.slices.slice_scores` of one slice (|B| x K; rows of events without a
        ground truth in the slice are not used): Eq. 4 on the slice's columns."""
        last = m - 1
        n_s = cols.sum(axis=1)
        columns = np.where(cols, self.col_min[self.batch, last], FAR)
        by_columns = (columns[:, :, None] <= self.caps).sum(axis=1)
        row_min = np.where(cols[:, None, :], self.matrix, FAR).min(axis=2)
        by_rows = np.cumsum(row_min[:, :, None] <= self.caps, axis=1)[self.batch, last]
        rows_are_units = m <= n_s
        count = np.where(rows_are_units[:, None], by_rows, by_columns)
        with np.errstate(divide="ignore", invalid="ignore"):
            values = count / np.where(rows_are_units, m, n_s)[:, None]
        return np.where((n_s == self.n_truth)[:, None], whole, values)
