"""Scoring recommendation events over a grid of k (synonyms) and r (top-r cut-offs), a batch at
a time, into columns.

:func:`score_batch` is the one code path behind ``reval score``, ``reval evaluate``, the
backtest and the streaming scoring worker, so live, replayed and offline numbers agree exactly;
:func:`score_event` is its one-event case.  A batch's events become rank matrices (one gather of
the recommended hashtags' neighbour rows, :meth:`stream.evaluation.neighbours.NeighbourCache.matrices`),
every signal of :data:`stream.evaluation.signals.SIGNALS` is computed for every (r, k) cell of every event
in numpy passes (:class:`stream.evaluation.rank_grid.RankGrid`), and the results stay columns
(:class:`ScoredBatch`: one array per signal) until a consumer needs records
(:meth:`ScoredBatch.records`, the scores topic's JSON) or sums (:mod:`stream.evaluation.quality`).
``tests/oracle.py`` scores one event at a time by the definitions and the tests compare, to the
last bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from stream.evaluation.chance import MIN_ROOM
from stream.evaluation.metrics import ExactScores
from stream.evaluation.neighbours import NeighbourCache
from stream.evaluation.rank import DCG, RankWeights
from stream.evaluation.rank_grid import RankGrid
from stream.evaluation.signals import RECORD_KEYS, SIGNALS
from stream.evaluation.slices import SLICES, Bands
from stream.intake.records import Recommendation

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Flags = npt.NDArray[np.bool_]

DEFAULT_KS: tuple[int, ...] = (0, 5, 10, 20, 30, 40, 50, 60, 70)
DEFAULT_RS: tuple[int | None, ...] = (1, 5, 10)
ALL = None  # an r of None means "the whole recommended list"


def r_label(r: int | None) -> str:
    return "all" if r is None else str(r)


def parse_ints(text: str, *, allow_all: bool = False) -> tuple[int | None, ...]:
    """Parse ``"0,5,10"`` (and ``"all"`` when allowed) into sorted, distinct values.

    >>> parse_ints("10, 0,5,5"), parse_ints("1,all", allow_all=True)
    ((0, 5, 10), (1, None))
    """
    values: set[int | None] = set()
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        if allow_all and part == "all":
            values.add(None)
            continue
        try:
            number = int(part)
        except ValueError:
            raise ValueError(f"{part!r} is not a whole number in {text!r}") from None
        if number < (1 if allow_all else 0):
            raise ValueError(f"{number} is out of range in {text!r}")
        values.add(number)
    if not values:
        raise ValueError(f"no values in {text!r}")
    return tuple(sorted(values, key=lambda v: (v is None, v or 0)))


@dataclass(frozen=True)
class ScoredBatch:
    """The scores of a batch of events, as columns: one |B| x |r| x |k| array per signal
    (:data:`stream.evaluation.signals.SIGNALS`), the null model's expectations, the exact-match metrics
    and the popularity slices.  Rows of unscorable events hold zeros and are never read as
    scores (:attr:`scorable`).

    >>> from stream.synonyms.thesaurus import JsonThesaurus
    >>> cache = NeighbourCache(JsonThesaurus({"flood": ["rain"], "rain": ["flood"]}), max_k=1)
    >>> events = [Recommendation("1", ("rain", "help")), Recommendation("2", ())]
    >>> batch = score_batch([(events[0], ["flood"]), (events[1], ["flood"])], cache, ks=[0, 1])
    >>> batch.values["reval_hit_ratio"][0].tolist(), batch.unscorable
    ([[0.0, 1.0]], [None, 'empty_recommended'])
    >>> batch.records()[0]["reval_reciprocal_rank"]
    {'all': {'0': 0.0, '1': 1.0}}
    """

    tweet_ids: list[str]
    recommenders: list[str]
    version: str
    ks: tuple[int, ...]
    #: The r labels (``"1"``, ``"5"``, ``"all"``), in order: the middle axis of every array.
    rs: tuple[str, ...]
    unscorable: list[str | None]  # None, empty_recommended or empty_ground_truth
    n_recommended: Ints
    unknown_recommended: Ints  # recommended hashtags the thesaurus lacks
    #: Each signal's values by key: |B| x |r| x |k|.
    values: dict[str, Floats]
    #: The null recommender's expected #REval-hit-ratio (:mod:`stream.evaluation.chance`), |B| x |r| x |k|;
    #: None when the thesaurus has no null model.  The chance correction of a set of events is
    #: the kappa of its sums (:func:`stream.evaluation.chance.corrected_of_sums`), never a mean.
    expected: Floats | None
    #: The exact-match metrics (:attr:`stream.evaluation.metrics.ExactScores.NAMES`), |B| x |r| x 5.
    exact: Floats
    #: #REval-hit-ratio on each popularity slice's ground truths (:mod:`stream.evaluation.slices`): which
    #: events have a ground truth in the slice, and their values (|B| x |r| x |k|).
    slices: dict[str, tuple[Flags, Floats]]

    def __len__(self) -> int:
        return len(self.tweet_ids)

    @property
    def scorable(self) -> Flags:
        return np.fromiter((u is None for u in self.unscorable), bool, len(self.unscorable))

    def corrected(self) -> Floats | None:
        """Each event's own chance-corrected score, ``(observed - expected) / (1 - expected)``,
        NaN where the expectation leaves no room (:data:`stream.evaluation.chance.MIN_ROOM`): for one event
        only -- a set of events is corrected from its sums."""
        if self.expected is None:
            return None
        room = 1.0 - self.expected
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = (self.values["reval_hit_ratio"] - self.expected) / room
        out: Floats = np.where(room > MIN_ROOM, ratio, np.nan)
        return out

    def records(self) -> list[dict[str, Any]]:
        """Each event's scores record (the scores topic's JSON, keys in the order of
        :data:`stream.evaluation.signals.RECORD_KEYS`): ``{r: {k: value}}`` per signal.  Events with
        the same cell of a signal share one dict (never modified)."""
        columns = [c.per_event() if isinstance(c, CellRows) else c for c in self.columns().values()]
        return [dict(zip(RECORD_KEYS, row, strict=True)) for row in zip(*columns, strict=True)]

    def columns(self) -> dict[str, Sequence[Any] | CellRows]:
        """The records as columns, by key in the order of :data:`stream.evaluation.signals.RECORD_KEYS`:
        the per-event fields as lists, each signal's cells as :class:`CellRows` (an
        unscorable event's cells are all ``{}``).  What
        :meth:`records` assembles, and what a writer of the records' bytes encodes -- each
        distinct cell once."""
        keys = [str(k) for k in self.ks]
        rs = self.rs
        n = len(self)
        scorable = self.scorable
        empty = CellRows(np.zeros((1, 0)), np.zeros(n, dtype=np.int64), (), ())  # {} for every event
        cells: dict[str, CellRows] = {}
        for signal in SIGNALS:
            cells[signal.key] = _shared_cells(self.values[signal.key], rs, keys, scorable)
        cells["exact"] = _shared_cells(self.exact, rs, list(ExactScores.NAMES), scorable)
        corrected = self.corrected()
        if corrected is None or self.expected is None:
            cells["reval_hit_ratio_expected"] = cells["reval_hit_ratio_corrected"] = empty
        else:
            # The null model's expectations vary with the ground truth: events rarely share a
            # row, so none is looked for.
            cells["reval_hit_ratio_expected"] = _shared_cells(
                self.expected, rs, keys, scorable, distinct=False
            )
            cells["reval_hit_ratio_corrected"] = _shared_cells(
                corrected, rs, keys, scorable, nan_is_none=True, distinct=False
            )
        cells["reval_hit_ratio_slices"] = self._slice_cells(keys, scorable) if self.slices else empty
        fields: dict[str, Sequence[Any]] = {
            "tweet_id": self.tweet_ids,
            "recommender": self.recommenders,
            "thesaurus_version": [self.version] * n,
            "scorable": scorable.tolist(),
            "unscorable_reason": self.unscorable,
            "unknown_recommended": self.unknown_recommended.tolist(),
            "n_recommended": self.n_recommended.tolist(),
        }
        return {key: fields[key] if key in fields else cells[key] for key in RECORD_KEYS}

    def _slice_cells(self, keys: list[str], scorable: Flags) -> CellRows:
        """Each event's ``{r: {slice: {k: value}}}`` over the slices its ground truth falls in."""
        names = tuple(name for name in SLICES if name in self.slices)
        n = len(self)
        present = np.stack([self.slices[name][0] for name in names], axis=1)
        # |B| x |r| x slices x |k|, zeros where the event has no ground truth in the slice.
        values = np.stack([self.slices[name][1] for name in names], axis=2)
        values = np.where(present[:, None, :, None], values, 0.0).reshape(n, -1)
        rows, index = _distinct_rows(np.concatenate([present.astype(np.float64), values], axis=1))
        return CellRows(rows, np.where(scorable, index, -1), self.rs, tuple(keys), groups=names)

    def take(self, rows: Sequence[int]) -> ScoredBatch:
        """The batch of these events only, in this order."""
        at = np.asarray(rows, dtype=np.int64)
        return replace(
            self,
            tweet_ids=[self.tweet_ids[i] for i in rows],
            recommenders=[self.recommenders[i] for i in rows],
            unscorable=[self.unscorable[i] for i in rows],
            n_recommended=self.n_recommended[at],
            unknown_recommended=self.unknown_recommended[at],
            values={key: v[at] for key, v in self.values.items()},
            expected=None if self.expected is None else self.expected[at],
            exact=self.exact[at],
            slices={name: (p[at], v[at]) for name, (p, v) in self.slices.items()},
        )

    def event(self, i: int) -> EventScore:
        """Event ``i``'s scores as one object (the offline commands' and tests' view)."""
        return EventScore(self, i)


