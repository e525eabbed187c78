"""The neighbour table: each hashtag's nearest hashtags, re-ranked against hubness
(:mod:`stream.synonyms.hubness`), with their distances and the popularity the chance correction weighs
by -- what the index job builds and publishes and what scorers load.

Built by :func:`build_neighbour_table` from the hashtags' mean vectors: all pairs up to a size,
above it candidates from a clustered search whose recall is checked on a sample against the
exact re-ranking (:data:`RECALL_TARGET`), or from an exact blocked search.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from stream.synonyms.hubness import (
    Candidates,
    Ids,
    ReRanked,
    candidate_count,
    centre_block,
    check_method,
    clustered_candidates,
    exact_candidates,
    hubness_report,
    rerank,
    sampled_recall,
)
from stream.synonyms.thesaurus import (
    StoredThesaurus,
    ThesaurusFormatError,
    ThesaurusMetadata,
    UnitRows,
    check_k,
    check_max_distance,
    content_version,
    kept_unit_rows,
    name_ranks,
    utc_now,
)


def _rank_neighbours(
    method: str,
    space: npt.NDArray[np.float32],
    depth: int,
    name_rank: npt.NDArray[np.int64],
    candidates: Candidates | Literal["clustered"] | None,
    seed: int,
) -> tuple[ReRanked, dict[str, Any]]:
    """The re-ranked table and how its candidates were found (``build_neighbour_table``)."""
    n = space.shape[0]
    if candidates is None:
        return rerank(method, space, depth, name_rank, seed=seed), {"kind": "exact"}
    want = min(candidate_count(depth, method), max(n - 1, 0))
    if candidates == "clustered":
        found = clustered_candidates(space, want, cover=depth, seed=seed) if want else None
        if found is not None:
            ids, sims, clustered = found
            del found  # the candidates (n x 400 ids and cosines) go once re-ranked
            ranked = rerank(method, space, depth, name_rank, (ids, sims), seed=seed)
            del ids, sims
            recall = sampled_recall(method, ranked, clustered, name_rank, (10, depth))
            bound = recall[10].mean() - 2.33 * recall[10].std() / np.sqrt(len(recall[10]))
            report = {
                **clustered.report(),
                "recall_at_10": round(float(recall[10].mean()), 6),
                f"recall_at_{depth}": round(float(recall[depth].mean()), 6),
                "recall_at_10_lower_bound": round(float(bound), 6),
            }
            if bound >= RECALL_TARGET:
                return ranked, report
            search: dict[str, Any] = {"kind": "nearest", "clustered_fell_short": report}
        else:
            search = {"kind": "nearest", "clustered_fell_short": None}
        candidates = exact_candidates
    else:
        search = {"kind": "nearest" if candidates is exact_candidates else "candidates"}
    empty = (np.zeros((n, 0), np.int32), np.zeros((n, 0), np.float32))
    ids, sims = candidates(space, want) if want else empty
    return rerank(method, space, depth, name_rank, (ids, sims), seed=seed), search


@dataclass(frozen=True)
class Centring:
    """How the centred space of :func:`stream.synonyms.hubness.centred` maps back to the unit rows:
    x = a_x x' + m with m the mean row, and b_x = (x - m).m -- what turns cosines in the
    centred space into the embeddings' own (:func:`embedding_cosines`)."""

    a: npt.NDArray[np.float64]
    b: npt.NDArray[np.float64]
    mm: float

    @classmethod
    def of(cls, unit: npt.NDArray[np.float64]) -> Centring:
        """Of unit rows held whole (a build reads them in blocks: :func:`ranking_space`)."""
        mean = unit.mean(axis=0)
        shifted = unit - mean
        return cls(np.linalg.norm(shifted, axis=1), shifted @ mean, float(mean @ mean))


