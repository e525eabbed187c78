"""Hashtag thesauri: Syn_k(h), the k nearest hashtags of h in an embedding space.

The #REval method (SPEC "Synonyms and thesaurus (3.2)") counts a recommended
hashtag as a hit when a ground-truth hashtag is among its k nearest synonyms.
This module provides the thesauri that answer "which hashtags are nearest to h":

* :class:`AnnoyThesaurus` -- an Annoy ``angular`` index over unit hashtag vectors,
  saved atomically and memory-mapped when loaded (the production thesaurus).
* :class:`ExactThesaurus` -- the same answers by brute-force cosine (for checking
  Annoy's recall, and for small data).
* :class:`JsonThesaurus` -- a user's own thesaurus from a JSON file.
* :class:`ThesaurusStore` -- a versioned directory that the periodic index job
  publishes into and scoring workers load from, with an atomically updated
  ``CURRENT`` pointer.

All distances are *cosine* distances, ``1 - cos``, in ``[0, 2]``.  Hashtags are
expected to be normalised already (lower case, no ``#``); lookups do not
normalise, so ``"#Covid"`` is simply a hashtag the thesaurus has never seen.

>>> import numpy as np
>>> th = ExactThesaurus.build(["swim", "dive", "sport"], np.eye(3) + 0.5)
>>> th.synonyms("swim", 1), th.synonyms("never-seen", 5), th.synonyms("swim", 0)
(['swim', 'dive'], ['never-seen'], ['swim'])
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import math
import os
import re
import shutil
import stat
import sys
import tempfile
import time
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
from annoy import AnnoyIndex

from stream.hashtags import normalise_hashtag

__all__ = [
    "DEFAULT_SEARCH_K_FACTOR",
    "HASHTAGS_FILE",
    "INDEX_FILE",
    "METADATA_FILE",
    "AnnoyThesaurus",
    "ExactThesaurus",
    "JsonThesaurus",
    "Thesaurus",
    "ThesaurusFormatError",
    "ThesaurusMetadata",
    "ThesaurusStore",
    "angular_to_cosine",
    "cosine_to_angular",
    "load_thesaurus",
]

INDEX_FILE = "index.ann"
HASHTAGS_FILE = "hashtags.json"
METADATA_FILE = "metadata.json"
_THESAURUS_FILES = (INDEX_FILE, HASHTAGS_FILE, METADATA_FILE)

#: Default ``search_k`` is this many times Annoy's own default (``n_trees * n``).
#: On the clustered 10,000-vector test set (64-d, 50 trees) Annoy's default gave
#: recall@10 0.71; 10x (search_k 5,500 for k = 10) gives 0.987 at well under a
#: millisecond a query.
DEFAULT_SEARCH_K_FACTOR = 10

_CURRENT_FILE = "CURRENT"
_VERSION_RE = re.compile(r"v(\d{6,})")
# Temp and trash entries left by a writer that crashed are removed once they are
# this old; younger ones may belong to a writer still at work.
_STALE_SECONDS = 3600.0


class ThesaurusFormatError(ValueError):
    """A thesaurus file or directory is malformed (the message says where and how)."""


class _ReplacedWhileLoading(Exception):
    """Internal: the directory being loaded was replaced by a writer; load again."""


_LOAD_ATTEMPTS = 5


# --------------------------------------------------------------------------- metadata


@dataclass(frozen=True)
class ThesaurusMetadata:
    """What a thesaurus was built from and how; stored as ``metadata.json``.

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
        missing = [f.name for f in fields(cls) if f.name not in data and f.name != "max_distance"]
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
        return cls(**values, max_distance=max_distance)

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


def _utc_now() -> str:
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


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"k must be a non-negative integer, got {k!r}")


class _BaseThesaurus(ABC):
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
        _check_k(k)
        return [hashtag, *self.neighbours(hashtag, k)]

    def __repr__(self) -> str:
        m = self.metadata
        name = type(self).__name__
        return f"{name}(count={m.count}, version={m.version!r}, model={m.model_id!r})"


# --------------------------------------------------------------------------- vectors


def angular_to_cosine(angular: float) -> float:
    """Annoy's angular distance ``sqrt(2(1 - cos))`` as a cosine distance ``1 - cos``."""
    return min(max(angular * angular / 2.0, 0.0), 2.0)


