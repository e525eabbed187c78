"""The chance-corrected #REval: the null model against simulation, and its properties."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream.evaluation.chance import ChanceModel, CorrectedSum, corrected_of_sums
from stream.evaluation.metrics import rank_matrix, reval_by_k
from stream.evaluation.neighbours import NeighbourCache
from stream.evaluation.scoring import score_event
from stream.intake.records import Recommendation
from stream.synonyms.neighbour_table import NeighbourTable, build_neighbour_table
from stream.synonyms.thesaurus import ThesaurusMetadata

from .oracle import oracle_record

KS = [0, 1, 5, 10, 20]


@pytest.fixture(scope="module")
def table() -> NeighbourTable:
    rng = np.random.default_rng(7)
    n = 300
    counts = np.minimum(rng.zipf(1.7, size=n), 200)  # popularity as skewed as a real feed's
    vectors = rng.standard_normal((n, 24)) + 0.5
    return build_neighbour_table(
        [f"h{i:03d}" for i in range(n)], vectors, counts, depth=20, method="center+csls"
    )


def simulate(table: NeighbourTable, m: int, truth: list[str], runs: int, seed: int) -> np.ndarray:
    """The null recommender itself: m distinct hashtags by successive popularity-weighted
    draws (exponential clocks: the m smallest Exp(1) / w), scored with Eq. 4."""
    rng = np.random.default_rng(seed)
    weights = table.counts.astype(float)
    keys = rng.exponential(size=(runs, len(weights))) / weights
    drawn = np.argpartition(keys, m - 1, axis=1)[:, :m]
    cache = NeighbourCache(table, max(KS))
    names = table.hashtags
    total = np.zeros(len(KS))
    for row in drawn:
        total += reval_by_k(rank_matrix([names[j] for j in row], truth, cache.ranks), len(truth), KS)
    return total / runs


@pytest.mark.parametrize(
    ("m", "truth"),
    [
        (1, ["h000"]),  # |R| <= |G|
        (2, ["h003", "h150"]),
        (5, ["h010"]),  # |R| > |G|
        (10, ["h001", "h002"]),
        (10, ["h299", "unknown-to-the-thesaurus"]),
    ],
)
def test_expected_value_matches_the_simulated_null_recommender(
    table: NeighbourTable, m: int, truth: list[str]
) -> None:
    runs = 20_000
    simulated = simulate(table, m, truth, runs, seed=m)
    expected = ChanceModel(table).expected(m, truth, KS)
    # Sampling error of the simulation (3 standard errors, at least 0.003) plus the
    # analytic approximation of successive sampling.
    tolerance = 3 * np.sqrt(simulated * (1 - simulated) / runs) + 0.005
    assert np.all(np.abs(np.asarray(expected) - simulated) <= tolerance), (expected, simulated.tolist())


def test_expected_value_grows_with_k_and_stays_a_probability(table: NeighbourTable) -> None:
    model = ChanceModel(table)
    for m, truth in [(1, ["h005"]), (3, ["h005", "h006", "h007"]), (10, ["h100"])]:
        values = model.expected(m, truth, KS)
        assert all(0.0 <= v <= 1.0 for v in values)
        assert values == sorted(values)


def test_a_ground_truth_nobody_knows_expects_zero(table: NeighbourTable) -> None:
    assert ChanceModel(table).expected(3, ["nope"], KS) == [0.0] * len(KS)
    with pytest.raises(ValueError):
        ChanceModel(table).expected(0, ["h001"], KS)


@settings(max_examples=200, deadline=None)
@given(observed=st.floats(0, 1), expected=st.floats(0, 1))
def test_one_event_is_kappa_shaped(observed: float, expected: float) -> None:
    value = corrected_of_sums(observed, expected, 1.0)
    if expected >= 1.0 - 1e-9:
        assert value is None  # no room above chance: no score, never a huge negative one
        return
    assert value is not None and value <= 1.0 + 1e-9
    assert corrected_of_sums(expected, expected, 1.0) == 0.0
    assert corrected_of_sums(1.0, expected, 1.0) == pytest.approx(1.0)
    assert (value > 0) == (observed > expected)


events_strategy = st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(a=events_strategy, b=events_strategy)
def test_the_corrected_score_of_a_set_is_the_kappa_of_its_sums(
    a: list[tuple[float, float]], b: list[tuple[float, float]]
) -> None:
    """Sets combine by adding sums (any split of the events gives the same score), and the
    score is (sum o - sum e) / (n - sum e) -- not the mean of per-event values."""
    left, right, whole = CorrectedSum(), CorrectedSum(), CorrectedSum()
    for o, e in a:
        left.update(o, e)
        whole.update(o, e)
    for o, e in b:
        right.update(o, e)
        whole.update(o, e)
    combined = left + right
    events = a + b
    room = len(events) - sum(e for _, e in events)
    if room <= 1e-6:
        return
    want = (sum(o for o, _ in events) - sum(e for _, e in events)) / room
    assert combined.get() == pytest.approx(want, abs=1e-9)
    assert whole.get() == pytest.approx(want, abs=1e-9)


def test_one_event_near_certain_chance_does_not_outweigh_the_others() -> None:
    """The failure of averaging per-event kappas: one event with expectation 0.9999 that
    misses scores -9999 alone; in the kappa of sums it weighs as one event."""
    acc = CorrectedSum()
    for _ in range(1000):
        acc.update(0.3, 0.1)
    acc.update(0.0, 0.9999)
    value = acc.get()
    assert value is not None and value == pytest.approx((300.0 - 100.9999) / (1001 - 100.9999))
    assert 0.2 < value < 0.23
    per_event = [corrected_of_sums(0.3, 0.1, 1.0)] * 1000 + [corrected_of_sums(0.0, 0.9999, 1.0)]
    assert (
        float(np.mean([v for v in per_event if v is not None])) < -9
    )  # what the mean of per-event values gave


def test_the_interval_covers_the_true_kappa() -> None:
    """The delta-method interval: ~95% of 400 simulated sets of 300 events cover the
    population's kappa (binomial tolerance: at least 91%)."""
    rng = np.random.default_rng(5)
    expected = rng.uniform(0.0, 0.8, size=300)
    truth_kappa = 0.3
    p = expected + truth_kappa * (1 - expected)  # P(hit) of each event
    covered = 0
    for _ in range(400):
        acc = CorrectedSum()
        for o, e in zip((rng.random(300) < p).astype(float), expected, strict=True):
            acc.update(float(o), float(e))
        interval = acc.interval()
        assert interval is not None
        covered += interval[0] <= truth_kappa <= interval[1]
    assert covered >= 0.91 * 400, covered


