"""The Annoy thesaurus: a directory with the neighbour table scorers use and the Annoy
index behind it, built, saved atomically, loaded with every file checked.

The thesaurus concept and its pure maths are in :mod:`stream.synonyms.thesaurus`; the versioned
store of these directories in :mod:`workers.adapters.files.store`; how a directory is replaced
safely in :mod:`workers.adapters.files.atomic_files`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import stat
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from annoy import AnnoyIndex

from stream.evaluation.chance import ChanceModel
from stream.evaluation.neighbours import NeighbourCache
from stream.evaluation.slices import Bands
from stream.synonyms.drift import (
    DEFAULT_MIN_SUPPORT,
    DEFAULT_TOP,
    TOP_NEIGHBOURS,
    Snapshot,
    ThesaurusDrift,
    compare,
)
from stream.synonyms.hubness import DEFAULT_METHOD, candidate_count, exact_candidates, scores
from stream.synonyms.means import HashtagMeans
from stream.synonyms.neighbour_table import NeighbourTable, build_neighbour_table
from stream.synonyms.thesaurus import (
    BaseThesaurus,
    Thesaurus,
    ThesaurusFormatError,
    ThesaurusMetadata,
    check_k,
)
from workers.adapters.files.atomic_files import (
    DirectoryReader,
    being_replaced,
    fsync_path,
    publish_directory,
    remove_tree,
    temporary_directory,
)
from workers.adapters.files.thesaurus_files import (
    HASHTAGS_FILE,
    INDEX_FILE,
    METADATA_FILE,
    TABLE_FILE,
    THESAURUS_FILES,
    check_writable_thesaurus_dir,
    parse_table,
    read_json,
    read_verified,
    verify_fd,
    write_table_files,
)

#: Neighbours per hashtag in the table (the largest k scorers can ask for; deeper
#: queries go to the Annoy index).
DEFAULT_DEPTH = 100
#: Up to this many hashtags the re-ranking sees every pair (two exact passes); above, each
#: hashtag's nearest by cosine, found among nearby clusters with the table's recall checked on a
#: sample (:func:`stream.synonyms.hubness.clustered_candidates`), or exactly in one pass
#: (:func:`stream.synonyms.hubness.exact_candidates`) where the clusters do not reach the recall.
EXACT_CANDIDATES_UP_TO = 20_000

#: The Annoy index is built in a thread while the table is searched when it takes at most this
#: many bytes (its items' vectors, 4 (d + 3) bytes each: 309 MB at 100,000 x 768), after the
#: table otherwise: beside the search, Annoy's ~3.7 KB per hashtag at 768-d (3.7 GB at
#: 1,000,000) would add to the search's peak of memory (BENCHMARKS.md, issue 27 §5).
ANNOY_BESIDE_MAX_BYTES = 512 * 2**20

#: Default ``search_k`` is this many times Annoy's own default (``n_trees * n``).
#: On the clustered 10,000-vector test set (64-d, 50 trees) Annoy's default gave
#: recall@10 0.71; 10x (search_k 5,500 for k = 10) gives 0.987 at well under a
#: millisecond a query.
DEFAULT_SEARCH_K_FACTOR = 10


class _ReplacedWhileLoading(Exception):
    """Internal: the directory being loaded was replaced by a writer; load again."""


_LOAD_ATTEMPTS = 5
#: How long a reader waits for a directory that a save is replacing (between its two
#: renames, :mod:`workers.adapters.files.atomic_files`) to be there again.
_REPLACE_WAIT_S = 2.0


def angular_to_cosine(angular: float) -> float:
    """Annoy's angular distance ``sqrt(2(1 - cos))`` as a cosine distance ``1 - cos``."""
    return min(max(angular * angular / 2.0, 0.0), 2.0)


def cosine_to_angular(cosine: float) -> float:
    """A cosine distance ``1 - cos`` as Annoy's angular distance ``sqrt(2(1 - cos))``."""
    return math.sqrt(2.0 * max(cosine, 0.0))