def cosine_to_angular(cosine: float) -> float:
    """A cosine distance ``1 - cos`` as Annoy's angular distance ``sqrt(2(1 - cos))``."""
    return math.sqrt(2.0 * max(cosine, 0.0))


def _check_max_distance(max_distance: float | None) -> float | None:
    if max_distance is None:
        return None
    value = float(max_distance)
    if not 0.0 <= value <= 2.0:
        raise ValueError(f"max_distance is a cosine distance in [0, 2], got {max_distance!r}")
    return value


def _prepare(
    names: Sequence[str],
    vectors: npt.ArrayLike,
    counts: Sequence[int] | None,
    min_count: int,
) -> tuple[list[str], npt.NDArray[np.float64]]:
    """Validate the inputs, drop hashtags below ``min_count``, scale vectors to unit length."""
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

    keep = (
        np.ones(len(names), dtype=bool)
        if counts is None
        else np.asarray(counts, dtype=np.int64) >= min_count
    )
    kept_names = [name for name, k in zip(names, keep, strict=True) if k]
    matrix = matrix[keep]
    norms = np.linalg.norm(matrix, axis=1)
    bad = ~np.isfinite(norms) | (norms == 0.0)
    if bad.any():
        name = kept_names[int(np.flatnonzero(bad)[0])]
        # A zero vector has no direction: every cosine with it is undefined.
        raise ValueError(f"vector for hashtag {name!r} is zero or not finite")
    return kept_names, matrix / norms[:, None]


def _content_version(
    names: Sequence[str], unit: npt.NDArray[np.float64], params: Mapping[str, Any]
) -> str:
    """A version derived from the content, so a rebuild from the same data is the same version."""
    digest = hashlib.sha256()
    digest.update(json.dumps(params, sort_keys=True).encode())
    digest.update(json.dumps(list(names), ensure_ascii=False).encode())
    digest.update(np.ascontiguousarray(unit, dtype="<f4").tobytes())
    return digest.hexdigest()[:16]


# --------------------------------------------------------------------------- files


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, ensure_ascii=False, indent=2)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False if unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False  # C library older than glibc 2.28
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False  # file system or kernel without exchange
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _publish_directory(tmp: Path, target: Path) -> None:
    """Move the finished directory ``tmp`` to ``target``, replacing whatever is there whole.

    An existing target is swapped with ``tmp`` in one atomic step where the
    system can (Linux), so the path always names a complete thesaurus.  Elsewhere
    the old target is renamed aside first (POSIX cannot rename a directory onto a
    non-empty one): readers then see the old one, for an instant nothing, then
    the new one -- never a mixture.
    """
    if not target.exists():
        os.rename(tmp, target)
    elif _exchange(tmp, target):
        _remove_tree(tmp)  # now holds the old thesaurus
    else:
        trash = Path(tempfile.mkdtemp(prefix=f".{target.name}.trash-", dir=target.parent))
        # The placeholder is empty, so renaming the old target onto it is allowed.
        os.replace(target, trash)
        try:
            os.replace(tmp, target)
        except BaseException:
            os.replace(trash, target)
            raise
        _remove_tree(trash)
    _fsync_path(target.parent)


