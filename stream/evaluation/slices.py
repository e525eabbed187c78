"""Slices of the score by the ground truth's popularity: head, torso, tail and novel.

A recommender that is good on the few hashtags everybody uses and useless on the long
tail looks fine on average (paper ``002_…``: cores and cold start).  Each thesaurus
version ranks its hashtags by training frequency (the tweets its mean averages); the
most used hashtags that together carry the first ``head`` share of all uses are the
*head*, the next ones up to the ``torso`` share the *torso*, the rest the *tail*; a
ground-truth hashtag the thesaurus does not know is *novel* (cold start: only an exact
recommendation can hit it).  Shares, not counts, so the bands mean the same on a feed
of a thousand tweets and of a billion.

An event is scored in a slice on the ground-truth hashtags of that slice: Eq. 4 with G
cut to them, so one event can count in several slices, each with its own |G|.  Four
fixed labels: bounded, whatever the vocabulary.

>>> bands = Bands(["flood", "fire", "rain", "hail"], [60, 25, 10, 5])
>>> [bands.of(h) for h in ("flood", "fire", "rain", "hail", "sharknado")]
['head', 'torso', 'tail', 'tail', 'novel']
>>> columns = columns_by_slice(["flood", "sharknado"], bands)
>>> columns
{'head': [0], 'novel': [1]}
>>> slice_scores([[0, 1 << 30], [1 << 30, 1 << 30]], columns, [0, 10])
{'head': [1.0, 1.0], 'novel': [0.0, 0.0]}
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from stream.evaluation.metrics import reval_by_k, reval_from_minima

__all__ = ["DEFAULT_SHARES", "SLICES", "Bands", "columns_by_slice", "slice_scores"]

SLICES = ("head", "torso", "tail", "novel")
#: Cumulative shares of hashtag uses that end the head and the torso.
DEFAULT_SHARES = (0.5, 0.8)


class Bands:
    """Each known hashtag's popularity band in one thesaurus version."""

    def __init__(
        self,
        hashtags: Sequence[str],
        counts: npt.ArrayLike,
        shares: tuple[float, float] = DEFAULT_SHARES,
    ) -> None:
        head, torso = shares
        if not 0.0 < head <= torso <= 1.0:
            raise ValueError(f"band shares must satisfy 0 < head <= torso <= 1, got {shares}")
        uses = np.asarray(counts, dtype=np.float64)
        if uses.shape != (len(hashtags),):
            raise ValueError(f"{len(hashtags)} hashtags but {uses.shape} counts")
        # Most used first, ties by name: the same bands on every build of the same counts.
        order = sorted(range(len(hashtags)), key=lambda i: (-uses[i], hashtags[i]))
        total = float(uses.sum())
        self.shares = shares
        self._band: dict[str, str] = {}
        before = 0.0  # uses of the hashtags ranked above this one (sums of counts: exact)
        for i in order:
            name = "head" if before < head * total else "torso" if before < torso * total else "tail"
            self._band[hashtags[i]] = name
            before += uses[i]

    def of(self, hashtag: str) -> str:
        return self._band.get(hashtag, "novel")


def columns_by_slice(truth: Sequence[str], bands: Bands) -> dict[str, list[int]]:
    """The ground truths' positions in each slice they fall in (once per event)."""
    columns: dict[str, list[int]] = {}
    for j, hashtag in enumerate(truth):
        columns.setdefault(bands.of(hashtag), []).append(j)
    return {label: columns[label] for label in SLICES if label in columns}


def slice_scores(
    matrix: Sequence[Sequence[int]],
    columns: dict[str, list[int]],
    ks: Sequence[int],
    whole: list[float] | None = None,
) -> dict[str, list[float]]:
    """#REval-hit-ratio at each k of ``ks`` on the ground truths of each slice of
    ``columns`` (:func:`columns_by_slice`); ``matrix`` is the |R| x |G| rank matrix of
    :func:`stream.evaluation.metrics.rank_matrix`.  ``whole``: Eq. 4 on all of G, already computed,
    reused for a slice that holds every ground truth (the usual case: one band)."""
    n_rec = len(matrix)
    n_truth = len(matrix[0]) if matrix else 0
    out: dict[str, list[float]] = {}
    column_minima: list[int] | None = None
    for label, cols in columns.items():
        if whole is not None and len(cols) == n_truth:
            out[label] = list(whole)
        elif n_rec > len(cols):  # Eq. 4 counts the slice's columns: their minima over all rows
            if column_minima is None:
                column_minima = list(map(min, zip(*matrix, strict=True)))
            minima = sorted([column_minima[j] for j in cols])
            out[label] = reval_from_minima(minima, len(cols), ks)
        else:
            out[label] = reval_by_k([[row[j] for j in cols] for row in matrix], len(cols), ks)
    return out