def test_scores_carry_the_expectation_beside_the_raw_value(table: NeighbourTable) -> None:
    cache = NeighbourCache(table, 20, chance=ChanceModel(table))
    event = Recommendation("1", ("h000", "h001", "h002"), ("h005",))
    score = score_event(event, ["h005"], cache, KS, [1, None])
    model = ChanceModel(table)
    for label, rows in (("1", 1), ("all", 3)):
        expected = model.expected(rows, ["h005"], KS)
        for k, e in zip(KS, expected, strict=True):
            assert score.expected[label][k] == e
            assert score.corrected[label][k] == corrected_of_sums(score.reval[label][k], e, 1.0)
    as_json = score.to_json()
    assert (
        set(as_json["reval_hit_ratio_corrected"]) == set(as_json["reval_hit_ratio_expected"]) == {"1", "all"}
    )
    # Without a null model (a JSON thesaurus) the raw score is unchanged and nothing is corrected.
    plain = score_event(event, ["h005"], NeighbourCache(table, 20), KS, [1, None])
    assert plain.reval == score.reval and plain.expected == {} and plain.corrected == {}


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(
        st.tuples(
            st.integers(1, 12),
            st.lists(
                st.sampled_from([f"h{i:03d}" for i in range(0, 300, 7)] + ["nope", "nada"]),
                min_size=1,
                max_size=8,
                unique=True,
            ),
        ),
        min_size=1,
        max_size=40,
    ),
    ks=st.lists(st.integers(0, 25), min_size=1, max_size=6),
)
def test_a_batch_of_expectations_is_the_same_as_one_at_a_time(
    table: NeighbourTable, requests: list[tuple[int, list[str]]], ks: list[int]
) -> None:
    """expected_many (unions and sums computed for the whole batch) gives exactly what
    expected gives on a fresh model: the same floats, not just close ones."""
    batch = ChanceModel(table).expected_many([*requests, *requests[:3]], ks)
    one_at_a_time = ChanceModel(table)
    assert batch == [one_at_a_time.expected(m, truth, ks) for m, truth in [*requests, *requests[:3]]]