@dataclass(frozen=True)
class CellRows:
    """A signal's cells as their distinct rows of floats: event ``i``'s cell is
    ``{r: {key: value}}`` of ``rows[index[i]]`` (r-major), or ``{}`` where ``index[i]`` is -1
    (an unscorable event).  ``nan_is_none``: a NaN is written None (the corrected score
    where the expectation leaves no room).  With ``groups`` (the popularity slices) the cell
    has a middle level, ``{r: {group: {key: value}}}``, over the groups a row has: its first
    ``len(groups)`` columns flag them (1.0 or 0.0), the rest are r-major, then group, then
    key (every group's values there, read only where flagged).  A writer of the records'
    bytes formats the rows without building the dicts; :meth:`shared` builds them, once per
    distinct row.

    >>> cells = CellRows(np.array([[0.5, 1.0]]), np.array([0, -1]), ("all",), ("0", "5"))
    >>> cells.shared().per_event()
    [{'all': {'0': 0.5, '5': 1.0}}, {}]
    >>> row = np.array([[0.0, 1.0, 0.0, 0.5]])  # flags head, tail; then all: head, tail
    >>> sliced = CellRows(row, np.array([0]), ("all",), ("0",), groups=("head", "tail"))
    >>> sliced.shared().per_event()
    [{'all': {'tail': {'0': 0.5}}}]
    """

    rows: Floats
    index: Ints
    rs: tuple[str, ...]
    keys: tuple[str, ...]
    nan_is_none: bool = False
    groups: tuple[str, ...] = ()

    def layout(self, flags: Sequence[float]) -> list[tuple[str, list[tuple[str | None, int]]]]:
        """Where a row's values go, for a row with these group ``flags``: for each r label,
        ``(group or None, column of the group's first key)`` in the cell's order."""
        width, n_groups = len(self.keys), len(self.groups)
        if not n_groups:
            return [(label, [(None, j * width)]) for j, label in enumerate(self.rs)]
        present = [g for g in range(n_groups) if flags[g]]
        return [
            (label, [(self.groups[g], n_groups + (j * n_groups + g) * width) for g in present])
            for j, label in enumerate(self.rs)
        ]

    def shared(self) -> Shared:
        keys, n_groups = self.keys, len(self.groups)

        def cell(values: list[float]) -> dict[str, Any]:
            row: list[float | None] = (
                [None if v != v else v for v in values] if self.nan_is_none else [*values]
            )
            out: dict[str, Any] = {}
            for label, places in self.layout(values[:n_groups]):
                found = [
                    (group, dict(zip(keys, row[at : at + len(keys)], strict=True))) for group, at in places
                ]
                out[label] = found[0][1] if not n_groups else dict(found)
            return out

        values = [cell(row) for row in self.rows.tolist()]
        if (self.index < 0).any():
            values.append({})
        return Shared(values, np.where(self.index < 0, len(values) - 1, self.index))

    def per_event(self) -> list[Any]:
        return self.shared().per_event()


