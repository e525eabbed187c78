"""Rank-aware #REval-hit-ratio (stream/evaluation/rank.py): README's worked example, the reduction to
Eq. 4 under flat weights, bounds, monotonicity, and its export (scores, /metrics, evaluate)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from stream.evaluation.experiment import ExperimentConfig
from stream.evaluation.metrics import FAR, reval_by_k, reval_hit_ratio
from stream.evaluation.neighbours import NeighbourCache
from stream.evaluation.rank import DCG, FLAT, TOP, RankWeights, ranked_by_k, reval_ranked
from stream.evaluation.scoring import r_label, score_event
from stream.intake.records import Recommendation
from stream.synonyms.thesaurus import JsonThesaurus
from workers.adapters.prometheus.exporter import Exporter, LabelGuard
from workers.adapters.prometheus.quality_metrics import QualityMetrics
from workers.commands.evaluate_summary import Run, Scored, summarise

from .test_metrics import TABLE2_SYN, syn

SCHEMES = [FLAT, DCG, TOP]


def reference(matrix: list[list[int]], n_truth: int, k: int, w: RankWeights) -> float:
    """The README's definition, written out with no shortcut (no prefix maxima, no bisection)."""
    n_rec = len(matrix)
    n = min(n_rec, n_truth)
    # a unit's links as (row index, synonym rank): rows when |R| <= |G|, columns otherwise
    if n_rec <= n_truth:
        units = [[(i, j) for j in row] for i, row in enumerate(matrix)]
    else:
        units = [[(i, matrix[i][g]) for i in range(n_rec)] for g in range(n_truth)]
    values = sorted(
        (max((w.rec(i + 1) * w.syn(j) for i, j in unit if j <= k), default=0.0) for unit in units),
        reverse=True,
    )
    ideal = [w.rec(t) for t in range(1, n + 1)]
    return sum(min(v, c) for v, c in zip(values, ideal, strict=False)) / sum(ideal)


# --------------------------------------------------------------------------- README's worked example

DCG2 = 1 / math.log2(3)  # w_rec(2) = w_syn(1) = 0.6309
DCG3 = 1 / math.log2(5)  # w_syn(3) = 0.4307

#: README, "Rank-aware #REval-hit-ratio": (R in order, G, Eq. 4, ranked with DCG weights), k = 3.
WORKED = [
    (["hockey", "championship"], ["football", "sport"], 0.5, DCG3 / (1 + DCG2), 0.2641),
    (["championship", "hockey"], ["football", "sport"], 0.5, DCG2 * DCG3 / (1 + DCG2), 0.1666),
    (["football", "sport"], ["hockey", "sports"], 0.5, DCG2 * DCG2 / (1 + DCG2), 0.2441),
    (["sport", "football"], ["hockey", "sports"], 0.5, DCG2 / (1 + DCG2), 0.3869),
    (["hockey"], ["football", "rugby"], 0.0, 0.0, 0.0),
    (["swim", "exercise"], ["sport"], 1.0, DCG3, 0.4307),
    (["exercise", "swim"], ["sport"], 1.0, DCG2 * DCG3, 0.2717),
    # |R| > |G| and bowling is hockey's nearest synonym: sorted credits 1, 0.6309, 0.6309 are
    # capped at the ideal list's 1, 0.6309, 0.5, so the score is 1, not 1.06.
    (["hockey", "football", "sport", "swim"], ["hockey", "football", "bowling"], 1.0, 1.0, 1.0),
]


@pytest.mark.parametrize(("recommended", "truth", "eq4", "formula", "shown"), WORKED)
def test_readme_worked_example(
    recommended: list[str], truth: list[str], eq4: float, formula: float, shown: float
) -> None:
    got = reval_ranked(recommended, truth, syn)
    assert got == pytest.approx(formula, abs=1e-12)
    assert round(formula, 4) == shown  # the number printed in the README
    assert reval_ranked(recommended, truth, syn, FLAT) == reval_hit_ratio(recommended, truth, syn) == eq4


def test_readme_example_through_score_event() -> None:
    # The scorer's path (NeighbourCache ranks, the (r, k) grid) gives the README's numbers too.
    cache = NeighbourCache(JsonThesaurus({h: s[1:] for h, s in TABLE2_SYN.items()}), max_k=3)
    for recommended, truth, eq4, formula, _ in WORKED:
        event = Recommendation("1", tuple(recommended), tuple(truth))
        result = score_event(event, truth, cache, ks=(0, 3))
        assert result.reval["all"][3] == eq4
        assert result.ranked["all"][3] == pytest.approx(formula, abs=1e-12)
        assert result.to_json()["reval_hit_ratio_ranked"]["all"]["3"] == result.ranked["all"][3]


def test_unscorable_and_weights() -> None:
    assert reval_ranked([], ["a"], syn) is None and reval_ranked(["a"], [], syn) is None
    assert [DCG.rec(i) for i in (1, 2, 3)] == pytest.approx([1.0, 0.6309, 0.5], abs=1e-4)
    assert [TOP.rec(i) for i in (1, 2, 3)] == pytest.approx([1.0, 9 / 16, 9 / 25])
    assert [TOP.syn(j) for j in (0, 1)] == pytest.approx([1.0, 9 / 16])
    with pytest.raises(ValueError, match="must be 1"):
        RankWeights("bad", lambda i: 0.5, lambda j: 1.0)


