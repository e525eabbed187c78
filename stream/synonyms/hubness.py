"""Hubness of a hashtag embedding space, and the neighbour re-rankings that reduce it.

In high-dimensional spaces some points -- *hubs* -- are among the nearest
neighbours of very many others.  Means of tweet embeddings are prone to it:
the mean of many tweets drifts to the centre of the space, so a popular
hashtag such as ``#hurricane`` ends up near everything.  For #REval that is
fatal: every recommended hashtag then counts a hub among its synonyms, so a
deliberately bad recommender (the ``least-popular`` canary) scores like a good
one once k is large.

Measured by the k-occurrence N_k(h): how many hashtags list h among their k
nearest.  A space without hubs has N_k close to k for every h (skewness near
0); here raw BERTag means give a skewness of 5-10 and hubs in 8% of all lists.

The re-rankings (``method``), all applied when a thesaurus is built:

* ``raw`` -- cosine, as the paper does;
* ``center`` -- subtract the mean of all hashtag vectors, then cosine
  (Suzuki et al. 2013, "Centering similarity measures to reduce hubs");
* ``csls`` -- cross-domain similarity local scaling (Conneau et al. 2018):
  ``2 cos(x, y) - r_x - r_y`` with ``r_y`` the mean cosine of y to its
  :data:`CSLS_K` nearest: a hub's own neighbourhood is dense, so it pays;
* ``center+csls`` -- both (the default: lowest hubness and the widest gap
  between good and bad recommenders on the sample feed, docs/experiment.md);
* ``mp`` -- mutual proximity (Schnitzer et al. 2012), Gaussian form: the
  probability that y is as close to x as it is *for both* x and y, from each
  hashtag's mean and spread of similarities.

Every method re-ranks a candidate list per hashtag (its ``candidates`` nearest
by cosine in the -- possibly centred -- space), so an approximate index can
supply the candidates for large vocabularies.

References
----------
Radovanović, Nanopoulos, Ivanović (2010) "Hubs in space", JMLR 11.
Suzuki, Hara, Shimbo, Saerens, Fukumizu (2013) EMNLP.
Conneau, Lample, Ranzato, Denoyer, Jégou (2018) "Word translation without parallel data", ICLR.
Schnitzer, Flexer, Schedl, Widmer (2012) "Local and global scaling reduce hubs in space", JMLR 13.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

METHODS = ("raw", "center", "csls", "center+csls", "mp")
DEFAULT_METHOD = "center+csls"
CSLS_K = 10
#: Hashtags sampled per hashtag to estimate its similarity distribution (mutual proximity).
MP_SAMPLE = 2048

Ids = npt.NDArray[np.signedinteger[Any]]
"""Row ids of hashtags (-1: none): int32 below 2**31 rows (:func:`id_dtype`), else int64."""
Candidates = Callable[[npt.NDArray[np.float32], int], tuple[Ids, npt.NDArray[np.float32]]]
"""``(unit vectors, c) -> (ids, cosines)``: each row's c nearest others, nearest first."""


def id_dtype(n: int) -> type[np.int32] | type[np.int64]:
    """The integer type of ids among ``n`` rows: int32 where it holds them (half the memory of
    a candidate list: n x 400 ids are 1.6 GB at 1,000,000 hashtags instead of 3.2)."""
    return np.int32 if n < 2**31 else np.int64


def check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"hubness method must be one of {', '.join(METHODS)}, got {method!r}")
    return method


def candidate_count(depth: int, method: str) -> int:
    """How many cosine candidates a re-ranking looks at for ``depth`` neighbours when an
    approximate index supplies them: 4x depth (at least 100 more), so that what re-ranks
    into the top ``depth`` is almost always among them (recall@70 0.999 against the exact
    re-ranking on the sample feed with 3x; ``tests/test_hubness.py`` checks >= 0.95 on a
    space built to have strong hubs)."""
    return depth if method in ("raw", "center") else max(4 * depth, depth + 100)


