"""The synonym ranks of one thesaurus version, as the scorer reads them: :class:`NeighbourCache`
(every hashtag's neighbours asked once, at the largest k) and :class:`RowSearch` (read straight
from a neighbour table's rows, for a whole batch in one gather).

A rank matrix answers Syn_k for every k at once (:mod:`stream.evaluation.metrics`): entry (i, j) is the
rank of ground truth g_j among recommended r_i's synonyms, so g_j is in Syn_k(r_i) exactly
when the entry is <= k.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import chain, repeat

import numpy as np
import numpy.typing as npt

from stream.evaluation.chance import ChanceModel
from stream.evaluation.metrics import FAR, rank_matrix
from stream.evaluation.slices import Bands
from stream.synonyms.neighbour_table import NeighbourTable
from stream.synonyms.thesaurus import Thesaurus

Ranks = npt.NDArray[np.int64]
"""Rank matrices of a batch, |B| x max|R| x max|G|, padded with :data:`~stream.evaluation.metrics.FAR`."""


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

    ``chance`` is the version's null model (:class:`stream.evaluation.chance.ChanceModel`); with it,
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
        #: The version's popularity bands (:mod:`stream.evaluation.slices`); None: no slices.
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
        """:func:`stream.evaluation.metrics.rank_matrix` with :meth:`ranks` (the same matrix)."""
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

    def count_known(self, hashtags: Sequence[str]) -> int:
        """How many of ``hashtags`` the thesaurus holds (on a neighbour table: one lookup in
        its index each, without a Python call per hashtag)."""
        if self._search is not None:
            return sum(map(self._search.has, hashtags))
        return sum(1 for h in hashtags if h in self.thesaurus)


class RowSearch:
    """Synonym ranks read straight from a neighbour table's rows, for every hashtag at once.

    Building a ``{synonym: rank}`` dictionary for each new hashtag made the first pass over a
    version ~3x slower than the next (issue 12 §4); a search in the row costs the same every
    time.  Each row's first ``max_k`` neighbour ids (without the -1 gaps, as
    :meth:`stream.synonyms.neighbour_table.NeighbourTable.neighbours` reads them) are one stretch of a
    string, id i as the character ``chr(i + 1)`` (``chr(0)`` pads): ``str.find`` of a ground
    truth's character in a recommended hashtag's stretch is its rank - 1, and a neighbour
    listed twice keeps its first rank, as :meth:`NeighbourCache.ranks` does.  Memory: 2 bytes
    per table entry below 65,535 hashtags, 4 above (28 MB at 100,000 x 70).

    >>> from stream.synonyms.neighbour_table import build_neighbour_table
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
        #: Whether the table holds a hashtag (a dict's own lookup: no Python frame per call).
        self.has = self._ids.__contains__
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
        array (:data:`~stream.evaluation.metrics.FAR` pads), from one gather of the recommended hashtags'
        rows: the same entries."""
        rec_ids = self._ids_of(recommended)
        truth_ids = self._ids_of(truths)
        truth_known = truth_ids >= 0
        truth_ids[~truth_known] = -2  # never an entry of a row, nor a recommended hashtag's id
        strangers: list[tuple[int, int, int]] = []  # (b, i, j): an unknown hashtag on both sides, equal
        n_rec = np.fromiter(map(len, recommended), np.int64, len(recommended))
        n_truth = np.fromiter(map(len, truths), np.int64, len(truths))
        unknown_rec = (rec_ids < 0) & (np.arange(rec_ids.shape[1]) < n_rec[:, None])
        unknown_truth = ~truth_known & (np.arange(truth_ids.shape[1]) < n_truth[:, None])
        for b in np.flatnonzero(unknown_rec.any(axis=1) & unknown_truth.any(axis=1)).tolist():
            rec, truth = recommended[b], truths[b]
            at = {g: j for j, g in enumerate(truth)}
            strangers += [(b, i, at[h]) for i, h in enumerate(rec) if unknown_rec[b, i] and h in at]
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

    def _ids_of(self, lists: Sequence[Sequence[str]]) -> npt.NDArray[np.int64]:
        """Each list's hashtags' ids as one |lists| x longest array (-1 for a hashtag the table
        lacks and for the padding): the look-ups in one C loop."""
        lengths = np.fromiter(map(len, lists), np.int64, len(lists))
        flat = list(chain.from_iterable(lists))
        found = np.fromiter(map(self._ids.get, flat, repeat(-1, len(flat))), np.int64, len(flat))
        ids = np.full((len(lists), int(lengths.max(initial=0))), -1, dtype=np.int64)
        row = np.repeat(np.arange(len(lists)), lengths)
        ids[row, np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)] = found
        return ids

    def matrix(self, recommended: Sequence[str], truth: Sequence[str]) -> list[list[int]]:
        """:func:`stream.evaluation.metrics.rank_matrix` of ``recommended`` x ``truth`` on this table."""
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