def test_a_prepared_model_gives_the_same_expectations(table: NeighbourTable) -> None:
    """prepare() only moves the per-version tables from the first events into the set-up:
    every expectation the same float, for both cases (|R| <= |G| and |R| > |G|) and every m."""
    rng = np.random.default_rng(11)
    names = table.hashtags
    asks = [
        (m, [names[j] for j in rng.choice(len(names), size=g, replace=False)])
        for m in range(1, 13)
        for g in (1, 3)
    ]
    lazy = ChanceModel(table)
    prepared = ChanceModel(table)
    prepared.prepare(KS)
    for m, truth in asks:
        assert prepared.expected(m, truth, KS) == lazy.expected(m, truth, KS)


def test_batched_scores_are_the_scores_one_event_at_a_time(table: NeighbourTable) -> None:
    from stream.evaluation.scoring import score_batch
    from stream.evaluation.slices import Bands

    rng = np.random.default_rng(3)
    names = list(table.hashtags)
    events = []
    for i in range(120):
        recommended = tuple(dict.fromkeys(rng.choice(names, size=int(rng.integers(1, 12)))))
        truth = tuple(
            dict.fromkeys(
                [*rng.choice(names, size=int(rng.integers(1, 8))), "unknown"][: int(rng.integers(1, 9))]
            )
        )
        events.append((Recommendation(str(i), recommended, truth), truth))
    bands = Bands(table.hashtags, table.counts)
    batched = score_batch(
        events, NeighbourCache(table, 20, chance=ChanceModel(table), bands=bands), KS, [1, 5, None]
    )
    single = NeighbourCache(table, 20, chance=ChanceModel(table), bands=bands)
    assert batched.records() == [oracle_record(e, t, single, KS, [1, 5, None]) for e, t in events]


def reference_mass(
    model: ChanceModel, table: NeighbourTable, g: int, ks: list[int]
) -> npt.NDArray[np.float64]:
    """w(A_g(k)) as it was computed before the precomputed grid: a cumulative sum over g's
    (rank, holder) entries (every table entry naming g, and g itself at rank 0)."""
    entries = sorted(
        [
            (rank, h)
            for h, row in enumerate(table.neighbour_ids.tolist())
            for rank, j in enumerate(row, 1)
            if j == g
        ]
        + [(0, g)]
    )
    cumulative = np.concatenate([[0.0], np.cumsum(model._w[[h for _, h in entries]])])
    return cumulative[np.searchsorted([rank for rank, _ in entries], np.asarray(ks), side="right")]


def reference_expected(
    model: ChanceModel, table: NeighbourTable, m: int, truth: list[str], ks: list[int]
) -> list[float]:
    """Expected value for m > |G| as it was computed before the tables, one g at a time:
    the mean over G of 1 - prod_t clip(1 - w(A_g(k)) * scale_t)."""
    total = np.zeros(len(ks))
    for name in truth:
        if name in table:
            mass = reference_mass(model, table, table.hashtags.index(name), ks)
            total += 1.0 - np.prod(np.clip(1.0 - mass[..., None] * model._schedule(m), 0.0, 1.0), axis=-1)
    return (total / len(truth)).tolist()


@pytest.mark.parametrize("m", [2, 3, 5, 9, 10, 11, 14])
def test_tabled_hit_probabilities_are_the_per_hashtag_ones(table: NeighbourTable, m: int) -> None:
    """Every hashtag's terms, computed for all at once (m <= 10 from tables built one draw at a
    time, beyond it for the event's hashtags only), are the same floats as one g at a time."""
    ks = [0, 1, 2, 5, 10, 19, 20, 30]
    model = ChanceModel(table)
    names = list(table.hashtags)
    for g in range(0, len(names), 3):
        truth = list(dict.fromkeys([names[g]] if g % 2 else [names[g], names[(g * 7) % len(names)], "nope"]))
        if m > len(truth):
            assert model.expected(m, truth, ks) == reference_expected(model, table, m, truth, ks)


SmallTable = tuple[list[list[int]], list[int], list[int], int]


