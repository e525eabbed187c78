"""Tests for meaning drift between thesaurus versions: the core (stream.synonyms.drift), the store
adapter (workers.adapters.files.annoy_thesaurus.thesaurus_drift) and ``reval thesaurus diff`` (its function)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import redis
from typer.testing import CliRunner

from stream.intake.records import Coordinates
from stream.synonyms.drift import (
    IncomparableVersionsError,
    Snapshot,
    compare,
    hashtag_shifts,
    jaccard,
    recent_shift,
)
from stream.synonyms.hubness import DEFAULT_METHOD
from stream.synonyms.means import HashtagMeans
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus, build_from_means, thesaurus_drift
from workers.adapters.files.store import ThesaurusStore
from workers.adapters.prometheus.exporter import Exporter
from workers.adapters.redis.redis_means import Contribution, RedisMeans
from workers.adapters.redis.redis_reservoir import RedisReservoir
from workers.commands.cli import app
from workers.commands.drift import thesaurus_diff
from workers.service.index import Indexer
from workers.service.stores import means_of
from workers.settings import Settings

DIM = 16
CLUSTERS = ("flood", "vote", "game")
PER_CLUSTER = 11  # a hashtag's top-10 is its cluster: a move to another cluster replaces it
TWEETS = 12  # per hashtag: well above the default minimum support
#: The top-level keys of ``reval thesaurus diff --json`` (the JSON contract).
DIFF_KEYS = {
    "ranked_by",
    "significant",
    "compared",
    "only_old",
    "only_new",
    "shift_quantiles",
    "jaccard_quantiles",
    "share_top10_changed_over_half",
    "movers",
}


def _centres(rng: np.random.Generator) -> dict[str, npt.NDArray[np.float64]]:
    # Orthogonal directions, so the clusters are far apart and each hashtag's top-10 is
    # its own cluster first.
    basis = np.linalg.qr(rng.normal(size=(DIM, DIM)))[0]
    return {name: basis[i] for i, name in enumerate(CLUSTERS)}


def _names() -> list[str]:
    return [f"{c}{i}" for c in CLUSTERS for i in range(PER_CLUSTER)]


def _snapshot(
    vectors: dict[str, npt.NDArray[np.float64]],
    counts: dict[str, int] | None = None,
    model_id: str = "m",
) -> Snapshot:
    """A version whose neighbours are the exact cosine top-10 of ``vectors``."""
    names = sorted(vectors)
    matrix = np.array([vectors[n] for n in names], dtype=np.float64)
    unit = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    sims = unit @ unit.T
    np.fill_diagonal(sims, -np.inf)
    neighbours = [[names[j] for j in np.argsort(-row, kind="stable")[:10]] for row in sims]
    return Snapshot(
        names,
        matrix,
        neighbours,
        counts=None if counts is None else [counts[n] for n in names],
        model_id=model_id,
    )


def _vectors(seed: int = 0) -> dict[str, npt.NDArray[np.float64]]:
    rng = np.random.default_rng(seed)
    centres = _centres(rng)
    return {name: centres[name.rstrip("0123456789")] + 0.1 * rng.normal(size=DIM) for name in _names()}


# --------------------------------------------------------------------------- core


def test_identical_versions_have_no_movers() -> None:
    version = _snapshot(_vectors(), {n: 10 for n in _names()})
    drift = compare(version, version)
    assert drift.movers == ()
    assert drift.compared == len(_names()) and drift.only_old == drift.only_new == 0
    shifts = hashtag_shifts(version, version)
    assert shifts.cosines == pytest.approx(1.0) and np.all(shifts.jaccards == 1.0)
    assert drift.shift_quantiles is not None and drift.shift_quantiles.p99 == pytest.approx(0.0, abs=1e-12)
    assert drift.jaccard_quantiles is not None and drift.jaccard_quantiles.to_dict() == {
        "p50": 0.0,
        "p90": 0.0,
        "p99": 0.0,
    }
    assert drift.share_top10_changed_over_half == 0.0


def test_a_hashtag_moved_to_another_cluster_is_the_first_mover() -> None:
    before = _vectors()
    after = dict(before)
    after["flood3"] = before["vote0"] + 0.01  # now means what the vote hashtags mean
    counts = {n: 10 for n in _names()}
    drift = compare(_snapshot(before, counts), _snapshot(after, counts), min_support=5, top=5)
    first = drift.movers[0]
    assert first.hashtag == "flood3"
    assert first.cosine < 0.5 and first.jaccard < 0.5
    assert set(first.old_neighbours) >= {f"flood{i}" for i in range(PER_CLUSTER) if i != 3}
    assert len(first.new_neighbours) == 10
    assert set(first.new_neighbours) <= {f"vote{i}" for i in range(PER_CLUSTER)}  # all ten now votes
    assert first.support_old == first.support_new == 10
    assert len(drift.movers) <= 5
    # Others moved only in their neighbour lists: every later mover has cosine 1.
    assert all(m.cosine == pytest.approx(1.0) for m in drift.movers[1:])


def test_ties_in_cosine_are_broken_by_the_lowest_jaccard() -> None:
    vectors = np.eye(3)
    old = Snapshot(["a", "b", "c"], vectors, [["x", "y"], ["x", "y"], ["x", "y"]], model_id="m")
    new = Snapshot(["a", "b", "c"], vectors, [["x", "z"], ["p", "q"], ["x", "y"]], model_id="m")
    drift = compare(old, new, min_support=0)
    assert [m.hashtag for m in drift.movers] == ["b", "a"]  # c did not move at all
    assert [m.jaccard for m in drift.movers] == [0.0, pytest.approx(1 / 3)]


def test_min_support_filters_movers_but_not_the_summary() -> None:
    before = _vectors()
    after = dict(before)
    after["flood3"] = before["vote0"]
    after["game2"] = before["flood0"]
    counts_old = {n: 10 for n in _names()}
    counts_new = dict(counts_old, flood3=3)  # few tweets in the new version: chance, not meaning
    drift = compare(_snapshot(before, counts_old), _snapshot(after, counts_new), min_support=5)
    assert "flood3" not in {m.hashtag for m in drift.movers}
    assert drift.movers[0].hashtag == "game2"
    assert drift.compared == len(_names())
    loose = compare(_snapshot(before, counts_old), _snapshot(after, counts_new), min_support=3)
    assert {m.hashtag for m in loose.movers[:2]} == {"flood3", "game2"}


def test_unknown_support_filters_nothing() -> None:
    before = _vectors()
    after = dict(before, flood3=before["vote0"])
    drift = compare(_snapshot(before), _snapshot(after), min_support=1000)
    assert drift.movers[0].hashtag == "flood3"
    assert drift.movers[0].support_old is None and drift.movers[0].support_new is None


def test_only_old_only_new_and_summary() -> None:
    before = _vectors()
    after = {n: v for n, v in before.items() if n != "game5"}
    after["newtag"] = before["game0"]
    drift = compare(_snapshot(before), _snapshot(after))
    assert (drift.compared, drift.only_old, drift.only_new) == (len(_names()) - 1, 1, 1)
    payload = drift.to_dict()
    assert set(payload) == DIFF_KEYS
    assert set(payload["shift_quantiles"]) == {"p50", "p90", "p99"}
    json.dumps(payload)  # JSON-serialisable as it is


def test_nothing_in_common() -> None:
    a = Snapshot(["a"], np.ones((1, 2)), [[]], model_id="m")
    b = Snapshot(["b"], np.ones((1, 2)), [[]], model_id="m")
    drift = compare(a, b)
    assert (drift.compared, drift.only_old, drift.only_new, drift.movers) == (0, 1, 1, ())
    assert drift.shift_quantiles is None and drift.share_top10_changed_over_half is None


def test_different_models_or_dimensions_are_refused() -> None:
    a = Snapshot(["a"], np.ones((1, 3)), [[]], model_id="vinai/bertweet-base")
    b = Snapshot(["a"], np.ones((1, 2)), [[]], model_id="vinai/bertweet-base")
    with pytest.raises(IncomparableVersionsError, match=r"\(3-d\).*\(2-d\)"):
        compare(a, b)
    c = Snapshot(["a"], np.ones((1, 3)), [[]], model_id="minilm")
    with pytest.raises(ValueError, match=r"'vinai/bertweet-base'.*'minilm'"):
        compare(a, c)
    d = Snapshot(["a"], np.ones((1, 3)), [[]], model_id="vinai/bertweet-base", space="raw")
    with pytest.raises(ValueError, match="built differently"):
        compare(a, d)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="2 hashtags but 1 neighbour lists"):
        Snapshot(["a", "b"], np.ones((2, 2)), [[]])
    with pytest.raises(ValueError, match="unique"):
        Snapshot(["a", "a"], np.ones((2, 2)), [[], []])
    zero = Snapshot(["a"], np.zeros((1, 2)), [[]])
    with pytest.raises(ValueError, match="'a' is zero"):
        compare(zero, zero)
    ok = Snapshot(["a"], np.ones((1, 2)), [[]])
    with pytest.raises(ValueError, match="min_support"):
        compare(ok, ok, min_support=-1)


def test_jaccard_uses_sets() -> None:
    assert jaccard(["a", "b"], ["b", "a"]) == 1.0
    assert jaccard(["a"], []) == 0.0


# --------------------------------------------------------------------------- adapter and command


def _means(moved: bool) -> HashtagMeans:
    """Tweets around three topic centres; with ``moved``, flood3's later tweets are about votes."""
    rng = np.random.default_rng(7)
    centres = _centres(rng)
    means = HashtagMeans(DIM)

    def tweet(centre: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        x = centre + 0.3 * rng.normal(size=DIM)
        return x / np.linalg.norm(x)  # unit length, as the encoder pools tweets

    for name in _names():
        topic = name.rstrip("0123456789")
        for _ in range(TWEETS):
            means.update([name], tweet(centres[topic]))
    if moved:
        # Many more tweets about votes: the running mean of flood3 now points at the vote cluster.
        for _ in range(20 * TWEETS):
            means.update(["flood3"], tweet(centres["vote"]))
    means.update(["rare"], centres["game"])  # one tweet: below any sensible minimum support
    return means


def _build(moved: bool, method: str = DEFAULT_METHOD) -> AnnoyThesaurus:
    thesaurus = build_from_means(_means(moved), model_id="test-model", method=method, depth=10, n_trees=10)
    assert thesaurus is not None
    return thesaurus


@pytest.mark.parametrize("method", ["center+csls", "raw"])
def test_thesaurus_drift_finds_the_moved_hashtag(method: str) -> None:
    old, new = _build(False, method=method), _build(True, method=method)
    drift = thesaurus_drift(old, new, min_support=5, top=3)
    top = drift.movers[0]
    assert top.hashtag == "flood3"
    assert top.support_old == TWEETS and top.support_new == 21 * TWEETS
    assert top.cosine < 0.5
    assert "flood0" in top.old_neighbours and "vote0" in top.new_neighbours
    assert "rare" not in {m.hashtag for m in drift.movers}
    assert drift.compared == len(_names()) + 1 and drift.only_old == drift.only_new == 0
    same = thesaurus_drift(old, old)
    assert same.movers == () and same.share_top10_changed_over_half == 0.0


def test_hashtags_that_got_no_tweets_and_kept_their_neighbours_are_no_movers() -> None:
    """With a centring hubness method every vector shifts a little when any hashtag gets
    tweets (the mean of the vocabulary moves): only hashtags that got tweets, or whose
    neighbours changed, are movers (the sample feed's backtest listed 20 hashtags with
    cosine 1.000 and identical neighbours)."""
    old = _build(False)
    means = _means(False)
    rng = np.random.default_rng(11)
    for _ in range(5):  # enough new tweets (min_support) to be tested
        x = _centres(np.random.default_rng(7))["flood"] + 0.3 * rng.normal(size=DIM)
        means.update(["flood1"], x / np.linalg.norm(x))
    new = build_from_means(means, model_id="test-model", method=DEFAULT_METHOD, depth=10, n_trees=10)
    assert new is not None
    drift = thesaurus_drift(old, new, min_support=5, top=50)
    assert drift.shift_quantiles is not None and drift.shift_quantiles.p50 > 0  # every vector moved a bit
    for mover in drift.movers:
        assert mover.support_old != mover.support_new or set(mover.old_neighbours) != set(
            mover.new_neighbours
        )
    assert "flood1" in {m.hashtag for m in drift.movers}


def test_a_version_recovers_each_raw_mean_from_its_centred_index(tmp_path: Path) -> None:
    """What the shift test between versions stands on: the raw mean (its length is the
    tweets' spread) from the index's centred unit vector, after a save and a load."""
    from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus, raw_means

    means = _means(True)
    built = build_from_means(means, model_id="test-model", method=DEFAULT_METHOD, depth=10, n_trees=10)
    assert built is not None
    built.save(tmp_path / "v")
    loaded = AnnoyThesaurus.load(tmp_path / "v")
    got = raw_means(loaded)
    assert got is not None
    want = np.array([means[h].mean() for h in loaded.table.hashtags])
    assert np.allclose(got, want, atol=1e-5)
    assert 0.0 < float(np.linalg.norm(want, axis=1).min()) < 1.0  # unit tweets: spread shows
    # a version written without resultants has none: the diff falls back to the cosine
    names, vectors, counts = _means(False).matrix()
    plain = AnnoyThesaurus.build(names, vectors, counts=counts, model_id="test-model", depth=10, n_trees=10)
    assert raw_means(plain) is None
    drift = thesaurus_drift(plain, loaded, min_support=5)
    assert drift.ranked_by == "cosine" and drift.significant is None and drift.movers[0].effect is None


def test_thesaurus_drift_refuses_other_models() -> None:
    old = _build(False)
    other = build_from_means(_means(True), model_id="another-model", depth=10, n_trees=10)
    assert other is not None
    with pytest.raises(ValueError, match=r"'test-model'.*'another-model'"):
        thesaurus_drift(old, other)


def test_diff_json_matches_the_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _build(False).save(tmp_path / "old")
    store = ThesaurusStore(tmp_path / "store")  # NEW may be a store: its current version
    store.publish(_build(True))
    assert thesaurus_diff(tmp_path / "old", tmp_path / "store", as_json=True, top=5, min_support=5) == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload) == DIFF_KEYS
    assert payload["compared"] == len(_names()) + 1
    assert (payload["only_old"], payload["only_new"]) == (0, 0)
    for key in ("shift_quantiles", "jaccard_quantiles"):
        q = payload[key]
        assert set(q) == {"p50", "p90", "p99"} and 0.0 <= q["p50"] <= q["p90"] <= q["p99"] <= 2.0
    assert 0.0 <= payload["share_top10_changed_over_half"] <= 1.0
    movers = payload["movers"]
    assert 1 <= len(movers) <= 5
    assert set(movers[0]) == {
        "hashtag",
        "cosine",
        "jaccard",
        "support_old",
        "support_new",
        "old_neighbours",
        "new_neighbours",
        "effect",
        "effect_low",
        "effect_high",
        "p",
        "significant",
        "examples_before",
        "examples_since",
    }
    assert movers[0]["hashtag"] == "flood3"
    # versions that record their raw means: ranked by the shift test of the tweets since OLD
    assert payload["ranked_by"] == "effect_low" and payload["significant"] >= 1
    assert movers[0]["significant"] and movers[0]["effect_low"] > 0.5
    assert movers[0]["support_old"] == TWEETS and isinstance(movers[0]["new_neighbours"], list)
    assert len(movers[0]["old_neighbours"]) == 10


