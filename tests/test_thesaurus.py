"""Tests for stream.synonyms.thesaurus: Syn_k(h) from Annoy, exact and JSON thesauri, and the store."""

from __future__ import annotations

import doctest
import functools
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workers.adapters.files.thesaurus_files as thesaurus_files
from stream.synonyms.thesaurus import (
    ExactThesaurus,
    JsonThesaurus,
    Thesaurus,
    ThesaurusFormatError,
    ThesaurusMetadata,
)
from tests.store_reader import read_until
from workers.adapters.files import annoy_thesaurus
from workers.adapters.files import store as store_module
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus, angular_to_cosine, cosine_to_angular
from workers.adapters.files.store import ThesaurusStore, load_thesaurus, read_json_thesaurus
from workers.adapters.files.thesaurus_files import (
    HASHTAGS_FILE,
    INDEX_FILE,
    METADATA_FILE,
    THESAURUS_FILES,
    ThesaurusCorruptError,
    ThesaurusOverwriteError,
)

Builder = Callable[..., AnnoyThesaurus | ExactThesaurus]
# Both rank by plain cosine here ("raw"); the hubness re-rankings are tested in test_hubness.py.
BUILDERS: list[Builder] = [functools.partial(AnnoyThesaurus.build, method="raw"), ExactThesaurus.build]
BUILDER_IDS = ["annoy", "exact"]


def _angles(degrees: dict[str, float]) -> tuple[list[str], npt.NDArray[np.float64]]:
    """Hashtags on the unit circle: the cosine distance is a function of the angle gap."""
    names = list(degrees)
    rad = np.radians([degrees[n] for n in names])
    return names, np.stack([np.cos(rad), np.sin(rad)], axis=1)


# swim is nearest to sport, but sport has two nearer hashtags (paper 3.2's example).
SPORTS = {
    "swim": 0.0,
    "dive": 8.0,
    "sport": 20.0,
    "sports": 23.0,
    "exercise": 27.0,
    "golf": 60.0,
    "hockey": 70.0,
    "bowling": 75.0,
}


@pytest.fixture(params=BUILDERS, ids=BUILDER_IDS)
def sports(request: pytest.FixtureRequest) -> AnnoyThesaurus | ExactThesaurus:
    names, vectors = _angles(SPORTS)
    built: AnnoyThesaurus | ExactThesaurus = request.param(names, vectors, model_id="test")
    return built


def _clustered(
    n: int, dim: int, clusters: int, noise: float, seed: int
) -> tuple[list[str], npt.NDArray[np.float64]]:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim))
    vectors = centres[rng.integers(0, clusters, n)] + noise * rng.standard_normal((n, dim))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return [f"tag{i:05d}" for i in range(n)], vectors


# --------------------------------------------------------------------------- Syn_k(h)


def test_syn_0_is_the_hashtag_itself(sports: Thesaurus) -> None:
    assert sports.synonyms("swim", 0) == ["swim"]
    assert sports.neighbours("swim", 0) == []


def test_unknown_hashtag_is_its_own_only_synonym(sports: Thesaurus) -> None:
    assert "curling" not in sports
    assert sports.synonyms("curling", 5) == ["curling"]
    assert sports.neighbours("curling", 5) == []
    # Lookups do not normalise: "#swim" is not the hashtag "swim".
    assert sports.synonyms("#swim", 2) == ["#swim"]


def test_hashtag_first_then_exactly_k_others_nearest_first(sports: Thesaurus) -> None:
    assert sports.synonyms("swim", 3) == ["swim", "dive", "sport", "sports"]
    assert sports.synonyms("sport", 4) == ["sport", "sports", "exercise", "dive", "swim"]
    for k in range(len(SPORTS)):
        syn = sports.synonyms("golf", k)
        assert syn[0] == "golf"
        assert len(syn) == k + 1
        assert len(set(syn)) == len(syn)


def test_k_beyond_size_gives_every_other_hashtag(sports: Thesaurus) -> None:
    others = sports.neighbours("hockey", 100)
    assert sorted(others) == sorted(set(SPORTS) - {"hockey"})
    assert others[:2] == ["bowling", "golf"]