@dataclass(frozen=True)
class Shared:
    """A column whose events share a few distinct values: event ``i``'s is
    ``values[index[i]]``.

    >>> Shared(["a", "b"], np.array([1, 0, 1])).per_event()
    ['b', 'a', 'b']
    """

    values: list[Any]
    index: Ints

    def per_event(self) -> list[Any]:
        values = self.values
        return [values[j] for j in self.index.tolist()]


def _shared_cells(
    cells: Floats,
    rs: Sequence[str],
    keys: Sequence[str],
    scorable: Flags,
    nan_is_none: bool = False,
    distinct: bool = True,
) -> CellRows:
    """The distinct event rows of a |B| x |r| x len(keys) array (bytes: -0.0 and NaN are rows
    of their own; every event's own row when not ``distinct``), and which each event has (-1:
    not ``scorable``)."""
    n, n_r = cells.shape[:2]
    flat = cells.reshape(n, n_r * len(keys))
    rows, index = _distinct_rows(flat) if distinct else (flat, np.arange(n, dtype=np.int64))
    return CellRows(rows, np.where(scorable, index, -1), tuple(rs), tuple(keys), nan_is_none)


def _distinct_rows(flat: Floats) -> tuple[Floats, Ints]:
    """The distinct rows of ``flat`` (compared as bytes: -0.0 and NaN are rows of their own)
    and each row's index among them; rows without columns are one row, no rows none."""
    n = len(flat)
    if n == 0 or flat.shape[1] == 0:
        return flat[:1], np.zeros(n, dtype=np.int64)
    flat = np.ascontiguousarray(flat)
    void = flat.view(np.dtype((np.void, flat.dtype.itemsize * flat.shape[1]))).ravel()
    _, first, inverse = np.unique(void, return_index=True, return_inverse=True)
    return flat[first], inverse.ravel().astype(np.int64)


