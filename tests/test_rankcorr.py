"""ρ_w and τ_w (paper 001, section 3): hand-computed examples, the definitions written out
pair by pair, numpy's weighted covariance, and scipy's weighted τ where the two coincide."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from stream.auditing.rankcorr import descending_ranks, pair_weights, rho_w, tau_w, top_weight


def test_weights_are_the_papers_f_with_n0_2() -> None:
    assert top_weight([1, 2, 10]).tolist() == pytest.approx([1 / 9, 1 / 16, 1 / 144])
    # R(n0) = f(1) / sum_n f(n): 001 quotes R(2) ~ 0.28 for the infinite ranking
    share = top_weight([1])[0] / top_weight(np.arange(1, 2_000_000)).sum()
    assert share == pytest.approx(0.28, abs=0.005)


def test_hand_computed_four_items_top_swap() -> None:
    # a = (1, 2, 3, 4); b = (2, 1, 3, 4).  f = 1/9, 1/16, 1/25, 1/36.
    # w ∝ (1/9 + 1/16, 1/16 + 1/9, 2/25, 2/36) = (0.1736111, 0.1736111, 0.08, 0.0555556) / 0.4827778
    w = pair_weights(np.array([1.0, 2, 3, 4]), np.array([2.0, 1, 3, 4]))
    assert w.tolist() == pytest.approx([0.359609, 0.359609, 0.165708, 0.115075], abs=1e-6)
    # ā = b̄ = 2.036249; var = 0.984302; cov = 0.624694 -> ρ_w = 0.634656
    assert rho_w([4, 3, 2, 1], [3, 4, 2, 1]) == pytest.approx(0.634656, abs=2e-6)
    # τ_w: one discordant pair (items 1, 2), both orders: (1 - Σw² - 4 w1 w2) / (1 - Σw²)
    sq = float((w**2).sum())
    assert tau_w([4, 3, 2, 1], [3, 4, 2, 1]) == pytest.approx((1 - sq - 4 * w[0] * w[1]) / (1 - sq))
    assert tau_w([4, 3, 2, 1], [3, 4, 2, 1]) == pytest.approx(0.261735, abs=1e-6)


def test_a_swap_at_the_top_costs_more_than_at_the_bottom() -> None:
    x = np.arange(20.0)[::-1]
    top, bottom = x.copy(), x.copy()
    top[[0, 1]] = top[[1, 0]]
    bottom[[18, 19]] = bottom[[19, 18]]
    for f in (rho_w, tau_w):
        assert f(x, x) == pytest.approx(1.0)
        assert f(x, top) < f(x, bottom) < 1.0
    # unweighted, both swaps cost the same
    assert stats.kendalltau(x, top).statistic == pytest.approx(stats.kendalltau(x, bottom).statistic)


def _tau_by_pairs(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    """Eq. 7 with a_ij = sqrt(w_i w_j) sign(a_j - a_i), written out over ordered pairs."""
    a, b = descending_ranks(x), descending_ranks(y)
    num = za = zb = 0.0
    for i in range(len(a)):
        for j in range(len(a)):
            if i != j:
                sa, sb = np.sign(a[j] - a[i]), np.sign(b[j] - b[i])
                num += w[i] * w[j] * sa * sb
                za += w[i] * w[j] * sa * sa
                zb += w[i] * w[j] * sb * sb
    return num / np.sqrt(za * zb)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=3, max_size=12))
def test_definitions_written_out_agree_ties_included(rows: list[tuple[int, int]]) -> None:
    x = np.array([r[0] for r in rows], dtype=float)
    y = np.array([r[1] for r in rows], dtype=float)
    if len(set(x)) < 2 or len(set(y)) < 2:
        return
    a, b = descending_ranks(x), descending_ranks(y)
    w = pair_weights(a, b)
    assert tau_w(x, y) == pytest.approx(_tau_by_pairs(x, y, w), abs=1e-9)
    # ρ_w is the w-weighted Pearson correlation of the ranks: numpy's aweights covariance
    cov = np.cov(a, b, aweights=w, bias=True)
    assert rho_w(x, y) == pytest.approx(cov[0, 1] / np.sqrt(cov[0, 0] * cov[1, 1]), abs=1e-9)
    assert -1.0 - 1e-12 <= tau_w(x, y) <= 1.0 + 1e-12


def test_no_ties_tau_w_denominator_is_one_minus_sum_of_squares() -> None:
    rng = np.random.default_rng(3)
    x, y = rng.permutation(15).astype(float), rng.permutation(15).astype(float)
    w = pair_weights(descending_ranks(x), descending_ranks(y))
    a, b = descending_ranks(x), descending_ranks(y)
    sa = np.sign(a[None, :] - a[:, None])
    sb = np.sign(b[None, :] - b[:, None])
    assert tau_w(x, y) == pytest.approx((np.outer(w, w) * sa * sb).sum() / (1 - (w**2).sum()))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8)), min_size=3, max_size=15))
def test_equal_weights_give_scipys_weighted_tau_with_a_constant_weigher(rows: list[tuple[int, int]]) -> None:
    """Where the definitions coincide: with every weight equal, 001's τ_w and Vigna's weighted
    τ (scipy.stats.weightedtau, additive, weigher ≡ 1) are both Kendall's τ_b."""
    x = np.array([r[0] for r in rows], dtype=float)
    y = np.array([r[1] for r in rows], dtype=float)
    if len(set(x)) < 2 or len(set(y)) < 2:
        return
    flat = np.full(len(x), 1.0 / len(x))
    ours = _tau_by_pairs(x, y, flat)
    scipy_tau = stats.weightedtau(x, y, weigher=lambda r: 1.0).statistic
    assert ours == pytest.approx(scipy_tau, abs=1e-9)
    assert ours == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-9)
    # and an infinite n0 makes 001's weights equal: τ_w tends to τ_b
    assert tau_w(x, y, n0=1e9) == pytest.approx(ours, abs=1e-6)


def test_rankings_that_differ_only_far_down_barely_move_tau_w() -> None:
    rng = np.random.default_rng(0)
    x = np.arange(200.0)[::-1]
    y = x.copy()
    y[50:] = rng.permutation(y[50:])  # everything below rank 50 shuffled
    assert tau_w(x, y) > 0.9 > stats.kendalltau(x, y).statistic


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="two rankings"):
        tau_w([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="at least two"):
        rho_w([1], [1])
    with pytest.raises(ValueError, match="finite"):
        tau_w([1, float("nan")], [1, 2])
    assert np.isnan(tau_w([1, 1, 1], [1, 2, 3]))  # a constant ranking correlates with nothing