def test_negative_k_is_an_error(sports: Thesaurus) -> None:
    with pytest.raises(ValueError, match="non-negative"):
        sports.synonyms("swim", -1)


def test_synonymy_is_not_symmetric(sports: Thesaurus) -> None:
    assert "sport" in sports.synonyms("swim", 2)
    assert "swim" not in sports.synonyms("sport", 2)


def test_distances_are_cosine_and_nondecreasing(sports: AnnoyThesaurus | ExactThesaurus) -> None:
    pairs = sports.neighbours_with_distances("swim", 7)
    dists = [d for _, d in pairs]
    assert dists == sorted(dists)
    expected = {name: 1 - math.cos(math.radians(angle)) for name, angle in SPORTS.items()}
    for name, d in pairs:
        assert d == pytest.approx(expected[name], abs=1e-5)


@pytest.mark.parametrize("build", BUILDERS, ids=BUILDER_IDS)
def test_max_distance_cuts_the_list(build: Builder) -> None:
    names, vectors = _angles(SPORTS)
    limit = 1 - math.cos(math.radians(21.0))  # sport (20°) is in, sports (23°) is out
    th = build(names, vectors, max_distance=limit)
    assert th.metadata.max_distance == pytest.approx(limit)
    assert th.synonyms("swim", 5) == ["swim", "dive", "sport"]
    assert th.synonyms("swim", 1) == ["swim", "dive"]
    assert th.synonyms("golf", 5) == ["golf", "hockey", "bowling"]  # 10°, 15°; not 33°
    assert th.synonyms("bowling", 5) == ["bowling", "hockey", "golf"]  # 5° and 15°
    with pytest.raises(ValueError, match="max_distance"):
        build(names, vectors, max_distance=2.5)


def test_angular_and_cosine_distances_convert() -> None:
    for cosine in (0.0, 0.1, 0.5, 1.0, 2.0):
        assert angular_to_cosine(cosine_to_angular(cosine)) == pytest.approx(cosine)
    assert angular_to_cosine(math.sqrt(2)) == pytest.approx(1.0)  # orthogonal


@pytest.mark.parametrize("build", BUILDERS, ids=BUILDER_IDS)
def test_min_count_leaves_out_rare_hashtags(build: Builder) -> None:
    names, vectors = _angles(SPORTS)
    counts = [5, 1, 5, 2, 5, 5, 5, 5]  # dive and sports are rare
    th = build(names, vectors, counts=counts, min_count=3)
    assert len(th) == 6
    assert th.metadata.count == 6 and th.metadata.min_count == 3
    assert "dive" not in th and "sports" not in th
    assert th.synonyms("dive", 3) == ["dive"]
    assert th.synonyms("swim", 2) == ["swim", "sport", "exercise"]
    with pytest.raises(ValueError, match="counts"):
        build(names, vectors, min_count=3)


@pytest.mark.parametrize("build", BUILDERS, ids=BUILDER_IDS)
def test_identical_vectors_still_give_k_others(build: Builder) -> None:
    names = ["b", "a", "a2", "c", "d"]
    vectors = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.9, 0.3], [0.0, 1.0]])
    th = build(names, vectors)
    for h in ("a", "a2", "b"):
        syn = th.synonyms(h, 2)
        assert syn[0] == h and h not in syn[1:]
        assert set(syn[1:]) == {"a", "a2", "b"} - {h}
        assert len(th.synonyms(h, 3)) == 4
    # Ties are broken by name.
    assert th.neighbours("c", 3) == ["a", "a2", "b"]


