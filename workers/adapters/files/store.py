"""The versioned thesaurus store the index job publishes into and the scorers load from,
and :func:`load_thesaurus`, which opens any thesaurus path a command is given.

The store's atomicity needs no directory swap: every version is written under a new name
(reserved with ``mkdir``, renamed onto atomically) and ``CURRENT`` is replaced in one
step (:func:`workers.adapters.files.atomic_files.write_text_atomically`), so a scorer always
finds a whole version.  The Annoy thesaurus itself is :mod:`workers.adapters.files.annoy_thesaurus`.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from datetime import UTC, datetime
from pathlib import Path

from stream.synonyms.thesaurus import JsonPairs, JsonThesaurus, Thesaurus, ThesaurusFormatError, json_kind
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus
from workers.adapters.files.atomic_files import (
    discard_directory,
    remove_stale,
    remove_tree,
    write_text_atomically,
)
from workers.adapters.files.thesaurus_files import METADATA_FILE, THESAURUS_FILES

__all__ = ["ThesaurusStore", "load_thesaurus", "read_json_thesaurus", "version_number"]

_CURRENT_FILE = "CURRENT"
_VERSION_RE = re.compile(r"v(\d{6,})")
# Temp and trash entries left by a writer that crashed are removed once they are
# this old; younger ones may belong to a writer still at work.
_STALE_SECONDS = 3600.0


def read_json_thesaurus(path: str | Path) -> JsonThesaurus:
    """Read a JSON thesaurus file (UTF-8): ``{"hashtag": ["nearest", "next", ...]}``."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh, object_pairs_hook=JsonPairs)
    except json.JSONDecodeError as exc:
        raise ThesaurusFormatError(f"{path}: invalid JSON ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise ThesaurusFormatError(f"{path}: not UTF-8 text ({exc})") from exc
    if not isinstance(data, JsonPairs):
        raise ThesaurusFormatError(
            f'{path}: expected an object {{"hashtag": ["synonym", ...]}}, got {json_kind(data)}'
        )
    mtime = datetime.fromtimestamp(path.stat().st_mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return JsonThesaurus(data, source=str(path), built_at=mtime)


def load_thesaurus(path: str | Path) -> Thesaurus:
    """Open a thesaurus: an Annoy thesaurus directory, a :class:`ThesaurusStore` root
    (its current version) or a ``.json`` file.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"thesaurus path {path} does not exist")
    if path.is_dir():
        if not (path / METADATA_FILE).exists() and (path / _CURRENT_FILE).is_file():
            loaded = ThesaurusStore(path).load_current()
            if loaded is None:
                raise ThesaurusFormatError(f"thesaurus store {path} has no current version")
            return loaded
        return AnnoyThesaurus.load(path)
    if path.suffix.lower() == ".json":
        return read_json_thesaurus(path)
    raise ThesaurusFormatError(
        f"{path} is neither a thesaurus directory ({', '.join(THESAURUS_FILES)}) nor a .json thesaurus file"
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
        """Published version names, oldest first.

        A version directory is published whole (its files are written beside it and renamed
        into place), so one without its metadata is only a name :meth:`publish` reserved --
        a writer at work, or one killed before its rename -- and is not a version."""
        if not self.root.is_dir():
            return []
        found = [
            entry.name
            for entry in self.root.iterdir()
            if _VERSION_RE.fullmatch(entry.name) and (entry / METADATA_FILE).is_file()
        ]
        return sorted(found, key=version_number)

    def _remove_stale_reservations(self) -> None:
        """Names reserved by writers that died before their rename (empty, old): removed."""
        cutoff = time.time() - _STALE_SECONDS
        for entry in self.root.iterdir():
            if not _VERSION_RE.fullmatch(entry.name) or (entry / METADATA_FILE).exists():
                continue
            with contextlib.suppress(OSError):  # not empty, or gone: a writer's, or none
                if entry.is_dir() and entry.lstat().st_mtime < cutoff:
                    entry.rmdir()

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
        remove_stale(self.root, _STALE_SECONDS)
        self._remove_stale_reservations()
        existing = [version_number(v) for v in self.versions()]
        current = self.current_version()
        if current is not None:
            existing.append(version_number(current))
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
            # Never publish a version we cannot read back: checksums, index and table.
            AnnoyThesaurus.load(self.root / name).close()
        except BaseException:
            remove_tree(self.root / name)
            raise
        self._set_current(name)
        self.prune()
        return name

    def _set_current(self, name: str) -> None:
        write_text_atomically(self.root / _CURRENT_FILE, name + "\n")

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
            discard_directory(self.root / name)  # a reader sees the whole version or none of it
            removed.append(name)
        return removed

    def load(self, version: str, *, search_k: int | None = None, index: bool = True) -> AnnoyThesaurus:
        """One version (``index=False``: the neighbour table only, as scorers need)."""
        if not _VERSION_RE.fullmatch(version):
            raise ValueError(f"not a version name: {version!r}")
        return AnnoyThesaurus.load(self.root / version, search_k=search_k, index=index)

    def load_current(self, *, search_k: int | None = None, index: bool = True) -> AnnoyThesaurus | None:
        """The current version, or ``None`` before the first publish."""
        for _ in range(5):
            version = self.current_version()
            if version is None:
                return None
            try:
                return self.load(version, search_k=search_k, index=index)
            except (FileNotFoundError, ThesaurusFormatError):
                # Pruned between reading CURRENT and opening it: a newer version is
                # current by now, so try again; if CURRENT is unchanged it is a real error.
                if self.current_version() == version:
                    raise
        raise ThesaurusFormatError(f"{self.root}: current version keeps changing while loading")


def version_number(name: str) -> int:
    """``v000012`` -> 12 (the store's sortable version names).

    >>> version_number("v000012")
    12
    """
    match = _VERSION_RE.fullmatch(name)
    if match is None:
        raise ValueError(f"not a version name: {name!r}")
    return int(match.group(1))
