"""Scoring recommendation events over a grid of k (synonyms) and r (top-r cut-offs).

This is the one code path behind ``reval score``, ``reval evaluate`` and the
streaming scoring worker, so live, replayed and offline numbers agree exactly.
Each hashtag's neighbours are asked of the thesaurus once, at the largest k, as
synonym ranks, so every smaller k is answered from the same look-up (cached per
thesaurus version; on a neighbour table, read from its rows with nothing to cache).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
import numpy.typing as npt

from stream.chance import ChanceModel, CorrectedSum, corrected_of_sums
from stream.metrics import (
    FAR,
    ExactScores,
    Mean,
    exact_from_ranks,
    rank_matrix,
    reval_by_k,
    reval_precision_by_k,
)
from stream.neighbour_table import NeighbourTable
from stream.rank import DCG, RankWeights, ranked_by_k
from stream.records import Recommendation
from stream.slices import Bands, columns_by_slice, slice_scores
from stream.thesaurus import Thesaurus

Ranks = npt.NDArray[np.int64]
"""Rank matrices of a batch, |B| x max|R| x max|G|, padded with :data:`~stream.metrics.FAR`."""

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


class NeighbourCache:
    """Synonym ranks of one thesaurus version, fetched once at ``max_k`` per hashtag.

    For each hashtag the cache keeps ``{synonym: rank}``: 0 for the hashtag itself
    and i for its i-th nearest neighbour, so ``g`` is in Syn_k(h) exactly when its
    rank is <= k -- one look-up answers every k.  Hashtags the thesaurus lacks are
    not cached (Syn(h) = {h}), and the cache is bounded (least recently used go
    first), so a stream of ever-new hashtags cannot grow it without limit.

    A neighbour table (``thesaurus`` itself, or ``table`` behind it) is searched instead
    (:class:`RowSearch`): no per-hashtag state, so the first event of a version scores as
    fast as the next ones.

    ``chance`` is the version's null model (:class:`stream.chance.ChanceModel`); with it,
    scores carry the null's expected #REval-hit-ratio too (what the chance correction of
    any set of events is computed from).
    """

    def __init__(
        self,
        thesaurus: Thesaurus,
        max_k: int,
        max_entries: int = 200_000,
        *,
        chance: ChanceModel | None = None,
        bands: Bands | None = None,
        table: NeighbourTable | None = None,
    ) -> None:
        self.thesaurus = thesaurus
        #: The version's popularity bands (:mod:`stream.slices`); None: no slices.
        self.bands = bands
        self.max_k = max_k
        self.max_entries = max_entries
        self.chance = chance
        self._ranks: OrderedDict[str, dict[str, int]] = OrderedDict()
        self.queries = 0
        if table is None and isinstance(thesaurus, NeighbourTable):
            table = thesaurus
        # Larger tables than a string can index (over a million hashtags) keep the dictionaries.
        self._search = (
            RowSearch(table, max_k) if table is not None and len(table) <= RowSearch.LIMIT else None
        )

    @property
    def version(self) -> str:
        return self.thesaurus.version

    def ranks(self, hashtag: str) -> dict[str, int]:
        found = self._ranks.get(hashtag)
        if found is not None:
            self._ranks.move_to_end(hashtag)
            return found
        if hashtag not in self.thesaurus or not self.max_k:
            return {hashtag: 0}
        self.queries += 1
        found = {}
        for rank, name in enumerate(self.thesaurus.neighbours(hashtag, self.max_k), start=1):
            found.setdefault(name, rank)
        found[hashtag] = 0
        self._ranks[hashtag] = found
        if len(self._ranks) > self.max_entries:
            self._ranks.popitem(last=False)
        return found

    def matrix(self, recommended: Sequence[str], truth: Sequence[str]) -> list[list[int]]:
        """:func:`stream.metrics.rank_matrix` with :meth:`ranks` (the same matrix)."""
        if self._search is not None:
            return self._search.matrix(recommended, truth)
        return rank_matrix(recommended, truth, self.ranks)

    def matrices(self, recommended: Sequence[Sequence[str]], truths: Sequence[Sequence[str]]) -> Ranks:
        """:meth:`matrix` of each ``(recommended[b], truths[b])``, as one array padded with FAR
        (:meth:`RowSearch.matrices` on a neighbour table: one gather for the batch)."""
        if self._search is not None:
            return self._search.matrices(recommended, truths)
        out = np.full((len(recommended), max(map(len, recommended)), max(map(len, truths))), FAR, np.int64)
        for b, (rec, truth) in enumerate(zip(recommended, truths, strict=True)):
            out[b, : len(rec), : len(truth)] = self.matrix(rec, truth)
        return out

    def known(self, hashtag: str) -> bool:
        return hashtag in self.thesaurus


class RowSearch:
    """Synonym ranks read straight from a neighbour table's rows, for every hashtag at once.

    Building a ``{synonym: rank}`` dictionary for each new hashtag made the first pass over a
    version ~3x slower than the next (issue 12 §4); a search in the row costs the same every
    time.  Each row's first ``max_k`` neighbour ids (without the -1 gaps, as
    :meth:`stream.neighbour_table.NeighbourTable.neighbours` reads them) are one stretch of a
    string, id i as the character ``chr(i + 1)`` (``chr(0)`` pads): ``str.find`` of a ground
    truth's character in a recommended hashtag's stretch is its rank - 1, and a neighbour
    listed twice keeps its first rank, as :meth:`NeighbourCache.ranks` does.  Memory: 2 bytes
    per table entry below 65,535 hashtags, 4 above (28 MB at 100,000 x 70).

    >>> from stream.neighbour_table import build_neighbour_table
    >>> unit = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    >>> table = build_neighbour_table(["a", "b", "c"], unit, depth=2, method="raw")
    >>> RowSearch(table, 2).matrix(["a", "c", "new"], ["b", "c", "new"])
    [[1, 2, 1073741824], [1, 0, 1073741824], [1073741824, 1073741824, 0]]
    """

    #: Hashtags a table may have: one character each (Unicode ends at 0x10FFFF).
    LIMIT = 0x10FFFF

    def __init__(self, table: NeighbourTable, max_k: int) -> None:
        if max_k > table.depth and table.depth < len(table) - 1:
            raise ValueError(f"this thesaurus holds {table.depth} neighbours per hashtag; k={max_k} is more")
        if len(table) > self.LIMIT:
            raise ValueError(f"{len(table)} hashtags: more than {self.LIMIT} characters")
        ids = table.neighbour_ids[:, :max_k]
        if np.any((ids[:, :-1] < 0) & (ids[:, 1:] >= 0)):
            # A gap before a neighbour: the neighbours after it move up (stable sort, -1s last).
            ids = np.take_along_axis(ids, np.argsort(ids < 0, axis=1, kind="stable"), axis=1)
        # UTF-32 is how to make a string of these characters at once; lone surrogates included.
        self._rows = (ids + 1).astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")
        self._width = ids.shape[1]
        self._ids = {name: i for i, name in enumerate(table.hashtags)}
        self._array: npt.NDArray[np.int32] | None = None  # the same rows as ids, for a batch

    def _table(self) -> npt.NDArray[np.int32]:
        """The rows as an n x width array of ids (-1 pads), made on first use: the batch path
        gathers its rows at once (4 bytes per entry beside the string's 2 or 4)."""
        if self._array is None:
            rows = np.frombuffer(self._rows.encode("utf-32-le", "surrogatepass"), dtype="<u4")
            self._array = (rows.astype(np.int64) - 1).astype(np.int32).reshape(len(self._ids), self._width)
        return self._array

    def matrices(self, recommended: Sequence[Sequence[str]], truths: Sequence[Sequence[str]]) -> Ranks:
        """:meth:`matrix` of each ``(recommended[b], truths[b])`` as one |B| x max|R| x max|G|
        array (:data:`~stream.metrics.FAR` pads), from one gather of the recommended hashtags'
        rows: the same entries."""
        index = self._ids.get
        n_rec = max(map(len, recommended))
        n_truth = max(map(len, truths))
        rec_ids = np.full((len(recommended), n_rec), -1, dtype=np.int64)
        truth_ids = np.full((len(recommended), n_truth), -2, dtype=np.int64)  # never an entry of a row
        strangers: list[tuple[int, int, int]] = []  # (b, i, j): an unknown hashtag on both sides, equal
        for b, (rec, truth) in enumerate(zip(recommended, truths, strict=True)):
            hs = [index(h, -1) for h in rec]
            gs = [index(g, -2) for g in truth]
            rec_ids[b, : len(hs)] = hs
            truth_ids[b, : len(gs)] = gs
            if -1 in hs and -2 in gs:
                at = {g: j for j, g in enumerate(truth)}
                strangers += [(b, i, at[h]) for i, h in enumerate(rec) if hs[i] < 0 and h in at]
        rows = self._table()[np.maximum(rec_ids, 0)]  # B x R x width: the one gather
        hit = rows[:, :, None, :] == truth_ids[:, None, :, None]  # B x R x G x width
        # str.find's answer: the first position holding g, + 1 (its rank); none: FAR.
        found = np.where(hit.any(axis=3), hit.argmax(axis=3) + 1, FAR) if self._width else FAR
        known = rec_ids[:, :, None] >= 0
        same = known & (rec_ids[:, :, None] == truth_ids[:, None, :])  # the hashtag itself: rank 0
        matrix = np.where(same, 0, np.where(known, found, FAR))
        for b, i, j in strangers:  # Syn(h) = {h} for a hashtag the table lacks
            matrix[b, i, j] = 0
        return matrix

    def matrix(self, recommended: Sequence[str], truth: Sequence[str]) -> list[list[int]]:
        """:func:`stream.metrics.rank_matrix` of ``recommended`` x ``truth`` on this table."""
        index, find, width = self._ids.get, self._rows.find, self._width
        columns = []
        for g in truth:
            j = index(g)
            columns.append((g, j, None if j is None else chr(j + 1)))
        matrix = []
        for h in recommended:
            i = index(h)
            if i is None:  # Syn(h) = {h}
                matrix.append([0 if g == h else FAR for g, _, _ in columns])
                continue
            start = i * width
            end = start + width
            row = []
            for _, j, char in columns:
                if j == i:
                    row.append(0)
                elif char is None:  # a ground truth the thesaurus lacks: no one's synonym
                    row.append(FAR)
                else:
                    at = find(char, start, end)
                    row.append(FAR if at < 0 else at - start + 1)
            matrix.append(row)
        return matrix


@dataclass(frozen=True)
class EventScore:
    """The scores of one event.  ``reval[r][k]`` and ``exact[r]`` use r labels
    (``"1"``, ``"5"``, ``"all"``); both are empty when the event is unscorable."""

    tweet_id: str
    recommender: str
    thesaurus_version: str
    unscorable: str | None = None  # empty_recommended | empty_ground_truth
    reval: dict[str, dict[int, float]] = field(default_factory=dict)
    #: The null recommender's expected #REval-hit-ratio (:mod:`stream.chance`) for this event,
    #: when the thesaurus has a null model: the chance correction of a set of events is the
    #: kappa of its sums (:func:`stream.chance.corrected_of_sums`), never a mean of per-event values.
    expected: dict[str, dict[int, float]] = field(default_factory=dict)
    exact: dict[str, ExactScores] = field(default_factory=dict)
    unknown_recommended: int = 0  # recommended hashtags the thesaurus lacks
    n_recommended: int = 0
    #: Rank-aware #REval-hit-ratio (:mod:`stream.rank`, DCG weights unless asked otherwise).
    ranked: dict[str, dict[int, float]] = field(default_factory=dict)
    #: #REval-hit-ratio on the ground truths of each popularity slice (:mod:`stream.slices`):
    #: ``slices[r][slice][k]``, only the slices the event's ground truth falls in.
    slices: dict[str, dict[str, dict[int, float]]] = field(default_factory=dict)
    #: The precision form of #REval (:func:`stream.metrics.reval_precision_by_k`): the share of
    #: the top-r recommended hashtags with a ground truth among their k synonyms, ``[r][k]``.
    #: What the #REval alert tests: exported as sums, averaged by :class:`Summary` and written
    #: to the event's JSON as "reval_hit_ratio_precision".
    precision: dict[str, dict[int, float]] = field(default_factory=dict)
    #: The score cells of :meth:`to_json` (its "reval_hit_ratio" ... "reval_hit_ratio_precision"),
    #: made by :func:`stream.batch_scoring.score_events` beside the fields above from the same
    #: lists: a batch's scores are written out once each, and re-keying every dict for JSON cost more than
    #: making it.  Shared, never modified.
    json_cells: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def corrected(self) -> dict[str, dict[int, float | None]]:
        """This one event's chance-corrected score, ``(observed - expected) / (1 - expected)``
        (None where the expectation is 1: no room).  For a single event only: a set of events
        is corrected from its sums (:class:`stream.chance.CorrectedSum`)."""
        return {
            r: {k: corrected_of_sums(self.reval[r][k], e, 1.0) for k, e in by_k.items()}
            for r, by_k in self.expected.items()
        }

    def to_json(self) -> dict[str, Any]:
        cells = self.json_cells if self.json_cells is not None else self._json_cells()
        # The key order is the record's: fields added later come after the first ones, so
        # consumers that know only those keep working.
        return {
            "tweet_id": self.tweet_id,
            "recommender": self.recommender,
            "thesaurus_version": self.thesaurus_version,
            "scorable": self.unscorable is None,
            "unscorable_reason": self.unscorable,
            "reval_hit_ratio": cells["reval_hit_ratio"],
            "reval_hit_ratio_corrected": cells["reval_hit_ratio_corrected"],
            "exact": cells["exact"],
            "unknown_recommended": self.unknown_recommended,
            "n_recommended": self.n_recommended,
            "reval_hit_ratio_ranked": cells["reval_hit_ratio_ranked"],
            "reval_hit_ratio_slices": cells["reval_hit_ratio_slices"],
            "reval_hit_ratio_expected": cells["reval_hit_ratio_expected"],
            "reval_hit_ratio_precision": cells["reval_hit_ratio_precision"],
        }

    def _json_cells(self) -> dict[str, Any]:
        """The score cells of :meth:`to_json`, made from the fields (one event's path)."""
        return {
            "reval_hit_ratio": {r: str_keys(by_k) for r, by_k in self.reval.items()},
            "reval_hit_ratio_corrected": {r: str_keys(by_k) for r, by_k in self.corrected.items()},
            "exact": {r: scores.as_dict() for r, scores in self.exact.items()},
            "reval_hit_ratio_ranked": {r: str_keys(by_k) for r, by_k in self.ranked.items()},
            "reval_hit_ratio_slices": {
                r: {name: str_keys(by_k) for name, by_k in by_slice.items()}
                for r, by_slice in self.slices.items()
            },
            "reval_hit_ratio_expected": {r: str_keys(by_k) for r, by_k in self.expected.items()},
            "reval_hit_ratio_precision": {r: str_keys(by_k) for r, by_k in self.precision.items()},
        }


_LABELS: dict[tuple[int, ...], tuple[str, ...]] = {}


def str_keys(by_k: Mapping[int, float | None]) -> dict[str, float | None]:
    """``{k: value}`` with the k as JSON keys (strings; made once per grid of k)."""
    ks = tuple(by_k)
    labels = _LABELS.get(ks)
    if labels is None:
        if len(_LABELS) > 256:
            _LABELS.clear()
        labels = _LABELS[ks] = tuple(map(str, ks))
    return dict(zip(labels, by_k.values(), strict=True))


def score_event(
    event: Recommendation,
    truth: Sequence[str],
    cache: NeighbourCache,
    ks: Sequence[int] = DEFAULT_KS,
    rs: Sequence[int | None] = (ALL,),
    weights: RankWeights = DCG,
) -> EventScore:
    """Score one event for every (r, k); ``truth`` is the event's or the joined tweet's.

    One |R| x |G| matrix of synonym ranks answers every (r, k): the top-r rows go
    to :func:`stream.metrics.reval_by_k` (Eq. 4),
    :func:`stream.rank.ranked_by_k` (rank-aware, with ``weights``) and
    :func:`stream.metrics.exact_from_ranks`.
    """
    recommended = list(dict.fromkeys(event.recommended))
    truth = list(dict.fromkeys(truth))
    base = {
        "tweet_id": event.tweet_id,
        "recommender": event.recommender,
        "thesaurus_version": cache.version,
        "n_recommended": len(recommended),
    }
    if not recommended:
        return EventScore(**base, unscorable="empty_recommended")  # type: ignore[arg-type]
    if not truth:
        return EventScore(**base, unscorable="empty_ground_truth")  # type: ignore[arg-type]
    matrix = cache.matrix(recommended, truth)
    n_truth = len(truth)
    chance, bands = cache.chance, cache.bands
    columns = columns_by_slice(truth, bands) if bands is not None else {}
    unknown = sum(1 for h in recommended if not cache.known(h))
    score = EventScore(**base, unknown_recommended=unknown)  # type: ignore[arg-type]
    # Its cells are filled in place below (its dicts are its own, made empty).
    reval, expected_, exact, ranked = score.reval, score.expected, score.exact, score.ranked
    slices, precision = score.slices, score.precision
    # The top-r rows are a prefix of the matrix, so every r with the same number of rows (r
    # beyond |R|, and "all") has the same scores: computed once per row count.
    done: dict[
        int,
        tuple[list[float], list[float] | None, ExactScores, list[float], dict[str, list[float]], list[float]],
    ]
    done = {}
    # No synonym link within the largest k (the usual event on a live feed): Eq. 4, its
    # rank-aware variant and every slice are 0 at every k and r, as those functions find.
    unreached = bool(ks) and min(chain.from_iterable(matrix)) > min(max(ks), FAR - 1)
    zeros = [0.0] * len(ks)
    for r in rs:
        rows = matrix[:r] if r is not None else matrix
        label = r_label(r)
        found = done.get(len(rows))
        if found is None:
            observed = zeros if unreached else reval_by_k(rows, n_truth, ks)
            found = done[len(rows)] = (
                observed,
                chance.expected(len(rows), truth, ks) if chance is not None else None,
                exact_from_ranks(rows, n_truth),
                zeros if unreached else ranked_by_k(rows, n_truth, ks, weights),
                {name: zeros for name in columns}
                if unreached
                else slice_scores(rows, columns, ks, observed)
                if columns
                else {},
                zeros if unreached else reval_precision_by_k(rows, ks),
            )
        observed, at_chance, exact[label], by_rank, by_slice, shares = found
        precision[label] = dict(zip(ks, shares, strict=True))
        reval[label] = dict(zip(ks, observed, strict=True))
        if at_chance is not None:
            expected_[label] = dict(zip(ks, at_chance, strict=True))
        ranked[label] = dict(zip(ks, by_rank, strict=True))
        if columns:
            slices[label] = {name: dict(zip(ks, values, strict=True)) for name, values in by_slice.items()}
    return score


class Summary:
    """Averages over events, per (r, k) and per exact metric, river style; the
    chance-corrected score is the kappa of the events' sums (:class:`stream.chance.CorrectedSum`),
    with a 95% delta-method interval.

    ``get()`` gives the shape ``reval score --json`` prints for one r.
    """

    def __init__(self) -> None:
        self.events = 0
        self.unscorable = 0
        self.reval: dict[str, dict[int, Mean]] = {}
        self.corrected: dict[str, dict[int, CorrectedSum]] = {}
        self.ranked: dict[str, dict[int, Mean]] = {}
        self.precision: dict[str, dict[int, Mean]] = {}
        self.exact: dict[str, dict[str, Mean]] = {}

    def update(self, score: EventScore) -> None:
        self.events += 1
        if score.unscorable is not None:
            self.unscorable += 1
            return
        for table, values in (
            (self.reval, score.reval),
            (self.ranked, score.ranked),
            (self.precision, score.precision),
        ):
            for r, by_k in values.items():
                means = table.setdefault(r, {})
                for k, value in by_k.items():
                    means.setdefault(k, Mean()).update(value)
        for r, by_k in score.expected.items():
            sums = self.corrected.setdefault(r, {})
            observed = score.reval[r]
            for k, expected in by_k.items():
                sums.setdefault(k, CorrectedSum()).update(observed[k], expected)
        for r, scores in score.exact.items():
            exact = self.exact.setdefault(r, {})
            for name, value in scores.as_dict().items():
                exact.setdefault(name, Mean()).update(value)

    def update_many(self, scores: Iterable[EventScore]) -> Summary:
        for score in scores:
            self.update(score)
        return self

    def _corrected(self, label: str, k: int) -> dict[str, Any]:
        found = self.corrected.get(label, {}).get(k)
        interval = None if found is None else found.interval()
        value = None if found is None else found.get()
        return {
            "reval_hit_ratio_corrected": value,
            # why the corrected score is null: no null model (a thesaurus without popularity),
            # or an expectation that leaves no room above chance
            "corrected_null_reason": None
            if value is not None
            else "no_null_model"
            if found is None
            else "no_room",
            "corrected_ci_low": None if interval is None else interval[0],
            "corrected_ci_high": None if interval is None else interval[1],
            "reval_hit_ratio_expected": None if found is None else found.expected / found.count,
        }

    def get(self, r: int | None = ALL) -> dict[str, Any]:
        label = r_label(r)
        return {
            "events": self.events,
            "unscorable": self.unscorable,
            "by_k": {
                str(k): {
                    "reval_hit_ratio": mean.get(),
                    **self._corrected(label, k),
                    "reval_hit_ratio_ranked": _mean_of(self.ranked, label, k),
                    # #REval's precision form: what the #REval alert tests (its sums are exported)
                    "reval_hit_ratio_precision": _mean_of(self.precision, label, k),
                }
                for k, mean in sorted(self.reval.get(label, {}).items())
            },
            "exact": {name: mean.get() for name, mean in self.exact.get(label, {}).items()},
        }

    def labels(self) -> list[str]:
        return list(self.reval)


def _mean_of(table: dict[str, dict[int, Mean]], label: str, k: int) -> float | None:
    found = table.get(label, {}).get(k)
    return None if found is None else found.get()