def embedding_cosines(
    centring: Centring | None, rows: slice, ids: Ids, sims: npt.NDArray[np.float32]
) -> npt.NDArray[np.float64]:
    """The cosines of the unit rows ``unit[i]`` and ``unit[ids[i, j]]`` (i in ``rows``) from
    their cosines ``sims`` in the space they were ranked in: ``unit`` itself (``centring``
    None), or its centred space, where x.y = a_x a_y x'.y' + b_x + b_y + m.m (:class:`Centring`)
    -- a few operations per neighbour instead of gathering its 768 floats (19% of a 100,000
    build).  Equal to the direct dot products within float32 rounding (~1e-7).

    >>> from stream.synonyms.hubness import centred
    >>> unit = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    >>> space = centred(unit)
    >>> ids = np.array([[1], [2], [1]])
    >>> sims = np.einsum("ij,ikj->ik", space, space[ids]).astype(np.float32)
    >>> np.round(embedding_cosines(Centring.of(unit), slice(0, 3), ids, sims), 6).tolist()
    [[0.6], [0.8], [0.8]]
    """
    if centring is None:
        return sims.astype(np.float64)
    a, b = centring.a, centring.b
    safe = np.maximum(ids, 0)
    cosines: npt.NDArray[np.float64] = (
        a[rows, None] * a[safe] * sims.astype(np.float64) + b[rows, None] + b[safe] + centring.mm
    )
    return cosines


def ranking_space(rows: UnitRows, centre: bool) -> tuple[npt.NDArray[np.float32], Centring | None]:
    """The space the hashtags are ranked in, float32: their unit rows, or (``centre``) the
    unit rows centred (:func:`stream.synonyms.hubness.centred`) with the :class:`Centring` back.
    Read from ``rows`` in blocks: the same values to the bit as from the whole float64
    matrix (numpy sums a column's rows in order, so the running sum over the blocks is the
    whole matrix's), without that matrix (6.1 GB at 1,000,000 x 768).

    >>> from stream.synonyms.hubness import centred
    >>> unit = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    >>> space, centring = ranking_space(kept_unit_rows(["a", "b", "c"], unit, None, 1), True)
    >>> whole = Centring.of(unit)
    >>> pairs = [(space, centred(unit)), (centring.a, whole.a), (centring.b, whole.b)]
    >>> [bool(np.array_equal(x, y)) for x, y in pairs]
    [True, True, True]
    """
    n, d = len(rows), rows.dimension
    space = np.empty((n, d), dtype=np.float32)
    if not centre:
        for start, block in rows.blocks():
            space[start : start + len(block)] = block
        return space, None
    total = np.zeros(d)
    for _, block in rows.blocks():
        total = np.add.reduce(np.concatenate([total[None], block]), axis=0)
    mean = total / n
    a, b = np.empty(n), np.empty(n)
    for start, block in rows.blocks():
        stop = start + len(block)
        shifted = block - mean
        space[start:stop], a[start:stop] = centre_block(shifted)
        b[start:stop] = shifted @ mean
    return space, Centring(a, b, float(mean @ mean))


