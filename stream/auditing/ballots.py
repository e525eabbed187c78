"""Adaptive pairwise vote collection focused on the top ranks (paper 001, section 2).

Items (in the audit: pairs of hashtags) are ranked by people who see two items at a time
and pick the more related one.  The votes come in ``n_b`` *ballots*:

* ballot 1 compares all N items, each item drawn into ``M`` comparisons (pairs of items
  drawn at random under that constraint; with M·N odd one random item appears M+1 times,
  001's footnote 6);
* ballot k > 1 compares the N^(k) = round(α N^(k−1)) items ranked highest so far (Eq. 2),
  again M comparisons each;
* so N_comp = Σ_k M N^(k) / 2 comparisons in all (Eq. 3), and a top item is seen
  M_top = n_b M times (Eq. 4) where uniform pairs of the same budget show each item
  M_unif = 2 N_comp / N times.

Scores (section 2.6): x_i^(k) = n_i / M_i, the Borda win ratio of item i in ballot k with
ties as half wins (n_i = wins + ties / 2, footnote 4); y_i^(1) = x_i^(1) and, for k > 1, the
linear rescaling through (1, 1) fitted between the ballot's x and the running means before
it (Eq. 6): y = 1 − b̂ + b̂ x with b̂ = Σ_j (1 − x_j)(1 − ȳ_j^(k−1)) / Σ_j (1 − x_j)²;
ȳ_i^(k) = the mean of y_i over the ballots 1..k (Eq. 5).  The final ranking is by ȳ.

The parameters' bounds (section 2.7, :meth:`Protocol.check`): 2 ≤ n_b ≤ 10;
(2/N)^(1/(n_b−1)) ≤ α ≤ 0.1^(1/(n_b−1)) (at least two items, at most 10% of them, reach
the last ballot); M ≥ 2.  The paper's precision target M_top ≥ 100 is reported
(:attr:`Protocol.m_top`), not enforced: a pilot audit may run smaller.

A :class:`Campaign` is a pure function of the votes given to it: the comparisons of each
ballot are drawn from a generator seeded by (seed, ballot), so the same votes in the same
order rebuild the same state -- the live audit derives it from the Kafka log of votes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Outcome of a comparison, as the score of its left item: a win, a loss, a tie.
LEFT, RIGHT, TIE = 1.0, 0.0, 0.5


def paper_round(x: float) -> int:
    """round() as in the paper (halves up), not Python's round-half-to-even.

    >>> paper_round(22.5), paper_round(11.5), paper_round(2.4)
    (23, 12, 2)
    """
    return math.floor(x + 0.5)


def alpha_bounds(n_items: int, n_ballots: int) -> tuple[float, float]:
    """001's range for α (section 2.7): at least 2 items and at most 10% of them in the
    last ballot.

    >>> [round(x, 3) for x in alpha_bounds(990, 7)]
    [0.356, 0.681]
    """
    if n_ballots < 2:
        raise ValueError(f"the adaptive protocol needs at least 2 ballots, got {n_ballots}")
    return (2.0 / n_items) ** (1.0 / (n_ballots - 1)), 0.1 ** (1.0 / (n_ballots - 1))


@dataclass(frozen=True)
class Protocol:
    """The parameters of a vote collection: N items, n_b ballots, fraction α, M per ballot.

    >>> p = Protocol(990, n_ballots=7, alpha=0.5, m=20).check()
    >>> p.sizes(), p.comparisons, p.m_top
    ((990, 495, 248, 124, 62, 31, 16), 19660, 140)
    """

    n_items: int
    n_ballots: int = 3
    alpha: float = 0.3
    m: int = 4

    def sizes(self) -> tuple[int, ...]:
        """N^(k) for k = 1..n_b (Eq. 2)."""
        out = [self.n_items]
        for _ in range(self.n_ballots - 1):
            out.append(paper_round(self.alpha * out[-1]))
        return tuple(out)

    @property
    def comparisons(self) -> int:
        """N_comp, Eq. 3 (a ballot with M·N^(k) odd has one comparison more)."""
        return sum(math.ceil(self.m * n / 2) for n in self.sizes())

    @property
    def m_top(self) -> int:
        """M_top = n_b M: comparisons of an item that reaches the last ballot (Eq. 4)."""
        return self.n_ballots * self.m

    @property
    def m_uniform(self) -> float:
        """M_unif = 2 N_comp / N: comparisons per item of uniform pairs with this budget."""
        return 2.0 * self.comparisons / self.n_items

    def check(self) -> Protocol:
        """Raise ValueError naming the parameter out of 001's bounds."""
        if self.n_items < 4:
            raise ValueError(f"the adaptive protocol needs at least 4 items, got {self.n_items}")
        if not 2 <= self.n_ballots <= 10:
            raise ValueError(f"ballots n_b={self.n_ballots} is outside 001's range 2..10")
        low, high = alpha_bounds(self.n_items, self.n_ballots)
        if low > high + 1e-9:
            raise ValueError(
                f"{self.n_items} items are too few for the adaptive protocol: 001 asks for at least 2 "
                "and at most 10% of the items in the last ballot, so at least 20 items"
            )
        if not low - 1e-9 <= self.alpha <= high + 1e-9:
            raise ValueError(
                f"alpha={self.alpha:g} is outside 001's range [{low:.3f}, {high:.3f}] for "
                f"{self.n_items} items and {self.n_ballots} ballots (at least 2 and at most 10% of "
                "the items reach the last ballot)"
            )
        if self.sizes()[-1] < 2:
            raise ValueError(f"alpha={self.alpha:g} leaves fewer than 2 items for the last ballot")
        if self.m < 2:
            raise ValueError(f"M={self.m}: each item needs at least 2 comparisons per ballot")
        return self

    @classmethod
    def for_budget(cls, n_items: int, budget: int, n_ballots: int, alpha: float) -> Protocol:
        """The largest even M whose N_comp fits ``budget`` (Eq. 3 solved for M).

        >>> Protocol.for_budget(990, 20000, 7, 0.5).m
        20
        """
        sizes = Protocol(n_items, n_ballots, alpha, 2).sizes()
        m = int(2 * budget // sum(sizes))
        m -= m % 2
        if m < 2:
            raise ValueError(
                f"a budget of {budget} comparisons is too small: the protocol needs at least "
                f"{Protocol(n_items, n_ballots, alpha, 2).comparisons} (M = 2)"
            )
        return cls(n_items, n_ballots, alpha, m)


def draw_pairs(items: Sequence[int] | IntArray, m: int, rng: np.random.Generator) -> IntArray:
    """Random comparisons in which every item appears ``m`` times (one random item once
    more when ``m · len(items)`` is odd), never an item against itself; rows (left, right).

    >>> pairs = draw_pairs([0, 1, 2, 3], 2, np.random.default_rng(0))
    >>> pairs.shape, np.bincount(pairs.ravel()).tolist(), bool((pairs[:, 0] != pairs[:, 1]).all())
    ((4, 2), [2, 2, 2, 2], True)
    """
    ids = np.asarray(items, dtype=np.int64)
    if len(np.unique(ids)) < 2:
        raise ValueError("comparisons need at least two distinct items")
    pool = np.repeat(ids, m)
    if len(pool) % 2:
        pool = np.append(pool, rng.choice(ids))
    rng.shuffle(pool)
    pairs = pool.reshape(-1, 2)
    for _ in range(100 * len(pairs)):
        bad = np.flatnonzero(pairs[:, 0] == pairs[:, 1])
        if not len(bad):
            return pairs
        i = int(bad[0])
        item = pairs[i, 0]
        fits = np.flatnonzero((pairs[:, 0] != item) & (pairs[:, 1] != item))
        if not len(fits):  # every other comparison holds this item: swap with any, try again
            fits = np.flatnonzero(np.arange(len(pairs)) != i)
        j = int(rng.choice(fits))
        pairs[i, 1], pairs[j, 1] = pairs[j, 1], pairs[i, 1]
    raise ValueError(f"cannot draw comparisons without self-pairs for {len(ids)} items")


@dataclass(frozen=True)
class BallotResult:
    """One ballot's tallies: the items in it, and per item its score n_i (wins + ties/2)
    and comparisons M_i."""

    items: IntArray
    wins: FloatArray
    shown: FloatArray


def running_means(n_items: int, ballots: Sequence[BallotResult]) -> FloatArray:
    """ȳ after the given ballots (Eqs. 1, 5, 6); NaN for an item never compared.

    >>> b1 = BallotResult(np.arange(4), np.array([3.0, 2.0, 1.0, 0.0]), np.full(4, 3.0))
    >>> running_means(4, [b1]).round(3).tolist()
    [1.0, 0.667, 0.333, 0.0]
    >>> b2 = BallotResult(np.array([0, 1]), np.array([1.0, 1.0]), np.array([2.0, 2.0]))
    >>> running_means(4, [b1, b2]).round(3).tolist()  # x = 0.5 each, rescaled towards ȳ
    [0.917, 0.75, 0.333, 0.0]
    """
    means = np.full(n_items, np.nan)
    for k, ballot in enumerate(ballots, start=1):
        seen = ballot.shown > 0
        items = ballot.items[seen]
        x = ballot.wins[seen] / ballot.shown[seen]
        if k == 1 or not len(items):
            y = x
        else:
            before = means[items]
            known = np.isfinite(before)
            den = float(((1.0 - x[known]) ** 2).sum())
            b = float(((1.0 - x[known]) * (1.0 - before[known])).sum()) / den if den > 0 else 1.0
            y = 1.0 - b + b * x
        previous = np.where(np.isfinite(means[items]), means[items], y)
        means[items] = ((k - 1) * previous + y) / k
    return means


def tally(items: IntArray, pairs: IntArray, outcomes: FloatArray, n_items: int) -> BallotResult:
    """A ballot's tallies from its comparisons (rows left, right) and their outcomes (the
    left item's score: 1 win, 0.5 tie, 0 loss; NaN = not voted, left out).

    >>> r = tally(np.array([0, 1, 2]), np.array([[0, 1], [1, 2], [2, 0]]), np.array([1.0, 0.5, np.nan]), 3)
    >>> r.wins.tolist(), r.shown.tolist()
    ([1.0, 0.5, 0.5], [1.0, 2.0, 1.0])
    """
    voted = np.isfinite(outcomes)
    left, right, score = pairs[voted, 0], pairs[voted, 1], outcomes[voted]
    wins = np.bincount(left, score, n_items) + np.bincount(right, 1.0 - score, n_items)
    shown = np.bincount(left, None, n_items) + np.bincount(right, None, n_items)
    return BallotResult(items, wins[items].astype(np.float64), shown[items].astype(np.float64))


class VoteError(ValueError):
    """A vote the campaign cannot take; ``reason`` is a short code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass
class _Ballot:
    number: int
    items: IntArray
    pairs: IntArray
    outcomes: FloatArray = field(init=False)

    def __post_init__(self) -> None:
        self.outcomes = np.full(len(self.pairs), np.nan)


class Campaign:
    """One adaptive vote collection over ``protocol.n_items`` items, driven by votes.

    >>> c = Campaign(Protocol(6, n_ballots=2, alpha=0.34, m=2), seed=1)
    >>> len(c.pending()), c.ballot_number, c.finished
    (6, 1, False)
    >>> for cid, left, right in c.pending():
    ...     c.vote(cid, LEFT if min(left, right) == left else RIGHT)  # lower index wins
    >>> c.ballot_number, c.scores().round(2).tolist()  # x after ballot 1 (2 comparisons each)
    (2, [1.0, 0.5, 1.0, 0.0, 0.5, 0.0])
    >>> sorted({i for _, a, b in c.pending() for i in (a, b)})  # top round(0.34 * 6) = 2, M = 2
    [0, 2]
    >>> for cid, left, right in c.pending():
    ...     c.vote(cid, TIE)
    >>> c.finished, c.votes, c.scores().round(2).tolist()
    (True, 8, [1.0, 0.5, 1.0, 0.0, 0.5, 0.0])
    """

    def __init__(self, protocol: Protocol, seed: int) -> None:
        self.protocol = protocol
        self.seed = seed
        self.closed: list[_Ballot] = []
        self.current: _Ballot | None = self._open(1, np.arange(protocol.n_items, dtype=np.int64))

    def _open(self, number: int, items: IntArray) -> _Ballot:
        rng = np.random.default_rng([self.seed, number])
        return _Ballot(number, items, draw_pairs(items, self.protocol.m, rng))

    @property
    def finished(self) -> bool:
        return self.current is None

    @property
    def ballot_number(self) -> int:
        """The ballot votes go to now (n_b + 1 once finished)."""
        return self.current.number if self.current is not None else self.protocol.n_ballots + 1

    @property
    def votes(self) -> int:
        ballots = [*self.closed, *([self.current] if self.current else [])]
        return int(sum(np.isfinite(b.outcomes).sum() for b in ballots))

    def pending(self) -> list[tuple[str, int, int]]:
        """The comparisons of the current ballot without a vote: (id, left, right)."""
        b = self.current
        if b is None:
            return []
        return [
            (f"{b.number}.{j}", int(b.pairs[j, 0]), int(b.pairs[j, 1]))
            for j in np.flatnonzero(~np.isfinite(b.outcomes))
        ]

    def comparison(self, comparison_id: str) -> tuple[int, int] | None:
        """(left, right) of a comparison of the current ballot without a vote yet; None
        for any other id."""
        found = self._locate(comparison_id)
        if found is None or np.isfinite(found[0].outcomes[found[1]]):
            return None
        ballot, j = found
        return int(ballot.pairs[j, 0]), int(ballot.pairs[j, 1])

    def _locate(self, comparison_id: str) -> tuple[_Ballot, int] | None:
        number, _, index = comparison_id.partition(".")
        b = self.current
        if b is None or not number.isdigit() or not index.isdigit() or int(number) != b.number:
            return None
        j = int(index)
        return (b, j) if j < len(b.pairs) else None

    def voted(self, comparison_id: str) -> bool:
        """Whether ``comparison_id`` names a comparison (of any ballot so far) with a vote."""
        number, _, index = comparison_id.partition(".")
        if not (number.isdigit() and index.isdigit()):
            return False
        for b in [*self.closed, *([self.current] if self.current else [])]:
            if b.number == int(number) and int(index) < len(b.pairs):
                return bool(np.isfinite(b.outcomes[int(index)]))
        return False

    def evidence(self) -> list[tuple[IntArray, IntArray, FloatArray]]:
        """(items, voted comparisons, their outcomes) of each ballot the scores come
        from: the closed ones, or the open first ballot while none is closed."""
        chosen = self.closed or ([self.current] if self.current is not None else [])
        out = []
        for b in chosen:
            done = np.isfinite(b.outcomes)
            out.append((b.items, b.pairs[done], b.outcomes[done]))
        return out

    def vote(self, comparison_id: str, left_score: float) -> None:
        """Record one vote: ``left_score`` 1 (left more related), 0 (right), 0.5 (as related)."""
        if left_score not in (LEFT, RIGHT, TIE):
            raise VoteError("bad_outcome", f"a vote scores the left item 1, 0 or 0.5, not {left_score!r}")
        if self.current is None:
            raise VoteError("finished", "the campaign is finished: every ballot is closed")
        found = self._locate(comparison_id)
        if found is None:
            raise VoteError(
                "unknown_comparison", f"no open comparison {comparison_id!r} in ballot {self.current.number}"
            )
        ballot, j = found
        if np.isfinite(ballot.outcomes[j]):
            raise VoteError("already_voted", f"comparison {comparison_id} already has its vote")
        ballot.outcomes[j] = left_score
        if np.isfinite(ballot.outcomes).all():
            self._close()

    def _close(self) -> None:
        assert self.current is not None
        self.closed.append(self.current)
        number = self.current.number
        if number >= self.protocol.n_ballots:
            self.current = None
            return
        means = self.scores()
        size = self.protocol.sizes()[number]
        items = self.current.items
        order = sorted(items.tolist(), key=lambda i: (-means[i], i))
        self.current = self._open(number + 1, np.array(sorted(order[:size]), dtype=np.int64))

    def results(self) -> list[BallotResult]:
        """The tallies of the closed ballots."""
        n = self.protocol.n_items
        return [tally(b.items, b.pairs, b.outcomes, n) for b in self.closed]

    def scores(self, provisional: bool = False) -> FloatArray:
        """ȳ of every item after the closed ballots.  ``provisional``: while ballot 1 is
        still open, its win ratios so far instead (0.5 for an item with no vote yet)."""
        if self.closed:
            return running_means(self.protocol.n_items, self.results())
        if not provisional or self.current is None:
            return np.full(self.protocol.n_items, np.nan)
        b = self.current
        partial = tally(b.items, b.pairs, b.outcomes, self.protocol.n_items)
        return np.where(partial.shown > 0, partial.wins / np.maximum(partial.shown, 1.0), 0.5)