def _check_directory(directory: Path) -> None:
    """Raise unless ``directory`` is a directory; wait for one a save is replacing."""
    deadline = time.monotonic() + _REPLACE_WAIT_S
    while True:
        try:
            # One stat, not exists() then is_dir(): a save in between must not
            # make a directory look like a file.
            mode = os.stat(directory).st_mode
            break
        except FileNotFoundError:
            if time.monotonic() > deadline or not being_replaced(directory):
                raise FileNotFoundError(f"thesaurus directory {directory} does not exist") from None
            time.sleep(0.001)
    if not stat.S_ISDIR(mode):
        raise ThesaurusFormatError(f"{directory} is not a directory")


class AnnoyThesaurus(BaseThesaurus):
    """A thesaurus directory: the neighbour table, and the Annoy index behind it.

    The table (:class:`stream.synonyms.neighbour_table.NeighbourTable`) holds every hashtag's
    ``depth`` nearest hashtags, ranked by the build's hubness method; scorers need
    nothing else.  The Annoy index (``angular``, over the unit -- and for ``center``
    methods centred -- hashtag vectors) supplied the table's candidates on large
    vocabularies and answers queries deeper than the table (``reval synonyms -k
    200``), re-ranked the same way.  Files: ``index.ann``, ``hashtags.json``,
    ``table.npz``, ``metadata.json`` (with a SHA-256 of each of the others,
    checked on load: a damaged file is refused before Annoy's native code sees it).

    >>> import numpy as np, tempfile
    >>> names = ["swim", "dive", "sport", "golf"]
    >>> vectors = np.array([[1.0, 0.1, 0.0], [0.9, 0.3, 0.0], [0.6, 0.8, 0.0], [0.0, 1.0, 0.2]])
    >>> th = AnnoyThesaurus.build(names, vectors, n_trees=10, model_id="demo", method="raw", depth=2)
    >>> th.synonyms("swim", 2)
    ['swim', 'dive', 'sport']
    >>> th.synonyms("golf", 0), th.synonyms("unknown", 3)
    (['golf'], ['unknown'])
    >>> [(h, round(d, 3)) for h, d in th.neighbours_with_distances("swim", 1)]
    [('dive', 0.025)]
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = th.save(f"{tmp}/th")
    ...     AnnoyThesaurus.load(f"{tmp}/th").neighbours("swim", 3)  # deeper than the table: Annoy
    ['dive', 'sport', 'golf']
    """

    METRIC: Literal["angular"] = "angular"

    def __init__(
        self, table: NeighbourTable, index: AnnoyIndex | None, *, search_k: int | None = None
    ) -> None:
        if index is not None and index.get_n_items() != len(table):
            raise ThesaurusFormatError(f"index has {index.get_n_items()} items but {len(table)} hashtags")
        self.table = table
        self._index = index
        #: Nodes Annoy inspects a query; ``None`` means ``DEFAULT_SEARCH_K_FACTOR``
        #: times Annoy's own default.  Higher: better recall, slower queries.
        self.search_k = search_k

    @classmethod
    def build(
        cls,
        names: Sequence[str],
        vectors: npt.ArrayLike,
        *,
        counts: Sequence[int] | npt.ArrayLike | None = None,
        min_count: int = 1,
        model_id: str = "",
        method: str = DEFAULT_METHOD,
        depth: int = DEFAULT_DEPTH,
        candidates: Literal["auto", "exact", "nearest", "clustered"] = "auto",
        version: str | None = None,
        n_trees: int = 50,
        max_distance: float | None = None,
        seed: int = 42,
        search_k: int | None = None,
        n_jobs: int = 1,
        resultants: Sequence[float] | npt.ArrayLike | None = None,
    ) -> AnnoyThesaurus:
        """Index ``vectors[i]`` as hashtag ``names[i]`` and rank every hashtag's ``depth``
        nearest by ``method`` (:mod:`stream.synonyms.hubness`).

        ``resultants[i]``: the length of hashtag i's mean of unit tweet embeddings before
        normalisation (its tweets' spread is ``1 - resultant^2``); with them the table records
        what recovers each raw mean from the index (:func:`raw_means`), so that
        ``reval thesaurus diff`` can test a hashtag's shift against its own spread.

        Hashtags with ``counts[i] < min_count`` are left out (minimum support); the counts
        (all 1 when not given) are the popularity the chance correction weighs by.
        ``candidates``: what the re-ranking looks at -- ``exact`` (every pair),
        ``nearest`` (each hashtag's :func:`~stream.synonyms.hubness.candidate_count` nearest by
        cosine, found exactly, then re-ranked), ``clustered`` (the same found among nearby
        clusters, kept only where the table's recall@10 against the exact re-ranking, measured
        on a sample, reaches 0.99; ``nearest`` otherwise), or ``auto`` (exact up to
        :data:`EXACT_CANDIDATES_UP_TO` hashtags, clustered above).  Annoy's own queries are far too slow for
        the re-ranking's deep candidate lists (~3 ms per hashtag at 100,000 x 768 for 400
        candidates, against ~1.1-1.5 ms for the exact search's matrix products on 2 cores), so
        the Annoy index only answers queries deeper than the table.  ``version`` defaults to
        a hash of the content and parameters, so the same data gives the same version.  The
        table does not depend on ``n_jobs`` (Annoy's build threads); the Annoy index is
        reproducible for a given ``seed`` only with ``n_jobs=1``.
        """
        if n_trees < 1:
            raise ValueError(f"n_trees must be at least 1, got {n_trees}")
        if candidates == "auto":
            candidates = "exact" if len(names) <= EXACT_CANDIDATES_UP_TO else "clustered"
        # The index answers queries deeper than the table, in the space the table ranks in.
        # A small one is built in a thread while the table is searched: Annoy's trees (~18 s
        # of CPU at 100,000 x 768, 50 trees) release the GIL, and much of the table's search is
        # one core's numpy work, so on 2 cores the two overlap. A large one is built after
        # the table, once the search's candidates are freed (ANNOY_BESIDE_MAX_BYTES).
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="annoy-build") as pool:
            building: list[Future[AnnoyIndex]] = []
            later: list[npt.NDArray[np.float32]] = []

            def index_space(space: npt.NDArray[np.float32]) -> None:
                if 4 * space.shape[0] * (space.shape[1] + 3) <= ANNOY_BESIDE_MAX_BYTES:
                    building.append(pool.submit(_annoy_index, space, n_trees, seed, n_jobs))
                else:
                    later.append(space)

            table = build_neighbour_table(
                names,
                vectors,
                counts,
                depth=depth,
                method=method,
                candidates={"exact": None, "nearest": exact_candidates, "clustered": "clustered"}[candidates],
                max_distance=max_distance,
                min_count=min_count,
                model_id=model_id,
                n_trees=n_trees,
                metric=cls.METRIC,
                version=version,
                seed=seed,
                on_space=index_space,
            )
            index = building[0].result() if building else _annoy_index(later.pop(), n_trees, seed, n_jobs)
        if resultants is not None:
            table.stats.update(
                _mean_geometry(names, vectors, resultants, table, centred=method.startswith("center"))
            )
        return cls(table, index, search_k=search_k)

    @classmethod
    def load(
        cls, directory: str | Path, *, search_k: int | None = None, index: bool = True, prefault: bool = False
    ) -> AnnoyThesaurus:
        """Open a saved thesaurus after checking every file's checksum; the index (skipped
        with ``index=False``, as scorers do) is memory-mapped, not read into memory.  A
        directory that a save replaces meanwhile is read again, whole."""
        directory = Path(directory)
        for attempt in range(_LOAD_ATTEMPTS):
            _check_directory(directory)
            try:
                return cls._load_once(directory, search_k=search_k, index=index, prefault=prefault)
            except _ReplacedWhileLoading as exc:
                if attempt == _LOAD_ATTEMPTS - 1:
                    if exc.__cause__ is None:  # pragma: no cover - always raised "from" an error
                        raise
                    raise exc.__cause__ from None
        raise AssertionError("unreachable")  # pragma: no cover

    @classmethod
    def _load_once(
        cls, directory: Path, *, search_k: int | None, index: bool, prefault: bool
    ) -> AnnoyThesaurus:
        try:
            opened = DirectoryReader(directory)
        except FileNotFoundError as exc:  # renamed aside by a save since we looked
            raise _ReplacedWhileLoading from exc
        with opened as reader:
            try:
                loaded = cls._read(reader, search_k=search_k, index=index, prefault=prefault)
            except (OSError, ThesaurusFormatError) as exc:
                # A save swapped the directory (and is deleting the old one) while
                # we read it: what we saw was not a broken thesaurus, so try again.
                if reader.replaced():
                    raise _ReplacedWhileLoading from exc
                raise
            if not reader.consistent:
                loaded.close()
                raise _ReplacedWhileLoading from ThesaurusFormatError(
                    f"{directory} kept being replaced while loading"
                )
            return loaded

    @classmethod
    def _read(
        cls, reader: DirectoryReader, *, search_k: int | None, index: bool, prefault: bool
    ) -> AnnoyThesaurus:
        directory = reader.directory
        if not reader.is_file(METADATA_FILE):
            raise ThesaurusFormatError(f"{directory} is not a thesaurus directory: missing {METADATA_FILE}")
        metadata = ThesaurusMetadata.from_dict(read_json(reader, METADATA_FILE))
        if metadata.metric != cls.METRIC:
            raise ThesaurusFormatError(
                f"{directory / METADATA_FILE}: metric {metadata.metric!r}, expected {cls.METRIC!r}"
            )
        if not metadata.checksums or not reader.is_file(TABLE_FILE):
            raise ThesaurusFormatError(
                f"{directory} was built by an older reval-stream (no {TABLE_FILE} or checksums): rebuild it"
            )
        missing = [name for name in THESAURUS_FILES if not reader.is_file(name)]
        if missing:
            raise ThesaurusFormatError(
                f"{directory} is not a thesaurus directory: missing {', '.join(missing)}"
            )
        table = parse_table(
            metadata,
            read_verified(reader, HASHTAGS_FILE, metadata.checksums),
            read_verified(reader, TABLE_FILE, metadata.checksums),
            str(directory),
        )
        annoy = None
        if index:
            annoy = AnnoyIndex(metadata.dimension, cls.METRIC)
            fd = reader.open_fd(INDEX_FILE)
            try:
                verify_fd(fd, directory / INDEX_FILE, metadata.checksums)
                annoy.load(reader.path_of_fd(INDEX_FILE, fd), prefault=prefault)
            except OSError as exc:
                raise ThesaurusFormatError(f"{directory / INDEX_FILE}: cannot load ({exc})") from exc
            finally:
                os.close(fd)  # the memory map outlives the descriptor
        try:
            return cls(table, annoy, search_k=search_k)
        except ThesaurusFormatError as exc:
            raise ThesaurusFormatError(f"{directory}: {exc}") from exc

    def save(self, directory: str | Path, *, replace: bool = False) -> Path:
        """Write the thesaurus to ``directory`` atomically.

        ``directory`` must not exist, be empty, or -- with ``replace`` -- hold a thesaurus
        written by this project (never anything else: :class:`ThesaurusOverwriteError`).
        Everything is written into a temporary directory beside the target (same file
        system) and renamed into place (:func:`~workers.adapters.files.atomic_files.publish_directory`),
        so a reader never sees a partial thesaurus.
        Note: Annoy re-opens its index from the file it saved, so this object then
        memory-maps ``directory/index.ann``.
        """
        target = Path(directory)
        check_writable_thesaurus_dir(target, replace=replace)
        if self._index is None:
            raise ValueError("a thesaurus loaded without its index cannot be saved")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = temporary_directory(target)
        try:
            index_path = tmp / INDEX_FILE
            if not self._index.save(str(index_path)):
                raise OSError(f"Annoy could not save {index_path}")
            metadata = write_table_files(tmp, self.table)
            fsync_path(index_path)
            fsync_path(tmp)
            publish_directory(tmp, target)
        except BaseException:
            remove_tree(tmp)
            raise
        self.table = NeighbourTable(
            self.table.hashtags,
            self.table.neighbour_ids,
            self.table.distances,
            self.table.counts,
            metadata,
            self.table.stats,
        )
        return target

    @property
    def metadata(self) -> ThesaurusMetadata:
        return self.table.metadata

    def annotate(self, **fields: Any) -> None:
        """Change metadata fields (e.g. ``drift``) of a thesaurus not saved yet: they are
        written with it by :meth:`save`.  Checksums cover the other files, so the field
        is part of the version as published."""
        self.table = NeighbourTable(
            self.table.hashtags,
            self.table.neighbour_ids,
            self.table.distances,
            self.table.counts,
            dataclasses.replace(self.table.metadata, **fields),
            self.table.stats,
        )

    @property
    def hashtags(self) -> tuple[str, ...]:
        """All hashtags, in id order."""
        return self.table.hashtags

    @property
    def depth(self) -> int:
        return self.table.depth

    def effective_search_k(self, k: int) -> int:
        """The ``search_k`` a query for ``k`` neighbours (``k + 1`` items) uses."""
        if self.search_k is not None:
            return self.search_k
        return DEFAULT_SEARCH_K_FACTOR * max(self.table.metadata.n_trees, 1) * (k + 1)

    def neighbours_with_distances(
        self, hashtag: str, k: int, *, search_k: int | None = None
    ) -> list[tuple[str, float]]:
        """Up to ``k`` nearest other hashtags with their cosine distances, nearest first:
        from the table up to its depth, beyond it from Annoy, re-ranked the same way."""
        check_k(k)
        k = min(k, max(len(self.table) - 1, 0))  # no more exist; Annoy's C ints overflow on huge k
        if k <= self.table.depth or len(self.table) - 1 <= self.table.depth:
            return self.table.neighbours_with_distances(hashtag, min(k, max(self.table.depth, 0)))
        item = self.table.index_of(hashtag)
        if item is None:
            return []
        if self._index is None:
            raise ValueError(f"this thesaurus was loaded without its index: at most k={self.table.depth}")
        return self._deep_query(item, k, search_k)

    def _deep_query(self, item: int, k: int, search_k: int | None) -> list[tuple[str, float]]:
        assert self._index is not None
        method = self.table.metadata.hubness_method
        want = candidate_count(k, method)
        ids, dists = self._index.get_nns_by_item(
            item,
            want + 1,
            search_k=self.effective_search_k(want) if search_k is None else search_k,
            include_distances=True,
        )
        pairs = [(i, 1.0 - angular_to_cosine(d)) for i, d in zip(ids, dists, strict=True) if i != item][:want]
        cand = np.array([[i for i, _ in pairs]], dtype=np.int64)
        sims = np.array([[c for _, c in pairs]], dtype=np.float32)
        ranked = scores(method, np.array([item]), cand, sims, self.table.stats)[0]
        names = self.table.hashtags
        order = sorted(range(len(pairs)), key=lambda j: (-ranked[j], names[pairs[j][0]]))[:k]
        own = np.asarray(self._index.get_item_vector(item))
        # The distance reported is the cosine distance of the embeddings (as in the table);
        # for centred methods Annoy's own distance is in the centred space.
        found = []
        for j in order:
            other = pairs[j][0]
            found.append((names[other], self._embedding_distance(item, other, own)))
        limit = self.table.metadata.max_distance
        out = []
        for name, d in found:
            if limit is not None and d > limit:
                break
            out.append((name, d))
        return out

    def _embedding_distance(self, item: int, other: int, own: npt.NDArray[np.float64]) -> float:
        row = self.table.neighbour_ids[item]
        hit = np.flatnonzero(row == other)
        if hit.size:
            return float(self.table.distances[item, hit[0]])
        assert self._index is not None
        vec = np.asarray(self._index.get_item_vector(other))
        cos = float(own @ vec / (np.linalg.norm(own) * np.linalg.norm(vec) or 1.0))
        return min(max(1.0 - cos, 0.0), 2.0)

    def neighbours(self, hashtag: str, k: int) -> list[str]:
        return [name for name, _ in self.neighbours_with_distances(hashtag, k)]

    def similarities(
        self, pairs: Sequence[tuple[str, str]], *, ranking: bool = True
    ) -> npt.NDArray[np.float64]:
        """How near each pair is by this thesaurus's own ranking score (its hubness
        method's, in its space; higher = nearer), the mean of both directions (CSLS is
        symmetric, mutual proximity nearly so); NaN where a hashtag is unknown.  What the
        human audit (:mod:`stream.auditing.audit`) ranks the pairs by.  ``ranking=False``: the plain
        cosine in the index's space instead (in [-1, 1])."""
        if self._index is None:
            raise ValueError("this thesaurus was loaded without its index: no similarities")
        method, stats = self.table.metadata.hubness_method, self.table.stats
        out = np.full(len(pairs), np.nan)
        for row, (a, b) in enumerate(pairs):
            i, j = self.table.index_of(a), self.table.index_of(b)
            if i is None or j is None:
                continue
            u, v = (np.asarray(self._index.get_item_vector(x), dtype=np.float64) for x in (i, j))
            cos = np.array([[u @ v / ((np.linalg.norm(u) * np.linalg.norm(v)) or 1.0)]], dtype=np.float32)
            if not ranking:
                out[row] = float(cos[0, 0])
                continue
            there = scores(method, np.array([i]), np.array([[j]]), cos, stats)[0, 0]
            back = scores(method, np.array([j]), np.array([[i]]), cos, stats)[0, 0]
            out[row] = (there + back) / 2.0
        return out

    def vectors(self) -> npt.NDArray[np.float32]:
        """The vectors the Annoy index holds, row i = hashtag i: the unit embeddings, for
        ``center`` hubness methods centred on this version's mean and scaled to unit length."""
        if self._index is None:
            raise ValueError("this thesaurus was loaded without its index: it has no vectors")
        out = np.empty((len(self.table), self.table.metadata.dimension), dtype=np.float32)
        for i in range(len(self.table)):
            out[i] = self._index.get_item_vector(i)
        return out

    def close(self) -> None:
        """Release the memory map; the index is unusable afterwards."""
        if self._index is not None:
            self._index.unload()

    def __contains__(self, hashtag: object) -> bool:
        return hashtag in self.table

    def __len__(self) -> int:
        return len(self.table)


