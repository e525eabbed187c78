"""Hashtag thesauri: Syn_k(h), the k nearest hashtags of h in an embedding space.

The #REval method (SPEC "Synonyms and thesaurus (3.2)") counts a recommended
hashtag as a hit when a ground-truth hashtag is among its k nearest synonyms.
This module is the thesaurus *concept*, free of I/O:

* :class:`Thesaurus` -- what the scorer needs (``neighbours``, ``synonyms``, ``version``);
* :class:`ThesaurusMetadata` -- what a thesaurus was built from and how;
* :class:`ExactThesaurus` -- nearest hashtags by brute-force cosine (numpy);
* :class:`JsonThesaurus` -- a user's own ``{"hashtag": ["nearest", ...]}`` mapping.

Annoy indexes and the versioned on-disk store are adapters
(:mod:`workers.adapters.files.annoy_thesaurus`, :mod:`workers.adapters.files.store`).  All distances
are *cosine* distances, ``1 - cos``, in ``[0, 2]``.  Hashtags are expected to be normalised already
(lower case, no ``#``); lookups do not normalise, so ``"#Covid"`` is simply a
hashtag the thesaurus has never seen.

>>> import numpy as np
>>> th = ExactThesaurus.build(["swim", "dive", "sport"], np.eye(3) + 0.5)
>>> th.synonyms("swim", 1), th.synonyms("never-seen", 5), th.synonyms("swim", 0)
(['swim', 'dive'], ['never-seen'], ['swim'])
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from stream.intake.hashtags import normalise_hashtag


class ThesaurusFormatError(ValueError):
    """A thesaurus file or directory is malformed (the message says where and how)."""


# --------------------------------------------------------------------------- metadata


#: ``metadata.json``'s ``format`` of directories written by this project (a thesaurus of ours).
FORMAT = "reval-thesaurus/2"


@dataclass(frozen=True)
class ThesaurusMetadata:
    """What a thesaurus was built from and how; stored as ``metadata.json``.

    ``hubness_method`` is the neighbour ranking (:mod:`stream.synonyms.hubness`), ``depth`` how
    many neighbours per hashtag the neighbour table holds, ``hubness`` the k-occurrence
    report of that table (:class:`stream.synonyms.hubness.HubnessReport` as a dict), ``drift`` what
    moved since the version before it (the index job fills it in before publishing).

    >>> m = ThesaurusMetadata(model_id="vinai/bertweet-base", dimension=768, count=2,
    ...                       built_at="2024-01-01T00:00:00Z", version="abc", n_trees=50,
    ...                       metric="angular", min_count=1, max_distance=0.3)
    >>> ThesaurusMetadata.from_json(m.to_json()) == m
    True
    """

    model_id: str
    dimension: int
    count: int
    built_at: str
    version: str
    n_trees: int
    metric: str
    min_count: int
    max_distance: float | None = None
    hubness_method: str = "raw"
    depth: int = 0
    hubness: dict[str, Any] | None = None
    format: str = FORMAT
    #: SHA-256 of each file of the thesaurus directory, checked before any is used.
    checksums: dict[str, str] | None = None
    #: Meaning drift from the version before (:meth:`stream.synonyms.drift.ThesaurusDrift.to_dict`:
    #: quantiles and the movers with their old and new neighbours and example tweets), the
    #: recent-use movers (``recent``) and the event time its tweets go up to (``events_until``,
    #: where the index job knows it); None when none of these is known.
    drift: dict[str, Any] | None = None
    #: The audit of this version (the index job fills it in): the coherence lift of its
    #: synonym sets (:mod:`stream.auditing.coherence`) and its agreement with people's votes
    #: (:mod:`stream.auditing.audit`); None when not audited.
    audit: dict[str, Any] | None = None
    #: How the table's neighbours were searched
    #: (:func:`~stream.synonyms.neighbour_table.build_neighbour_table`):
    #: ``kind``
    #: ``exact`` (every pair), ``nearest`` (each hashtag's nearest by cosine, found exactly,
    #: re-ranked) or ``clustered`` (found among nearby clusters, with the table's recall
    #: against the exact re-ranking measured on a sample of hashtags); None when not recorded.
    search: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ThesaurusMetadata:
        """Parse a mapping, ignoring unknown keys (files written by newer versions)."""
        if not isinstance(data, Mapping):
            raise ThesaurusFormatError(
                f"thesaurus metadata: expected a JSON object, got {type(data).__name__}"
            )
        optional = {
            "max_distance", "hubness_method", "depth", "hubness", "format", "checksums", "drift", "search",
        }  # fmt: skip
        missing = [f.name for f in fields(cls) if f.name not in data and f.name not in optional]
        if missing:
            raise ThesaurusFormatError(f"thesaurus metadata: missing key(s) {', '.join(missing)}")
        values: dict[str, Any] = {}
        for name in ("model_id", "built_at", "version", "metric"):
            values[name] = _expect(data[name], str, name)
        for name in ("dimension", "count", "n_trees", "min_count"):
            values[name] = _expect(data[name], int, name)
        max_distance = data.get("max_distance")
        if max_distance is not None:
            # JSON has one number type; an integral max distance comes back as an int.
            max_distance = float(_expect(max_distance, (int, float), "max_distance"))
        values["max_distance"] = max_distance
        values["hubness_method"] = _expect(data.get("hubness_method", "raw"), str, "hubness_method")
        values["depth"] = _expect(data.get("depth", 0), int, "depth")
        hubness = data.get("hubness")
        values["hubness"] = None if hubness is None else dict(_expect(hubness, Mapping, "hubness"))
        drift = data.get("drift")
        values["drift"] = None if drift is None else dict(_expect(drift, Mapping, "drift"))
        search = data.get("search")
        values["search"] = None if search is None else dict(_expect(search, Mapping, "search"))
        values["format"] = _expect(data.get("format", ""), str, "format")
        checksums = data.get("checksums")
        if checksums is not None:
            checksums = _expect(checksums, Mapping, "checksums")
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in checksums.items()):
                raise ThesaurusFormatError(
                    "thesaurus metadata: 'checksums' must map file names to hex digests"
                )
            checksums = dict(checksums)
        values["checksums"] = checksums
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> ThesaurusMetadata:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ThesaurusFormatError(f"thesaurus metadata: invalid JSON ({exc})") from exc
        return cls.from_dict(data)


def _expect(value: Any, kind: type | tuple[type, ...], name: str) -> Any:
    # bool is an int subclass; a boolean where a count belongs is a format error.
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ThesaurusFormatError(
            f"thesaurus metadata: {name!r} has the wrong type ({type(value).__name__})"
        )
    return value


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- protocol


@runtime_checkable
class Thesaurus(Protocol):
    """What the #REval scorer needs from a thesaurus."""

    @property
    def version(self) -> str: ...

    @property
    def metadata(self) -> ThesaurusMetadata: ...

    def neighbours(self, hashtag: str, k: int) -> list[str]:
        """Up to ``k`` nearest *other* hashtags, nearest first."""
        ...

    def synonyms(self, hashtag: str, k: int) -> list[str]:
        """Syn_k(h): ``[hashtag] + neighbours(hashtag, k)``; ``[hashtag]`` when unknown."""
        ...

    def __contains__(self, hashtag: object) -> bool: ...

    def __len__(self) -> int: ...