class _DirectoryReader:
    """Opens every file of one directory through a single directory handle.

    A writer may replace the directory while we read it; reading through the
    handle keeps all files from the same (old or new) directory, so a reader
    never combines the metadata of one thesaurus with the index of another.
    Falls back to plain paths where ``dir_fd`` is not supported.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fd: int | None = None
        if os.open in os.supports_dir_fd and hasattr(os, "O_DIRECTORY"):
            self._fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            opened = os.fstat(self._fd)
        else:
            opened = os.stat(directory)
        self._identity = (opened.st_dev, opened.st_ino)

    @property
    def consistent(self) -> bool:
        """Whether every file read came from one directory (always, with a directory handle)."""
        return self._fd is not None or not self.replaced()

    def replaced(self) -> bool:
        """Whether the path now names another directory (or none) than the one opened."""
        try:
            now = os.stat(self.directory)
        except FileNotFoundError:
            return True
        return (now.st_dev, now.st_ino) != self._identity

    def __enter__(self) -> _DirectoryReader:
        return self

    def __exit__(self, *_: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def is_file(self, name: str) -> bool:
        if self._fd is None:
            return (self.directory / name).is_file()
        try:
            return stat.S_ISREG(os.stat(name, dir_fd=self._fd).st_mode)
        except FileNotFoundError:
            return False

    def open_fd(self, name: str) -> int:
        if self._fd is None:
            return os.open(self.directory / name, os.O_RDONLY)
        return os.open(name, os.O_RDONLY, dir_fd=self._fd)

    def read_json(self, name: str) -> Any:
        path = self.directory / name
        try:
            with os.fdopen(self.open_fd(name), encoding="utf-8") as fh:
                return json.load(fh)
        except json.JSONDecodeError as exc:
            raise ThesaurusFormatError(f"{path}: invalid JSON ({exc})") from exc
        except UnicodeDecodeError as exc:
            raise ThesaurusFormatError(f"{path}: not UTF-8 text ({exc})") from exc

    def path_of_fd(self, name: str, fd: int) -> str:
        """A path that names the already opened file ``fd``, for libraries that want a path."""
        proc = f"/proc/self/fd/{fd}"
        return proc if self._fd is not None and os.path.exists(proc) else str(self.directory / name)


# --------------------------------------------------------------------------- Annoy


class AnnoyThesaurus(_BaseThesaurus):
    """Approximate nearest hashtags from an Annoy ``angular`` index.

    >>> import numpy as np, tempfile
    >>> names = ["swim", "dive", "sport", "golf"]
    >>> vectors = np.array([[1.0, 0.1, 0.0], [0.9, 0.3, 0.0], [0.6, 0.8, 0.0], [0.0, 1.0, 0.2]])
    >>> th = AnnoyThesaurus.build(names, vectors, n_trees=10, model_id="demo")
    >>> th.synonyms("swim", 2)
    ['swim', 'dive', 'sport']
    >>> th.synonyms("golf", 0), th.synonyms("unknown", 3)
    (['golf'], ['unknown'])
    >>> [(h, round(d, 3)) for h, d in th.neighbours_with_distances("swim", 1)]
    [('dive', 0.025)]
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = th.save(f"{tmp}/th")
    ...     AnnoyThesaurus.load(f"{tmp}/th").neighbours("swim", 3)
    ['dive', 'sport', 'golf']
    """

    METRIC: Literal["angular"] = "angular"

    def __init__(
        self,
        index: AnnoyIndex,
        hashtags: Sequence[str],
        metadata: ThesaurusMetadata,
        *,
        search_k: int | None = None,
    ) -> None:
        if index.get_n_items() != len(hashtags):
            raise ThesaurusFormatError(
                f"index has {index.get_n_items()} items but {len(hashtags)} hashtags"
            )
        self._index = index
        self._names: tuple[str, ...] = tuple(hashtags)
        self._ids = {name: i for i, name in enumerate(self._names)}
        if len(self._ids) != len(self._names):
            raise ThesaurusFormatError("hashtag list contains duplicates")
        self._metadata = metadata
        #: Nodes Annoy inspects a query; ``None`` means ``DEFAULT_SEARCH_K_FACTOR``
        #: times Annoy's own default.  Higher: better recall, slower queries.
        self.search_k = search_k

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
        n_trees: int = 50,
        max_distance: float | None = None,
        seed: int = 42,
        search_k: int | None = None,
        n_jobs: int = 1,
    ) -> AnnoyThesaurus:
        """Index ``vectors[i]`` as hashtag ``names[i]``.

        Hashtags with ``counts[i] < min_count`` are left out (minimum support).
        ``version`` defaults to a hash of the content and parameters, so the same
        data gives the same version.  ``n_jobs=1`` keeps the build reproducible for
        a given ``seed``; more threads build faster.
        """
        if n_trees < 1:
            raise ValueError(f"n_trees must be at least 1, got {n_trees}")
        max_distance = _check_max_distance(max_distance)
        kept, unit = _prepare(names, vectors, counts, min_count)
        dimension = int(unit.shape[1])
        index = AnnoyIndex(dimension, cls.METRIC)
        index.set_seed(seed)
        for i, row in enumerate(unit):
            index.add_item(i, row.tolist())
        index.build(n_trees, n_jobs=n_jobs)
        if version is None:
            params = {"metric": cls.METRIC, "n_trees": n_trees, "seed": seed,
                      "min_count": min_count, "max_distance": max_distance, "model_id": model_id}
            version = _content_version(kept, unit, params)
        metadata = ThesaurusMetadata(
            model_id=model_id,
            dimension=dimension,
            count=len(kept),
            built_at=_utc_now(),
            version=version,
            n_trees=n_trees,
            metric=cls.METRIC,
            min_count=min_count,
            max_distance=max_distance,
        )
        return cls(index, kept, metadata, search_k=search_k)

    @classmethod
    def load(
        cls, directory: str | Path, *, search_k: int | None = None, prefault: bool = False
    ) -> AnnoyThesaurus:
        """Open a saved thesaurus; the index is memory-mapped, not read into memory."""
        directory = Path(directory)
        try:
            # One stat, not exists() then is_dir(): a save in between must not
            # make a directory look like a file.
            mode = os.stat(directory).st_mode
        except FileNotFoundError:
            raise FileNotFoundError(f"thesaurus directory {directory} does not exist") from None
        if not stat.S_ISDIR(mode):
            raise ThesaurusFormatError(f"{directory} is not a directory")
        for _ in range(_LOAD_ATTEMPTS - 1):
            with contextlib.suppress(_ReplacedWhileLoading):
                return cls._load_once(directory, search_k=search_k, prefault=prefault)
        try:
            return cls._load_once(directory, search_k=search_k, prefault=prefault)
        except _ReplacedWhileLoading as exc:
            if exc.__cause__ is None:  # pragma: no cover - always raised "from" an error
                raise
            raise exc.__cause__ from None

    @classmethod
    def _load_once(
        cls, directory: Path, *, search_k: int | None, prefault: bool
    ) -> AnnoyThesaurus:
        with _DirectoryReader(directory) as reader:
            try:
                loaded = cls._read(reader, search_k=search_k, prefault=prefault)
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
        cls, reader: _DirectoryReader, *, search_k: int | None, prefault: bool
    ) -> AnnoyThesaurus:
        directory = reader.directory
        missing = [name for name in _THESAURUS_FILES if not reader.is_file(name)]
        if missing:
            raise ThesaurusFormatError(
                f"{directory} is not a thesaurus directory: missing {', '.join(missing)}"
            )
        metadata = ThesaurusMetadata.from_dict(reader.read_json(METADATA_FILE))
        if metadata.metric != cls.METRIC:
            raise ThesaurusFormatError(
                f"{directory / METADATA_FILE}: metric {metadata.metric!r}, expected {cls.METRIC!r}"
            )
        hashtags = reader.read_json(HASHTAGS_FILE)
        if not isinstance(hashtags, list) or not all(isinstance(h, str) for h in hashtags):
            raise ThesaurusFormatError(f"{directory / HASHTAGS_FILE}: expected a list of strings")
        if len(hashtags) != metadata.count:
            raise ThesaurusFormatError(
                f"{directory}: {len(hashtags)} hashtags but metadata says {metadata.count}"
            )
        index = AnnoyIndex(metadata.dimension, cls.METRIC)
        fd = reader.open_fd(INDEX_FILE)
        try:
            index.load(reader.path_of_fd(INDEX_FILE, fd), prefault=prefault)
        except OSError as exc:
            raise ThesaurusFormatError(f"{directory / INDEX_FILE}: cannot load ({exc})") from exc
        finally:
            os.close(fd)  # the memory map outlives the descriptor
        try:
            return cls(index, hashtags, metadata, search_k=search_k)
        except ThesaurusFormatError as exc:
            raise ThesaurusFormatError(f"{directory}: {exc}") from exc

    def save(self, directory: str | Path) -> Path:
        """Write the thesaurus to ``directory`` atomically, replacing any existing one.

        Everything is written into a temporary directory beside the target (same
        file system) and renamed into place, so a reader never sees a partial
        thesaurus.  Note: Annoy re-opens its index from the file it saved, so this
        object then memory-maps ``directory/index.ann``.
        """
        target = Path(directory)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            index_path = tmp / INDEX_FILE
            if not self._index.save(str(index_path)):
                raise OSError(f"Annoy could not save {index_path}")
            _fsync_path(index_path)
            _write_json(tmp / HASHTAGS_FILE, list(self._names))
            _write_json(tmp / METADATA_FILE, self._metadata.to_dict())
            _fsync_path(tmp)
            _publish_directory(tmp, target)
        except BaseException:
            _remove_tree(tmp)
            raise
        return target

    @property
    def metadata(self) -> ThesaurusMetadata:
        return self._metadata

    @property
    def hashtags(self) -> tuple[str, ...]:
        """All hashtags, in id order."""
        return self._names

    def effective_search_k(self, k: int) -> int:
        """The ``search_k`` a query for ``k`` neighbours (``k + 1`` items) uses."""
        if self.search_k is not None:
            return self.search_k
        return DEFAULT_SEARCH_K_FACTOR * max(self._metadata.n_trees, 1) * (k + 1)

    def neighbours_with_distances(
        self, hashtag: str, k: int, *, search_k: int | None = None
    ) -> list[tuple[str, float]]:
        """Up to ``k`` nearest other hashtags with their cosine distances, nearest first.

        Equal distances are ordered by name, as in :class:`ExactThesaurus`.
        """
        _check_k(k)
        item = self._ids.get(hashtag)
        if item is None or k == 0:
            return []
        ids, dists = self._index.get_nns_by_item(
            item,
            k + 1,
            search_k=self.effective_search_k(k) if search_k is None else search_k,
            include_distances=True,
        )
        # h is normally its own nearest, but an identical vector or an approximate
        # search can put it elsewhere or leave it out: drop it wherever it is and
        # still keep k others.
        found = sorted(
            (angular_to_cosine(d), self._names[i]) for i, d in zip(ids, dists, strict=True)
            if i != item
        )[:k]
        limit = self._metadata.max_distance
        return [(name, d) for d, name in found if limit is None or d <= limit]

    def neighbours(self, hashtag: str, k: int) -> list[str]:
        return [name for name, _ in self.neighbours_with_distances(hashtag, k)]

    def close(self) -> None:
        """Release the memory map; the thesaurus is unusable afterwards."""
        self._index.unload()

    def __contains__(self, hashtag: object) -> bool:
        return hashtag in self._ids

    def __len__(self) -> int:
        return len(self._names)


# --------------------------------------------------------------------------- exact


class ExactThesaurus(_BaseThesaurus):
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
        rank = np.empty(len(self._names), dtype=np.int64)
        rank[sorted(range(len(self._names)), key=self._names.__getitem__)] = np.arange(
            len(self._names)
        )
        self._name_rank = rank
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
        n_trees: int = 50,
        max_distance: float | None = None,
        seed: int = 42,
    ) -> ExactThesaurus:
        """Same signature as :meth:`AnnoyThesaurus.build`; ``n_trees`` and ``seed`` are unused."""
        del n_trees, seed  # accepted so the two builders are interchangeable
        max_distance = _check_max_distance(max_distance)
        kept, unit = _prepare(names, vectors, counts, min_count)
        if version is None:
            params = {"metric": cls.METRIC, "min_count": min_count,
                      "max_distance": max_distance, "model_id": model_id}
            version = _content_version(kept, unit, params)
        metadata = ThesaurusMetadata(
            model_id=model_id,
            dimension=int(unit.shape[1]),
            count=len(kept),
            built_at=_utc_now(),
            version=version,
            n_trees=0,
            metric=cls.METRIC,
            min_count=min_count,
            max_distance=max_distance,
        )
        return cls(kept, unit, metadata)

    @property
    def metadata(self) -> ThesaurusMetadata:
        return self._metadata

    @property
    def hashtags(self) -> tuple[str, ...]:
        return self._names

    def neighbours_with_distances(self, hashtag: str, k: int) -> list[tuple[str, float]]:
        """Up to ``k`` nearest other hashtags with cosine distances, by distance then name."""
        _check_k(k)
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
        return [
            (self._names[i], float(dist[i]))
            for i in order
            if limit is None or dist[i] <= limit
        ]

    def neighbours(self, hashtag: str, k: int) -> list[str]:
        return [name for name, _ in self.neighbours_with_distances(hashtag, k)]

    def __contains__(self, hashtag: object) -> bool:
        return hashtag in self._ids

    def __len__(self) -> int:
        return len(self._names)


# --------------------------------------------------------------------------- JSON


class _Pairs(list[tuple[str, Any]]):
    """A JSON object kept as its key/value pairs, so duplicate keys can be reported."""


def _normalise_entry(raw: Any, where: str) -> str:
    if not isinstance(raw, str):
        raise ThesaurusFormatError(f"{where}: expected a hashtag string, got {_json_kind(raw)}")
    plain = unicodedata.normalize("NFC", raw.strip()).lstrip("#＃").lower()
    full = normalise_hashtag(raw)
    # Accept what normalises cleanly; reject text that normalisation would cut
    # short ("new york" -> "new"), which would silently match the wrong hashtag.
    if not plain or full != plain:
        raise ThesaurusFormatError(f"{where}: {raw!r} is not a valid hashtag")
    return full


def _json_kind(value: Any) -> str:
    if isinstance(value, _Pairs):
        return "an object"
    return {list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


class JsonThesaurus(_BaseThesaurus):
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
            if isinstance(raw_value, str | bytes | _Pairs | Mapping) or not isinstance(
                raw_value, Sequence
            ):
                raise ThesaurusFormatError(
                    f"{source}: key {raw_key!r}: expected a list of hashtags, "
                    f"got {_json_kind(raw_value)}"
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
            built_at=built_at or _utc_now(),
            version=hashlib.sha256(canonical).hexdigest()[:16],
            n_trees=0,
            metric=self.METRIC,
            min_count=0,
            max_distance=None,
        )

    @classmethod
    def load(cls, path: str | Path) -> JsonThesaurus:
        """Read a JSON thesaurus file (UTF-8)."""
        path = Path(path)
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh, object_pairs_hook=_Pairs)
        except json.JSONDecodeError as exc:
            raise ThesaurusFormatError(f"{path}: invalid JSON ({exc})") from exc
        except UnicodeDecodeError as exc:
            raise ThesaurusFormatError(f"{path}: not UTF-8 text ({exc})") from exc
        if not isinstance(data, _Pairs):
            raise ThesaurusFormatError(
                f'{path}: expected an object {{"hashtag": ["synonym", ...]}}, '
                f"got {_json_kind(data)}"
            )
        mtime = datetime.fromtimestamp(path.stat().st_mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return cls(data, source=str(path), built_at=mtime)

    @property
    def metadata(self) -> ThesaurusMetadata:
        return self._metadata

    @property
    def hashtags(self) -> tuple[str, ...]:
        return tuple(self._table)

    def neighbours(self, hashtag: str, k: int) -> list[str]:
        _check_k(k)
        return list(self._table.get(hashtag, ())[:k])

    def __contains__(self, hashtag: object) -> bool:
        return hashtag in self._table

    def __len__(self) -> int:
        return len(self._table)


# --------------------------------------------------------------------------- loading


def load_thesaurus(path: str | Path) -> Thesaurus:
    """Open a thesaurus: an Annoy thesaurus directory, a :class:`ThesaurusStore` root
    (its current version) or a ``.json`` file.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"thesaurus path {path} does not exist")
    if path.is_dir():
        if not (path / INDEX_FILE).exists() and (path / _CURRENT_FILE).is_file():
            loaded = ThesaurusStore(path).load_current()
            if loaded is None:
                raise ThesaurusFormatError(f"thesaurus store {path} has no current version")
            return loaded
        return AnnoyThesaurus.load(path)
    if path.suffix.lower() == ".json":
        return JsonThesaurus.load(path)
    raise ThesaurusFormatError(
        f"{path} is neither a thesaurus directory ({', '.join(_THESAURUS_FILES)}) "
        "nor a .json thesaurus file"
    )


