"""A thesaurus directory's files: their names, their checksums, who may be overwritten, and
the neighbour table read from (and written to) them.

A version is ``index.ann`` (Annoy), ``hashtags.json``, ``table.npz`` (the neighbour table)
and ``metadata.json`` with a SHA-256 of each of the others, checked before anything is
parsed.  Scorers need only the table: :mod:`workers.adapters.redis.redis_thesaurus` publishes
the same files' bytes to Redis and parses them with :func:`parse_table`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from stream.synonyms.neighbour_table import NeighbourTable
from stream.synonyms.thesaurus import ThesaurusFormatError, ThesaurusMetadata
from workers.adapters.files.atomic_files import DirectoryReader, sha256_file, write_bytes, write_json
from workers.adapters.files.feeds import check_output_path

__all__ = [
    "HASHTAGS_FILE",
    "INDEX_FILE",
    "METADATA_FILE",
    "TABLE_FILE",
    "THESAURUS_FILES",
    "ThesaurusCorruptError",
    "ThesaurusOverwriteError",
    "check_writable_thesaurus_dir",
    "is_our_thesaurus",
    "parse_table",
    "read_json",
    "read_verified",
    "verify_fd",
    "write_table_files",
]

INDEX_FILE = "index.ann"
HASHTAGS_FILE = "hashtags.json"
TABLE_FILE = "table.npz"
METADATA_FILE = "metadata.json"
THESAURUS_FILES = (INDEX_FILE, HASHTAGS_FILE, TABLE_FILE, METADATA_FILE)


def _verify(data_digest: str, path: Path, checksums: dict[str, str]) -> None:
    expected = checksums.get(path.name)
    if expected is None:
        raise ThesaurusFormatError(f"{path.parent / METADATA_FILE}: no checksum for {path.name}")
    if data_digest != expected:
        raise ThesaurusCorruptError(f"{path}: checksum mismatch (the file is damaged or was changed)")


def verify_fd(fd: int, path: Path, checksums: dict[str, str]) -> None:
    """Check the checksum of the open file ``fd`` (read through a duplicate, so ``fd``'s
    own position is untouched)."""
    digest = hashlib.sha256()
    with os.fdopen(os.dup(fd), "rb") as fh:
        fh.seek(0)
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    _verify(digest.hexdigest(), path, checksums)


class ThesaurusCorruptError(ThesaurusFormatError):
    """A thesaurus file does not match the checksum written with it."""


class ThesaurusOverwriteError(ThesaurusFormatError):
    """A thesaurus would replace something that is not a thesaurus of ours (or without --force)."""


def is_our_thesaurus(directory: Path) -> bool:
    """Whether ``directory`` holds a thesaurus written by this project (its metadata says so)."""
    try:
        with open(directory / METADATA_FILE, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and str(data.get("format", "")).startswith("reval-thesaurus/")


def check_writable_thesaurus_dir(target: Path, *, replace: bool) -> None:
    """Refuse to write a thesaurus over anything but nothing, an empty directory, or --
    with ``replace`` -- a thesaurus of ours."""
    if not target.exists() and not target.is_symlink():
        try:
            check_output_path(target)
        except ValueError as exc:
            raise ThesaurusOverwriteError(str(exc)) from None
        return
    if not target.is_dir() or target.is_symlink():
        raise ThesaurusOverwriteError(f"{target} exists and is not a directory: refusing to replace it")
    if not any(target.iterdir()):
        return
    if not is_our_thesaurus(target):
        raise ThesaurusOverwriteError(
            f"{target} is not empty and holds no thesaurus of ours: refusing to write there "
            "(choose a new directory)"
        )
    foreign = sorted(p.name for p in target.iterdir() if p.name not in THESAURUS_FILES)
    if foreign:
        raise ThesaurusOverwriteError(
            f"{target} holds a thesaurus and other files ({', '.join(foreign[:3])}): refusing to replace it"
        )
    if not replace:
        raise ThesaurusOverwriteError(f"{target} already holds a thesaurus: pass --force to replace it")


def read_verified(reader: DirectoryReader, name: str, checksums: dict[str, str]) -> bytes:
    """The whole file, after checking it against its checksum."""
    data = reader.read_bytes(name)
    _verify(hashlib.sha256(data).hexdigest(), reader.directory / name, checksums)
    return data


def read_json(reader: DirectoryReader, name: str) -> Any:
    path = reader.directory / name
    try:
        return json.loads(reader.read_bytes(name).decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise ThesaurusFormatError(f"{path}: invalid JSON ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise ThesaurusFormatError(f"{path}: not UTF-8 text ({exc})") from exc


def parse_table(
    metadata: ThesaurusMetadata, hashtags_json: bytes, table_npz: bytes, where: str
) -> NeighbourTable:
    """A version's neighbour table from its (already verified) ``hashtags.json`` and
    ``table.npz`` bytes: what a scorer loads, from a directory or from Redis."""
    hashtags = json.loads(hashtags_json)
    if not isinstance(hashtags, list) or not all(isinstance(h, str) for h in hashtags):
        raise ThesaurusFormatError(f"{where}/{HASHTAGS_FILE}: expected a list of strings")
    if len(hashtags) != metadata.count:
        raise ThesaurusFormatError(f"{where}: {len(hashtags)} hashtags but metadata says {metadata.count}")
    try:
        with np.load(io.BytesIO(table_npz), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        stats = {name: arrays[name] for name in arrays if name not in ("neighbours", "distances", "counts")}
        return NeighbourTable(
            hashtags, arrays["neighbours"], arrays["distances"], arrays["counts"], metadata, stats
        )
    except ThesaurusFormatError:
        raise
    except (KeyError, ValueError, OSError) as exc:
        raise ThesaurusFormatError(f"{where}/{TABLE_FILE}: not a neighbour table ({exc})") from exc


def write_table_files(directory: Path, table: NeighbourTable) -> ThesaurusMetadata:
    """Write the table's files into ``directory``, which already holds the index, then the
    metadata with every file's checksum; return that metadata."""
    write_json(directory / HASHTAGS_FILE, list(table.hashtags))
    buffer = io.BytesIO()
    arrays: dict[str, Any] = {
        "neighbours": table.neighbour_ids,
        "distances": table.distances,
        "counts": table.counts,
        **table.stats,
    }
    np.savez(buffer, **arrays)
    write_bytes(directory / TABLE_FILE, buffer.getvalue())
    checksums = {name: sha256_file(directory / name) for name in (INDEX_FILE, HASHTAGS_FILE, TABLE_FILE)}
    metadata = dataclasses.replace(table.metadata, checksums=checksums)
    write_json(directory / METADATA_FILE, metadata.to_dict())
    return metadata