class ThesaurusSource(Protocol):
    """Where a scorer finds the published thesaurus versions: the directory store
    (:class:`workers.adapters.files.store.ThesaurusStore`) or Redis
    (:class:`workers.adapters.redis.redis_thesaurus.RedisThesauri`)."""

    def versions(self) -> list[str]:
        """Published version names, oldest first."""
        ...

    def current_version(self) -> str | None:
        """The version to serve; ``None`` before the first publish."""
        ...

    def load(self, version: str, *, index: bool = ...) -> Thesaurus:
        """One version (``index=False``: the neighbour table only, all a scorer needs)."""
        ...


def check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"k must be a non-negative integer, got {k!r}")


class BaseThesaurus(ABC):
    """Shared parts: Syn_k from neighbours, version from metadata."""

    @property
    @abstractmethod
    def metadata(self) -> ThesaurusMetadata: ...

    @abstractmethod
    def neighbours(self, hashtag: str, k: int) -> list[str]: ...

    @property
    def version(self) -> str:
        return self.metadata.version

    def synonyms(self, hashtag: str, k: int) -> list[str]:
        check_k(k)
        return [hashtag, *self.neighbours(hashtag, k)]

    def __repr__(self) -> str:
        m = self.metadata
        name = type(self).__name__
        return f"{name}(count={m.count}, version={m.version!r}, model={m.model_id!r})"