def _annoy_index(space: npt.NDArray[np.float32], n_trees: int, seed: int, n_jobs: int) -> AnnoyIndex:
    """An angular Annoy index of the rows of ``space``, item i = row i."""
    index = AnnoyIndex(space.shape[1], AnnoyThesaurus.METRIC)
    index.set_seed(seed)
    for i in range(len(space)):
        index.add_item(i, space[i].tolist())
    # Annoy holds its own copy now: where this was the last reference (the index built after
    # the table), the space is freed before the trees are.
    del space
    index.build(n_trees, n_jobs=n_jobs)
    return index


def neighbour_cache(thesaurus: Thesaurus, max_k: int, *, ks: Sequence[int] | None = None) -> NeighbourCache:
    """The scorer's view of a thesaurus: synonym ranks up to ``max_k``, and, when the
    thesaurus has a neighbour table, the null model for the chance-corrected score and the
    popularity bands for the slices (JSON thesauri have no popularity: neither).  ``ks``:
    the grid of k the scorer will ask for; its null-model tables are then computed here, with
    the rest of the set-up, not on the first events (:meth:`stream.evaluation.chance.ChanceModel.prepare`)."""
    table = thesaurus.table if isinstance(thesaurus, AnnoyThesaurus) else thesaurus
    if isinstance(table, NeighbourTable) and max_k > table.depth and table.depth < len(table) - 1:
        raise ValueError(f"the thesaurus holds {table.depth} neighbours per hashtag; k={max_k} is more")
    if not isinstance(table, NeighbourTable):
        return NeighbourCache(thesaurus, max_k=max_k)
    bands = Bands(table.hashtags, table.counts)
    chance = ChanceModel(table)
    if ks is not None:
        chance.prepare(ks)
    # Ranks searched in the table's rows: no per-hashtag state, cold as fast as warm.
    return NeighbourCache(thesaurus, max_k=max_k, chance=chance, bands=bands, table=table)


