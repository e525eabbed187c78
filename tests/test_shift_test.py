"""The spread-aware shift test (stream/synonyms/shift_test.py): calibrated when nothing changed, and
ranking a focused hashtag that took a new sense above a generic one whose mean moved as far."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from stream.synonyms.drift import recent_shift
from stream.synonyms.shift_test import benjamini_hochberg, chi2_sf, effective_dimension, shift_test

DIM = 64


def unit_tweets(
    rng: np.random.Generator, centre: npt.NDArray[np.float64], spread: float, n: int
) -> npt.NDArray[np.float64]:
    """``n`` unit-length tweets around ``centre``, anisotropic (a few strong directions)."""
    scales = spread * np.geomspace(1.0, 0.05, DIM)
    x = centre + rng.normal(size=(n, DIM)) * scales
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def direction(rng: np.random.Generator) -> npt.NDArray[np.float64]:
    v = rng.normal(size=DIM)
    return v / np.linalg.norm(v)


def test_no_change_gives_few_false_alarms_at_every_size() -> None:
    rng = np.random.default_rng(3)
    for n in (20, 60, 200):
        p_values = []
        for _ in range(300):
            centre = direction(rng) * rng.uniform(0.5, 2.0)
            spread = rng.uniform(0.3, 1.5)
            a, b = unit_tweets(rng, centre, spread, n), unit_tweets(rng, centre, spread, n)
            p_values.append(float(shift_test([n], a.sum(0)[None], [n], b.sum(0)[None]).p[0]))
        p = np.array(p_values)
        assert np.mean(p < 0.01) <= 0.02, (n, np.mean(p < 0.01))
        assert not benjamini_hochberg(p, 0.01).any()


def test_a_focused_hashtag_that_changed_sense_outranks_a_generic_one_whose_mean_moved_more() -> None:
    rng = np.random.default_rng(5)
    a, c = direction(rng), direction(rng)
    b = (a + c) / np.linalg.norm(a + c)  # a related but other sense (another crisis)
    # hijacked: tight tweets about a, then tight tweets about b
    hijacked = unit_tweets(rng, 3.0 * a, 0.6, 30), unit_tweets(rng, 3.0 * b, 0.6, 30)
    # generic: tweets about everything; the topic of the day turns its (short) mean around
    generic = unit_tweets(rng, 0.5 * a, 1.5, 300), unit_tweets(rng, -0.5 * a, 1.5, 300)
    before = np.array([hijacked[0].sum(0), generic[0].sum(0)])
    after = np.array([hijacked[1].sum(0), generic[1].sum(0)])
    totals = before + after
    shift = recent_shift(["hijacked", "generic"], totals, [60, 600], after, [30, 300], min_support=5)
    by_name = {m.hashtag: m for m in shift.movers}
    # the cosine of the means alone ranks the generic hashtag first ...
    assert by_name["generic"].cosine < by_name["hijacked"].cosine
    # ... the spread-aware effect the hijacked one, and both shifts are real
    assert [m.hashtag for m in shift.movers] == ["hijacked", "generic"]
    assert by_name["hijacked"].effect_low > by_name["generic"].effect_high
    assert shift.significant == 2


def test_the_effect_interval_covers_the_true_shift() -> None:
    rng = np.random.default_rng(11)
    covered, n = 0, 30
    centre_a, centre_b = 2.0 * direction(rng), 2.0 * direction(rng)
    # the true standardised shift, from large samples
    big_a, big_b = unit_tweets(rng, centre_a, 0.8, 200_000), unit_tweets(rng, centre_b, 0.8, 200_000)
    spread = 0.5 * (np.sum(big_a.var(0)) + np.sum(big_b.var(0)))
    truth = np.linalg.norm(big_a.mean(0) - big_b.mean(0)) / np.sqrt(spread)
    for _ in range(200):
        a, b = unit_tweets(rng, centre_a, 0.8, n), unit_tweets(rng, centre_b, 0.8, n)
        t = shift_test([n], a.sum(0)[None], [n], b.sum(0)[None])
        covered += int(t.effect_low[0] <= truth <= t.effect_high[0])
    assert covered / 200 >= 0.9, covered


def test_helpers() -> None:
    # chi-square tail against known quantiles (k = 10: 95% at 18.307, 99% at 23.209)
    assert np.allclose(chi2_sf(np.array([18.307, 23.209]), 10.0), [0.05, 0.01], atol=0.002)
    rng = np.random.default_rng(2)
    along_a_line = np.outer(rng.normal(size=500), direction(rng)) + 1e-3 * rng.normal(size=(500, DIM))
    dim = effective_dimension(along_a_line)
    assert dim is not None and dim < 1.1
    assert effective_dimension(np.zeros((2, DIM))) is None


def test_a_sure_shift_outranks_the_same_shift_that_few_tweets_only_suggest() -> None:
    """Movers rank by the lower end of the effect's interval: the same change of sense seen in
    5 tweets a side and in 200 -- the point effect of the 5 is as likely above as below, their
    interval reaches 0, so the 200 rank first every time."""
    point_first = 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        a, c = direction(rng), direction(rng)
        b = (a + c) / np.linalg.norm(a + c)
        sure = unit_tweets(rng, 2.0 * a, 1.0, 200), unit_tweets(rng, 2.0 * b, 1.0, 200)
        few = unit_tweets(rng, 2.0 * a, 1.0, 5), unit_tweets(rng, 2.0 * b, 1.0, 5)
        before = np.array([sure[0].sum(0), few[0].sum(0)])
        after = np.array([sure[1].sum(0), few[1].sum(0)])
        shift = recent_shift(["sure", "few"], before + after, [400, 10], after, [200, 5], min_support=5)
        assert [m.hashtag for m in shift.movers] == ["sure", "few"], seed
        by_name = {m.hashtag: m for m in shift.movers}
        point_first += by_name["few"].effect > by_name["sure"].effect
    assert 3 <= point_first <= 17, point_first  # the point effect would have put the 5 first often