@pytest.mark.parametrize("build", BUILDERS, ids=BUILDER_IDS)
def test_build_validates_its_input(build: Builder) -> None:
    with pytest.raises(ValueError, match="more than once"):
        build(["a", "a"], np.eye(2))
    with pytest.raises(ValueError, match="2 names but 3 vectors"):
        build(["a", "b"], np.eye(3))
    with pytest.raises(ValueError, match="2-D"):
        build(["a"], np.ones(3))
    with pytest.raises(ValueError, match="'b' is zero"):
        build(["a", "b"], np.array([[1.0, 0.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="non-empty"):
        build(["a", ""], np.eye(2))


@pytest.mark.parametrize("build", BUILDERS, ids=BUILDER_IDS)
def test_empty_and_single_hashtag_thesauri(build: Builder) -> None:
    empty = build([], np.zeros((0, 4)))
    assert len(empty) == 0 and empty.synonyms("a", 3) == ["a"]
    one = build(["a"], np.ones((1, 4)))
    assert one.synonyms("a", 3) == ["a"]


def test_annoy_build_is_deterministic_and_versioned_by_content() -> None:
    names, vectors = _clustered(500, 16, 10, 1.0, seed=1)
    first = AnnoyThesaurus.build(names, vectors, n_trees=10, seed=7)
    second = AnnoyThesaurus.build(names, vectors, n_trees=10, seed=7)
    assert first.version == second.version
    assert all(first.neighbours(h, 10) == second.neighbours(h, 10) for h in names[:50])
    other = AnnoyThesaurus.build(names, vectors[::-1].copy(), n_trees=10, seed=7)
    assert other.version != first.version
    assert AnnoyThesaurus.build(names, vectors, version="v-explicit").version == "v-explicit"


def test_all_thesauri_satisfy_the_protocol(sports: Thesaurus) -> None:
    json_th = JsonThesaurus({"a": ["b"]})
    for th in (sports, json_th):
        assert isinstance(th, Thesaurus)
        assert th.version == th.metadata.version
        assert len(th) == th.metadata.count


def test_nearest_candidates_agree_with_exact_on_small_data() -> None:
    names, vectors = _clustered(300, 8, 5, 0.8, seed=3)
    annoy = AnnoyThesaurus.build(names, vectors, n_trees=20, method="raw", candidates="nearest")
    exact = ExactThesaurus.build(names, vectors)
    for h in names[:60]:
        assert set(annoy.neighbours(h, 10)) == set(exact.neighbours(h, 10))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(min_value=1, max_value=25),
    dim=st.integers(min_value=2, max_value=6),
    k=st.integers(min_value=0, max_value=30),
    seed=st.integers(min_value=0, max_value=2**16),
    duplicates=st.booleans(),
)
def test_syn_k_invariants(n: int, dim: int, k: int, seed: int, duplicates: bool) -> None:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, dim))
    if duplicates:
        vectors[rng.integers(0, n, n)] = vectors[0]
    names = [f"h{i}" for i in range(n)]
    exact = ExactThesaurus.build(names, vectors)
    annoy = AnnoyThesaurus.build(names, vectors, n_trees=5, method="raw", candidates="nearest")
    for th in (exact, annoy):
        for h in names:
            syn = th.synonyms(h, k)
            assert syn[0] == h
            assert len(syn) == min(k, n - 1) + 1
            assert len(set(syn)) == len(syn)
            dists = [d for _, d in th.neighbours_with_distances(h, k)]
            assert dists == sorted(dists)
    for h in names:
        exact_d = [d for _, d in exact.neighbours_with_distances(h, k)]
        annoy_d = [d for _, d in annoy.neighbours_with_distances(h, k)]
        assert annoy_d == pytest.approx(exact_d, abs=1e-5)


# --------------------------------------------------------------------------- recall


def test_annoy_answers_queries_deeper_than_the_table_with_recall_against_exact() -> None:
    """10,000 clustered 64-d vectors (200 clusters, noisy enough that Annoy's own
    default search_k gives recall@10 ~0.72).  The table (exact nearest candidates) is
    exact; Annoy at the default search_k answers what is deeper than the table and must
    reach recall 0.95 too."""
    names, vectors = _clustered(10_000, 64, 200, 1.5, seed=0)
    annoy = AnnoyThesaurus.build(names, vectors, n_trees=50, method="raw", candidates="nearest", depth=10)
    assert annoy.effective_search_k(10) == 5_500
    exact = ExactThesaurus.build(names, vectors)
    queries = np.random.default_rng(1).choice(len(names), size=200, replace=False)
    for k in (10, 20):  # 10: the table; 20: deeper than the table, so Annoy
        recall = [
            len(set(annoy.neighbours(names[q], k)) & set(exact.neighbours(names[q], k))) / k for q in queries
        ]
        assert float(np.mean(recall)) >= 0.95, f"recall@{k} = {np.mean(recall):.4f}"


# --------------------------------------------------------------------------- save / load