# --------------------------------------------------------------------------- store


class ThesaurusStore:
    """Versioned thesauri for the periodic index job, safe for concurrent readers.

    Layout: ``root/v000001/``, ``root/v000002/``, ... (each an Annoy thesaurus
    directory) and ``root/CURRENT`` naming the version to serve.  Publishing
    writes a new version, then replaces ``CURRENT`` atomically, then prunes old
    versions to the newest ``keep`` (never the current one).  The store's version
    names are distinct from ``thesaurus.version``, which identifies the content.

    >>> import numpy as np, tempfile
    >>> th = AnnoyThesaurus.build(["a", "b", "c"], np.eye(3) + 0.1, n_trees=5)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     store = ThesaurusStore(tmp, keep=2)
    ...     print(store.publish(th), store.publish(th), store.publish(th), store.versions())
    ...     print(store.current_version(), store.load_current().synonyms("a", 1))
    v000001 v000002 v000003 ['v000002', 'v000003']
    v000003 ['a', 'b']
    """

    def __init__(self, root: str | Path, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.root = Path(root)
        self.keep = keep

    def versions(self) -> list[str]:
        """Published version names, oldest first."""
        if not self.root.is_dir():
            return []
        found = [
            entry.name
            for entry in self.root.iterdir()
            if _VERSION_RE.fullmatch(entry.name) and entry.is_dir()
        ]
        return sorted(found, key=_version_number)

    def current_version(self) -> str | None:
        try:
            text = (self.root / _CURRENT_FILE).read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        if not _VERSION_RE.fullmatch(text):
            raise ThesaurusFormatError(f"{self.root / _CURRENT_FILE}: bad version {text!r}")
        return text

    def publish(self, thesaurus: AnnoyThesaurus) -> str:
        """Save ``thesaurus`` as a new version, make it current, prune; return its name."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._remove_stale()
        existing = [_version_number(v) for v in self.versions()]
        current = self.current_version()
        if current is not None:
            existing.append(_version_number(current))
        number = max(existing, default=0) + 1
        while True:
            name = f"v{number:06d}"
            try:
                # Reserves the name: mkdir fails if another writer got there first.
                (self.root / name).mkdir()
                break
            except FileExistsError:
                number += 1
        try:
            thesaurus.save(self.root / name)
        except BaseException:
            _remove_tree(self.root / name)
            raise
        self._set_current(name)
        self.prune()
        return name

    def _set_current(self, name: str) -> None:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{_CURRENT_FILE}.tmp-", dir=self.root)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(name + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp_name, self.root / _CURRENT_FILE)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
        _fsync_path(self.root)

    def prune(self) -> list[str]:
        """Remove all but the newest ``keep`` versions and the current one; return the removed."""
        versions = self.versions()
        protected = set(versions[-self.keep :])
        current = self.current_version()
        if current is not None:
            protected.add(current)
        removed = []
        for name in versions:
            if name in protected:
                continue
            # Renamed away first so a reader sees the whole version or none of it.
            trash = Path(tempfile.mkdtemp(prefix=f".{name}.trash-", dir=self.root))
            with contextlib.suppress(FileNotFoundError):  # another writer pruned it already
                os.replace(self.root / name, trash)
            _remove_tree(trash)
            removed.append(name)
        return removed

    def _remove_stale(self) -> None:
        cutoff = time.time() - _STALE_SECONDS
        for entry in self.root.iterdir():
            if not entry.name.startswith(".") or not (
                ".tmp-" in entry.name or ".trash-" in entry.name
            ):
                continue
            try:
                if entry.lstat().st_mtime >= cutoff:
                    continue
                if entry.is_dir():
                    _remove_tree(entry)
                else:
                    entry.unlink(missing_ok=True)
            except FileNotFoundError:
                continue

    def load(self, version: str, *, search_k: int | None = None) -> AnnoyThesaurus:
        if not _VERSION_RE.fullmatch(version):
            raise ValueError(f"not a version name: {version!r}")
        return AnnoyThesaurus.load(self.root / version, search_k=search_k)

    def load_current(self, *, search_k: int | None = None) -> AnnoyThesaurus | None:
        """The current version, or ``None`` before the first publish."""
        for _ in range(5):
            version = self.current_version()
            if version is None:
                return None
            try:
                return self.load(version, search_k=search_k)
            except (FileNotFoundError, ThesaurusFormatError):
                # Pruned between reading CURRENT and opening it: a newer version is
                # current by now, so try again; if CURRENT is unchanged it is a real error.
                if self.current_version() == version:
                    raise
        raise ThesaurusFormatError(f"{self.root}: current version keeps changing while loading")


def _version_number(name: str) -> int:
    match = _VERSION_RE.fullmatch(name)
    if match is None:
        raise ValueError(f"not a version name: {name!r}")
    return int(match.group(1))
