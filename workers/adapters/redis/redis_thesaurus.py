"""Thesaurus versions in Redis, for scorers on hosts that share no file system with the index job.

A scorer needs of a version only what answers ``Syn_k`` for ``k <=`` the largest k: the
neighbour table (int32 neighbour ids, float32 distances, int64 counts and the hubness
statistics, ``table.npz``), the hashtag names (``hashtags.json``) and ``metadata.json``
with the SHA-256 of both -- a few MB per 100,000 hashtags at depth 10, never the Annoy
file (that stays the build artefact, for the index job and ``reval synonyms``).  The index
job publishes each version it builds here as well as in its directory store; a scorer
loads a version by name, checks the checksums, and answers every lookup from memory.

Keys (``prefix`` as the running means')
---------------------------------------
``{prefix}:thesaurus:<version>``   HASH: ``metadata.json``, ``hashtags.json``, ``table.npz``
                                   (the file names as fields, the files' bytes as values)
``{prefix}:thesaurus:versions``    ZSET of the published versions, scored by number
``{prefix}:thesaurus:current``     STRING: the version scorers should use

Each command touches one key, so this works unchanged on Redis Cluster.  Publishing writes
the version's hash first and moves ``current`` only after it (a separate round trip: on a
cluster the two keys may live on different nodes), so ``current`` never names a version
that is not there yet -- with a :class:`~workers.adapters.redis.redis_client.Replication`, not even
after a failover: the version is on the replicas before ``current`` moves, and ``current``
before :meth:`RedisThesauri.publish` returns.  Pruning then deletes all but the newest
``keep`` and the current one.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, cast

from stream.synonyms.neighbour_table import NeighbourTable
from stream.synonyms.thesaurus import ThesaurusFormatError, ThesaurusMetadata
from workers.adapters.files.store import version_number
from workers.adapters.files.thesaurus_files import HASHTAGS_FILE, METADATA_FILE, TABLE_FILE, parse_table
from workers.adapters.redis.redis_client import Client, Replication, replicated

#: What a scorer needs of a version directory.
SCORER_FILES = (METADATA_FILE, HASHTAGS_FILE, TABLE_FILE)


class RedisThesauri:
    """The scorers' view of the published thesaurus versions, kept in Redis.

    Same reading interface as :class:`workers.adapters.files.store.ThesaurusStore`
    (``current_version``, ``load``), so a scorer takes either.
    """

    def __init__(
        self, client: Client, prefix: str = "reval", keep: int = 3, replication: Replication | None = None
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.client: Any = client
        self.keep = keep
        self.replication = replication
        self._base = f"{prefix}:thesaurus"
        self._current = f"{self._base}:current"
        self._versions = f"{self._base}:versions"

    def key(self, version: str) -> str:
        return f"{self._base}:{version}"

    def publish(self, directory: str | Path, version: str) -> int:
        """Publish the saved version in ``directory`` under ``version``, make it current and
        prune; return the bytes stored."""
        directory = Path(directory)
        number = version_number(version)
        files = {name: (directory / name).read_bytes() for name in SCORER_FILES}
        with replicated(self.replication):
            pipe = self.client.pipeline(transaction=False)
            pipe.hset(self.key(version), mapping=files)
            pipe.zadd(self._versions, {version: number})
            pipe.execute()
        with replicated(self.replication):
            self.client.set(self._current, version)  # only once the version is there
        self.prune()
        return sum(len(data) for data in files.values())

    def prune(self) -> list[str]:
        """Delete all but the newest ``keep`` versions and the current one."""
        names = [_text(v) for v in self.client.zrange(self._versions, 0, -1)]
        current = self.current_version()
        old = [v for v in names[: max(0, len(names) - self.keep)] if v != current]
        for version in old:
            self.client.delete(self.key(version))
            self.client.zrem(self._versions, version)
        return old

    def versions(self) -> list[str]:
        """Published versions, oldest first."""
        return [_text(v) for v in self.client.zrange(self._versions, 0, -1)]

    def current_version(self) -> str | None:
        value = self.client.get(self._current)
        return None if value is None else _text(value)

    def load(self, version: str, *, index: bool = False) -> NeighbourTable:
        """The version's neighbour table, after checking its checksums (``index`` must be
        False: the Annoy index is never published here)."""
        if index:
            raise ValueError(
                "Redis holds neighbour tables only; load the Annoy index from the directory store"
            )
        where = f"redis {self.key(version)}"
        raw = cast(dict[bytes, bytes], self.client.hgetall(self.key(version)))
        files = {_text(name): data for name, data in raw.items()}
        missing = [name for name in SCORER_FILES if name not in files]
        if missing:
            raise FileNotFoundError(f"{where}: no {', '.join(missing)} (pruned, or never published)")
        metadata = ThesaurusMetadata.from_json(files[METADATA_FILE].decode())
        for name in (HASHTAGS_FILE, TABLE_FILE):
            expected = (metadata.checksums or {}).get(name)
            if expected is None or hashlib.sha256(files[name]).hexdigest() != expected:
                raise ThesaurusFormatError(f"{where}: {name} does not match its checksum in {METADATA_FILE}")
        return parse_table(metadata, files[HASHTAGS_FILE], files[TABLE_FILE], where)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


__all__ = ["SCORER_FILES", "RedisThesauri"]