class NeighbourTable(StoredThesaurus):
    """Every hashtag's ``depth`` nearest hashtags, precomputed: what a scorer needs.

    ``neighbours[i]`` are the row ids of hashtag i's nearest hashtags, nearest first
    (ranked by the build's hubness method), -1 where there are fewer; ``distances[i]``
    their cosine distances; ``counts[i]`` how many tweets hashtag i's mean averages
    (its training popularity).  Lookups are memory reads: no index to query.

    >>> unit = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    >>> table = build_neighbour_table(["a", "b", "c"], unit, [5, 2, 1], depth=2, method="raw")
    >>> table.synonyms("a", 1), table.neighbours("c", 5), table.depth
    (['a', 'b'], ['b', 'a'], 2)
    """

    def __init__(
        self,
        hashtags: Sequence[str],
        neighbours: npt.ArrayLike,
        distances: npt.ArrayLike,
        counts: npt.ArrayLike,
        metadata: ThesaurusMetadata,
        stats: Mapping[str, npt.ArrayLike] | None = None,
    ) -> None:
        self._names: tuple[str, ...] = tuple(hashtags)
        self._ids = {name: i for i, name in enumerate(self._names)}
        self._neighbours = np.asarray(neighbours, dtype=np.int32)
        self._distances = np.asarray(distances, dtype=np.float32)
        self._counts = np.asarray(counts, dtype=np.int64)
        n = len(self._names)
        if len(self._ids) != n:
            raise ThesaurusFormatError("hashtag list contains duplicates")
        if self._neighbours.ndim != 2 or self._neighbours.shape[0] != n:
            raise ThesaurusFormatError(f"neighbour table of shape {self._neighbours.shape} for {n} hashtags")
        if self._distances.shape != self._neighbours.shape or self._counts.shape != (n,):
            raise ThesaurusFormatError("distances/counts do not match the neighbour table")
        if self._neighbours.size and (self._neighbours.max() >= n or self._neighbours.min() < -1):
            raise ThesaurusFormatError("neighbour ids out of range")
        #: The hubness method's per-hashtag statistics (:func:`stream.synonyms.hubness.method_stats`).
        self.stats = {name: np.asarray(value, dtype=np.float32) for name, value in (stats or {}).items()}
        self._metadata = metadata

    @property
    def depth(self) -> int:
        """Neighbours held per hashtag (the largest k this table answers)."""
        return int(self._neighbours.shape[1])

    @property
    def neighbour_ids(self) -> npt.NDArray[np.int32]:
        return self._neighbours

    @property
    def distances(self) -> npt.NDArray[np.float32]:
        return self._distances

    @property
    def counts(self) -> npt.NDArray[np.int64]:
        return self._counts

    def index_of(self, hashtag: str) -> int | None:
        return self._ids.get(hashtag)

    def neighbours_with_distances(self, hashtag: str, k: int) -> list[tuple[str, float]]:
        """Up to ``k`` nearest other hashtags with their cosine distances, nearest first."""
        item = self._row(hashtag, k)
        if item is None:
            return []
        row, dist = self._neighbours[item, :k].tolist(), self._distances[item, :k].tolist()
        return [(self._names[j], float(d)) for j, d in zip(row, dist, strict=True) if j >= 0]

    def neighbours(self, hashtag: str, k: int) -> list[str]:
        # The scorer's cold path (first lookup of a hashtag): names only, no distances.
        item = self._row(hashtag, k)
        if item is None:
            return []
        names = self._names
        return [names[j] for j in self._neighbours[item, :k].tolist() if j >= 0]

    def _row(self, hashtag: str, k: int) -> int | None:
        check_k(k)
        if k > self.depth and self.depth < len(self._names) - 1:
            raise ValueError(f"this thesaurus holds {self.depth} neighbours per hashtag; k={k} is more")
        return self._ids.get(hashtag)

    def __contains__(self, hashtag: object) -> bool:
        return hashtag in self._ids

    def __len__(self) -> int:
        return len(self._names)


#: The recall@10 against the exact re-ranking that a clustered search must show on its
#: sampled hashtags (a one-sided 99% lower confidence bound) for the build to keep its table;
#: below it the build searches again, exactly (issue 27 §2: recall@10 >= 0.99).
RECALL_TARGET = 0.99