def test_diff_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _build(False).save(tmp_path / "old")
    _build(True).save(tmp_path / "new")
    assert thesaurus_diff(tmp_path / "old", tmp_path / "new", as_json=False, top=3, min_support=5) == 0
    text = capsys.readouterr().out
    assert "#flood3" in text and "moved furthest beyond their spread" in text and "hashtags in both" in text
    assert "effect" in text and "shifted beyond their spread (1% FDR)" in text
    assert thesaurus_diff(tmp_path / "old", tmp_path / "old", as_json=False, top=3, min_support=5) == 0
    assert "no hashtag with support ≥ 5 in both versions moved" in capsys.readouterr().out


def test_diff_errors_are_one_line_value_errors(tmp_path: Path) -> None:
    _build(False).save(tmp_path / "old")
    missing = tmp_path / "nope"
    with pytest.raises(ValueError, match="does not exist"):
        thesaurus_diff(tmp_path / "old", missing, as_json=True, top=5, min_support=5)
    (tmp_path / "syn.json").write_text('{"a": ["b"]}', encoding="utf-8")
    with pytest.raises(ValueError, match="JSON thesaurus"):
        thesaurus_diff(tmp_path / "old", tmp_path / "syn.json", as_json=True, top=5, min_support=5)
    other = build_from_means(_means(False), model_id="another-model", depth=10, n_trees=10)
    assert other is not None
    other.save(tmp_path / "other")
    with pytest.raises(ValueError, match="different models") as info:
        thesaurus_diff(tmp_path / "old", tmp_path / "other", as_json=True, top=5, min_support=5)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="--top"):
        thesaurus_diff(tmp_path / "old", tmp_path / "old", as_json=True, top=-1, min_support=5)


