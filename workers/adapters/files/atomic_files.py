"""Files and directories that readers see whole or not at all, with the standard library only.

* A small file (a store's ``CURRENT``) is written beside its target, flushed to disk and
  renamed over it (:func:`write_text_atomically`): ``rename(2)`` replaces a file atomically.
* A directory is written under a temporary name beside its target and renamed into place
  (:func:`publish_directory`).  Onto nothing or onto an empty directory (a name reserved
  with ``mkdir``, as the versioned store does) that is one atomic ``rename(2)``.  A
  *non-empty* directory cannot be renamed over (POSIX), and swapping two directories needs
  Linux's ``renameat2(RENAME_EXCHANGE)``, which Python does not offer; so the old directory
  is first renamed aside (``.NAME.trash-*``), then the new one in.  Between the two renames
  the path names nothing: :func:`being_replaced` tells a reader that this is what it saw
  (the trash is there), so it waits and tries again instead of failing.  A crash between
  them leaves the old directory in the trash beside the path, nothing lost.  The live
  path never replaces a directory: the store writes every version under a new name and
  switches ``CURRENT``, so scorers always find a whole version.
* :class:`DirectoryReader` opens every file of one directory through a single directory
  handle, so a reader never combines files of two versions of a replaced directory.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = [
    "DirectoryReader",
    "being_replaced",
    "discard_directory",
    "fsync_path",
    "publish_directory",
    "remove_stale",
    "remove_tree",
    "sha256_file",
    "temporary_directory",
    "write_bytes",
    "write_json",
    "write_text_atomically",
]

_TMP = ".tmp-"
_TRASH = ".trash-"  # the old directory during a replace (a reader waits for the new one)
_DISCARDED = ".discarded-"  # a directory being deleted (nothing comes back)


def fsync_path(path: Path) -> None:
    """Flush a file's (or a directory's entries') changes to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, ensure_ascii=False, indent=2)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())


def write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def write_text_atomically(path: Path, text: str) -> None:
    """Replace the file ``path`` with ``text`` in one step: readers see the old or the new
    content, never a part, even across a crash."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}{_TMP}", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def temporary_directory(target: Path) -> Path:
    """A new empty directory beside ``target`` (same file system) to build it in."""
    return Path(tempfile.mkdtemp(prefix=f".{target.name}{_TMP}", dir=target.parent))


def publish_directory(tmp: Path, target: Path) -> None:
    """Move the finished directory ``tmp`` to ``target``, replacing whatever is there whole.

    Onto nothing or an empty directory: one atomic rename.  Onto a non-empty directory: the
    old one is renamed aside, then ``tmp`` in (module docstring); readers see the old one,
    for an instant nothing (:func:`being_replaced` is then true), then the new one -- never
    a mixture.
    """
    try:
        os.rename(tmp, target)  # POSIX: allowed onto a missing name or an empty directory
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or target.is_symlink():
            raise
        trash = Path(tempfile.mkdtemp(prefix=f".{target.name}{_TRASH}", dir=target.parent))
        # The placeholder is empty, so renaming the old target onto it is allowed.
        os.replace(target, trash)
        try:
            os.replace(tmp, target)
        except BaseException:
            os.replace(trash, target)
            raise
        remove_tree(trash)
    fsync_path(target.parent)


def discard_directory(path: Path) -> None:
    """Delete a directory so that readers see all of it or none: renamed aside first (a
    no-op if another writer got there first), then removed."""
    trash = Path(tempfile.mkdtemp(prefix=f".{path.name}{_DISCARDED}", dir=path.parent))
    with contextlib.suppress(FileNotFoundError):
        os.replace(path, trash)
    remove_tree(trash)


def being_replaced(target: Path) -> bool:
    """Whether :func:`publish_directory` is between its two renames of ``target`` (its old
    directory in the trash), or has put the new one in since the caller found none."""
    if target.exists():
        return True
    prefix = f".{target.name}{_TRASH}"
    with contextlib.suppress(OSError):
        return any(entry.name.startswith(prefix) for entry in os.scandir(target.parent))
    return False


def remove_stale(directory: Path, max_age_s: float) -> None:
    """Remove the temporary and trash entries a writer that crashed left in ``directory``,
    once older than ``max_age_s`` (younger ones may belong to a writer still at work)."""
    cutoff = time.time() - max_age_s
    for entry in directory.iterdir():
        if not entry.name.startswith(".") or not any(m in entry.name for m in (_TMP, _TRASH, _DISCARDED)):
            continue
        try:
            if entry.lstat().st_mtime >= cutoff:
                continue
            if entry.is_dir():
                remove_tree(entry)
            else:
                entry.unlink(missing_ok=True)
        except FileNotFoundError:
            continue


class DirectoryReader:
    """Opens every file of one directory through a single directory handle.

    A writer may replace the directory while we read it; reading through the
    handle keeps all files from the same (old or new) directory, so a reader
    never combines the files of two versions.  Falls back to plain paths where
    ``dir_fd`` is not supported (then :attr:`consistent` tells whether it held).
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

    def __enter__(self) -> DirectoryReader:
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

    def read_bytes(self, name: str) -> bytes:
        with os.fdopen(self.open_fd(name), "rb") as fh:
            return fh.read()

    def path_of_fd(self, name: str, fd: int) -> str:
        """A path that names the already opened file ``fd``, for libraries that want a path."""
        proc = f"/proc/self/fd/{fd}"
        return proc if self._fd is not None and os.path.exists(proc) else str(self.directory / name)
