"""Chance-corrected #REval: how much better than a popularity-weighted random recommender.

With k synonyms per recommended hashtag, even random recommendations hit: Syn_k(R)
covers |R| (k + 1) hashtags, and more of them when the thesaurus has hubs.  The
corrected score compares an event's #REval-hit-ratio with what a *null recommender*
would expect for the same event::

    corrected = (observed - expected) / (1 - expected)       (Cohen's kappa form)

and the corrected score of a *set* of events (a window, a cell, a slice) is the kappa of
its sums, ``(sum observed - sum expected) / (sum best - sum expected)``
(:func:`corrected_of_sums`, :class:`CorrectedSum`), never the mean of per-event values.

The null draws the same number m = |R| of distinct hashtags from the thesaurus
vocabulary, successively and each with probability proportional to its training
popularity (the tweets its mean averages), given the same ground truth G and k.
1 means a perfect score, 0 chance level, < 0 worse than chance.  Where the expected
value leaves no room (1 for every event) no recommender can beat chance: no score (None).

The expectation is analytic, from per-version statistics, so scoring needs no
sampling.  With B_k = {h : Syn_k(h) ∩ G ≠ ∅} and A_g(k) = {h : g ∈ Syn_k(h)}:

* |R| <= |G|: E[rho] / m = sum over h in B_k of P(h in R) / m;
* |R| > |G|:  E[rho] / |G| = mean over g in G of P(R ∩ A_g(k) ≠ ∅).

Successive sampling without replacement has no closed form for these
probabilities; we use the standard approximation that replaces the mass already
drawn before draw t by its expectation s_t (computed once per version):
P(R ∩ A = ∅) ≈ prod_{t<m} (1 - w(A) / (W - s_t)).  Checked against simulation in
``tests/test_chance.py``, also at real thesaurus sizes (thousands of hashtags with a crisis
feed's long-tailed popularity, 70 neighbours, hub-sized sets A, m up to 10): per event
within 0.01 (the error grows with m and with the weight of A: it overestimates the hit
probability of a set holding several of the most popular hashtags by up to ~0.004 at
m = 10), and for a set of events the null's kappa is off by at most ~0.0015 -- the
approximation does not bias the corrected score at any scale that matters (the goal:
|random's corrected| <= 0.02), so no calibration is applied.
"""

from __future__ import annotations

import math
import operator
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stream.synonyms.neighbour_table import NeighbourTable

#: Below this much room (sum of best - sum of expected, in events) a corrected score of the
#: aggregate is not reported: the chance level leaves no room for a recommender to beat it.
MIN_ROOM = 1e-9


def corrected_of_sums(observed: float, expected: float, best: float) -> float | None:
    """The chance-corrected score of a *set* of events, from its sums (kappa of the aggregate).

    ``(sum observed - sum expected) / (sum best - sum expected)``, where ``best`` is the
    highest score each event allows (1 per scorable event for #REval).  Never the mean of
    per-event :func:`corrected` values: there an event whose expectation is near 1 weighs
    thousands of others.  None when the expectation leaves no room (``best - expected``
    below :data:`MIN_ROOM`), e.g. every event's chance level is 1 or there are no events.

    >>> corrected_of_sums(observed=3.0, expected=1.0, best=5.0)
    0.5
    >>> corrected_of_sums(observed=1.0, expected=2.0, best=2.0) is None  # no room above chance
    True
    """
    room = best - expected
    if not room > MIN_ROOM:
        return None
    return (observed - expected) / room


