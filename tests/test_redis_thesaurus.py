"""Thesaurus versions reach scorers through Redis: no shared file system, lookups from memory.

Real Redis (conftest's ``redis_url``); real thesauri built with Annoy.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import cast

import numpy as np
import pytest
import redis

from stream.synonyms.thesaurus import ThesaurusFormatError, ThesaurusSource
from tests.live import prefixed_redis
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus
from workers.adapters.files.store import ThesaurusStore
from workers.adapters.files.thesaurus_files import TABLE_FILE
from workers.adapters.prometheus.exporter import Exporter
from workers.adapters.redis.redis_thesaurus import SCORER_FILES, RedisThesauri
from workers.service.score import Scorer
from workers.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture
def client(redis_url: str, redis_prefix: str) -> Iterator[redis.Redis]:
    with prefixed_redis(redis_url, redis_prefix) as c:
        yield c


def _thesaurus(seed: int, n: int = 300) -> AnnoyThesaurus:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(12, 24))
    vectors = centres[rng.integers(0, 12, n)] + 0.3 * rng.normal(size=(n, 24))
    return AnnoyThesaurus.build(
        [f"tag{i}" for i in range(n)],
        vectors,
        counts=rng.integers(1, 50, n),
        model_id="test-model",
        n_trees=10,
    )


def _published(
    tmp_path: Path, client: redis.Redis, prefix: str, seed: int
) -> tuple[ThesaurusStore, str, RedisThesauri, int]:
    """A version published to a store, then to Redis: (store, version, Redis's copy, bytes sent)."""
    store = ThesaurusStore(tmp_path / "store")
    version = store.publish(_thesaurus(seed))
    thesauri = RedisThesauri(client, prefix)
    return store, version, thesauri, thesauri.publish(store.root / version, version)


def test_a_published_version_loads_from_redis_as_from_its_directory(
    tmp_path: Path, client: redis.Redis, redis_prefix: str
) -> None:
    store, version, thesauri, stored = _published(tmp_path, client, redis_prefix, 1)
    # Either is a scorer's source of versions (stream.synonyms.thesaurus.ThesaurusSource), to the letter.
    sources: list[ThesaurusSource] = [store, thesauri]
    assert [(s.current_version(), s.versions()) for s in sources] == [(version, [version])] * 2
    on_disk = store.load(version, index=False)
    table = thesauri.load(version)
    assert table.hashtags == on_disk.hashtags and table.metadata == on_disk.metadata
    for tag in on_disk.hashtags:
        assert table.synonyms(tag, table.depth) == on_disk.synonyms(tag, table.depth)
    np.testing.assert_array_equal(table.counts, on_disk.table.counts)
    # Only what a scorer needs travels: no Annoy file.
    assert stored == sum((store.root / version / name).stat().st_size for name in SCORER_FILES)
    assert {k.decode() for k in cast(list[bytes], client.hkeys(thesauri.key(version)))} == set(SCORER_FILES)
    with pytest.raises(ValueError, match="neighbour tables only"):
        thesauri.load(version, index=True)


def test_a_damaged_or_missing_version_is_refused(
    tmp_path: Path, client: redis.Redis, redis_prefix: str
) -> None:
    _, version, thesauri, _ = _published(tmp_path, client, redis_prefix, 2)
    data = bytearray(cast(bytes | None, client.hget(thesauri.key(version), TABLE_FILE)) or b"")
    data[len(data) // 2] ^= 0xFF
    client.hset(thesauri.key(version), TABLE_FILE, bytes(data))
    with pytest.raises(ThesaurusFormatError, match=r"table\.npz does not match its checksum"):
        thesauri.load(version)
    with pytest.raises(FileNotFoundError, match="pruned, or never published"):
        thesauri.load("v000099")


def test_publishing_prunes_all_but_the_newest_and_the_current(
    tmp_path: Path, client: redis.Redis, redis_prefix: str
) -> None:
    store = ThesaurusStore(tmp_path / "store", keep=5)
    thesauri = RedisThesauri(client, redis_prefix, keep=2)
    for seed in range(4):
        version = store.publish(_thesaurus(seed, n=50))
        thesauri.publish(store.root / version, version)
    assert thesauri.versions() == ["v000003", "v000004"] and thesauri.current_version() == "v000004"
    assert client.exists(thesauri.key("v000001")) == 0


class _FirstIncarnation:
    def current(self, topic: str) -> str:
        return "0"


def test_a_scorer_on_another_host_loads_the_index_jobs_version_from_redis(
    tmp_path: Path, client: redis.Redis, redis_prefix: str
) -> None:
    """The index job writes its directory; the scorer's own directory stays empty."""
    index_settings = Settings(index_dir=tmp_path / "index-host", redis_prefix=redis_prefix)
    store = ThesaurusStore(index_settings.index_dir)
    version = store.publish(_thesaurus(3))
    RedisThesauri(client, redis_prefix).publish(store.root / version, version)
    scorer_settings = Settings(index_dir=tmp_path / "score-host", redis_prefix=redis_prefix)
    scorer = Scorer(scorer_settings, Exporter(), client, _FirstIncarnation())  # type: ignore[arg-type]
    assert scorer.index_version == version and not scorer_settings.index_dir.exists()
    on_disk = store.load(version, index=False)
    ranks = scorer.cache.ranks("tag0")  # synonym -> rank: the scorer's lookups, from memory
    assert sorted(ranks, key=ranks.__getitem__)[:6] == on_disk.synonyms("tag0", 5)
    # The same scorer told to read the directory store finds nothing on its host.
    local = Scorer(
        Settings(index_dir=tmp_path / "score-host", redis_prefix=redis_prefix, thesaurus_source="dir"),
        Exporter(),
        client,
        _FirstIncarnation(),  # type: ignore[arg-type]
    )
    assert local.index_version is None