def exact_candidates(
    unit: npt.NDArray[np.float32], c: int, *, block: int = 1024
) -> tuple[Ids, npt.NDArray[np.float32]]:
    """Each row's ``c`` nearest other rows by cosine (exact; ties by index), in blocks.

    >>> ids, sims = exact_candidates(np.eye(3, dtype=np.float32) + 0.1, 2)
    >>> ids.tolist()
    [[1, 2], [0, 2], [0, 1]]
    """
    n = unit.shape[0]
    c = max(min(c, n - 1), 0)
    ids = np.zeros((n, c), dtype=id_dtype(n))
    sims = np.zeros((n, c), dtype=np.float32)
    if c <= 0:
        return ids, sims
    everyone = np.arange(n)
    for start in range(0, n, block):
        rows = np.arange(start, min(start + block, n))
        s = unit[rows] @ unit.T
        s[np.arange(len(rows)), rows] = -np.inf
        ids[rows], sims[rows] = top_per_row(s, everyone, c)
    return ids, sims


def top_per_row(
    sims: npt.NDArray[np.float32], columns: npt.NDArray[np.int64], c: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """Per row of ``sims`` (rows x m, column j is item ``columns[j]``, ascending): the ``c``
    largest as (items, values), largest first, ties by item.  ``c <= m``.

    A full ``argpartition`` of each row costs ~10-20 ns per entry; instead a strided
    eighth of the row gives a threshold that at least ``c`` entries reach (the c-th
    largest of a subset is at most the c-th largest of the row), and only the ~8c
    entries above it are partitioned: ~2 ns per entry, and exact.

    >>> top_per_row(np.array([[0.1, 0.9, 0.5, 0.9]], np.float32), np.array([3, 5, 7, 8]), 2)[0].tolist()
    [[5, 8]]
    """
    rows, m = sims.shape
    if m < 16 * c:
        # Short rows (a clustered search's): the whole block at once, vectorised; a row loop
        # costs ~0.1 ms a row whatever its length.
        order = best_first(sims, np.broadcast_to(columns, sims.shape), c)
        return columns[order], np.take_along_axis(sims, order, 1)
    ids = np.empty((rows, c), dtype=np.int64)
    out = np.empty((rows, c), dtype=np.float32)
    stride = max(1, min(8, m // (2 * c)))
    if stride > 1:
        sample = sims[:, ::stride]
        floor = np.partition(sample, sample.shape[1] - c, axis=1)[:, sample.shape[1] - c]
    for i in range(rows):
        row = sims[i]
        at = np.flatnonzero(row >= floor[i]) if stride > 1 else np.arange(m)
        values = row[at]
        if len(at) > c:
            keep = np.argpartition(-values, c - 1)[:c]
            keep.sort()  # back to ascending items, so the stable sort below breaks ties by item
            at, values = at[keep], values[keep]
        order = np.argsort(-values, kind="stable")
        ids[i], out[i] = columns[at[order]], values[order]
    return ids, out


# --------------------------------------------------------------------------- clustered search

#: Rows of a clustered search whose exact neighbours are computed: to choose how many
#: clusters each cluster probes, and to check the finished table's recall against the exact
#: re-ranking (:func:`sampled_recall`).
RECALL_SAMPLE = 300
#: The share of the sampled rows' true ``cover`` nearest that the probed clusters must hold.
COVER_TARGET = 0.999
#: A clustered search compares at most this share of all pairs; above it, the exact blocked
#: search costs about as much and is exact.
CLUSTERED_MAX_SHARE = 0.25


@dataclass(frozen=True)
class ClusteredSearch:
    """How a clustered (inverted-file) search found its candidates, and what it saw of exact.

    Each of the ``n`` rows only compared with the members of the ``probes`` clusters nearest
    its own (more where those hold fewer than ``c`` others); ``pairs`` the pairs compared.
    ``sample`` rows had their cosines to every row computed exactly (``sample_sims``) to
    choose ``probes`` so that they found at least ``cover_target`` of their true ``cover``
    nearest (``cover``: what they found).
    """

    n: int
    clusters: int
    probes: int
    pairs: int
    cover: float
    sample: npt.NDArray[np.int64]
    sample_sims: npt.NDArray[np.float32]

    def report(self) -> dict[str, Any]:
        n = self.n
        return {
            "kind": "clustered",
            "clusters": self.clusters,
            "probes": self.probes,
            "pairs_share": round(self.pairs / max(n * n, 1), 6),
            "sample": len(self.sample),
            "cover": round(self.cover, 6),
        }


def spherical_kmeans(
    space: npt.NDArray[np.float32], clusters: int, *, seed: int = 0, sample: int = 0, iterations: int = 6
) -> npt.NDArray[np.float32]:
    """``clusters`` unit centroids of the rows of ``space`` by cosine (k-means on the sphere),
    fitted on ``sample`` rows drawn at random (all when 0 or more than there are).

    >>> pts = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], np.float32)
    >>> sorted(np.argmax(pts @ spherical_kmeans(pts, 2).T, axis=1).tolist())
    [0, 0, 1, 1]
    """
    rng = np.random.default_rng(seed)
    n = space.shape[0]
    fit = space[np.sort(rng.choice(n, size=sample, replace=False))] if 0 < sample < n else space
    centroids = fit[rng.choice(len(fit), size=clusters, replace=False)].copy()
    for _ in range(iterations):
        label = np.argmax(fit @ centroids.T, axis=1)
        order = np.argsort(label, kind="stable")
        present, starts = np.unique(label[order], return_index=True)
        # Sums of each cluster's rows (an emptied cluster keeps its centroid); sorted runs
        # and reduceat: np.add.at row by row took 13 s at 100,000 x 768.
        sums = np.add.reduceat(fit[order], starts, axis=0)
        norms = np.linalg.norm(sums, axis=1)
        filled = norms > 0
        centroids[present[filled]] = (sums[filled] / norms[filled, None]).astype(np.float32)
    return centroids


def nearest_centroid(
    space: npt.NDArray[np.float32], centroids: npt.NDArray[np.float32], *, block: int = 8192
) -> npt.NDArray[np.int64]:
    """Each row's most similar centroid."""
    label = np.empty(space.shape[0], dtype=np.int64)
    for start in range(0, space.shape[0], block):
        label[start : start + block] = np.argmax(space[start : start + block] @ centroids.T, axis=1)
    return label


def clustered_candidates(
    space: npt.NDArray[np.float32],
    c: int,
    *,
    cover: int,
    seed: int = 0,
    sample: int = RECALL_SAMPLE,
    cover_target: float = COVER_TARGET,
    max_share: float = CLUSTERED_MAX_SHARE,
) -> tuple[Ids, npt.NDArray[np.float32], ClusteredSearch] | None:
    """Each row's ``c`` nearest others by cosine among the members of the clusters nearest
    its own (an inverted-file search joined with itself) as ``(ids, cosines, how)``, each
    as :func:`exact_candidates` gives them, or None where that would compare
    more than ``max_share`` of all pairs to find ``cover_target`` of the true ``cover``
    nearest on a sample of rows (a space without clusters: search exactly instead).

    The rows are clustered by :func:`spherical_kmeans` (about sqrt(n) clusters); each cluster's
    rows are compared with the members of the clusters whose centroids are nearest its
    centroid, in one matrix product, and each row keeps its best ``c``
    (:func:`top_per_row`).  How many clusters are probed is chosen on ``sample`` rows
    compared with every row: the fewest that hold ``cover_target`` of their true ``cover``
    nearest.  That is an estimate: the build checks the finished table's recall on the same
    rows (:func:`sampled_recall`) and searches exactly where it falls short.
    """
    n = space.shape[0]
    c = min(c, n - 1)
    clusters = round(float(np.sqrt(n)))
    if c < 1 or clusters < 4 or cover < 1:
        return None
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(n, size=min(sample, n), replace=False))
    sample_sims = space[rows] @ space.T
    sample_sims[np.arange(len(rows)), rows] = -np.inf
    cover = min(cover, n - 1)
    # In blocks of sampled rows: a partition of all 300 at once makes a negated copy and an
    # int64 index of 300 x n (3.6 GB at 1,000,000); each row's partition is its own.
    truth = np.concatenate(
        [
            np.argpartition(-sample_sims[lo : lo + 16], cover - 1, axis=1)[:, :cover]
            for lo in range(0, len(rows), 16)
        ]
    )

    centroids = spherical_kmeans(space, clusters, seed=seed, sample=min(n, 24 * clusters))
    label = nearest_centroid(space, centroids)
    closeness = centroids @ centroids.T
    np.fill_diagonal(closeness, np.inf)  # a cluster probes itself first
    probe_order = np.argsort(-closeness, axis=1, kind="stable")
    probe_rank = np.empty_like(probe_order)
    probe_rank[np.arange(clusters)[:, None], probe_order] = np.arange(clusters)[None, :]
    # The probes each sampled row needs for each of its true nearest; the fewest that reach the target.
    needed = np.sort(probe_rank[label[rows][:, None], label[truth]].ravel())
    probes = int(needed[min(len(needed) - 1, int(np.ceil(cover_target * len(needed))) - 1)]) + 1

    sizes = np.bincount(label, minlength=clusters)
    members = np.argsort(label, kind="stable")
    starts = np.concatenate([[0], np.cumsum(sizes)])
    plans: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = []
    pairs = 0
    for a in np.flatnonzero(sizes):
        reach = np.cumsum(sizes[probe_order[a]])
        # At least c + 1 members (the row itself is among them), so every row gets c candidates.
        p = max(probes, int(np.searchsorted(reach, c + 1)) + 1)
        union = np.sort(np.concatenate([members[starts[b] : starts[b + 1]] for b in probe_order[a, :p]]))
        plans.append((members[starts[a] : starts[a + 1]], union))
        pairs += int(sizes[a]) * len(union)
    if pairs > max_share * n * n:
        return None

    ids = np.zeros((n, c), dtype=id_dtype(n))
    sims = np.zeros((n, c), dtype=np.float32)
    for own, union in plans:
        for start in range(0, len(own), 1024):
            block = own[start : start + 1024]
            s = space[block] @ space[union].T
            s[np.arange(len(block)), np.searchsorted(union, block)] = -np.inf
            ids[block], sims[block] = top_per_row(s, union, c)
    found = np.mean(probe_rank[label[rows][:, None], label[truth]] < probes)
    return ids, sims, ClusteredSearch(n, clusters, probes, pairs, float(found), rows, sample_sims)


def sampled_recall(
    method: str,
    ranked: ReRanked,
    search: ClusteredSearch,
    name_rank: npt.NDArray[np.int64],
    ks: Sequence[int],
) -> dict[int, npt.NDArray[np.float64]]:
    """Per k of ``ks`` and sampled row of ``search``: the share of its first k neighbours in
    ``ranked`` that the same re-ranking over every other row (exact cosines, the same
    per-hashtag statistics) puts in its first k."""
    rows = search.sample
    n, depth = ranked.ids.shape
    deepest = min(max(ks), n - 1, depth)
    # In blocks of sampled rows: the scores of all 300 against every row are 300 x n float64
    # (2.4 GB at 1,000,000, several such temporaries at once); each row's ranking is its own.
    truths = []
    for lo in range(0, len(rows), 16):
        part = rows[lo : lo + 16]
        every = np.broadcast_to(np.arange(n), (len(part), n))
        exact = scores(method, part, every, search.sample_sims[lo : lo + 16], ranked.stats)
        exact[np.arange(len(part)), part] = -np.inf
        truths.append(best_first(exact, np.broadcast_to(name_rank, exact.shape), deepest))
    truth = np.concatenate(truths)
    got = ranked.ids[rows]
    out = {}
    for asked in ks:
        k = min(asked, deepest)
        out[asked] = np.array(
            [
                len(set(t[:k].tolist()) & set(g[:k].tolist())) / k if k else 1.0
                for t, g in zip(truth, got, strict=True)
            ]
        )
    return out


def centred(unit: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
    """Unit vectors minus their mean, scaled to unit length again (a zero row stays zero)."""
    matrix = np.asarray(unit, dtype=np.float64)
    mean = matrix.mean(axis=0)
    out = np.empty(matrix.shape, dtype=np.float32)
    # In blocks of rows: the same values (each row's own arithmetic) without three whole-matrix
    # float64 temporaries (600 MB each at 100,000 x 768, ~4 s of a build in page faults).
    for start in range(0, matrix.shape[0], 4096):
        out[start : start + 4096], _ = centre_block(matrix[start : start + 4096] - mean)
    return out


def centre_block(
    shifted: npt.NDArray[np.float64],
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Rows of unit vectors minus the mean (``shifted``) scaled to unit length again, and
    the lengths they had (:func:`centred`, a block of rows at a time)."""
    norms = np.linalg.norm(shifted, axis=1, keepdims=True)
    return np.divide(shifted, norms, out=np.zeros_like(shifted), where=norms > 0), norms[:, 0]


def _normal_cdf(z: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Phi(z) via erf (Abramowitz & Stegun 7.1.26, absolute error < 1.5e-7)."""
    x = np.abs(z) / np.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1.0 - poly * np.exp(-x * x)
    phi: npt.NDArray[np.float64] = 0.5 * (1.0 + np.sign(z) * erf)  # numpy types the product Any
    return phi


@dataclass(frozen=True)
class ReRanked:
    """Per hashtag: neighbour ids (nearest first, -1 = none)."""

    ids: Ids
    #: Per-hashtag statistics the method used (CSLS: ``csls_r``; MP: ``mp_mu``, ``mp_sigma``),
    #: so that a later, deeper query is ranked the same way (:func:`scores`).
    stats: dict[str, npt.NDArray[np.float32]]
    #: The neighbours' cosines in the space they were ranked in, where the re-ranking had them
    #: (:func:`rerank` of given candidates; ``None`` from the exact one).
    sims: npt.NDArray[np.float32] | None = None


def method_stats(
    method: str, space: npt.NDArray[np.float32], sims: npt.NDArray[np.float32], *, seed: int = 0
) -> dict[str, npt.NDArray[np.float32]]:
    """What ``method`` needs to know of every hashtag, from its sorted candidate cosines."""
    if method.endswith("csls"):
        top = sims[:, : min(CSLS_K, sims.shape[1])].astype(np.float64)
        finite = np.isfinite(top)  # a candidate list may be short (-inf = no candidate)
        total = np.where(finite, top, 0.0).sum(axis=1)
        r = np.divide(total, finite.sum(axis=1), out=np.zeros(space.shape[0]), where=finite.any(axis=1))
        return {"csls_r": r.astype(np.float32)}
    if method == "mp":
        mu, sigma = similarity_moments(space, seed=seed)
        return {"mp_mu": mu, "mp_sigma": sigma}
    return {}


def scores(
    method: str,
    rows: npt.NDArray[np.int64],
    ids: Ids,
    sims: npt.NDArray[np.float32],
    stats: dict[str, npt.NDArray[np.float32]],
) -> npt.NDArray[np.float64]:
    """The ranking score (higher = nearer) of candidates ``ids[i, j]`` of hashtag ``rows[i]``
    with cosines ``sims[i, j]``."""
    sims64 = sims.astype(np.float64)
    if method.endswith("csls"):
        # 2 cos(x, y) - r_x - r_y; r_x is the same for every candidate of x, so it is left out.
        return 2.0 * sims64 - stats["csls_r"][ids]
    if method == "mp":
        mu, sigma = stats["mp_mu"].astype(np.float64), stats["mp_sigma"].astype(np.float64)
        own = rows[:, None]
        return _normal_cdf((sims64 - mu[own]) / sigma[own]) * _normal_cdf((sims64 - mu[ids]) / sigma[ids])
    return sims64


def rerank(
    method: str,
    space: npt.NDArray[np.float32],
    depth: int,
    name_rank: npt.NDArray[np.int64],
    candidates: tuple[Ids, npt.NDArray[np.float32]] | None = None,
    *,
    seed: int = 0,
    block: int | None = None,
) -> ReRanked:
    """Re-rank each row's cosine ``candidates`` (ids and their cosines, computed in ``space``;
    -1 = no candidate) by ``method`` and keep the best ``depth``; ties are broken by
    ``name_rank``.  Without candidates every other hashtag is one: exact, O(n^2 d) like an
    exact cosine search, and the result keeps no cosines (``sims`` None).

    In blocks of ``block`` rows (4,096 of given candidates, 512 of all n): each row's ranking
    is its own, so the table is the same as in one pass, without its n x candidates float64
    scores (3.2 GB each at 1,000,000 x 400).
    """
    check_method(method)
    n = space.shape[0]
    if candidates is None:
        stats = method_stats(method, space, exact_candidates(space, CSLS_K)[1], seed=seed)
        keep, rows_per_block, dtype = min(depth, max(n - 1, 0)), block or 512, np.dtype(id_dtype(n))
    else:
        stats = method_stats(method, space, candidates[1], seed=seed)
        keep, rows_per_block, dtype = min(depth, candidates[0].shape[1]), block or 4096, candidates[0].dtype
    out_ids = np.full((n, depth), -1, dtype=dtype)  # -1 and -inf pad lists shorter than depth
    out_sims = np.full((n, depth), -np.inf, dtype=np.float32)
    for start in range(0, n, rows_per_block):
        rows = np.arange(start, min(start + rows_per_block, n), dtype=np.int64)
        if candidates is None:
            cand: Ids = np.broadcast_to(np.arange(n, dtype=dtype), (len(rows), n))
            cos = space[rows] @ space.T
        else:
            cand, cos = candidates[0][rows[0] : rows[-1] + 1], candidates[1][rows[0] : rows[-1] + 1]
        ranked = scores(method, rows, cand, cos, stats)
        ranked[cand < 0] = -np.inf
        if candidates is None:
            ranked[np.arange(len(rows)), rows] = -np.inf  # a hashtag is not its own neighbour
        order = best_first(ranked, name_rank[cand], keep)
        kept = np.take_along_axis(cand, order, 1)
        kept[~np.isfinite(np.take_along_axis(ranked, order, 1))] = -1
        out_ids[rows[0] : rows[-1] + 1, :keep] = kept
        out_sims[rows[0] : rows[-1] + 1, :keep] = np.take_along_axis(cos, order, 1)
    return ReRanked(out_ids, stats, None if candidates is None else out_sims)


def best_first(
    ranked: npt.NDArray[np.floating], ties: npt.NDArray[np.signedinteger[Any]], keep: int
) -> npt.NDArray[np.int64]:
    """Per row, the positions of the ``keep`` highest of ``ranked``, highest first, equal
    scores in ascending ``ties``: ``np.lexsort((ties, -ranked), axis=1)[:, :keep]``.

    A lexsort of whole rows (100,000 x 400 candidates: ~9 s) is mostly spent on what is
    dropped, and a stable sort is ~5x slower than numpy's default (vectorised) one; so the
    ``keep`` best are found by a partition and sorted by the default sort, and only a row
    where that can differ from the lexsort -- two equal scores among the kept, or a score
    equal to the ``keep``-th best left out -- is lexsorted whole.

    >>> best_first(np.array([[0.5, 0.9, 0.5, 0.1]]), np.array([[3, 0, 1, 2]]), 2).tolist()
    [[1, 2]]
    """
    rows, m = ranked.shape
    keep = min(keep, m)
    if keep == 0:
        return np.zeros((rows, 0), dtype=np.int64)
    if keep < m:
        part = np.argpartition(-ranked, keep - 1, axis=1)[:, :keep]
    else:
        part = np.broadcast_to(np.arange(m), (rows, m))
    top = np.take_along_axis(ranked, part, 1)
    order = np.argsort(-top, axis=1)
    top = np.take_along_axis(top, order, 1)
    out = np.take_along_axis(part, order, 1)
    tied = (top[:, 1:] == top[:, :-1]).any(axis=1)
    if keep < m:
        tied |= (ranked >= top[:, -1:]).sum(axis=1) > keep
    redo = np.flatnonzero(tied)
    if len(redo):
        out[redo] = np.lexsort((ties[redo], -ranked[redo]), axis=1)[:, :keep]
    return out


def similarity_moments(
    space: npt.NDArray[np.float32], *, sample: int = MP_SAMPLE, seed: int = 0
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """Per row: mean and standard deviation of its cosine to (a fixed sample of) the others."""
    n = space.shape[0]
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(n, size=min(sample, n), replace=False))
    mu = np.zeros(n, dtype=np.float64)
    sigma = np.zeros(n, dtype=np.float64)
    for start in range(0, n, 2048):
        rows = np.arange(start, min(start + 2048, n))
        s = (space[rows] @ space[pick].T).astype(np.float64)
        own = rows[:, None] == pick[None, :]
        s[own] = np.nan
        mu[rows] = np.nanmean(s, axis=1)
        sigma[rows] = np.nanstd(s, axis=1)
    sigma = np.maximum(sigma, 1e-6)
    return mu.astype(np.float32), sigma.astype(np.float32)


# --------------------------------------------------------------------------- measuring it


@dataclass(frozen=True)
class HubnessReport:
    """The k-occurrence distribution N_k of a neighbour table.

    ``hubs``: the largest N_k, as ``(hashtag, N_k)``; ``max_share``: the largest N_k
    as a share of all hashtags; ``share_with_hub``: the share of hashtags whose top k
    holds one of those hubs.
    """

    k: int
    hashtags: int
    skewness: float
    max: int
    max_share: float
    hubs: list[tuple[str, int]]
    share_with_hub: float

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["hubs"] = [[name, count] for name, count in self.hubs]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HubnessReport:
        return cls(**{**data, "hubs": [(str(h), int(c)) for h, c in data["hubs"]]})


def k_occurrence(neighbours: npt.NDArray[np.integer], k: int) -> npt.NDArray[np.int64]:
    """N_k: per hashtag (row id), how many rows list it among their first ``k`` (-1 = none).

    >>> k_occurrence(np.array([[1, 2], [0, 2], [0, 1], [2, -1]]), 1).tolist()
    [2, 1, 1, 0]
    """
    top = neighbours[:, :k].ravel()
    return np.bincount(top[top >= 0], minlength=neighbours.shape[0]).astype(np.int64)


def hubness_report(
    names: Sequence[str], neighbours: npt.NDArray[np.integer], k: int = 10, top: int = 10
) -> HubnessReport:
    """Skewness and largest values of N_k, the ``top`` hubs and how many lists they reach.

    >>> nb = np.array([[3, 1], [3, 0], [3, 1], [0, 1]])
    >>> report = hubness_report(["a", "b", "c", "hub"], nb, k=1, top=1)
    >>> report.hubs, report.max, report.share_with_hub
    ([('hub', 3)], 3, 0.75)
    """
    n = len(names)
    counts = k_occurrence(neighbours, k)
    mean, std = counts.mean() if n else 0.0, counts.std() if n else 0.0
    skewness = float(((counts - mean) ** 3).mean() / std**3) if std > 0 else 0.0
    order = sorted(range(n), key=lambda i: (-counts[i], names[i]))[:top]
    hub_ids = np.array(order, dtype=np.int64)
    reached = np.isin(neighbours[:, :k], hub_ids).any(axis=1) if n else np.zeros(0, dtype=bool)
    biggest = int(counts.max()) if n else 0
    return HubnessReport(
        k=k,
        hashtags=n,
        skewness=round(skewness, 4),
        max=biggest,
        max_share=round(biggest / n, 6) if n else 0.0,
        hubs=[(names[i], int(counts[i])) for i in order],
        share_with_hub=round(float(reached.mean()), 6) if n else 0.0,
    )