def _mean_geometry(
    names: Sequence[str],
    vectors: npt.ArrayLike,
    resultants: Sequence[float] | npt.ArrayLike,
    table: NeighbourTable,
    *,
    centred: bool,
    block: int = 4096,
) -> dict[str, npt.NDArray[np.float32]]:
    """The table's extra statistics that recover each kept hashtag's raw mean from the
    vector its index holds (:func:`raw_means`): ``resultant`` (the mean's length) and, for a
    centred space, ``centre`` (the mean unit row, as the build centres on it) and
    ``centre_offset`` (each unit row's distance from it).  In blocks: no n x d float64 copy."""
    row_of = {name: i for i, name in enumerate(names)}
    rows = np.array([row_of[h] for h in table.hashtags], dtype=np.int64)
    source = np.asarray(vectors)
    lengths = np.asarray(resultants, dtype=np.float64)[rows]
    out = {"resultant": lengths.astype(np.float32)}
    if centred and len(rows):
        total = np.zeros(source.shape[1])
        for start in range(0, len(rows), block):
            unit = _unit(source[rows[start : start + block]])
            total += unit.sum(axis=0)
        centre = total / len(rows)
        offsets = np.empty(len(rows))
        for start in range(0, len(rows), block):
            unit = _unit(source[rows[start : start + block]])
            offsets[start : start + len(unit)] = np.linalg.norm(unit - centre, axis=1)
        out |= {"centre": centre.astype(np.float32), "centre_offset": offsets.astype(np.float32)}
    return out


