"""The per-event reference of the scorer: one event at a time, by the definitions of
:mod:`stream.evaluation.metrics`, :mod:`stream.evaluation.rank`, :mod:`stream.evaluation.slices` and :mod:`stream.evaluation.chance`, in
plain Python -- the oracle that :func:`stream.evaluation.scoring.score_batch` (numpy passes over a whole
batch) must equal to the last bit, record for record.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

from stream.evaluation.chance import corrected_of_sums
from stream.evaluation.metrics import FAR, exact_from_ranks, reval_by_k, reval_precision_by_k
from stream.evaluation.neighbours import NeighbourCache
from stream.evaluation.rank import DCG, RankWeights, ranked_by_k
from stream.evaluation.scoring import ALL, r_label
from stream.evaluation.signals import RECORD_KEYS
from stream.evaluation.slices import columns_by_slice, slice_scores
from stream.intake.records import Recommendation


def reciprocal_rank_by_k(matrix: Sequence[Sequence[int]], ks: Sequence[int]) -> list[float]:
    """1 / i for the first row i (from 1) of ``matrix`` with a rank <= k, 0 if none, per k.

    >>> reciprocal_rank_by_k([[FAR, 9], [3, FAR]], [0, 3, 9])
    [0.0, 0.5, 1.0]
    """
    out = []
    for k in ks:
        cap = min(k, FAR - 1)
        first = next((i for i, row in enumerate(matrix) if min(row) <= cap), None)
        out.append(0.0 if first is None else 1 / (first + 1))
    return out


def _by_r(cells: dict[str, list[Any]], ks: Sequence[str]) -> dict[str, dict[str, Any]]:
    return {label: dict(zip(ks, values, strict=True)) for label, values in cells.items()}


def oracle_record(
    event: Recommendation,
    truth: Sequence[str],
    cache: NeighbourCache,
    ks: Sequence[int],
    rs: Sequence[int | None] = (ALL,),
    weights: RankWeights = DCG,
) -> dict[str, Any]:
    """The scores record of one event (:meth:`stream.evaluation.scoring.ScoredBatch.records`), by the
    definitions."""
    ks = list(dict.fromkeys(ks))
    keys = [str(k) for k in ks]
    recommended = list(dict.fromkeys(event.recommended))
    truth = list(dict.fromkeys(truth))
    reason = "empty_recommended" if not recommended else "empty_ground_truth" if not truth else None
    record: dict[str, Any] = {key: {} for key in RECORD_KEYS}
    record.update(
        tweet_id=event.tweet_id,
        recommender=event.recommender,
        thesaurus_version=cache.version,
        scorable=reason is None,
        unscorable_reason=reason,
        unknown_recommended=0,
        n_recommended=len(recommended),
    )
    if reason is not None:
        return record
    matrix = cache.matrix(recommended, truth)
    n_truth = len(truth)
    chance, bands = cache.chance, cache.bands
    columns = columns_by_slice(truth, bands) if bands is not None else {}
    record["unknown_recommended"] = sum(1 for h in recommended if not cache.known(h))
    cells: dict[str, dict[str, Any]] = {key: {} for key in RECORD_KEYS}
    unreached = bool(ks) and min(chain.from_iterable(matrix)) > min(max(ks), FAR - 1)
    zeros = [0.0] * len(ks)
    for r in rs:
        rows = matrix[:r] if r is not None else matrix
        label = r_label(r)
        observed = zeros if unreached else reval_by_k(rows, n_truth, ks)
        cells["reval_hit_ratio"][label] = observed
        cells["reval_hit_ratio_ranked"][label] = (
            zeros if unreached else ranked_by_k(rows, n_truth, ks, weights)
        )
        cells["reval_hit_ratio_precision"][label] = zeros if unreached else reval_precision_by_k(rows, ks)
        cells["reval_reciprocal_rank"][label] = reciprocal_rank_by_k(rows, ks)
        record["exact"][label] = exact_from_ranks(rows, n_truth).as_dict()
        if chance is not None:
            expected = chance.expected(len(rows), truth, ks)
            cells["reval_hit_ratio_expected"][label] = expected
            cells["reval_hit_ratio_corrected"][label] = [
                corrected_of_sums(o, e, 1.0) for o, e in zip(observed, expected, strict=True)
            ]
        if columns:
            by_slice = slice_scores(rows, columns, ks, observed)
            record["reval_hit_ratio_slices"][label] = {
                name: dict(zip(keys, values, strict=True)) for name, values in by_slice.items()
            }
    for key, by_label in cells.items():
        if by_label:
            record[key] = _by_r(by_label, keys)
    return record