def test_recent_shift_compares_recent_use_with_use_before() -> None:
    totals = np.array([[10.0, 5.0], [5.0, 5.0], [3.0, 0.0], [1.0, 1.0]])
    recent = np.array([[0.0, 5.0], [2.5, 2.5], [1.0, 0.0], [1.0, 1.0]])
    shift = recent_shift(["flood", "rain", "rare", "new"], totals, [10, 10, 6, 5], recent, [5, 5, 2, 5])
    # rare: 2 recent tweets; new: nothing before -- neither is compared or a mover
    assert shift.compared == 2 and [m.hashtag for m in shift.movers] == ["flood", "rain"]
    assert shift.movers[0].cosine == pytest.approx(0.0) and shift.movers[1].cosine == pytest.approx(1.0)
    assert (shift.movers[0].support_recent, shift.movers[0].support_before) == (5, 5)
    assert shift.shift_quantiles is not None and shift.shift_quantiles.p99 == pytest.approx(0.99)
    assert recent_shift(["x"], totals[:1], [10], recent[:1], [5], min_support=6).compared == 0
    assert recent_shift(["x"], totals[:1], [10], recent[:1], [5], top=0).movers == ()


# --------------------------------------------------------------------------- the index job


def _tweets(moved: bool, start: int) -> list[Contribution]:
    """The tweets behind :func:`_means` (the moved ones only, with ``moved``), as the embed
    worker hands them to Redis; offsets from ``start``, one tweet a minute of event time
    from day 0 (the moved ones from day 10)."""
    rng = np.random.default_rng(7)
    centres = _centres(rng)
    out: list[tuple[str, npt.NDArray[np.float64]]] = []
    if not moved:
        for name in _names():
            topic = name.rstrip("0123456789")
            out += [(name, centres[topic] + 0.3 * rng.normal(size=DIM)) for _ in range(TWEETS)]
    else:
        out += [("flood3", centres["vote"] + 0.3 * rng.normal(size=DIM)) for _ in range(20 * TWEETS)]
    day0 = 10 * 86400.0 if moved else 0.0
    return [  # unit length, as the encoder pools them
        Contribution(
            Coordinates("tweets", 0, start + i), [tag], vec / np.linalg.norm(vec), time=day0 + 60.0 * i
        )
        for i, (tag, vec) in enumerate(out)
    ]