def _sports_annoy(version: str | None = None, max_distance: float | None = None) -> AnnoyThesaurus:
    names, vectors = _angles(SPORTS)
    return AnnoyThesaurus.build(
        names,
        vectors,
        model_id="test-model",
        n_trees=10,
        version=version,
        max_distance=max_distance,
    )


def test_save_load_round_trip_is_identical_and_mmapped(tmp_path: Path) -> None:
    names, vectors = _clustered(2000, 32, 40, 1.0, seed=5)
    th = AnnoyThesaurus.build(
        names,
        vectors,
        counts=[1 + i % 4 for i in range(2000)],
        min_count=2,
        model_id="m",
        n_trees=20,
        max_distance=0.8,
    )
    before = {h: th.neighbours_with_distances(h, 10) for h in th.hashtags[:200]}
    target = th.save(tmp_path / "th")
    assert sorted(p.name for p in target.iterdir()) == sorted(THESAURUS_FILES)
    assert json.loads((target / HASHTAGS_FILE).read_text()) == list(th.hashtags)

    loaded = AnnoyThesaurus.load(target)
    assert loaded.metadata == th.metadata
    assert loaded.hashtags == th.hashtags
    assert {h: loaded.neighbours_with_distances(h, 10) for h in before} == before
    maps = Path("/proc/self/maps")
    if maps.exists():
        assert str((target / INDEX_FILE).resolve()) in maps.read_text()
    loaded.close()


def test_metadata_json_round_trip_and_errors() -> None:
    meta = _sports_annoy(max_distance=0.5).metadata
    assert ThesaurusMetadata.from_json(meta.to_json()) == meta
    assert meta.metric == "angular" and meta.dimension == 2 and meta.n_trees == 10
    assert meta.built_at.endswith("Z")
    data = meta.to_dict()
    data["max_distance"] = 1  # JSON may give an integral float back as an int
    assert ThesaurusMetadata.from_dict(data).max_distance == 1.0
    del data["dimension"]
    with pytest.raises(ThesaurusFormatError, match="dimension"):
        ThesaurusMetadata.from_dict(data)
    with pytest.raises(ThesaurusFormatError, match="'count'"):
        ThesaurusMetadata.from_dict({**meta.to_dict(), "count": "7"})
    with pytest.raises(ThesaurusFormatError, match="invalid JSON"):
        ThesaurusMetadata.from_json("{")


def test_save_over_an_existing_thesaurus_replaces_it_whole(tmp_path: Path) -> None:
    target = tmp_path / "th"
    _sports_annoy(version="old").save(target)
    new = AnnoyThesaurus.build(["a", "b"], np.eye(2) + 0.1, version="new")
    with pytest.raises(ThesaurusOverwriteError, match="--force"):
        new.save(target)  # replacing needs replace=True (the CLI's --force)
    new.save(target, replace=True)
    assert AnnoyThesaurus.load(target).version == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["th"]  # no temp or trash left
    # Anything but a clean thesaurus of ours is never replaced, not even with replace=True.
    (target / "keep.txt").write_text("the user's")
    with pytest.raises(ThesaurusOverwriteError, match="other files"):
        new.save(target, replace=True)
    assert (target / "keep.txt").read_text() == "the user's"


def test_save_never_replaces_what_is_not_a_thesaurus(tmp_path: Path) -> None:
    th = _sports_annoy()
    folder = tmp_path / "mine"
    (folder / "sub").mkdir(parents=True)
    (folder / "keep.txt").write_text("keep")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("notes")
    for target in (folder, a_file):
        with pytest.raises(ThesaurusOverwriteError, match="refusing"):
            th.save(target, replace=True)
    assert (folder / "keep.txt").read_text() == "keep" and (folder / "sub").is_dir()
    assert a_file.read_text() == "notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "notes.txt"]  # nothing hidden left
    empty = tmp_path / "empty"
    empty.mkdir()
    assert AnnoyThesaurus.load(th.save(empty)).version == th.version  # an empty folder is fine


