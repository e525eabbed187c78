"""The embedding drift test (stream.monitoring.mmd): calibrated under no drift, powerful under drift."""

from __future__ import annotations

import numpy as np
import pytest

from stream.monitoring.mmd import mmd_test


def test_false_alarms_match_alpha_when_nothing_drifts() -> None:
    """Two samples of one distribution: p <= 0.05 in about 5% of the tests (the permutation
    p-value is uniform under the null); 300 tests, so 1.5%-9.5% is 3.3 standard deviations."""
    rng = np.random.default_rng(11)
    p_values = [
        mmd_test(rng.normal(size=(40, 6)), rng.normal(size=(50, 6)), permutations=99, seed=i).p_value
        for i in range(300)
    ]
    rate = float(np.mean(np.array(p_values) <= 0.05))
    assert 0.015 <= rate <= 0.095, rate
    assert 0.35 <= float(np.mean(p_values)) <= 0.65  # uniform: mean 0.5


def test_a_shift_is_found() -> None:
    rng = np.random.default_rng(12)
    found = [
        mmd_test(rng.normal(size=(60, 8)), rng.normal(size=(60, 8)) + 0.5, permutations=99, seed=i).p_value
        for i in range(20)
    ]
    assert sum(p <= 0.01 for p in found) >= 19, found


def test_bounded_samples_and_errors() -> None:
    rng = np.random.default_rng(13)
    result = mmd_test(rng.normal(size=(1000, 3)), rng.normal(size=(700, 3)), max_samples=100)
    assert (result.n_reference, result.n_recent) == (100, 100)
    assert mmd_test(np.ones((5, 2)), np.ones((5, 2))).to_dict()["p_value"] == 1.0  # identical samples
    with pytest.raises(ValueError, match="at least 2"):
        mmd_test(np.ones((1, 2)), np.ones((5, 2)))
    with pytest.raises(ValueError, match="dimensions"):
        mmd_test(np.ones((3, 2)), np.ones((3, 4)))
    x, y = rng.normal(size=(30, 3)), rng.normal(size=(30, 3))
    assert mmd_test(x, y, seed=5) == mmd_test(x, y, seed=5)  # a seed gives one answer