@pytest.fixture
def redis_means(redis_url: str, redis_prefix: str) -> Iterator[tuple[redis.Redis, RedisMeans]]:
    client = redis.Redis.from_url(redis_url)
    means = RedisMeans(client, prefix=redis_prefix)
    try:
        yield client, means
    finally:
        means.clear()
        client.close()


def test_the_diff_of_two_versions_shows_the_movers_tweets_of_each_side(
    tmp_path: Path, redis_prefix: str, redis_means: tuple[redis.Redis, RedisMeans]
) -> None:
    """`reval thesaurus diff OLD NEW` between two version directories has no reservoir: it
    shows the example tweets the index job recorded in NEW for the movers since OLD."""
    client, _ = redis_means
    settings = Settings(index_dir=tmp_path / "store", redis_prefix=redis_prefix, model="test-model")
    indexer = Indexer(settings, Exporter(), client)
    means = means_of(client, settings)
    first = _tweets(False, 0)
    means.apply(first)
    assert indexer.run_once() == "v000001"
    reservoir = RedisReservoir(client, redis_prefix, settings.coherence_reservoir)
    reservoir.add([(("flood3",), f"river over its banks {i}", 60.0 * i) for i in range(20)])
    means.apply(_tweets(True, len(first)))
    reservoir.add([(("flood3",), f"polls open for the vote {i}", 10 * 86400.0 + 60.0 * i) for i in range(20)])
    assert indexer.run_once() == "v000002"
    store = tmp_path / "store"
    shown = CliRunner().invoke(
        app, ["thesaurus", "diff", str(store / "v000001"), str(store / "v000002"), "--json"]
    )
    assert shown.exit_code == 0, shown.output
    [mover] = [m for m in json.loads(shown.output)["movers"] if m["hashtag"] == "flood3"]
    assert mover["examples_before"] and all(t.startswith("river") for t in mover["examples_before"])
    assert mover["examples_since"] and all(t.startswith("polls") for t in mover["examples_since"])
    table = CliRunner().invoke(app, ["thesaurus", "diff", str(store / "v000001"), str(store / "v000002")])
    printed = " ".join(table.output.split())
    assert "#flood3, tweets up to OLD / since OLD:" in printed and "since: polls open" in printed
    # the other way round (NEW did not record the drift from OLD): no examples, no error
    back = CliRunner().invoke(
        app, ["thesaurus", "diff", str(store / "v000002"), str(store / "v000001"), "--json"]
    )
    assert back.exit_code == 0 and not any(m["examples_since"] for m in json.loads(back.output)["movers"])


