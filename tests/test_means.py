"""The streamed running mean equals the paper's batch definition for any order and batching."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st

from stream.synonyms.means import HashtagMeans, RunningMean, unit


def batch_definition(vectors: list[np.ndarray]) -> np.ndarray:
    """Paper 3.1.4: arithmetic mean of all the hashtag's tweet embeddings, unit length."""
    mean = np.mean(np.stack(vectors), axis=0)
    return mean / np.linalg.norm(mean)


tweets = st.lists(
    st.tuples(
        st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=3),
        st.lists(st.floats(-1, 1, allow_nan=False), min_size=4, max_size=4),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(tweets, st.randoms(use_true_random=False), st.integers(1, 7))
def test_any_order_and_batching_gives_the_batch_definition(data, rnd, batch) -> None:
    data = [(tags, np.array(vec)) for tags, vec in data]
    shuffled = list(data)
    rnd.shuffle(shuffled)
    table = HashtagMeans(dim=4)
    for start in range(0, len(shuffled), batch):
        chunk = shuffled[start : start + batch]
        table.update_batch([t for t, _ in chunk], np.stack([v for _, v in chunk]))
    for tag in table:
        used = [v for tags, v in data if tag in tags]
        assert table[tag].count == len(used)
        mean = np.mean(np.stack(used), axis=0)
        if np.linalg.norm(mean) > 1e-6:  # the direction of a ~zero mean is undefined
            np.testing.assert_allclose(table[tag].get(), batch_definition(used), atol=1e-6)


@settings(max_examples=100, deadline=None)
@given(tweets, st.integers(0, 40))
def test_two_partial_states_merge_exactly(data, cut) -> None:
    data = [(tags, np.array(vec)) for tags, vec in data]
    whole, left, right = HashtagMeans(4), HashtagMeans(4), HashtagMeans(4)
    for tags, vec in data:
        whole.update(tags, vec)
    for tags, vec in data[:cut]:
        left.update(tags, vec)
    for tags, vec in data[cut:]:
        right.update(tags, vec)
    merged = left.merge(right)
    assert set(merged) == set(whole)
    for tag in whole:
        assert merged[tag].count == whole[tag].count
        np.testing.assert_allclose(merged[tag].total, whole[tag].total, atol=1e-12)


def test_a_tweet_counts_once_per_distinct_hashtag() -> None:
    table = HashtagMeans(2)
    table.update(["a", "a", "b"], np.array([1.0, 0.0]))
    assert table["a"].count == 1 and table["b"].count == 1


def test_eq1_renormalising_each_step_is_not_the_batch_mean() -> None:
    """Why we keep (count, sum): the paper's Eq. 1 as printed drifts with arrival order."""
    vs = [np.array([1.0, 0.0]), np.array([0.0, 1.0]), np.array([0.0, 1.0])]
    v: npt.NDArray[np.floating] = unit(vs[0]).astype(np.float64)
    for n, x in enumerate(vs[1:], start=1):
        v = unit((n * v + x) / (n + 1))
    state = RunningMean.empty(2)
    for x in vs:
        state.update(x)
    assert not np.allclose(v, batch_definition(vs))
    np.testing.assert_allclose(state.get(), batch_definition(vs), atol=1e-7)


def test_matrix_is_sorted_and_respects_min_count() -> None:
    table = HashtagMeans(2)
    table.update(["b", "a"], np.array([0.0, 2.0]))
    table.update(["b"], np.array([2.0, 0.0]))
    names, vectors, counts = table.matrix(min_count=2)
    assert names == ["b"] and counts == [2]
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)


def test_zero_state_reads_as_zero() -> None:
    assert not RunningMean.empty(3).get().any()
