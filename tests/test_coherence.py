"""Thematic coherence (paper 003): hand-computed small clusters, scikit-learn's TF-IDF, the
pairwise definitions written out, the bottom-k sample, matched-popularity chance."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.feature_extraction.text import TfidfVectorizer

from stream.auditing.coherence import (
    PopularityIndex,
    bertscore_coherence,
    bottom_k,
    coherence_lift,
    coherence_text,
    greedy_f1,
    mean_pairwise_cosine,
    pair_clusters,
    sample_priority,
    tfidf_coherence,
    tfidf_rows,
)

WORDS = ["flood", "water", "rescue", "boston", "marathon", "bomb", "quake", "help", "now", "river"]


def test_tfidf_coherence_of_a_hand_computed_cluster() -> None:
    # Three texts; vocabulary (sorted) bb, cc, dd; n = 3; df: bb 2, cc 2, dd 1.
    # idf = ln((1 + n) / (1 + df)) + 1: bb = cc = ln(4/3) + 1 = 1.2877, dd = ln 2 + 1 = 1.6931.
    # rows: (1, 1, 0)/√2; (1.2877, 0, 1.6931)/2.1272 = (0.6054, 0, 0.7960); (0, 1, 0)
    # pairs: 0.7071 · 0.6054 = 0.4281, 0.7071, 0 -> mean 0.3784
    texts = ["bb cc", "bb dd", "cc cc"]
    idf_bb = np.log(4 / 3) + 1  # df 2
    idf_cc = np.log(4 / 3) + 1  # df 2 ("bb cc", "cc cc")
    idf_dd = np.log(4 / 2) + 1  # df 1
    v1 = np.array([idf_bb, idf_cc, 0.0])
    v2 = np.array([idf_bb, 0.0, idf_dd])
    v3 = np.array([0.0, 2 * idf_cc, 0.0])
    rows = [v / np.linalg.norm(v) for v in (v1, v2, v3)]
    by_hand = (rows[0] @ rows[1] + rows[0] @ rows[2] + rows[1] @ rows[2]) / 3
    assert tfidf_coherence(texts) == pytest.approx(by_hand)
    assert by_hand == pytest.approx(0.3784, abs=1e-4)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from(WORDS), min_size=0, max_size=6).map(" ".join), min_size=2, max_size=12)
)
def test_tfidf_rows_equal_scikit_learn_and_the_exhaustive_mean(texts: list[str]) -> None:
    ours = tfidf_rows(texts)
    if ours.shape[1]:
        theirs = TfidfVectorizer().fit_transform(texts).toarray()
        assert np.allclose(ours, theirs)
    pairs = [ours[i] @ ours[j] for i, j in combinations(range(len(texts)), 2)]
    assert mean_pairwise_cosine(ours) == pytest.approx(np.mean(pairs))


def test_identical_texts_are_fully_coherent_and_disjoint_ones_not() -> None:
    assert tfidf_coherence(["flood water", "flood water", "flood water"]) == pytest.approx(1.0)
    assert tfidf_coherence(["flood water", "boston marathon", "quake help"]) == pytest.approx(0.0)
    assert np.isnan(tfidf_coherence(["only one"]))


def test_bertscore_of_hand_made_token_vectors() -> None:
    e = np.eye(4)
    # text A: tokens e0, e1; text B: e0; text C: (e2 + e3)/sqrt2
    a, b, c = e[[0, 1]], e[[0]], ((e[2] + e[3]) / np.sqrt(2))[None, :]
    # A-B: recall(A as reference) = mean(max sims of e0, e1 in B) = (1 + 0)/2; precision 1 -> F 2/3
    assert greedy_f1(a, b) == pytest.approx(2 / 3)
    assert greedy_f1(b, a) == pytest.approx(2 / 3)  # F1 is symmetric
    # A-C and B-C share nothing: 0
    assert greedy_f1(a, c) == 0.0
    assert bertscore_coherence([a, b, c]) == pytest.approx((2 / 3 + 0 + 0) / 3)
    # a text without tokens is left out; fewer than two texts: NaN
    assert bertscore_coherence([a, b, np.zeros((0, 4))]) == pytest.approx(2 / 3)
    assert np.isnan(bertscore_coherence([a]))


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 9), st.integers(0, 10_000))
def test_bertscore_blocks_equal_the_pairs_written_out(n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    tokens = []
    for _ in range(n):
        t = rng.normal(size=(int(rng.integers(1, 6)), 8))
        tokens.append(t / np.linalg.norm(t, axis=1, keepdims=True))
    expected = np.mean([greedy_f1(tokens[i], tokens[j]) for i, j in combinations(range(n), 2)])
    assert bertscore_coherence(tokens, block=3) == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_coherence_text_drops_every_hashtag() -> None:
    assert coherence_text("#yolanda relief goods #tacloban arriving") == "relief goods arriving"
    assert coherence_text("#地震 #quake") == ""


def test_bottom_k_is_a_sketch_order_and_repetition_free() -> None:
    rng = np.random.default_rng(0)
    pairs = [("flood", f"tweet {i}") for i in range(500)]
    once = bottom_k(pairs, 20)["flood"]
    shuffled = [pairs[i] for i in rng.permutation(len(pairs))]
    redelivered = shuffled + shuffled[:300]  # a crash replays part of the stream
    assert bottom_k(redelivered, 20)["flood"] == once
    assert once == sorted(once, key=lambda t: sample_priority("flood", t))
    # the kept ones are the 20 smallest priorities of all 500
    assert set(once) == set(sorted((t for _, t in pairs), key=lambda t: sample_priority("flood", t))[:20])


def test_bottom_k_is_roughly_uniform() -> None:
    # each of 100 texts is kept with probability 10/100 over many hashtags (independent salts)
    kept = np.zeros(100)
    for h in range(400):
        for t in bottom_k([(f"h{h}", str(i)) for i in range(100)], 10)[f"h{h}"]:
            kept[int(t)] += 1
    assert kept.sum() == 4000
    assert kept.min() > 15 and kept.max() < 70  # binomial(400, 0.1): mean 40, sd 6


def test_random_hashtags_have_matched_popularity() -> None:
    counts = {f"h{i}": i + 1 for i in range(1000)}  # popularity 1..1000
    index = PopularityIndex(counts, window=25)
    rng = np.random.default_rng(1)
    for target in ("h10", "h500", "h999"):
        drawn = [index.draw(target, {target}, rng) for _ in range(50)]
        assert all(d is not None and abs(counts[d] - counts[target]) <= 25 for d in drawn)
    # everything excluded: None
    assert PopularityIndex({"a": 1}).draw("a", {"a"}, rng) is None


def test_pair_clusters_skips_synonyms_without_tweets_and_draws_as_many_random() -> None:
    counts = {f"h{i}": i + 1 for i in range(100)}
    neighbours = {"h50": ["h49", "ghost", "h51"], "h10": ["ghost"]}
    pairings = pair_clusters(
        ["h50", "h10"], lambda h, k: neighbours[h][:k], counts, 3, np.random.default_rng(0)
    )
    assert [p.hashtag for p in pairings] == ["h50"]  # h10's only synonym has no tweet
    (p,) = pairings
    assert p.synonyms == ("h49", "h51")
    assert len(p.random) == 2 and not set(p.random) & {"h50", "h49", "h51"}
    assert all(abs(counts[r] - 51) <= 30 for r in p.random)


def test_lift_ci_from_paired_bootstrap() -> None:
    rng = np.random.default_rng(0)
    random = rng.uniform(0.0, 0.1, size=60)
    better = random + 0.05 + rng.normal(0, 0.02, size=60)
    lift = coherence_lift(better, random, seed=2)
    assert lift is not None and lift.hashtags == 60
    assert lift.lift == pytest.approx(np.mean(better - random))
    assert 0 < lift.lift_ci_low < lift.lift < lift.lift_ci_high
    same = coherence_lift(random, random[::-1], seed=2)
    assert same is not None and same.lift_ci_low < 0 < same.lift_ci_high
    assert coherence_lift([float("nan")], [0.1]) is None