def test_the_index_job_exports_the_drift_of_each_new_version(
    tmp_path: Path, redis_prefix: str, redis_means: tuple[redis.Redis, RedisMeans]
) -> None:
    client, means = redis_means
    settings = Settings(
        index_dir=tmp_path / "store",
        redis_prefix=redis_prefix,
        model="test-model",
        index_keep=1,
        index_n_trees=10,
    )
    x = Exporter()
    indexer = Indexer(settings, x, client)
    means = means_of(client, settings)  # the embed workers' store: with event-time windows

    def gauge(name: str, **labels: str) -> float:
        value = x.registry.get_sample_value(name, labels)
        assert value is not None, name
        return value

    first = _tweets(False, 0)
    means.apply(first)
    assert indexer.run_once() == "v000001"
    # A first version has nothing to drift from: gaps, not zeros.
    assert math.isnan(gauge("reval_thesaurus_top10_changed_share"))
    assert math.isnan(gauge("reval_thesaurus_shift", quantile="0.99"))
    # All its tweets are recent (the last 24 h of event time): nothing before to compare with.
    assert gauge("reval_hashtag_recent_compared") == 0 and gauge("reval_hashtags_shifted") == 0
    assert math.isnan(gauge("reval_hashtag_recent_shift", quantile="0.5"))

    # The reservoir's texts of flood3 (as the embed workers write them, with event time):
    # flood talk on day 0, vote talk from day 10 -- the mover's examples of each side.
    reservoir = RedisReservoir(client, redis_prefix, settings.coherence_reservoir)
    reservoir.add([(("flood3",), f"river over its banks {i}", 60.0 * i) for i in range(20)])
    means.apply(_tweets(True, len(first)))
    reservoir.add([(("flood3",), f"polls open for the vote {i}", 10 * 86400.0 + 60.0 * i) for i in range(20)])
    assert indexer.run_once() == "v000002"  # keep=1: v000001 is pruned, its drift still computed
    assert gauge("reval_thesaurus_drift_compared") == len(_names())
    p50, p99 = gauge("reval_thesaurus_shift", quantile="0.5"), gauge("reval_thesaurus_shift", quantile="0.99")
    assert 0.0 <= p50 < 0.1 < p99  # one hashtag of 33 moved far, the rest barely
    assert 0.0 <= gauge("reval_thesaurus_top10_changed_share") < 0.5
    # The movers travel with the version, in its metadata.json (checked like the rest on load).
    first_meta, second = (
        indexer.store.load("v000002").metadata,
        json.loads((tmp_path / "store" / "v000002" / "metadata.json").read_text()),
    )
    assert first_meta.drift == second["drift"]
    movers = second["drift"]["movers"]
    assert movers[0]["hashtag"] == "flood3" and movers[0]["cosine"] < 0.5
    assert set(movers[0]["new_neighbours"]) & {n for n in _names() if n.startswith("vote")}
    assert second["drift"]["compared"] == len(_names()) and second["drift"]["from_version"]
    # ... with its tweets up to the event time v000001 covered (its events_until) and since
    assert movers[0]["examples_before"] and all(t.startswith("river") for t in movers[0]["examples_before"])
    assert movers[0]["examples_since"] and all(t.startswith("polls") for t in movers[0]["examples_since"])
    # Recent use (day 10: only flood3, now used like vote) against each hashtag's use before.
    assert gauge("reval_hashtag_recent_compared") == 1
    assert gauge("reval_hashtag_recent_shift", quantile="0.5") > 0.5
    recent = second["drift"]["recent"]
    assert recent["compared"] == 1 and recent["movers"][0]["hashtag"] == "flood3"
    # ... and beyond the spread of its own tweets: a discovery, counted by the gauge
    assert recent["significant"] == 1 == gauge("reval_hashtags_shifted")
    assert recent["movers"][0]["significant"] and recent["movers"][0]["effect_low"] > 0.5
    assert (
        recent["movers"][0]["support_recent"] == 20 * TWEETS
        and recent["movers"][0]["support_before"] == TWEETS
    )
    # ... shown with what a person needs to see the two senses: its neighbours then and now,
    # and tweets first seen before the recent window and within it.
    mover = recent["movers"][0]
    assert {n.rstrip("0123456789") for n in mover["old_neighbours"]} == {"flood"}
    assert "vote" in {n.rstrip("0123456789") for n in mover["neighbours"]}
    assert len(mover["examples_before"]) == 3 and len(mover["examples_recent"]) == 3
    assert all(t.startswith("river") for t in mover["examples_before"])
    assert all(t.startswith("polls") for t in mover["examples_recent"])
    shown = CliRunner().invoke(app, ["thesaurus", "inspect", str(tmp_path / "store" / "v000002")])
    printed = " ".join(shown.output.split())  # the console wraps lines at its width
    assert shown.exit_code == 0 and "moved most since" in printed and "#flood3" in printed
    assert "recent use furthest from earlier use: #flood3 (effect" in printed
    assert "1 shifted beyond" in printed
    assert "before: river over its banks" in printed and "recent: polls open" in printed
    # Never a label per hashtag: the three quantiles are all the series there are.
    samples = next(iter(x.thesaurus_shift.collect())).samples
    assert sorted(sample.labels["quantile"] for sample in samples) == ["0.5", "0.9", "0.99"]
    assert all(set(sample.labels) == {"quantile"} for sample in samples)