class StoredThesaurus(BaseThesaurus):
    """A thesaurus holding its hashtags (``_names``, in its own order) and its metadata."""

    _names: tuple[str, ...]
    _metadata: ThesaurusMetadata

    @property
    def metadata(self) -> ThesaurusMetadata:
        return self._metadata

    @property
    def hashtags(self) -> tuple[str, ...]:
        return self._names


# --------------------------------------------------------------------------- vectors


def check_max_distance(max_distance: float | None) -> float | None:
    if max_distance is None:
        return None
    value = float(max_distance)
    if not 0.0 <= value <= 2.0:
        raise ValueError(f"max_distance is a cosine distance in [0, 2], got {max_distance!r}")
    return value


class UnitRows:
    """The hashtags kept (``min_count``) and their vectors scaled to unit length, read
    block by block from the vectors as given: a build holds no float64 copy of the whole
    matrix (6.1 GB at 1,000,000 x 768).  Each row's arithmetic is the same whatever the
    block, so :meth:`matrix` equals scaling the whole matrix at once, to the bit.

    >>> rows = kept_unit_rows(["a", "b", "c"], [[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]], [5, 1, 2], 2)
    >>> rows.names, rows.matrix().tolist()
    (['a', 'c'], [[0.6, 0.8], [0.0, 1.0]])
    """

    def __init__(
        self, names: list[str], source: npt.NDArray[Any], rows: npt.NDArray[np.int64] | None
    ) -> None:
        self.names = names
        self._source = source
        self._rows = rows

    @property
    def dimension(self) -> int:
        return int(self._source.shape[1])

    def __len__(self) -> int:
        return len(self.names)

    def blocks(self, size: int = 4096) -> Iterator[tuple[int, npt.NDArray[np.float64]]]:
        """``(first row, unit rows)`` in blocks of ``size`` rows, float64."""
        for start in range(0, len(self.names), size):
            picked = slice(start, start + size) if self._rows is None else self._rows[start : start + size]
            block = np.array(self._source[picked], dtype=np.float64)
            norms = np.linalg.norm(block, axis=1)
            bad = ~np.isfinite(norms) | (norms == 0.0)
            if bad.any():
                name = self.names[start + int(np.flatnonzero(bad)[0])]
                # A zero vector has no direction: every cosine with it is undefined.
                raise ValueError(f"vector for hashtag {name!r} is zero or not finite")
            block /= norms[:, None]
            yield start, block

    def matrix(self) -> npt.NDArray[np.float64]:
        """All the unit rows, float64."""
        out = np.empty((len(self.names), self.dimension), dtype=np.float64)
        for start, block in self.blocks():
            out[start : start + len(block)] = block
        return out


def kept_unit_rows(
    names: Sequence[str],
    vectors: npt.ArrayLike,
    counts: Sequence[int] | None,
    min_count: int,
) -> UnitRows:
    """Validate the inputs and drop hashtags below ``min_count``: the unit rows to read."""
    matrix = np.asarray(vectors)
    if not np.issubdtype(matrix.dtype, np.floating):
        matrix = np.asarray(vectors, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"vectors must be a 2-D array (hashtags x dimensions), got {matrix.shape}")
    if matrix.shape[0] != len(names):
        raise ValueError(f"{len(names)} names but {matrix.shape[0]} vectors")
    if matrix.shape[1] < 1:
        raise ValueError("vectors must have at least one dimension")
    if counts is not None and len(counts) != len(names):
        raise ValueError(f"{len(names)} names but {len(counts)} counts")
    if counts is None and min_count > 1:
        raise ValueError(f"min_count={min_count} needs the hashtags' counts")
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"hashtag names must be non-empty strings, got {name!r}")
        if name in seen:
            raise ValueError(f"hashtag {name!r} appears more than once")
        seen.add(name)
    if counts is None:
        return UnitRows(list(names), matrix, None)
    keep = np.asarray(counts, dtype=np.int64) >= min_count
    kept_names = [name for name, k in zip(names, keep, strict=True) if k]
    return UnitRows(kept_names, matrix, None if keep.all() else np.flatnonzero(keep))


def name_ranks(names: Sequence[str]) -> npt.NDArray[np.int64]:
    """Each name's place in alphabetical order: the tie-break between equally near hashtags.

    >>> name_ranks(["b", "c", "a"]).tolist()
    [1, 2, 0]
    """
    rank = np.empty(len(names), dtype=np.int64)
    rank[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(names))
    return rank