def test_failed_save_leaves_the_old_thesaurus_and_no_temp_dirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "th"
    _sports_annoy(version="old").save(target)
    real_write = thesaurus_files.write_json

    def failing_write(path: Path, obj: object) -> None:
        if path.name == METADATA_FILE:
            raise OSError("disk full")
        real_write(path, obj)

    monkeypatch.setattr(thesaurus_files, "write_json", failing_write)
    with pytest.raises(OSError, match="disk full"):
        _sports_annoy(version="new").save(target, replace=True)
    assert [p.name for p in tmp_path.iterdir()] == ["th"]
    assert AnnoyThesaurus.load(target).version == "old"


def test_readers_never_see_a_half_written_thesaurus(tmp_path: Path) -> None:
    target = tmp_path / "th"
    versions = {}
    for i in range(2):
        names, vectors = _clustered(300 + 100 * i, 8, 5, 1.0, seed=i)
        versions[f"v{i}"] = AnnoyThesaurus.build(names, vectors, version=f"v{i}", n_trees=5)
    versions["v0"].save(target)
    stop = threading.Event()
    problems: list[str] = []
    loads = [0]
    # Whole versions only: a mixture (one version's metadata with another's
    # hashtags or index) shows as a count mismatch, since the two sizes differ.

    def reader() -> None:
        while not stop.is_set():
            try:
                # Between a save's two renames the path names nothing for an instant
                # (workers.adapters.files.atomic_files): load waits for the new one.
                th = AnnoyThesaurus.load(target)
            except Exception as exc:
                problems.append(repr(exc))
                continue
            expected = len(versions[th.version])
            if len(th) != expected:
                problems.append(f"{th.version}: {len(th)} hashtags, expected {expected}")
            loads[0] += 1

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(30):
            versions[f"v{i % 2}"].save(target, replace=True)
    finally:
        stop.set()
        thread.join()
    assert problems == []
    assert loads[0] > 0


# --------------------------------------------------------------------------- load_thesaurus


def test_load_thesaurus_dispatches_on_the_path(tmp_path: Path) -> None:
    annoy_dir = _sports_annoy().save(tmp_path / "annoy")
    assert isinstance(load_thesaurus(annoy_dir), AnnoyThesaurus)
    json_file = tmp_path / "mine.json"
    json_file.write_text(json.dumps({"swim": ["dive"]}))
    loaded = load_thesaurus(str(json_file))
    assert isinstance(loaded, JsonThesaurus)
    assert loaded.synonyms("swim", 3) == ["swim", "dive"]

    store = ThesaurusStore(tmp_path / "store")
    store.publish(_sports_annoy(version="stored"))
    assert load_thesaurus(tmp_path / "store").version == "stored"


def test_load_thesaurus_errors_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_thesaurus(tmp_path / "nowhere")
    broken = _sports_annoy().save(tmp_path / "broken")
    (broken / INDEX_FILE).unlink()
    with pytest.raises(ThesaurusFormatError, match=r"missing index\.ann"):
        load_thesaurus(broken)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ThesaurusFormatError, match=r"missing metadata\.json"):
        load_thesaurus(empty)
    other = tmp_path / "thesaurus.txt"
    other.write_text("swim dive")
    with pytest.raises(ThesaurusFormatError, match="neither"):
        load_thesaurus(other)
    truncated = _sports_annoy().save(tmp_path / "truncated")
    (truncated / HASHTAGS_FILE).write_text('["swim", "dive"]')
    with pytest.raises(ThesaurusCorruptError, match=r"hashtags\.json: checksum mismatch"):
        load_thesaurus(truncated)


# --------------------------------------------------------------------------- JSON thesaurus