@dataclass(slots=True, repr=False)
class CorrectedSum:
    """Running sums of observed, expected and best scores; :meth:`get` is their kappa.

    River-style (``update``/``get``); sums add, so windows, cells, slices and processes
    combine by adding their ``CorrectedSum`` (``+``), and Prometheus recording rules can do
    the same over any range with counters of the three sums.  The sums of squares of the
    excess ``observed - expected`` and of the room ``best - expected`` (and of their product)
    ride along, for :meth:`interval`.

    >>> acc = CorrectedSum()
    >>> for observed, expected in [(1.0, 0.2), (0.0, 0.2), (0.5, 0.6)]:
    ...     _ = acc.update(observed, expected)
    >>> acc.count, round(acc.get(), 6)
    (3, 0.25)
    >>> (acc + CorrectedSum().update(1.0, 0.999)).count
    4
    """

    observed: float = 0.0
    expected: float = 0.0
    best: float = 0.0
    count: int = 0
    #: Sums of excess², room² and excess x room over the events (excess = observed -
    #: expected, room = best - expected): the delta method's variance (:meth:`interval`).
    squares: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def update(self, observed: float, expected: float, best: float = 1.0) -> CorrectedSum:
        self.observed += observed
        self.expected += expected
        self.best += best
        self.count += 1
        excess, room = observed - expected, best - expected
        a, b, c = self.squares
        self.squares = (a + excess * excess, b + room * room, c + excess * room)
        return self

    def get(self) -> float | None:
        return corrected_of_sums(self.observed, self.expected, self.best)

    def interval(self, z: float = 1.959964) -> tuple[float, float] | None:
        """A normal (delta-method) interval for the kappa as an estimate of the kappa of the
        population the events were drawn from (events independent; ``z`` = 1.96: 95%).

        The kappa is a ratio of means, excess / room; its linearised variance is
        ``sum((excess_i - kappa room_i)^2) / (n (n - 1)) / mean(room)^2``.  None when the
        kappa is, or with fewer than 2 events.

        >>> acc = CorrectedSum()
        >>> for i in range(400):
        ...     _ = acc.update(float(i % 4 == 0), 0.1)
        >>> low, high = acc.interval()
        >>> round(acc.get(), 4), round(low, 4), round(high, 4)  # 1/6 +- 1.96 sqrt(.25 .75 / 400) / .9
        (0.1667, 0.1195, 0.2139)
        """
        kappa = self.get()
        n = self.count
        if kappa is None or n < 2:
            return None
        a, b, c = self.squares
        # sum over events of (excess - kappa room)^2, from the sums of squares and products
        spread = max(a - 2.0 * kappa * c + kappa * kappa * b, 0.0)
        room = (self.best - self.expected) / n
        half = z * math.sqrt(spread / (n * (n - 1))) / room
        return kappa - half, kappa + half

    def __add__(self, other: CorrectedSum) -> CorrectedSum:
        return CorrectedSum(
            self.observed + other.observed,
            self.expected + other.expected,
            self.best + other.best,
            self.count + other.count,
            tuple(x + y for x, y in zip(self.squares, other.squares, strict=True)),  # type: ignore[arg-type]
        )

    def __repr__(self) -> str:
        return (
            f"CorrectedSum(observed={self.observed!r}, expected={self.expected!r}, "
            f"best={self.best!r}, count={self.count})"
        )