class EventScore:
    """The scores of one event of a :class:`ScoredBatch`: ``reval[r][k]``, ``exact[r]``, ...
    with r labels (``"1"``, ``"5"``, ``"all"``) and int k; every cell is empty when the event is
    unscorable."""

    __slots__ = ("batch", "index")

    def __init__(self, batch: ScoredBatch, index: int) -> None:
        self.batch = batch
        self.index = index

    @property
    def tweet_id(self) -> str:
        return self.batch.tweet_ids[self.index]

    @property
    def recommender(self) -> str:
        return self.batch.recommenders[self.index]

    @property
    def thesaurus_version(self) -> str:
        return self.batch.version

    @property
    def unscorable(self) -> str | None:
        return self.batch.unscorable[self.index]

    @property
    def n_recommended(self) -> int:
        return int(self.batch.n_recommended[self.index])

    @property
    def unknown_recommended(self) -> int:
        return int(self.batch.unknown_recommended[self.index])

    def _by_r(self, cells: Floats | None) -> dict[str, dict[int, float]]:
        if cells is None or self.unscorable is not None:
            return {}
        rows = cells[self.index].tolist()
        return {
            label: dict(zip(self.batch.ks, row, strict=True))
            for label, row in zip(self.batch.rs, rows, strict=True)
        }

    @property
    def values(self) -> dict[str, dict[str, dict[int, float]]]:
        """Every signal's ``{r: {k: value}}``, by signal key."""
        return {key: self._by_r(cells) for key, cells in self.batch.values.items()}

    @property
    def reval(self) -> dict[str, dict[int, float]]:
        return self._by_r(self.batch.values["reval_hit_ratio"])

    @property
    def ranked(self) -> dict[str, dict[int, float]]:
        """Rank-aware #REval-hit-ratio (:mod:`stream.evaluation.rank`, DCG weights unless asked otherwise)."""
        return self._by_r(self.batch.values["reval_hit_ratio_ranked"])

    @property
    def precision(self) -> dict[str, dict[int, float]]:
        """The precision form of #REval (:func:`stream.evaluation.metrics.reval_precision_by_k`)."""
        return self._by_r(self.batch.values["reval_hit_ratio_precision"])

    @property
    def expected(self) -> dict[str, dict[int, float]]:
        """The null recommender's expected #REval-hit-ratio, when the thesaurus has a null model."""
        return self._by_r(self.batch.expected)

    @property
    def corrected(self) -> dict[str, dict[int, float | None]]:
        """This one event's chance-corrected score (None where the expectation is 1: no room)."""
        found = self._by_r(self.batch.corrected())
        return {r: {k: None if v != v else v for k, v in by_k.items()} for r, by_k in found.items()}

    @property
    def exact(self) -> dict[str, ExactScores]:
        if self.unscorable is not None:
            return {}
        rows = self.batch.exact[self.index].tolist()
        return {label: ExactScores(*row) for label, row in zip(self.batch.rs, rows, strict=True)}

    @property
    def slices(self) -> dict[str, dict[str, dict[int, float]]]:
        """``slices[r][slice][k]``, only the slices the event's ground truth falls in."""
        if self.unscorable is not None or not self.batch.slices:
            return {}
        out: dict[str, dict[str, dict[int, float]]] = {label: {} for label in self.batch.rs}
        for name in SLICES:
            found = self.batch.slices.get(name)
            if found is None or not found[0][self.index]:
                continue
            for label, row in zip(self.batch.rs, found[1][self.index].tolist(), strict=True):
                out[label][name] = dict(zip(self.batch.ks, row, strict=True))
        return out

    def to_json(self) -> dict[str, Any]:
        """The event's scores record (:meth:`ScoredBatch.records`)."""
        return self.batch.take([self.index]).records()[0]

    def __repr__(self) -> str:
        return f"EventScore({self.tweet_id!r}, {self.recommender!r}, unscorable={self.unscorable!r})"


