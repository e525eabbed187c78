"""#REval-hit-ratio against the paper's worked examples and its properties."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream.evaluation.metrics import Mean, exact_scores, reval_hit_ratio

TABLE2_SYN = {
    "hockey": ["hockey", "bowling", "golf", "sport"],
    "championship": ["championship", "champion", "winner", "tournament"],
    "football": ["football", "soccer", "footy", "rugby"],
    "sport": ["sport", "sports", "exercise", "keeepfit"],
    "swim": ["swim", "dive", "paddle", "sport"],
    "exercise": ["exercise", "keeepfit", "yoga", "walking"],
}


def syn(h: str) -> list[str]:
    return TABLE2_SYN.get(h, [h])


@pytest.mark.parametrize(
    ("recommended", "truth", "rho", "value"),
    [
        (["hockey", "championship"], ["football", "sport"], 1, 1 / 2),
        (["football", "sport"], ["hockey", "sports"], 1, 1 / 2),
        (["hockey"], ["football", "rugby"], 0, 0.0),
        (["swim", "exercise"], ["sport"], 1, 1.0),
    ],
)
def test_paper_table_2(recommended: list[str], truth: list[str], rho: int, value: float) -> None:
    assert reval_hit_ratio(recommended, truth, syn) == value
    assert value * min(len(recommended), len(truth)) == rho
    # exact match finds none of these
    assert reval_hit_ratio(recommended, truth, lambda h: [h]) == 0.0


def test_synonyms_expand_r_only() -> None:
    # Syn(sport) lacks hockey: recommending #sport for a #hockey tweet is not a hit...
    assert reval_hit_ratio(["sport"], ["hockey"], syn) == 0.0
    # ...but recommending #hockey for a #sport tweet is.
    assert reval_hit_ratio(["hockey"], ["sport"], syn) == 1.0


def test_duplicates_and_normalisation() -> None:
    assert reval_hit_ratio(["#Hockey", "hockey", "HOCKEY"], ["#Sport"], syn) == 1.0


def test_empty_sets_are_unscorable_not_zero() -> None:
    assert reval_hit_ratio([], ["a"], syn) is None
    assert reval_hit_ratio(["a"], [], syn) is None
    assert exact_scores([], ["a"]) is None
    mean = Mean()
    for value in (reval_hit_ratio([], ["a"], syn), 1.0):
        mean.update(value)
    assert mean.get() == 1.0 and mean.unscorable == 1


def test_exact_metrics() -> None:
    scores = exact_scores(["a", "b", "c", "d"], ["a", "x"])
    assert scores is not None
    assert scores.hit_rate == 1.0
    assert scores.precision == 0.25 and scores.recall == 0.5
    assert scores.f1 == pytest.approx(2 * 0.25 * 0.5 / 0.75)
    assert scores.hit_ratio == 0.5
    miss = exact_scores(["a"], ["b"])
    assert miss is not None and miss.as_dict() == dict.fromkeys(miss.NAMES, 0.0)


VOCAB = [f"h{i}" for i in range(12)]
tags = st.lists(st.sampled_from(VOCAB), min_size=1, max_size=6)
# a thesaurus: each hashtag gets an ordered neighbour list (without itself)
thesauri = st.fixed_dictionaries({h: st.permutations([v for v in VOCAB if v != h]) for h in VOCAB})


@settings(max_examples=200, deadline=None)
@given(tags, tags, thesauri, st.integers(0, 11))
def test_properties(recommended, truth, thesaurus, k) -> None:
    def syn_k(kk: int):
        return lambda h: [h, *thesaurus[h][:kk]]

    value = reval_hit_ratio(recommended, truth, syn_k(k))
    assert value is not None and 0.0 <= value <= 1.0
    # k = 0 is the hit ratio
    exact = exact_scores(recommended, truth)
    assert exact is not None
    assert reval_hit_ratio(recommended, truth, syn_k(0)) == exact.hit_ratio
    # nested synonym lists: never decreases as k grows
    values = [reval_hit_ratio(recommended, truth, syn_k(kk)) for kk in range(12)]
    assert all(a <= b for a, b in itertools.pairwise(values))  # type: ignore[operator]