class ChanceModel:
    """The null recommender's expected #REval-hit-ratio for a thesaurus version.

    Built once per version from its neighbour table (neighbour ranks and the hashtags'
    popularity); :meth:`expected` then costs a few array reads per ground-truth
    hashtag (cached for repeated ground truths).  The per-hashtag terms are computed for
    every hashtag at once (w(A_g(k)) at load, the miss probabilities for |R| > |G| when a
    grid of k and an m are first asked for), so a version's first events cost what its next
    ones do.  Memory at 100,000 hashtags x depth 70: ~115 MB at load (w(A_g(k)) for every
    rank, the reverse index for unions), ~85 MB more per grid of k for m <= 10.

    >>> import numpy as np
    >>> from stream.synonyms.neighbour_table import build_neighbour_table
    >>> unit = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    >>> table = build_neighbour_table(["a", "b", "c", "d"], unit, [1, 1, 1, 1], depth=1, method="raw")
    >>> model = ChanceModel(table)
    >>> [round(x, 4) for x in model.expected(1, ["a"], [0, 1])]  # P(draw a), P(draw a or b)
    [0.25, 0.5]
    """

    def __init__(self, table: NeighbourTable, *, cache: int = 50_000) -> None:
        self.depth = table.depth
        self._ids = {name: i for i, name in enumerate(table.hashtags)}
        weights = table.counts.astype(np.float64)
        if weights.size and weights.sum() <= 0:
            weights = np.ones_like(weights)
        self._w = weights / weights.sum() if weights.size else weights
        # Reverse index: for g, the (rank, h) with g among h's neighbours (and (0, g) itself),
        # sorted by rank, with the cumulative weight of h along that order.
        nb = table.neighbour_ids
        n, depth = nb.shape
        span = depth + 1
        # Every (holder h, rank, target g) entry -- g is h's rank-th nearest, rank 0 h itself --
        # as one integer key g * (n * span) + rank * n + h, sorted (a vectorised sort of int64:
        # with the three-key lexsorts it replaces the set-up took 2.9x as long at 1,000,000
        # hashtags x 100, BENCHMARKS.md).
        grid = n * span
        if n * grid >= 2**63:
            raise ValueError(f"{n} hashtags x depth {depth}: too many for the null model's int64 keys")
        key = np.empty((n, span), dtype=np.int64)
        key[:, 0] = np.arange(n)
        key[:, 1:] = nb
        valid = key >= 0
        key *= grid
        key += np.arange(span, dtype=np.int64) * n
        key += np.arange(n, dtype=np.int64)[:, None]
        key = key[valid]
        del valid
        key.sort()  # by g, rank, h
        starts = np.searchsorted(key, np.arange(n + 1, dtype=np.int64) * grid)
        holders = key % grid
        ranks = holders // n
        holders %= n
        #: w(A_g(k)) for every g and k < 0, 0, ..., depth (column k + 1): read by :meth:`_mass`.
        self._mass_by_rank = _masses_by_rank(self._w[holders], ranks, starts, depth)
        self._starts = starts
        # The same entries as one sortable key per g, holder * (depth + 1) + rank, sorted within
        # each g's run: a holder's entries are adjacent, smallest rank first.
        self._n, self._span = n, span
        key -= ranks * n + holders
        key += holders * span + ranks
        del holders, ranks
        key.sort()  # by g, h, rank
        key %= grid
        self._rev_keys = key
        self._drawn: list[float] = [0.0]  # s_t: expected mass drawn before draw t
        self._schedules: dict[int, npt.NDArray[np.float64]] = {}
        self._inclusions: dict[int, npt.NDArray[np.float64]] = {}
        self._columns: dict[tuple[int, ...], npt.NDArray[np.int64]] = {}
        self._hit_tables: OrderedDict[tuple[int, ...], _Hits] = OrderedDict()
        self._cache: OrderedDict[tuple[int, tuple[str, ...], tuple[int, ...]], list[float]] = OrderedDict()
        self._unions: OrderedDict[tuple[int, ...], tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = (
            OrderedDict()
        )
        self._cache_size = cache

    def prepare(self, ks: Sequence[int]) -> None:
        """Compute now what the first events asking for the grid ``ks`` would otherwise
        compute (the draw schedules, the inclusion probabilities and the hit table for every m
        the tables hold: ~0.2 s at 100,000 hashtags), so that the first events after a load
        cost what later ones do (issue 27 §2: cold scoring >= 0.9 of warm).  The same values:
        each is computed once either way."""
        k_tuple = tuple(ks)
        for m in range(1, _TABLED_DRAWS + 1):
            self._schedule(m)
            if m >= 2:
                self._included(m)
        if self.depth and len(self._w) and k_tuple:
            self._hits([0], _TABLED_DRAWS, k_tuple)

    def _schedule(self, m: int) -> npt.NDArray[np.float64]:
        """1 / (1 - s_t) for t < m (the total weight is 1)."""
        found = self._schedules.get(m)
        if found is not None:
            return found
        while len(self._drawn) < m:
            t = len(self._drawn)
            remaining = np.maximum(1.0 - np.asarray(self._drawn[:t]), 1e-12)
            # P(h drawn in the first t draws) for every h, then the expected mass drawn.
            not_drawn = np.prod(1.0 - np.minimum(self._w[:, None] / remaining[None, :], 1.0), axis=1)
            self._drawn.append(float(np.sum(self._w * (1.0 - not_drawn))))
        found = self._schedules[m] = 1.0 / np.maximum(1.0 - np.asarray(self._drawn[:m]), 1e-12)
        return found

    def _untouched(self, mass: npt.NDArray[np.float64], m: int) -> npt.NDArray[np.float64]:
        """P(no draw of m lands in a set of weight ``mass``), elementwise."""
        scale = self._schedule(m)
        untouched: npt.NDArray[np.float64] = np.prod(
            np.clip(1.0 - mass[..., None] * scale, 0.0, 1.0), axis=-1
        )
        return untouched

    def _included(self, m: int) -> npt.NDArray[np.float64]:
        """P(h in R) for every hashtag h when the null draws m (>= 2): 1 - P(no draw lands on h),
        once per m and version (in slices, so the temporaries stay small for any vocabulary)."""
        found = self._inclusions.get(m)
        if found is None:
            found = np.empty_like(self._w)
            step = 1 << 16
            for lo in range(0, len(self._w), step):
                found[lo : lo + step] = 1.0 - self._untouched(self._w[lo : lo + step], m)
            self._inclusions[m] = found
        return found

    def _hits(self, rows: Sequence[int], m: int, ks: tuple[int, ...]) -> list[list[float]]:
        """P(R ∩ A_g(k) ≠ ∅) for each g of ``rows`` (one list each) and k: some of the m draws
        lands among the hashtags with g among their k nearest."""
        if m > _TABLED_DRAWS:
            hits: list[list[float]] = self._hit_rows(np.asarray(rows, dtype=np.int64), m, ks).tolist()
            return hits
        every = self._hit_table(m, ks)
        # Row by row: a fancy index of a few rows costs more than the rest of an event's
        # expectation.
        return [every[g].tolist() for g in rows]

    def _hit_rows(self, rows: npt.NDArray[np.int64], m: int, ks: tuple[int, ...]) -> npt.NDArray[np.float64]:
        """:meth:`_hits` as one array (a row per g of ``rows``): the same values."""
        if m > _TABLED_DRAWS:
            untouched = self._untouched(self._mass_by_rank[rows][:, self._columns_of(ks)], m)
            return 1.0 - untouched
        return self._hit_table(m, ks)[rows]

    def _hit_table(self, m: int, ks: tuple[int, ...]) -> npt.NDArray[np.float64]:
        """Every hashtag's P(R ∩ A_g(k) ≠ ∅) for m <= :data:`_TABLED_DRAWS` draws (n x len(ks))."""
        table = self._hit_tables.get(ks)
        if table is None:
            if len(self._hit_tables) >= _TABLED_GRIDS:
                self._hit_tables.popitem(last=False)
            table = self._hit_tables[ks] = _Hits(self._mass_by_rank[:, self._columns_of(ks)])
        return table.at(m, self._schedule(m))

    def _mass(self, g: int | list[int], ks: tuple[int, ...]) -> npt.NDArray[np.float64]:
        """w(A_g(k)) for each k (one row per g when ``g`` is several): the weight of the
        hashtags with g among their k nearest (and g)."""
        return self._mass_by_rank[g][..., self._columns_of(ks)]

    def _columns_of(self, ks: tuple[int, ...]) -> npt.NDArray[np.int64]:
        """The columns of ``_mass_by_rank`` that answer each k."""
        columns = self._columns.get(ks)
        if columns is None:
            if len(self._columns) >= 64:  # grids of k are few; bounded all the same
                self._columns.clear()
            columns = self._columns[ks] = np.clip(np.asarray(ks, dtype=np.int64), -1, self.depth) + 1
        return columns

    def _union(self, rows: tuple[int, ...]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The holders of the union of the A_g (each once, with its smallest rank), by rank."""
        found = self._unions.get(rows)
        if found is None:
            starts, n, span = self._starts, self._n, self._span
            # Every (holder, rank) entry of the A_g, by holder and then rank.
            keys = np.concatenate([self._rev_keys[starts[g] : starts[g + 1]] for g in rows])
            if len(rows) > 1:
                keys.sort()
            holders = keys // span
            # A holder of several g (or twice in one table row) counts once, at its smallest
            # rank: the first of its entries.
            first = np.empty(len(keys), dtype=bool)
            first[:1] = True
            np.not_equal(holders[1:], holders[:-1], out=first[1:])
            holders = holders[first]
            ranks = keys[first] - holders * span
            # By rank, then holder.
            order = ranks * n + holders
            order.sort()
            found = (order % n, order // n)
            self._unions[rows] = found
            if len(self._unions) > self._cache_size:
                self._unions.popitem(last=False)
        return found

    def expected_many(
        self, requests: Sequence[tuple[int, Sequence[str]]], ks: Sequence[int]
    ) -> list[list[float]]:
        """:meth:`expected` for each ``(m, truth)`` of a batch, the same values: the unions of
        several ground-truth hashtags that are not cached yet (the costly case, |R| <= |G|)
        are computed together, a few sorts for the whole batch instead of a few per event,
        and cached; the sums of hit probabilities (|R| > |G|) and the single masses are read
        from the tables for the whole batch at once, uncached (a lookup costs less than a
        cache's bookkeeping).

        >>> import numpy as np
        >>> from stream.synonyms.neighbour_table import build_neighbour_table
        >>> unit = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
        >>> table = build_neighbour_table(["a", "b", "c", "d"], unit, [1, 1, 1, 1], depth=1, method="raw")
        >>> model = ChanceModel(table)
        >>> batch = model.expected_many([(1, ["a", "c"]), (3, ["a"])], [0, 1])
        >>> batch == [ChanceModel(table).expected(1, ["a", "c"], [0, 1]), model.expected(3, ["a"], [0, 1])]
        True
        """
        k_tuple = tuple(ks)
        out: list[list[float] | None] = [None] * len(requests)
        Key = tuple[int, tuple[str, ...], tuple[int, ...]]
        waiting: dict[Key, list[int]] = {}
        unions: list[tuple[Key, int, tuple[int, ...]]] = []  # |R| <= |G|, several hashtags
        sums: list[tuple[int, int, tuple[int, ...], int]] = []  # |R| > |G|
        singles: list[tuple[int, int]] = []  # one draw, one known hashtag: its mass
        ids, cache = self._ids, self._cache
        rows_of: dict[tuple[str, ...], tuple[int, ...]] = {}  # each ground truth's rows, once
        for i, (m, truth) in enumerate(requests):
            if m < 1 or not truth:
                out[i] = self.expected(m, truth, k_tuple)  # raises
                continue
            distinct = tuple(truth)
            rows = rows_of.get(distinct)
            if rows is None:
                rows = rows_of[distinct] = tuple(ids[g] for g in distinct if g in ids)
            if not rows:
                out[i] = [0.0] * len(k_tuple)
            elif m > len(distinct):  # a few lookups in the hit table: cheaper than any cache
                sums.append((i, m, rows, len(distinct)))
            elif len(rows) == 1 and m == 1:
                singles.append((i, rows[0]))
            else:
                key = (m, distinct, k_tuple)
                found = cache.get(key)
                if found is not None:
                    cache.move_to_end(key)
                    out[i] = found
                elif key in waiting:
                    waiting[key].append(i)
                else:
                    waiting[key] = [i]
                    unions.append((key, m, rows))
        results: dict[Key, list[float]] = {}
        chunk = 256  # unions per dense layout (bounds its memory)
        for lo in range(0, len(unions), chunk):
            part = unions[lo : lo + chunk]
            values = self._union_expectations([(m, rows) for _, m, rows in part], k_tuple)
            results.update(zip([key for key, _, _ in part], values, strict=True))
        for key, result in results.items():
            cache[key] = result
            for i in waiting[key]:
                out[i] = result
        while len(cache) > self._cache_size:
            cache.popitem(last=False)
        if sums:
            values = self._sum_expectations([(m, rows, n) for _, m, rows, n in sums], k_tuple)
            for (i, _, _, _), value in zip(sums, values, strict=True):
                out[i] = value
        if singles:  # P(h in R) = w_h for one draw
            masses = self._mass([g for _, g in singles], k_tuple).tolist()
            for (i, _), value in zip(singles, masses, strict=True):
                out[i] = value
        return out  # type: ignore[return-value]

    def _sum_expectations(
        self, items: Sequence[tuple[int, tuple[int, ...], int]], ks: tuple[int, ...]
    ) -> list[list[float]]:
        """For each (m, rows, |G|) with m > |G|, what :meth:`expected` computes: the mean over
        G of P(R ∩ A_g(k) ≠ ∅) -- the per-g terms added in the same order, for all at once."""
        lengths = np.fromiter((len(rows) for _, rows, _ in items), np.int64, len(items))
        flat = np.fromiter((g for _, rows, _ in items for g in rows), np.int64, int(lengths.sum()))
        item = np.repeat(np.arange(len(items)), lengths)
        place = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        ms = np.fromiter((m for m, _, _ in items), np.int64, len(items))[item]
        hits = np.zeros((len(items), int(lengths.max()), len(ks)))
        for m in np.unique(ms).tolist():  # one gather per number of draws
            chosen = ms == m
            hits[item[chosen], place[chosen]] = self._hit_rows(flat[chosen], m, ks)
        total = np.zeros((len(items), len(ks)))
        for j in range(hits.shape[1]):  # 0 + the first + the second ..., zeros after the last
            total += hits[:, j]
        means: list[list[float]] = (total / np.array([n for _, _, n in items])[:, None]).tolist()
        return means

    def _union_expectations(
        self, unions: Sequence[tuple[int, tuple[int, ...]]], ks: tuple[int, ...]
    ) -> list[list[float]]:
        """For each (m, rows), what :meth:`expected` computes through :meth:`_union` when
        m <= |G|: the running sum of P(h in R) over the union of the A_g in (rank, holder)
        order, read at each k and divided by m -- for all of them in one layout, with the
        same additions in the same order (so the same values)."""
        n, span = self._n, self._span
        stride = n * span
        groups = len(unions)
        if groups * stride >= 1 << 62:  # the packed keys would overflow: one at a time
            return [self._union_expectation(m, rows, ks) for m, rows in unions]
        segments = np.fromiter((g for _, rows in unions for g in rows), dtype=np.int64)
        group_of = np.fromiter((i for i, (_, rows) in enumerate(unions) for _ in rows), dtype=np.int64)
        lo, hi = self._starts[segments], self._starts[segments + 1]
        lengths = hi - lo
        begins = np.cumsum(lengths) - lengths
        where = np.arange(int(lengths.sum())) + np.repeat(lo - begins, lengths)
        # (group, holder, rank): a holder's entries in a group are adjacent, smallest rank first.
        packed = np.repeat(group_of, lengths) * stride + self._rev_keys[where]
        packed.sort()
        group, key = np.divmod(packed, stride)
        holder = key // span
        first = np.ones(len(packed), dtype=bool)
        first[1:] = (group[1:] != group[:-1]) | (holder[1:] != holder[:-1])
        group, holder, rank = group[first], holder[first], key[first] - holder[first] * span
        # (group, rank, holder): each union in the order of :meth:`_union`.
        packed = (group * span + rank) * n + holder
        packed.sort()
        group, key = np.divmod(packed, stride)
        holder = key % n
        ms = np.array([m for m, _ in unions], dtype=np.int64)
        inclusion = self._w[holder]
        for m in set(ms.tolist()) - {1}:
            chosen = ms[group] == m
            inclusion[chosen] = self._included(m)[holder[chosen]]
        # One row per union: 0, its P(h in R) in order, zeros after; running sums along rows.
        counts = np.bincount(group, minlength=groups)
        starts = np.cumsum(counts) - counts
        grid = np.zeros((groups, int(counts.max()) + 1))
        grid[group, np.arange(len(group)) - starts[group] + 1] = inclusion
        np.add.accumulate(grid, axis=1, out=grid)
        # How many entries of each union have rank <= k (ranks stop at the depth).
        top = (np.arange(groups)[:, None] * span + np.clip(np.asarray(ks), -1, span - 1)[None, :]) * n + n - 1
        covered = np.searchsorted(packed, top, side="right") - starts[:, None]
        values: list[list[float]] = (np.take_along_axis(grid, covered, axis=1) / ms[:, None]).tolist()
        return values

    def _union_expectation(self, m: int, rows: tuple[int, ...], ks: tuple[int, ...]) -> list[float]:
        """:meth:`expected` for m <= |G| through :meth:`_union` (one ground truth)."""
        holders, ranks = self._union(rows)
        # 0, then the running sum of P(h in R) over the union in (rank, holder) order.
        cumulative = np.zeros(len(holders) + 1)
        np.take(self._w if m == 1 else self._included(m), holders, out=cumulative[1:])
        np.add.accumulate(cumulative, out=cumulative)
        covered = ranks.searchsorted(ks, side="right")
        expected: list[float] = (cumulative[covered] / m).tolist()
        return expected

    def expected(self, m: int, truth: Sequence[str], ks: Sequence[int]) -> list[float]:
        """Expected #REval-hit-ratio of the null recommender drawing ``m`` hashtags, for
        ground truth ``truth`` (normalised, distinct), at each k of ``ks`` (k <= depth)."""
        if m < 1 or not truth:
            raise ValueError("the null recommender needs m >= 1 and a non-empty ground truth")
        k_tuple = tuple(ks)
        key = (m, tuple(truth), k_tuple)
        found = self._cache.get(key)
        if found is not None:
            self._cache.move_to_end(key)
            return found
        rows = tuple(self._ids[g] for g in truth if g in self._ids)
        if not rows:
            result = [0.0] * len(ks)
        elif m <= len(truth):
            # E[rho] = sum over the union B_k of the A_g(k) of P(h in R).
            if len(rows) == 1 and m == 1:
                result = self._mass(rows[0], k_tuple).tolist()  # P(h in R) = w_h for one draw
            else:
                result = self._union_expectation(m, rows, k_tuple)
        else:
            # The mean over G of the hit probabilities, in Python floats: the same additions
            # (0.0 + the first + ...) and division as in numpy, without its per-call cost.
            total = [0.0] * len(ks)
            for hit in self._hits(rows, m, k_tuple):
                total = list(map(operator.add, total, hit))
            result = [t / len(truth) for t in total]
        self._cache[key] = result
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return result


#: Up to how many draws (m) every hashtag's hit probabilities are tabled (per grid of k:
#: n x len(ks) x 8 bytes per m, 7.2 MB at 100,000 hashtags and 9 k), and for how many grids.
_TABLED_DRAWS = 10
_TABLED_GRIDS = 2


class _Hits:
    """P(R ∩ A_g(k) ≠ ∅) of every hashtag g at each k of one grid, for m = 1, 2, ... draws.

    Computed for all g together, when any is first asked for, so a ground truth's first event
    costs no more than its next (issue 12 §4).  The m draws miss A_g(k) with probability
    prod_{t<m} clip(1 - w(A_g(k)) / (1 - s_t)) (:meth:`ChanceModel._untouched`): each m
    multiplies the product of m - 1 by one more factor, the order ``np.prod`` multiplies them
    in, so the same floats."""

    def __init__(self, mass: npt.NDArray[np.float64]) -> None:
        self._mass = mass
        self._untouched = np.ones_like(mass)  # no draw yet
        self._by_draws: list[npt.NDArray[np.float64]] = []

    def at(self, m: int, scale: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """The n x len(ks) probabilities for m draws; ``scale`` is 1 / (1 - s_t) for t < m."""
        while len(self._by_draws) < m:
            factor = self._mass * scale[len(self._by_draws)]
            np.subtract(1.0, factor, out=factor)
            # np.clip(factor, 0.0, 1.0), in place: the same values, a third of the time.
            np.maximum(factor, 0.0, out=factor)
            np.minimum(factor, 1.0, out=factor)
            factor *= self._untouched  # the product so far (1.0 before the first) times it
            self._untouched = factor
            self._by_draws.append(1.0 - factor)
        return self._by_draws[m - 1]


def _masses_by_rank(
    weights: npt.NDArray[np.float64],
    ranks: npt.NDArray[np.int64],
    starts: npt.NDArray[np.int64],
    depth: int,
) -> npt.NDArray[np.float64]:
    """For runs of entries (run g: ``starts[g]:starts[g + 1]``, by rank, the first of rank 0:
    in :class:`ChanceModel` the hashtag itself), the running sum of ``weights`` along each run
    read after its last entry of rank <= r, for r = -1 (0.0), 0, ..., ``depth``: one row per
    run.  The sums are added along each run in order, as ``np.cumsum`` of the run adds them
    (so the same floats), for all runs at once: step p adds the p-th entry of every run that
    long (the longest runs first, so a prefix of them).  Memory: 8 (depth + 2) bytes per
    hashtag (58 MB at 100,000 x 70).

    >>> _masses_by_rank(np.array([0.5, 0.25, 0.125]), np.array([0, 2, 0]), np.array([0, 2, 3]), 2)
    array([[0.   , 0.5  , 0.5  , 0.75 ],
           [0.   , 0.125, 0.125, 0.125]])
    """
    n = len(starts) - 1
    lengths = np.diff(starts)
    longest_first = np.argsort(-lengths, kind="stable")
    heads = starts[:-1][longest_first]
    running = weights.copy()
    longer = np.sort(lengths)  # runs longer than p: n - (how many are <= p)
    for p in range(1, int(lengths.max(initial=0))):
        at = heads[: n - int(np.searchsorted(longer, p, side="right"))] + p
        running[at] = running[at - 1] + weights[at]
    # Each run's last entry of rank <= r, for every r: its entries of each rank counted, summed
    # along the ranks (in place: these are the largest temporaries of a version's load).
    span = depth + 1
    key = np.repeat(np.arange(n, dtype=np.int64) * span, lengths)
    key += ranks
    last = np.bincount(key, minlength=n * span).reshape(n, span)
    del key
    np.cumsum(last, axis=1, out=last)
    last += (starts[:-1] - 1)[:, None]
    out = np.zeros((n, span + 1))
    out[:, 1:] = running[last]
    return out