def _small_tables(n: int) -> st.SearchStrategy[SmallTable]:
    """Rows of n hashtags with gaps, duplicates and self entries; counts (zeros too); ks; m."""
    return st.tuples(
        st.lists(st.lists(st.integers(-1, n - 1), min_size=4, max_size=4), min_size=n, max_size=n),
        st.lists(st.integers(0, 5), min_size=n, max_size=n),
        st.lists(st.integers(-1, 6), min_size=1, max_size=5),
        st.integers(2, 12),
    )


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 8).flatmap(_small_tables))
def test_masses_by_rank_are_the_per_hashtag_sums(case: SmallTable) -> None:
    """On tables with gaps, duplicates, self entries and zero counts, the expectations from the
    precomputed w(A_g(k)) are the per-g cumulative sums' (m = 1) and hit terms' (m > 1)."""
    rows, counts, ks, m = case
    n = len(rows)
    metadata = ThesaurusMetadata(
        model_id="t", dimension=1, count=n, built_at="", version="v", n_trees=0, metric="cosine", min_count=1
    )
    small = NeighbourTable([f"h{i}" for i in range(n)], rows, np.zeros((n, 4), np.float32), counts, metadata)
    model = ChanceModel(small)
    for g, name in enumerate(small.hashtags):
        assert model.expected(1, [name], ks) == reference_mass(model, small, g, ks).tolist()
        assert model.expected(m, [name], ks) == reference_expected(model, small, m, [name], ks)


@pytest.mark.slow
def test_the_null_is_unbiased_at_real_thesaurus_sizes() -> None:
    """Successive sampling's approximation (stream.evaluation.chance's docstring) against the null
    recommender itself, simulated, on a thesaurus of real size: 3,000 hashtags with the
    long-tailed popularity of a crisis feed, 70 neighbours each (hubs included: A_g(70) holds
    hundreds of hashtags for some g), m up to 10, ground truths drawn by popularity as a
    feed's are, one hashtag (|R| > |G|) and five (|R| <= |G|, the union path).  What matters
    is the corrected score of a set of events: the bias of the null's kappa, (sum expected -
    sum simulated) / (events - sum expected), stays within 0.003 (measured: <= 0.0015 at
    5,515 hashtags; per ground truth the approximation is within 0.01)."""
    rng = np.random.default_rng(11)
    n = 3000
    counts = np.minimum(rng.zipf(1.45, size=n), 800)
    centres = rng.normal(size=(40, 24))
    vectors = centres[rng.integers(0, 40, n)] + 0.8 * rng.normal(size=(n, 24))
    names = [f"h{i}" for i in range(n)]
    table = build_neighbour_table(names, vectors, counts, depth=70, method="center+csls")
    model = ChanceModel(table)
    ks = [0, 10, 30, 70]
    # rank[h, g]: 0 for h itself, i for h's i-th neighbour, 127 beyond
    rank = np.full((n, n), 127, dtype=np.int8)
    ids = table.neighbour_ids
    for i in range(ids.shape[1] - 1, -1, -1):  # nearer ranks last, so they win
        valid = ids[:, i] >= 0
        rank[np.flatnonzero(valid), ids[valid, i]] = i + 1
    rank[np.arange(n), np.arange(n)] = 0
    weights = counts / counts.sum()
    runs = 6000
    for m, size in ((1, 1), (5, 1), (10, 1), (5, 5)):
        keys = rng.exponential(size=(runs, n)) / weights
        drawn = np.argpartition(keys, m - 1, axis=1)[:, :m]
        simulated, expected = [], []
        for _ in range(150):
            truth = list(dict.fromkeys(rng.choice(n, size=size, p=weights).tolist()))
            nearest = rank[drawn][:, :, truth]  # runs x m x |G|
            if m > len(truth):  # the ground-truth hashtags reached, over |G|
                hits = (nearest.min(axis=1)[:, :, None] <= np.array(ks)).mean(axis=1)
            else:  # the recommended hashtags reaching the ground truth, over m
                hits = (nearest.min(axis=2)[:, :, None] <= np.array(ks)).mean(axis=1)
            simulated.append(hits.mean(axis=0))
            expected.append(model.expected(m, [names[g] for g in truth], ks))
        sim, exp = np.array(simulated), np.array(expected)
        bias = (exp - sim).sum(axis=0) / (len(exp) - exp.sum(axis=0))
        assert np.all(np.abs(bias) <= 0.003), (m, size, bias.round(4).tolist())
        assert np.all(np.abs(exp - sim) <= 0.01 + 4 * np.sqrt(sim * (1 - sim) / runs)), (m, size)