def content_version(
    names: Sequence[str],
    unit: npt.NDArray[np.float64] | Iterable[npt.NDArray[np.float64]],
    params: Mapping[str, Any],
) -> str:
    """A version derived from the content, so a rebuild from the same data is the same version.
    ``unit``: the unit rows, whole or in consecutive blocks (the same version)."""
    digest = hashlib.sha256()
    digest.update(json.dumps(params, sort_keys=True).encode())
    digest.update(json.dumps(list(names), ensure_ascii=False).encode())
    for block in [unit] if isinstance(unit, np.ndarray) else unit:
        digest.update(np.ascontiguousarray(block, dtype="<f4").tobytes())
    return digest.hexdigest()[:16]


# --------------------------------------------------------------------------- exact


class ExactThesaurus(StoredThesaurus):
    """Exact nearest hashtags by brute-force cosine over a matrix of unit vectors.

    Ties are broken by name, so results are deterministic.

    >>> import numpy as np
    >>> th = ExactThesaurus.build(["b", "a", "c"], np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]))
    >>> th.neighbours_with_distances("c", 2)
    [('a', 1.0), ('b', 1.0)]
    >>> th.synonyms("a", 5)
    ['a', 'b', 'c']
    """

    METRIC = "cosine"

    def __init__(
        self,
        hashtags: Sequence[str],
        unit_vectors: npt.ArrayLike,
        metadata: ThesaurusMetadata,
    ) -> None:
        self._names: tuple[str, ...] = tuple(hashtags)
        self._ids = {name: i for i, name in enumerate(self._names)}
        self._matrix = np.asarray(unit_vectors, dtype=np.float64)
        if self._matrix.shape[0] != len(self._names):
            raise ValueError(f"{len(self._names)} hashtags but {self._matrix.shape[0]} vectors")
        self._name_rank = name_ranks(self._names)
        self._metadata = metadata

    @classmethod
    def build(
        cls,
        names: Sequence[str],
        vectors: npt.ArrayLike,
        *,
        counts: Sequence[int] | None = None,
        min_count: int = 1,
        model_id: str = "",
        version: str | None = None,
        max_distance: float | None = None,
    ) -> ExactThesaurus:
        """The exact twin of :meth:`AnnoyThesaurus.build`, called the same way (the Annoy
        index's and the re-ranking's parameters aside)."""
        max_distance = check_max_distance(max_distance)
        rows = kept_unit_rows(names, vectors, counts, min_count)
        kept, unit = rows.names, rows.matrix()
        if version is None:
            params = {
                "metric": cls.METRIC,
                "min_count": min_count,
                "max_distance": max_distance,
                "model_id": model_id,
            }
            version = content_version(kept, unit, params)
        metadata = ThesaurusMetadata(
            model_id=model_id,
            dimension=int(unit.shape[1]),
            count=len(kept),
            built_at=utc_now(),
            version=version,
            n_trees=0,
            metric=cls.METRIC,
            min_count=min_count,
            max_distance=max_distance,
        )
        return cls(kept, unit, metadata)

    def neighbours_with_distances(self, hashtag: str, k: int) -> list[tuple[str, float]]:
        """Up to ``k`` nearest other hashtags with cosine distances, by distance then name."""
        check_k(k)
        item = self._ids.get(hashtag)
        if item is None or k == 0:
            return []
        dist = 1.0 - self._matrix @ self._matrix[item]
        np.clip(dist, 0.0, 2.0, out=dist)
        dist[item] = np.inf
        others = len(self._names) - 1
        want = min(k, others)
        if want == 0:
            return []
        if want < others:
            # Everything up to the want-th distance, ties included, so the name
            # tie-break sees all hashtags at the cut-off distance.
            cutoff = np.partition(dist, want - 1)[want - 1]
            candidates = np.flatnonzero(dist <= cutoff)
        else:
            candidates = np.flatnonzero(np.isfinite(dist))
        order = candidates[np.lexsort((self._name_rank[candidates], dist[candidates]))][:want]
        limit = self._metadata.max_distance
        return [(self._names[i], float(dist[i])) for i in order if limit is None or dist[i] <= limit]

    def neighbours(self, hashtag: str, k: int) -> list[str]:
        return [name for name, _ in self.neighbours_with_distances(hashtag, k)]

    def __contains__(self, hashtag: object) -> bool:
        return hashtag in self._ids

    def __len__(self) -> int:
        return len(self._names)