def test_json_thesaurus_normalises_and_orders(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    path.write_text(
        json.dumps(
            {
                "#Swim": ["#Dive", "SPORT", "swim", "dive", "#paddle"],
                "sport": ["sports", "exercise"],
                "Café": [],
            }
        ),
        encoding="utf-8",
    )
    th = read_json_thesaurus(path)
    assert len(th) == 3 and "swim" in th and "Swim" not in th and "café" in th
    assert th.synonyms("swim", 10) == ["swim", "dive", "sport", "paddle"]
    assert th.synonyms("swim", 2) == ["swim", "dive", "sport"]
    assert th.synonyms("swim", 0) == ["swim"]
    assert th.synonyms("dive", 3) == ["dive"]  # listed as a synonym but has no entry
    assert th.metadata.metric == "user" and th.metadata.count == 3
    assert (
        th.version
        == JsonThesaurus(
            {"swim": ["dive", "sport", "paddle"], "sport": ["sports", "exercise"], "café": []}
        ).version
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('["swim"]', r"expected an object .* got a list"),
        ('{"swim": "dive"}', r"key 'swim': expected a list of hashtags, got a string"),
        ('{"swim": {"dive": 1}}', r"key 'swim': expected a list of hashtags, got an object"),
        ('{"swim": ["dive", 3]}', r"key 'swim', item 1: expected a hashtag string, got a number"),
        ('{"swim": ["dive", ["x"]]}', r"key 'swim', item 1: expected a hashtag string, got a list"),
        ('{"swim": ["new york"]}', r"key 'swim', item 0: 'new york' is not a valid hashtag"),
        ('{"#": ["dive"]}', r"key '#': '#' is not a valid hashtag"),
        ('{"Swim": [], "#swim": []}', r"keys 'Swim' and '#swim' are the same hashtag 'swim'"),
        ('{"swim": [], "swim": ["dive"]}', r"keys 'swim' and 'swim' are the same hashtag"),
        ('{"swim": [', r"invalid JSON"),
    ],
)
def test_json_thesaurus_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ThesaurusFormatError, match=message) as info:
        read_json_thesaurus(path)
    assert str(path) in str(info.value)


def test_json_thesaurus_from_a_dict() -> None:
    th = JsonThesaurus({"sport": ("sports", "#Exercise")}, model_id="curated-v1")
    assert th.synonyms("sport", 5) == ["sport", "sports", "exercise"]
    assert th.metadata.model_id == "curated-v1"
    with pytest.raises(ThesaurusFormatError, match=r"<dict>: key 'sport', item 0"):
        JsonThesaurus({"sport": [None]})  # type: ignore[list-item]


# --------------------------------------------------------------------------- store


def test_store_publish_current_prune_reload(tmp_path: Path) -> None:
    store = ThesaurusStore(tmp_path / "store", keep=2)
    assert store.current_version() is None and store.load_current() is None
    assert store.versions() == []
    published = [store.publish(_sports_annoy(version=f"content-{i}")) for i in range(4)]
    assert published == ["v000001", "v000002", "v000003", "v000004"]
    assert store.versions() == ["v000003", "v000004"]
    assert store.current_version() == "v000004"
    current = store.load_current()
    assert current is not None and current.version == "content-3"
    assert current.synonyms("swim", 2) == ["swim", "dive", "sport"]
    assert store.load("v000003").version == "content-2"
    assert sorted(p.name for p in store.root.iterdir()) == ["CURRENT", "v000003", "v000004"]
    with pytest.raises(ValueError, match="not a version name"):
        store.load("../elsewhere")
    with pytest.raises(ValueError, match="keep"):
        ThesaurusStore(tmp_path, keep=0)


def test_store_never_prunes_the_current_version(tmp_path: Path) -> None:
    store = ThesaurusStore(tmp_path, keep=3)
    for content in "abc":
        store.publish(_sports_annoy(version=content))
    # An operator rolled back by hand: v000003 is newest but v000001 is current.
    (tmp_path / "CURRENT").write_text("v000001\n")
    store.keep = 1
    assert store.prune() == ["v000002"]
    assert store.versions() == ["v000001", "v000003"]
    current = store.load_current()
    assert current is not None and current.version == "a"
    assert store.publish(_sports_annoy(version="d")) == "v000004"
    assert store.versions() == ["v000004"]


def test_store_numbers_stay_monotonic_after_versions_vanish(tmp_path: Path) -> None:
    store = ThesaurusStore(tmp_path, keep=1)
    store.publish(_sports_annoy())
    store.publish(_sports_annoy())
    (tmp_path / "v000002").rename(tmp_path / "elsewhere")  # newest removed by hand
    assert store.publish(_sports_annoy()) == "v000003"


def test_store_removes_only_stale_temp_entries(tmp_path: Path) -> None:
    store = ThesaurusStore(tmp_path)
    stale = tmp_path / ".v000007.tmp-abc"
    fresh = tmp_path / ".v000008.tmp-def"
    stale.mkdir()
    fresh.mkdir()
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    store.publish(_sports_annoy())
    assert not stale.exists() and fresh.exists()