def _unit(block: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
    x = np.asarray(block, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def raw_means(thesaurus: AnnoyThesaurus) -> npt.NDArray[np.float32] | None:
    """Each hashtag's raw mean of unit tweet embeddings (length = its resultant), recovered
    from the index's vector and the table's statistics; None for a version built without
    them (before they were recorded, or from vectors without counts)."""
    stats = thesaurus.table.stats
    if "resultant" not in stats:
        return None
    # float32 and in place: one n x d copy beside the index's (3 GB at 1,000,000 x 768), at the
    # precision the index holds anyway; the test takes float64 of the rows it compares.
    vectors = thesaurus.vectors()
    if "centre" in stats:  # the index holds (u - centre) / |u - centre|
        vectors *= stats["centre_offset"][:, None]
        vectors += stats["centre"]
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    vectors *= stats["resultant"][:, None]
    return vectors


def build_from_means(
    means: HashtagMeans,
    *,
    min_count: int = 1,
    model_id: str = "",
    method: str = DEFAULT_METHOD,
    depth: int = DEFAULT_DEPTH,
    n_trees: int = 50,
    seed: int = 42,
    n_jobs: int = -1,
) -> AnnoyThesaurus | None:
    """The one way a thesaurus is built from running means (``reval thesaurus build``, the
    index job, ``reval evaluate``); None when no hashtag qualifies."""
    names, vectors, counts = means.matrix(min_count)
    if not names:
        return None
    return AnnoyThesaurus.build(
        names,
        vectors,
        counts=counts,
        resultants=means.resultants(names),
        min_count=min_count,
        model_id=model_id,
        method=method,
        depth=depth,
        n_trees=n_trees,
        seed=seed,
        n_jobs=n_jobs,
    )


def thesaurus_drift(
    old: AnnoyThesaurus,
    new: AnnoyThesaurus,
    *,
    min_support: int = DEFAULT_MIN_SUPPORT,
    top: int = DEFAULT_TOP,
) -> ThesaurusDrift:
    """Which hashtags' meaning moved from ``old`` to ``new`` (:func:`stream.synonyms.drift.compare`).

    The vectors are those the indexes hold: for ``center`` hubness methods each version is
    centred on its own mean, so a move of the whole vocabulary's mean shifts every hashtag a
    little (the quantiles show it; the movers, ranked against each other, stand out from
    it).  The support is the table's counts (1 for every hashtag of a thesaurus built
    without counts).  Both top-10 lists are cut to the shallower table's depth, so a change
    of depth is not taken for a change of meaning.  Versions of different models,
    dimensions or hubness methods are refused (:class:`stream.synonyms.drift.IncomparableVersionsError`).
    """
    depth = min(TOP_NEIGHBOURS, old.depth, new.depth)
    return compare(_snapshot(old, depth), _snapshot(new, depth), min_support=min_support, top=top)


def _snapshot(thesaurus: AnnoyThesaurus, depth: int) -> Snapshot:
    table = thesaurus.table
    names = table.hashtags
    neighbours = [[names[j] for j in row if j >= 0] for row in table.neighbour_ids[:, :depth].tolist()]
    return Snapshot(
        names,
        thesaurus.vectors(),
        neighbours,
        counts=table.counts,
        means=raw_means(thesaurus),
        model_id=table.metadata.model_id,
        space=table.metadata.hubness_method,
    )