def score_batch(
    events: Sequence[tuple[Recommendation, Sequence[str]]],
    cache: NeighbourCache,
    ks: Sequence[int] = DEFAULT_KS,
    rs: Sequence[int | None] = (ALL,),
    weights: RankWeights = DCG,
) -> ScoredBatch:
    """Score each ``(event, truth)`` for every (r, k) and every signal; ``truth`` is the event's
    or its joined tweet's ground truth.

    Events are padded to the largest |R| x |G| within groups of similar sizes
    (:func:`_shape_group`), so one event of 100 hashtags does not make every other one cost as
    much; every r with the same number of rows is computed once.
    """
    ks = list(dict.fromkeys(ks))  # a k twice is one key of the records
    rs = list(dict.fromkeys(rs))
    labels = tuple(r_label(r) for r in rs)
    n = len(events)
    shape = (n, len(rs), len(ks))
    values = {signal.key: np.zeros(shape) for signal in SIGNALS}
    chance, bands = cache.chance, cache.bands
    expected = np.zeros(shape) if chance is not None else None
    exact = np.zeros((n, len(rs), len(ExactScores.NAMES)))
    slices: dict[str, tuple[Flags, Floats]] = {}
    unscorable: list[str | None] = [None] * n
    n_recommended = np.zeros(n, dtype=np.int64)
    unknown = np.zeros(n, dtype=np.int64)
    groups: dict[tuple[int, int], list[tuple[int, list[str], list[str]]]] = {}
    count_known = cache.count_known
    for b, (event, truth) in enumerate(events):
        recommended = list(dict.fromkeys(event.recommended))
        distinct = list(dict.fromkeys(truth))
        n_recommended[b] = len(recommended)
        if not recommended:
            unscorable[b] = "empty_recommended"
        elif not distinct:
            unscorable[b] = "empty_ground_truth"
        else:
            unknown[b] = len(recommended) - count_known(recommended)
            group = (_shape_group(len(recommended)), _shape_group(len(distinct)))
            groups.setdefault(group, []).append((b, recommended, distinct))
    for members in groups.values():
        at = np.array([b for b, _, _ in members], dtype=np.int64)
        recs = [rec for _, rec, _ in members]
        truths = [truth for _, _, truth in members]
        grid = RankGrid(
            cache.matrices(recs, truths),
            np.fromiter(map(len, recs), np.int64, len(recs)),
            np.fromiter(map(len, truths), np.int64, len(truths)),
            ks,
            weights,
        )
        columns = (
            [(name, grid.slice(cols)) for name, cols in _slice_columns(grid, truths, bands)]
            if bands is not None
            else []
        )
        by_rows: dict[bytes, tuple[Ints, dict[str, Floats]]] = {}  # one set per distinct row count
        for j, r in enumerate(rs):
            m = grid.rows(r)
            found = by_rows.get(m.tobytes())
            if found is None:
                found = by_rows[m.tobytes()] = (m, {s.key: s.values(grid, m) for s in SIGNALS})
            for signal_key, cells in found[1].items():
                values[signal_key][at, j] = cells
            exact[at, j] = grid.exact(m)
            for name, units in columns:
                if name not in slices:
                    slices[name] = (np.zeros(n, bool), np.zeros(shape))
                present, sliced = slices[name]
                present[at] = units.n_truth > 0
                sliced[at, j] = grid.slice_reval(m, units, found[1]["reval_hit_ratio"])
        if chance is not None and expected is not None:
            distinct_m = [m for m, _ in by_rows.values()]
            requests = [(int(m[i]), truth) for m in distinct_m for i, truth in enumerate(truths)]
            asked = np.array(chance.expected_many(requests, ks), dtype=np.float64)
            asked = asked.reshape(len(distinct_m), len(truths), len(ks))
            row_of = {m.tobytes(): i for i, m in enumerate(distinct_m)}
            for j, r in enumerate(rs):
                expected[at, j] = asked[row_of[grid.rows(r).tobytes()]]
    return ScoredBatch(
        tweet_ids=[event.tweet_id for event, _ in events],
        recommenders=[event.recommender for event, _ in events],
        version=cache.version,
        ks=tuple(ks),
        rs=labels,
        unscorable=unscorable,
        n_recommended=n_recommended,
        unknown_recommended=unknown,
        values=values,
        expected=expected,
        exact=exact,
        slices={name: slices[name] for name in SLICES if name in slices},
    )


