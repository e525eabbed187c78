"""001's adaptive protocol: ballot sizes and budget (Eqs. 2-4), the bounds, Borda win
ratios with ties as half wins, the rescaling between ballots (Eqs. 5-6), the state
replayed from events, and the simulated finding (adaptive beats uniform on τ_w)."""

from __future__ import annotations

import numpy as np
import pytest

from stream.auditing.audit import Area, AuditState, Plan, agreement, make_areas, replay
from stream.auditing.ballots import (
    LEFT,
    RIGHT,
    TIE,
    BallotResult,
    Campaign,
    Protocol,
    VoteError,
    alpha_bounds,
    draw_pairs,
    running_means,
    tally,
)
from stream.auditing.voters import Voters, exponential_similarity, simulate


def test_sizes_budget_and_top_comparisons_follow_eqs_2_to_4() -> None:
    p = Protocol(990, n_ballots=7, alpha=0.5, m=20)
    assert p.sizes() == (990, 495, 248, 124, 62, 31, 16)  # round half up, not Python's banker's
    assert p.comparisons == sum(20 * n // 2 for n in p.sizes()) == 19660
    # Eq. 3's approximation (1 - α^n_b) / (2(1 - α)) M N
    assert p.comparisons == pytest.approx((1 - 0.5**7) / (2 * 0.5) * 20 * 990, rel=0.01)
    assert p.m_top == 140 and p.m_uniform == pytest.approx(2 * 19660 / 990)
    assert Protocol.for_budget(990, 19660, 7, 0.5).m == 20
    assert Protocol.for_budget(990, 19659, 7, 0.5).m == 18  # the largest even M that fits


def test_parameter_bounds_of_section_2_7() -> None:
    low, high = alpha_bounds(45, 3)
    assert low == pytest.approx((2 / 45) ** 0.5) and high == pytest.approx(0.1**0.5)
    Protocol(45, 3, 0.3, 4).check()
    with pytest.raises(ValueError, match=r"alpha=0\.5 is outside 001's range"):
        Protocol(45, 3, 0.5, 4).check()
    with pytest.raises(ValueError, match="ballots n_b=11"):
        Protocol(45000, 11, 0.7, 4).check()
    with pytest.raises(ValueError, match="ballots n_b=1"):
        Protocol(45, 1, 0.3, 4).check()
    with pytest.raises(ValueError, match="at least 20 items"):
        Protocol(15, 2, 0.1, 4).check()
    with pytest.raises(ValueError, match="M=1"):
        Protocol(45, 3, 0.3, 1).check()
    with pytest.raises(ValueError, match="too small"):
        Protocol.for_budget(990, 100, 7, 0.5)


@pytest.mark.parametrize(("n", "m"), [(4, 2), (7, 3), (45, 4), (13, 5), (2, 3)])
def test_every_item_appears_m_times_never_against_itself(n: int, m: int) -> None:
    pairs = draw_pairs(list(range(n)), m, np.random.default_rng(n * m))
    shown = np.bincount(pairs.ravel(), minlength=n)
    assert (pairs[:, 0] != pairs[:, 1]).all()
    if n * m % 2 == 0:
        assert (shown == m).all()
    else:  # footnote 6: one item once more
        assert sorted(shown.tolist()) == [m] * (n - 1) + [m + 1]


def test_borda_win_ratio_counts_ties_as_half_wins() -> None:
    pairs = np.array([[0, 1], [0, 2], [1, 2], [2, 0]])
    result = tally(np.arange(3), pairs, np.array([LEFT, TIE, RIGHT, TIE]), 3)
    # item 0: beats 1, ties 2 twice -> 1 + 0.5 + 0.5 over 3; item 1: loses, loses -> 0/2;
    # item 2: tie, wins over 1, tie -> 0.5 + 1 + 0.5 over 3
    assert result.wins.tolist() == [2.0, 0.0, 2.0]
    assert result.shown.tolist() == [3.0, 2.0, 3.0]


def test_rescaling_between_ballots_is_eq_6_by_hand() -> None:
    # ballot 1: x = (0.9, 0.8, 0.5, 0.2); ballot 2 keeps items 0, 1 with x = (0.6, 0.4)
    b1 = BallotResult(np.arange(4), np.array([9.0, 8.0, 5.0, 2.0]), np.full(4, 10.0))
    b2 = BallotResult(np.array([0, 1]), np.array([3.0, 2.0]), np.array([5.0, 5.0]))
    # b = Σ(1-x)(1-ȳ) / Σ(1-x)² = (0.4·0.1 + 0.6·0.2) / (0.16 + 0.36) = 0.16 / 0.52
    b = 0.16 / 0.52
    y = [1 - b + b * 0.6, 1 - b + b * 0.4]
    expected = [(0.9 + y[0]) / 2, (0.8 + y[1]) / 2, 0.5, 0.2]
    assert running_means(4, [b1, b2]).tolist() == pytest.approx(expected)
    # f_resc(1) = 1: an item that wins everything stays at 1
    b3 = BallotResult(np.array([0, 1]), np.array([5.0, 0.0]), np.array([5.0, 5.0]))
    assert running_means(4, [b1, b3])[0] == pytest.approx((0.9 + 1.0) / 2)


def test_a_campaign_narrows_to_the_top_and_ends_after_n_b_ballots() -> None:
    protocol = Protocol(45, 3, 0.3, 4).check()
    campaign = Campaign(protocol, seed=5)
    seen = []
    while not campaign.finished:
        pending = campaign.pending()
        seen.append((campaign.ballot_number, len(pending), {i for _, a, b in pending for i in (a, b)}))
        for cid, left, right in pending:  # a consistent voter: lower index is more related
            campaign.vote(cid, LEFT if left < right else RIGHT)
    assert [(b, n, len(items)) for b, n, items in seen] == [(1, 90, 45), (2, 28, 14), (3, 8, 4)]
    assert seen[2][2] <= seen[1][2]  # nested: each ballot's items come from the one before
    assert campaign.votes == protocol.comparisons == 126
    top = np.argsort(-campaign.scores(), kind="stable")[:3]
    assert set(top.tolist()) <= {0, 1, 2, 3, 4}


def test_votes_the_campaign_cannot_take() -> None:
    campaign = Campaign(Protocol(21, 2, 0.1, 2).check(), seed=0)
    cid, _, _ = campaign.pending()[0]
    campaign.vote(cid, TIE)
    with pytest.raises(VoteError) as replayed:
        campaign.vote(cid, LEFT)
    assert replayed.value.reason == "already_voted"
    with pytest.raises(VoteError) as unknown:
        campaign.vote("1.999", LEFT)
    assert unknown.value.reason == "unknown_comparison"
    with pytest.raises(VoteError) as later:
        campaign.vote("2.0", LEFT)  # ballot 2 is not open yet
    assert later.value.reason == "unknown_comparison"
    with pytest.raises(VoteError) as bad:
        campaign.vote(campaign.pending()[0][0], 0.7)
    assert bad.value.reason == "bad_outcome"


def _plan() -> Plan:
    return Plan(
        "a1", "v1", (Area("x", tuple("abcdefg")), Area("y", tuple("hijklmn"))), 2, 0.1, 2, seed=3
    ).check()


def _vote(area: int, cid: str, choice: str, n: int) -> dict[str, object]:
    return {
        "type": "vote",
        "audit": "a1",
        "vote_id": f"vote-{n:04d}",
        "area": area,
        "comparison": cid,
        "choice": choice,
    }


def test_state_replayed_from_events_skips_replays_and_closed_comparisons() -> None:
    plan = _plan()
    live = AuditState(plan)
    events: list[dict[str, object]] = [{"type": "plan", "audit": "a1", "plan": plan.to_dict()}]
    for n, (area, cid, left, right) in enumerate(live.pending()[:30]):
        event = _vote(area, cid, "left" if left < right else "tie", n)
        live.apply(event)
        events.append(event)
    # a record written twice (a producer retry), and a second vote on a decided comparison
    events.append(dict(events[5]))
    events.append({**events[6], "vote_id": "another-vote"})
    (state,) = replay(events).values()
    assert state.votes == live.votes == 30
    assert state.skipped == {"replayed": 1, "already_voted": 1}
    assert [c.scores(provisional=True).tolist() for c in state.campaigns] == [
        c.scores(provisional=True).tolist() for c in live.campaigns
    ]
    assert state.pending() == live.pending()
    # other audits' events and unknown audits are ignored
    assert set(replay([*events, {**events[1], "audit": "other"}])) == {"a1"}


def test_check_vote_reasons() -> None:
    state = AuditState(_plan())
    area, cid, _, _ = state.pending()[0]
    good = _vote(area, cid, "left", 1)
    state.apply(good)
    for bad, reason in (
        (good, "replayed"),
        ({**good, "vote_id": "vote-9999"}, "already_voted"),
        ({**good, "vote_id": "vote-8888", "comparison": "1.500"}, "unknown_comparison"),
        ({**good, "vote_id": "vote-7777", "area": 9}, "unknown_comparison"),
        ({**good, "vote_id": "vote-6666", "area": True}, "unknown_comparison"),
        ({**good, "vote_id": "short"}, "bad_vote"),
        ({**good, "vote_id": "vote-5555", "comparison": state.pending()[0][1], "choice": "both"}, "bad_vote"),
    ):
        with pytest.raises(VoteError) as caught:
            state.check_vote(bad)
        assert caught.value.reason == reason, bad


def test_make_areas_are_disjoint_and_seeded_by_popular_hashtags() -> None:
    near = {h: [f"{h}{i}" for i in range(30)] for h in ("a", "b")}
    near["c"] = ["a1", "a2", *[f"c{i}" for i in range(30)]]
    areas = make_areas(["a", "c", "b"], lambda h, k: near[h][:k], 3, 8, np.random.default_rng(0))
    assert [a.seed for a in areas] == ["a", "c", "b"]
    assert areas[0].hashtags[:4] == ("a", "a0", "a1", "a2")  # the seed and its 3 nearest
    everything = [h for a in areas for h in a.hashtags]
    assert len(everything) == len(set(everything)) == 24
    assert len(areas[0].items) == 28


def test_agreement_of_a_thesaurus_that_ranks_like_the_voters() -> None:
    plan = Plan("a", "v", (Area("s", tuple("abcdefgh")),), 3, 0.3, 6, seed=1).check()
    state = AuditState(plan)
    truth = np.linspace(1.0, 0.0, 28)  # item i's relatedness: item 0 most related
    rng = np.random.default_rng(0)
    n = 0
    while not state.finished:
        for area, cid, left, right in state.pending():
            noisy = truth[[left, right]] + rng.normal(0, 0.05, 2)
            state.apply(
                {
                    "vote_id": f"vote-{n:05d}",
                    "area": area,
                    "comparison": cid,
                    "choice": "left" if noisy[0] > noisy[1] else "right",
                }
            )
            n += 1
    (only,), overall = agreement(state, [truth], resamples=200)
    assert (
        overall.tau_w is not None
        and overall.tau_w > 0.6
        and overall.rho_w is not None
        and overall.rho_w > 0.8
    )
    low, high = overall.tau_w_ci
    assert low is not None and high is not None and low <= overall.tau_w <= high
    (_, reverse) = agreement(state, [truth[::-1].copy()], resamples=50)
    assert reverse.tau_w is not None and reverse.tau_w < -0.6
    assert only.votes == plan.comparisons and not only.extra["provisional"]


def test_voters_follow_the_stochastic_transitivity_model() -> None:
    z = np.array([0.95, 0.0, -0.95])
    voters = Voters.draw(z, 500, np.random.default_rng(0))
    # σ*(1 - z²) shrinks the noise near ±1: opinions of |z| = 0.95 stay near 0.95
    assert abs(voters.opinions[:, 0].mean() - 0.95) < 0.01 and abs(voters.opinions[:, 2].mean() - 0.95) < 0.01
    assert voters.opinions[:, 1].mean() < 0.2
    pairs = np.array([[0, 1]] * 20_000)
    wins = voters.vote(pairs, np.random.default_rng(1)).mean()
    # item 0 loses only by oversight: ε ~ U[0.005, 0.05], mean 0.0275
    assert 1 - wins == pytest.approx(0.0275, abs=0.006)


def test_simulation_reproduces_001_adaptive_beats_uniform_on_tau_w() -> None:
    """001's Table 2 setting scaled down: mean over seeds, same voters and budget."""
    z = exponential_similarity(300)
    protocol = Protocol(300, n_ballots=5, alpha=0.5, m=20).check()
    runs = [simulate(z, protocol, 100, seed) for seed in range(6)]
    adaptive = np.mean([r.adaptive["tau_w"] for r in runs])
    uniform = np.mean([r.uniform["tau_w"] for r in runs])
    assert adaptive > uniform + 0.2
    assert np.mean([r.adaptive["rho_w"] for r in runs]) > np.mean([r.uniform["rho_w"] for r in runs])
    assert {r.budget for r in runs} == {protocol.comparisons}