# --------------------------------------------------------------------------- JSON


class JsonPairs(list[tuple[str, Any]]):
    """A JSON object kept as its key/value pairs, so duplicate keys can be reported."""


def _normalise_entry(raw: Any, where: str) -> str:
    if not isinstance(raw, str):
        raise ThesaurusFormatError(f"{where}: expected a hashtag string, got {json_kind(raw)}")
    plain = unicodedata.normalize("NFC", raw.strip()).lstrip("#＃").lower()
    full = normalise_hashtag(raw)
    # Accept what normalises cleanly; reject text that normalisation would cut
    # short ("new york" -> "new"), which would silently match the wrong hashtag.
    if not plain or full != plain:
        raise ThesaurusFormatError(f"{where}: {raw!r} is not a valid hashtag")
    return full


def json_kind(value: Any) -> str:
    if isinstance(value, JsonPairs):
        return "an object"
    return {
        list: "a list",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
        int: "a number",
        float: "a number",
    }.get(type(value), type(value).__name__)


class JsonThesaurus(BaseThesaurus):
    """A user's own thesaurus: ``{"hashtag": ["nearest", "next", ...]}``.

    Keys and values are normalised leniently (``#`` dropped, lower case); a
    hashtag listed among its own synonyms is dropped, as are repeats.

    >>> th = JsonThesaurus({"#Swim": ["dive", "#Sport", "swim"], "sport": ["sports"]})
    >>> th.synonyms("swim", 5), th.synonyms("swim", 1), th.synonyms("dive", 3)
    (['swim', 'dive', 'sport'], ['swim', 'dive'], ['dive'])
    >>> try:
    ...     JsonThesaurus({"swim": "dive"})
    ... except ThesaurusFormatError as exc:
    ...     print(exc)
    <dict>: key 'swim': expected a list of hashtags, got a string
    """

    METRIC = "user"

    def __init__(
        self,
        mapping: Mapping[str, Sequence[str]] | Sequence[tuple[str, Any]],
        *,
        source: str = "<dict>",
        model_id: str = "",
        built_at: str | None = None,
    ) -> None:
        pairs = list(mapping.items()) if isinstance(mapping, Mapping) else list(mapping)
        table: dict[str, list[str]] = {}
        original: dict[str, str] = {}
        for raw_key, raw_value in pairs:
            key = _normalise_entry(raw_key, f"{source}: key {raw_key!r}")
            if key in table:
                raise ThesaurusFormatError(
                    f"{source}: keys {original[key]!r} and {raw_key!r} are the same hashtag {key!r}"
                )
            if isinstance(raw_value, str | bytes | JsonPairs | Mapping) or not isinstance(
                raw_value, Sequence
            ):
                raise ThesaurusFormatError(
                    f"{source}: key {raw_key!r}: expected a list of hashtags, got {json_kind(raw_value)}"
                )
            synonyms: dict[str, None] = {}
            for position, raw in enumerate(raw_value):
                value = _normalise_entry(raw, f"{source}: key {raw_key!r}, item {position}")
                if value != key:
                    synonyms.setdefault(value, None)
            table[key] = list(synonyms)
            original[key] = raw_key
        self._table = table
        canonical = json.dumps(table, ensure_ascii=False, sort_keys=True).encode()
        self._metadata = ThesaurusMetadata(
            model_id=model_id or f"json:{source}",
            dimension=0,
            count=len(table),
            built_at=built_at or utc_now(),
            version=hashlib.sha256(canonical).hexdigest()[:16],
            n_trees=0,
            metric=self.METRIC,
            min_count=0,
            max_distance=None,
        )

    @property
    def metadata(self) -> ThesaurusMetadata:
        return self._metadata

    @property
    def hashtags(self) -> tuple[str, ...]:
        return tuple(self._table)

    def neighbours(self, hashtag: str, k: int) -> list[str]:
        check_k(k)
        return list(self._table.get(hashtag, ())[:k])

    def __contains__(self, hashtag: object) -> bool:
        return hashtag in self._table

    def __len__(self) -> int:
        return len(self._table)


# --------------------------------------------------------------------------- neighbour table