def score_event(
    event: Recommendation,
    truth: Sequence[str],
    cache: NeighbourCache,
    ks: Sequence[int] = DEFAULT_KS,
    rs: Sequence[int | None] = (ALL,),
    weights: RankWeights = DCG,
) -> EventScore:
    """Score one event for every (r, k): :func:`score_batch` of a batch of one."""
    return score_batch([(event, truth)], cache, ks, rs, weights).event(0)


def _shape_group(n: int) -> int:
    """The group of a list of ``n`` hashtags: lists up to 16 long are one group (the usual
    event), longer ones go by the next power of two.

    >>> [_shape_group(n) for n in (1, 10, 16, 17, 100)]
    [16, 16, 16, 32, 128]
    """
    return max(16, 1 << (n - 1).bit_length())


def _slice_columns(grid: RankGrid, truths: Sequence[Sequence[str]], bands: Bands) -> list[tuple[str, Flags]]:
    """Each slice's columns (|B| x max|G| flags): :func:`stream.evaluation.slices.columns_by_slice`."""
    labels = np.full(grid.matrix.shape[::2], -1, dtype=np.int64)
    index = {name: s for s, name in enumerate(SLICES)}
    for b, truth in enumerate(truths):
        labels[b, : len(truth)] = [index[bands.of(g)] for g in truth]
    return [(name, labels == s) for s, name in enumerate(SLICES) if (labels == s).any()]