# --------------------------------------------------------------------------- properties

ranks = st.one_of(st.integers(0, 12), st.just(FAR))
matrices = st.integers(1, 7).flatmap(
    lambda n_rec: st.integers(1, 7).flatmap(
        lambda n_truth: st.lists(
            st.lists(ranks, min_size=n_truth, max_size=n_truth), min_size=n_rec, max_size=n_rec
        )
    )
)
KS = list(range(13))


@settings(max_examples=300, deadline=None)
@given(matrices)
def test_flat_weights_are_eq4_exactly(matrix: list[list[int]]) -> None:
    n_truth = len(matrix[0])
    assert ranked_by_k(matrix, n_truth, KS, FLAT) == reval_by_k(matrix, n_truth, KS)


@settings(max_examples=300, deadline=None)
@given(matrices, st.sampled_from(SCHEMES))
def test_bounds_and_the_definition(matrix: list[list[int]], weights: RankWeights) -> None:
    n_truth = len(matrix[0])
    got = ranked_by_k(matrix, n_truth, KS, weights)
    assert all(0.0 <= v <= 1.0 + 1e-12 for v in got)
    assert got == pytest.approx([reference(matrix, n_truth, k, weights) for k in KS], abs=1e-12)
    # never lower as k grows: a larger k only adds links
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(got))


@settings(max_examples=300, deadline=None)
@given(matrices, st.sampled_from(SCHEMES), st.data())
def test_a_smaller_synonym_rank_never_scores_less(
    matrix: list[list[int]], weights: RankWeights, data: Any
) -> None:
    n_truth = len(matrix[0])
    i = data.draw(st.integers(0, len(matrix) - 1))
    g = data.draw(st.integers(0, n_truth - 1))
    closer = [row[:] for row in matrix]
    closer[i][g] = data.draw(st.integers(0, min(matrix[i][g], 12)))
    before = ranked_by_k(matrix, n_truth, KS, weights)
    after = ranked_by_k(closer, n_truth, KS, weights)
    assert all(a <= b + 1e-12 for a, b in zip(before, after, strict=True))


@settings(max_examples=300, deadline=None)
@given(matrices, st.sampled_from(SCHEMES), st.data())
def test_moving_a_hit_up_never_scores_less(matrix: list[list[int]], weights: RankWeights, data: Any) -> None:
    # A recommended hashtag with links swaps places with a higher one that has none.
    n_truth = len(matrix[0])
    hit = data.draw(st.integers(0, len(matrix) - 1))
    higher = data.draw(st.integers(0, hit))
    matrix = [row[:] for row in matrix]
    matrix[higher] = [FAR] * n_truth
    moved = [row[:] for row in matrix]
    moved[higher], moved[hit] = matrix[hit], matrix[higher]
    before = ranked_by_k(matrix, n_truth, KS, weights)
    after = ranked_by_k(moved, n_truth, KS, weights)
    assert all(a <= b + 1e-12 for a, b in zip(before, after, strict=True))


@settings(max_examples=300, deadline=None)
@given(matrices, st.sampled_from([DCG, TOP]), st.data())
def test_better_hit_first_never_scores_less_when_r_le_g(
    matrix: list[list[int]], weights: RankWeights, data: Any
) -> None:
    # |R| <= |G|: each row is one unit, so putting the row with the closer synonym higher
    # never lowers the score (the rearrangement inequality).
    n_truth = len(matrix[0])
    matrix = matrix[:n_truth]
    a = data.draw(st.integers(0, len(matrix) - 1))
    b = data.draw(st.integers(a, len(matrix) - 1))
    k = data.draw(st.sampled_from(KS))

    def credit(row: list[int]) -> float:
        return max((weights.syn(j) for j in row if j <= k), default=0.0)

    if credit(matrix[a]) > credit(matrix[b]):
        a, b = b, a  # b is now the better row, below a (or the same)
    if a > b:
        return
    swapped = [row[:] for row in matrix]
    swapped[a], swapped[b] = matrix[b], matrix[a]
    before = ranked_by_k(matrix, n_truth, [k], weights)[0]
    after = ranked_by_k(swapped, n_truth, [k], weights)[0]
    assert before <= after + 1e-12


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([f"h{i}" for i in range(8)]), min_size=1, max_size=6, unique=True),
    st.lists(st.sampled_from([f"h{i}" for i in range(8)]), min_size=1, max_size=6, unique=True),
)
def test_k0_with_dcg_is_ndcg(recommended: list[str], truth: list[str]) -> None:
    dcg = sum(1 / math.log2(1 + i) for i, h in enumerate(recommended, start=1) if h in truth)
    idcg = sum(1 / math.log2(1 + i) for i in range(1, min(len(recommended), len(truth)) + 1))
    assert reval_ranked(recommended, truth, lambda h: [h]) == pytest.approx(dcg / idcg, abs=1e-12)
    # a perfect list (the ground truth first) scores 1 whatever k and the weights
    perfect = [*truth, *(h for h in recommended if h not in truth)]
    for weights in SCHEMES:
        assert reval_ranked(perfect, truth, syn, weights) == pytest.approx(1.0)