def build_neighbour_table(
    names: Sequence[str],
    vectors: npt.ArrayLike,
    counts: Sequence[int] | npt.ArrayLike | None = None,
    *,
    depth: int,
    method: str = "center+csls",
    candidates: Candidates | Literal["clustered"] | None = None,
    max_distance: float | None = None,
    min_count: int = 1,
    model_id: str = "",
    n_trees: int = 0,
    metric: str = "cosine",
    version: str | None = None,
    seed: int = 0,
    on_space: Callable[[npt.NDArray[np.float32]], None] | None = None,
) -> NeighbourTable:
    """The neighbour table of hashtags ``names`` with embeddings ``vectors``.

    Hashtags seen fewer than ``min_count`` times (``counts``) are left out; the counts
    are also the popularity the null model weighs by (all 1 when not given).  ``method`` ranks the
    neighbours (:mod:`stream.synonyms.hubness`), exactly over all pairs by default; for large
    vocabularies ``candidates(unit, c)`` supplies each hashtag's c nearest by cosine in the
    (possibly centred) space and only those are re-ranked.  ``candidates="clustered"``
    finds them among nearby clusters (:func:`stream.synonyms.hubness.clustered_candidates`) and keeps
    that table only if its recall@10 against the exact re-ranking, measured on a sample of
    hashtags, reaches :data:`RECALL_TARGET` (a lower confidence bound); otherwise, or where
    the space has no clusters to use, the c nearest are found exactly
    (:func:`stream.synonyms.hubness.exact_candidates`).  How is recorded in the metadata's ``search``.
    Neighbours farther than ``max_distance`` (cosine distance of the embeddings) are cut off.
    The version is a hash of the content and the parameters.  ``on_space`` is called with
    the space the hashtags are ranked in (row i = the table's hashtag i; not to be modified)
    before the search, so that a caller can index it meanwhile.
    """
    check_method(method)
    if depth < 1:
        raise ValueError(f"depth must be at least 1, got {depth}")
    max_distance = check_max_distance(max_distance)
    given = None if counts is None else [int(c) for c in np.asarray(counts).tolist()]
    rows = kept_unit_rows(names, vectors, given, min_count)
    kept = rows.names
    row_of = {name: i for i, name in enumerate(names)}
    kept_counts = np.asarray([given[row_of[name]] if given else 1 for name in kept], dtype=np.int64)
    del row_of
    n = len(kept)
    params = {
        "metric": metric,
        "method": method,
        "depth": depth,
        "min_count": min_count,
        "max_distance": max_distance,
        "model_id": model_id,
        "seed": seed,
    }
    version = version or content_version(kept, (block for _, block in rows.blocks()), params)
    # The unit rows are read in blocks where they are needed; held whole (float64) only for
    # the exact re-ranking's neighbour cosines (all pairs: small vocabularies).
    space, centring = ranking_space(rows, method.startswith("center") and n > 0)
    name_rank = name_ranks(kept)
    if on_space is not None:
        on_space(space)
    ranked, search = _rank_neighbours(method, space, depth, name_rank, candidates, seed)
    unit = rows.matrix() if ranked.sims is None else None
    neighbours, distances = _distances(ranked, centring, unit, max_distance)
    metadata = ThesaurusMetadata(
        model_id=model_id,
        dimension=rows.dimension,
        count=n,
        built_at=utc_now(),
        version=version,
        n_trees=n_trees,
        metric=metric,
        min_count=min_count,
        max_distance=max_distance,
        hubness_method=method,
        depth=depth,
        hubness=hubness_report(kept, neighbours).to_dict(),
        search=search,
    )
    return NeighbourTable(kept, neighbours, distances, kept_counts, metadata, ranked.stats)


def _distances(
    ranked: ReRanked,
    centring: Centring | None,
    unit: npt.NDArray[np.float64] | None,
    max_distance: float | None,
    *,
    block: int = 4096,
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]:
    """The ranked neighbours (-1: none) and their cosine distances in the embedding space
    (not the space they were ranked in), each list cut at the first beyond ``max_distance``:
    from the neighbours' cosines in the ranking space (:func:`embedding_cosines`), or where
    the re-ranking has none (the exact one) as dot products of the ``unit`` rows.  In blocks
    of rows: each row's arithmetic is its own, without n x depth float64 temporaries."""
    n, depth = ranked.ids.shape
    neighbours = np.empty((n, depth), dtype=np.int32)
    distances = np.empty((n, depth), dtype=np.float32)
    # Gathering neighbours' vectors: small blocks (64 rows: ~20 MB of gathered rows at depth 100
    # x 768) stay in cache; 1,024-row blocks (300 MB) took 2-3x longer, 43 s of a 230-s build at
    # 100,000 (BENCHMARKS.md, issue 27 §5). Each cosine is the same dot product whatever the block.
    step = block if ranked.sims is not None else 64
    for start in range(0, n, step):
        rows = slice(start, start + step)
        ids = ranked.ids[rows]
        valid = ids >= 0
        if ranked.sims is not None:
            cosines = embedding_cosines(centring, rows, ids, ranked.sims[rows])
        else:
            assert unit is not None
            cosines = np.einsum("ij,ikj->ik", unit[rows], unit[np.where(valid, ids, 0)])
        near = np.where(valid, np.clip(1.0 - cosines, 0.0, 2.0), np.inf).astype(np.float32)
        if max_distance is not None:
            # Cut each list at the first neighbour beyond the limit (ranks stay contiguous).
            beyond = np.cumsum(near > max_distance, axis=1) > 0
            ids = np.where(beyond, -1, ids)
            near = np.where(beyond, np.inf, near)
        neighbours[rows], distances[rows] = ids, near
    return neighbours, distances