def test_a_name_reserved_by_a_killed_writer_is_no_version(tmp_path: Path) -> None:
    """A writer killed between reserving ``vNNNNNN`` and renaming its files into it leaves an
    empty directory (seen once in the index job's kill -9 fault test): not a version -- never
    listed, never loaded -- and removed once stale; the next version takes the next name."""
    store = ThesaurusStore(tmp_path)
    assert store.publish(_sports_annoy()) == "v000001"
    reserved = tmp_path / "v000002"
    reserved.mkdir()  # what the killed writer left
    assert store.versions() == ["v000001"]
    assert store.publish(_sports_annoy()) == "v000003"
    assert reserved.exists()  # young: may belong to a writer still at work
    old = time.time() - 2 * 3600
    os.utime(reserved, (old, old))
    store.publish(_sports_annoy())
    assert not reserved.exists() and store.versions() == ["v000001", "v000003", "v000004"]


def test_store_load_current_errors_when_current_is_missing(tmp_path: Path) -> None:
    store = ThesaurusStore(tmp_path)
    (tmp_path / "CURRENT").write_text("v000005\n")
    with pytest.raises(FileNotFoundError):
        store.load_current()
    (tmp_path / "CURRENT").write_text("garbage\n")
    with pytest.raises(ThesaurusFormatError, match="bad version"):
        store.current_version()


def test_store_load_current_retries_when_pruned_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ThesaurusStore(tmp_path, keep=1)
    store.publish(_sports_annoy(version="first"))
    real_load = AnnoyThesaurus.load
    calls: list[Path] = []

    def load_racing_a_writer(directory: str | Path, **kwargs: int | None) -> AnnoyThesaurus:
        calls.append(Path(directory))
        if len(calls) == 1:
            # A writer publishes and prunes after we read CURRENT.
            store.publish(_sports_annoy(version="second"))
        return real_load(directory, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(AnnoyThesaurus, "load", staticmethod(load_racing_a_writer))
    loaded = store.load_current()
    assert loaded is not None and loaded.version == "second"
    # v000001 (pruned under us), then v000002: the publish's own read-back, and ours.
    assert [p.name for p in calls] == ["v000001", "v000002", "v000002"]


def test_concurrent_readers_always_get_a_whole_version(tmp_path: Path) -> None:
    store = ThesaurusStore(tmp_path, keep=1)
    sizes: dict[str, int] = {}
    built = []
    for i in range(3):
        names, vectors = _clustered(200 + 50 * i, 8, 4, 1.0, seed=10 + i)
        th = AnnoyThesaurus.build(names, vectors, version=f"c{i}", n_trees=5)
        sizes[th.version] = len(th)
        built.append(th)
    store.publish(built[0])
    stop = threading.Event()
    read: list[tuple[int, list[str]]] = []

    def reader() -> None:
        read.append(read_until(store, sizes, stop.is_set))

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(20):
            store.publish(built[i % 3])
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert len(read) == 2 and [problems for _, problems in read] == [[], []]
    assert len(store.versions()) == 1


def test_reader_in_another_process_sees_whole_versions(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = ThesaurusStore(root, keep=1)
    built = []
    for i in range(2):
        names, vectors = _clustered(200 + 50 * i, 8, 4, 1.0, seed=20 + i)
        built.append(AnnoyThesaurus.build(names, vectors, version=f"p{i}", n_trees=5))
    store.publish(built[0])
    sizes = json.dumps({th.version: len(th) for th in built})
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    reader = subprocess.Popen(
        [sys.executable, "-m", "tests.store_reader", str(root), sizes],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "reader-started").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        for i in range(15):
            store.publish(built[i % 2])
    finally:
        (tmp_path / "stop").touch()
        out, _ = reader.communicate(timeout=30)
    report = json.loads(out)
    assert reader.returncode == 0
    assert report["problems"] == []
    assert report["loads"] > 0


# --------------------------------------------------------------------------- docs


@pytest.mark.parametrize("module", [annoy_thesaurus, store_module])
def test_docstring_examples_run(module: ModuleType) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