VOCAB = [f"h{i}" for i in range(10)]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from([*VOCAB, "unknown1"]), min_size=1, max_size=8, unique=True),
    st.lists(st.sampled_from([*VOCAB, "unknown2"]), min_size=1, max_size=5, unique=True),
    st.fixed_dictionaries({h: st.permutations([v for v in VOCAB if v != h]) for h in VOCAB}),
)
def test_scorer_equals_the_definitional_entry_point(recommended, truth, table) -> None:
    """score_event's grid (cached ranks, top-r rows) gives reval_ranked, and with flat
    weights Eq. 4, on random events."""
    cache = NeighbourCache(JsonThesaurus({h: list(n) for h, n in table.items()}), max_k=9)
    event = Recommendation("1", tuple(recommended), tuple(truth))
    ks, rs = (0, 1, 3, 9), (1, 2, 5, None)
    result = score_event(event, truth, cache, ks=ks, rs=rs)
    flat = score_event(event, truth, cache, ks=ks, rs=rs, weights=FLAT)
    for r in rs:
        top = recommended[:r] if r is not None else recommended
        for k in ks:
            synonyms = lambda h, k=k: [h, *table.get(h, [])[:k]]  # noqa: E731
            assert result.ranked[r_label(r)][k] == pytest.approx(
                reval_ranked(top, truth, synonyms), abs=1e-12
            )
            assert (
                flat.ranked[r_label(r)][k]
                == result.reval[r_label(r)][k]
                == reval_hit_ratio(top, truth, synonyms)
            )


# --------------------------------------------------------------------------- exported beside the others


def test_exported_to_metrics() -> None:
    exporter = Exporter()
    quality = QualityMetrics(
        exporter, ks=(0, 3), rs=(None,), windows=(300,), guard=LabelGuard(), window_label=lambda s: "5m"
    )
    cache = NeighbourCache(JsonThesaurus({h: s[1:] for h, s in TABLE2_SYN.items()}), max_k=3)
    event = Recommendation("1", ("exercise", "swim"), ("sport",), recommender="mowe")
    result = score_event(event, ("sport",), cache, ks=(0, 3))
    quality.observe(result, event_time=1.0)
    text = generate_latest(exporter.registry).decode()
    lines = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line[:1] != "#"}
    key = 'reval_hit_ratio_ranked_sum{k="3",r="all",recommender="mowe"}'
    assert lines[key] == pytest.approx(DCG2 * DCG3)
    assert lines['reval_hit_ratio_ranked_count{k="3",r="all",recommender="mowe"}'] == 1
    rolling = 'reval_hit_ratio_ranked_rolling{k="3",r="all",recommender="mowe",window="5m"}'
    assert lines[rolling] == pytest.approx(DCG2 * DCG3)
    # the existing families are unchanged beside it
    assert lines['reval_hit_ratio_sum{k="3",r="all",recommender="mowe"}'] == 1.0
    assert lines['reval_exact_match_sum{metric="hit_ratio",r="all",recommender="mowe"}'] == 0.0


def test_evaluate_cells_carry_the_ranked_mean() -> None:
    config = ExperimentConfig(splits=("time",), seeds=(1,), ks=(0, 3), rs=(1,), bootstrap=100)
    raw = np.array([[0.0, 1.0], [1.0, 1.0], [np.nan, np.nan]])
    ranked = np.array([[0.0, 0.25], [1.0, 0.5], [np.nan, np.nan]])
    run = Run("time", 1, [], [None, None, None], {}, {})  # type: ignore[list-item]
    run.scored["bertag", "raw", "mowe"] = Scored(raw, raw, np.array([[0.0], [1.0], [np.nan]]), ranked)
    cells = summarise(config, [run])
    assert [c["reval_hit_ratio_ranked"] for c in cells if c["seed"] == 1] == [0.5, 0.375]
    assert [c["reval_hit_ratio"] for c in cells if c["seed"] == 1] == [0.5, 1.0]


def test_a_huge_k_means_every_synonym_not_every_hashtag() -> None:
    """`reval score -k 0,99999999999` once built a weight table of 10^11 entries and counted
    non-synonyms (rank FAR) as hits; a k beyond every real rank is the whole synonym list."""
    from stream.evaluation.metrics import FAR, reval_by_k
    from stream.evaluation.rank import ranked_by_k

    matrix = [[FAR, 2], [FAR, FAR]]
    assert ranked_by_k(matrix, 2, [10**11]) == ranked_by_k(matrix, 2, [FAR - 1])
    assert reval_by_k(matrix, 2, [10**11]) == reval_by_k(matrix, 2, [3]) == [0.5]
    assert ranked_by_k([[FAR]], 1, [10**11]) == [0.0]
