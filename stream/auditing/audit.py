"""A human audit of a thesaurus (paper 001 applied to hashtags): the plan, the state
derived from the log of votes, and the agreement between the thesaurus and the people.

**Plan.** 001 pairs tokens *within* semantic areas (its section 2.2: random pairs over a
whole vocabulary are nearly all unrelated).  Here an area grows around a popular
hashtag: the seed, its nearest neighbours in the thesaurus (half the area) and hashtags
drawn from further down its neighbour list (the rest; mostly rare hashtags, which 001
asks for to expose hubs).  The *items* are all pairs of an area's hashtags; each area
runs its own adaptive campaign (:class:`stream.auditing.ballots.Campaign`).  Areas do not share
hashtags.  The plan is written once, as the first event of the audit.

**Events** (one JSON object each, appended to the ``votes`` topic, keyed by audit id):

    {"type": "plan", "audit": ID, "plan": {...}}
    {"type": "vote", "audit": ID, "vote_id": ..., "area": A, "comparison": "k.j",
     "choice": "left" | "right" | "tie", "voter": ..., "at": ISO time}

:func:`replay` folds them into an :class:`AuditState` per audit: a vote id seen before
and a vote the campaign cannot take (its comparison already voted, closed or unknown)
are counted and skipped, so a redelivered or doubly written event changes nothing.

**Agreement.** Per area, the thesaurus ranks the pairs by its similarity and people by
their final scores ȳ; ρ_w and τ_w (:mod:`stream.auditing.rankcorr`) compare the two, with a
bias-corrected percentile bootstrap over the votes (each ballot's comparisons resampled, the
ballots' memberships as they were; :func:`stream.auditing.rankcorr.bootstrap_interval`).  *Overall*
is the mean over areas (each area a separate competition: scores of different areas are not
comparable).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from itertools import combinations
from typing import Any

import numpy as np
import numpy.typing as npt

from stream.auditing.ballots import LEFT, RIGHT, TIE, Campaign, Protocol, VoteError, running_means, tally
from stream.auditing.rankcorr import bootstrap_interval, rho_w, tau_w

CHOICES = {"left": LEFT, "right": RIGHT, "tie": TIE}
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Area:
    """A semantic area: its seed hashtag and its hashtags (the seed first)."""

    seed: str
    hashtags: tuple[str, ...]

    @property
    def items(self) -> list[tuple[str, str]]:
        """Every pair of the area's hashtags, in a fixed order (item i = ``items[i]``)."""
        return list(combinations(self.hashtags, 2))


@dataclass(frozen=True)
class Plan:
    """What an audit asks: its areas and the protocol of each area's campaign."""

    audit: str
    thesaurus_version: str
    areas: tuple[Area, ...]
    n_ballots: int
    alpha: float
    m: int
    seed: int

    def protocol(self, area: int) -> Protocol:
        return Protocol(len(self.areas[area].items), self.n_ballots, self.alpha, self.m)

    def check(self) -> Plan:
        if not self.areas:
            raise ValueError("an audit needs at least one semantic area")
        for i in range(len(self.areas)):
            self.protocol(i).check()
        return self

    @property
    def comparisons(self) -> int:
        """Votes the whole audit asks for (Eq. 3, summed over areas)."""
        return sum(self.protocol(i).comparisons for i in range(len(self.areas)))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["areas"] = [{"seed": a.seed, "hashtags": list(a.hashtags)} for a in self.areas]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        areas = tuple(Area(str(a["seed"]), tuple(map(str, a["hashtags"]))) for a in data["areas"])
        return cls(
            str(data["audit"]),
            str(data["thesaurus_version"]),
            areas,
            int(data["n_ballots"]),
            float(data["alpha"]),
            int(data["m"]),
            int(data["seed"]),
        )


def make_areas(
    ranked: Sequence[str],
    neighbours: Callable[[str, int], Sequence[str]],
    n_areas: int,
    size: int,
    rng: np.random.Generator,
    depth: int = 50,
) -> list[Area]:
    """Up to ``n_areas`` areas of ``size`` hashtags around the first usable seeds of
    ``ranked`` (most popular first): the seed, its (size − 1) // 2 nearest, and random
    picks among the rest of its ``depth`` nearest; no hashtag in two areas.

    >>> near = {"a": list("bcdefgh"), "x": list("yzbcdw")}
    >>> areas = make_areas(["a", "x"], lambda h, k: near[h][:k], 2, 4, np.random.default_rng(0))
    >>> [(a.seed, a.hashtags[:2], len(a.hashtags)) for a in areas]
    [('a', ('a', 'b'), 4), ('x', ('x', 'y'), 4)]
    """
    if size < 3:
        raise ValueError(f"an area needs at least 3 hashtags, got {size}")
    used: set[str] = set()
    areas: list[Area] = []
    for seed in ranked:
        if len(areas) >= n_areas:
            break
        if seed in used:
            continue
        near = [h for h in neighbours(seed, depth) if h not in used and h != seed]
        if len(near) < size - 1:
            continue
        close = near[: (size - 1) // 2]
        rest = near[len(close) :]
        far = [rest[i] for i in sorted(rng.choice(len(rest), size - 1 - len(close), replace=False))]
        hashtags = (seed, *close, *far)
        used.update(hashtags)
        areas.append(Area(seed, hashtags))
    return areas


class AuditState:
    """The campaigns of one audit, as the votes so far made them."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.campaigns = [
            Campaign(plan.protocol(i), seed=plan.seed * 1000 + i) for i in range(len(plan.areas))
        ]
        self.vote_ids: set[str] = set()
        self.skipped: dict[str, int] = {}

    @property
    def votes(self) -> int:
        return sum(c.votes for c in self.campaigns)

    @property
    def finished(self) -> bool:
        return all(c.finished for c in self.campaigns)

    def check_vote(self, vote: Mapping[str, Any]) -> tuple[int, str, float]:
        """(area, comparison, left score) of a vote this state can take; VoteError if not."""
        vote_id = vote.get("vote_id")
        if not isinstance(vote_id, str) or not 8 <= len(vote_id) <= 64:
            raise VoteError("bad_vote", "vote_id must be a string of 8 to 64 characters")
        if vote_id in self.vote_ids:
            raise VoteError("replayed", f"vote {vote_id} was already counted")
        area, comparison, choice = vote.get("area"), vote.get("comparison"), vote.get("choice")
        if isinstance(area, bool) or not isinstance(area, int) or not 0 <= area < len(self.campaigns):
            raise VoteError("unknown_comparison", f"no area {area!r} in this audit")
        if choice not in CHOICES:
            raise VoteError("bad_vote", f"choice must be left, right or tie, not {choice!r}")
        campaign = self.campaigns[area]
        if not isinstance(comparison, str) or campaign.comparison(comparison) is None:
            voted = isinstance(comparison, str) and campaign.voted(comparison)
            reason = "already_voted" if voted else "unknown_comparison"
            raise VoteError(reason, f"comparison {comparison!r} of area {area} is not open for a vote")
        return area, comparison, CHOICES[choice]

    def apply(self, vote: Mapping[str, Any]) -> None:
        """Count one vote (validated by :meth:`check_vote`); VoteError when it cannot be."""
        area, comparison, score = self.check_vote(vote)
        self.campaigns[area].vote(comparison, score)
        self.vote_ids.add(str(vote["vote_id"]))

    def pending(self) -> list[tuple[int, str, int, int]]:
        """Open comparisons of every area, areas interleaved: (area, id, left, right)."""
        queues = [
            [(a, cid, left, right) for cid, left, right in c.pending()] for a, c in enumerate(self.campaigns)
        ]
        out: list[tuple[int, str, int, int]] = []
        for row in range(max((len(q) for q in queues), default=0)):
            out.extend(q[row] for q in queues if row < len(q))
        return out

    def item(self, area: int, index: int) -> tuple[str, str]:
        return self.plan.areas[area].items[index]


def replay(events: Iterable[Mapping[str, Any]]) -> dict[str, AuditState]:
    """Fold a log of events into the state of each audit (module docstring)."""
    states: dict[str, AuditState] = {}
    for event in events:
        audit = event.get("audit")
        if event.get("type") == "plan" and isinstance(audit, str) and audit not in states:
            states[audit] = AuditState(Plan.from_dict(event["plan"]))
        elif event.get("type") == "vote" and isinstance(audit, str) and audit in states:
            state = states[audit]
            try:
                state.apply(event)
            except VoteError as exc:
                state.skipped[exc.reason] = state.skipped.get(exc.reason, 0) + 1
    return states


# --------------------------------------------------------------------------- agreement


@dataclass
class Agreement:
    """ρ_w and τ_w of one area (or the mean over areas), with 95% bootstrap intervals."""

    rho_w: float | None
    tau_w: float | None
    rho_w_ci: tuple[float | None, float | None] = (None, None)
    tau_w_ci: tuple[float | None, float | None] = (None, None)
    items: int = 0
    votes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rho_w": self.rho_w,
            "rho_w_ci_low": self.rho_w_ci[0],
            "rho_w_ci_high": self.rho_w_ci[1],
            "tau_w": self.tau_w,
            "tau_w_ci_low": self.tau_w_ci[0],
            "tau_w_ci_high": self.tau_w_ci[1],
            "items": self.items,
            "votes": self.votes,
            **self.extra,
        }


def _correlations(human: FloatArray, model: FloatArray) -> tuple[float, float]:
    known = np.isfinite(human)
    if known.sum() < 2:
        return float("nan"), float("nan")
    return rho_w(model[known], human[known]), tau_w(model[known], human[known])


def bootstrap_scores(campaign: Campaign, resamples: int, rng: np.random.Generator) -> list[FloatArray]:
    """Replicates of ȳ with each ballot's votes resampled with replacement."""
    n = campaign.protocol.n_items
    ballots = campaign.evidence()
    out = []
    for _ in range(resamples):
        results = []
        for items, pairs, outcomes in ballots:
            pick = rng.integers(len(pairs), size=len(pairs)) if len(pairs) else np.zeros(0, dtype=np.int64)
            results.append(tally(items, pairs[pick], outcomes[pick], n))
        out.append(running_means(n, results))
    return out


def area_agreement(
    campaign: Campaign, model: FloatArray, resamples: int = 1000, seed: int = 0
) -> tuple[Agreement, list[tuple[float, float]]]:
    """The agreement of one area, and its bootstrap replicates (ρ_w, τ_w)."""
    ballots = campaign.evidence()
    n = campaign.protocol.n_items
    human = running_means(n, [tally(i, p, o, n) for i, p, o in ballots]) if ballots else np.full(n, np.nan)
    rho, tau = _correlations(human, model)
    reps = [
        _correlations(h, model) for h in bootstrap_scores(campaign, resamples, np.random.default_rng(seed))
    ]
    agreement = Agreement(
        _finite(rho),
        _finite(tau),
        bootstrap_interval([r for r, _ in reps], estimate=rho),
        bootstrap_interval([t for _, t in reps], estimate=tau),
        items=n,
        votes=campaign.votes,
        extra={"ballot": campaign.ballot_number, "provisional": not campaign.closed},
    )
    return agreement, reps


def agreement(
    state: AuditState, model: Sequence[FloatArray], resamples: int = 1000, seed: int = 0
) -> tuple[list[Agreement], Agreement]:
    """Per-area agreement and the overall one (the mean over areas with a value).
    ``model[a][i]``: the thesaurus's similarity of item i of area a (higher = nearer).

    >>> plan = Plan("demo", "v1", (Area("a", tuple("abcdefg")),), 2, 0.1, 4, seed=0)  # 21 items
    >>> state = AuditState(plan.check())
    >>> while not state.finished:  # people prefer the lower item index, as the model does
    ...     for area, cid, left, right in state.pending():
    ...         state.apply({"vote_id": f"vote-{cid}", "area": area, "comparison": cid,
    ...                      "choice": "left" if left < right else "right"})
    >>> per_area, overall = agreement(state, [np.arange(21.0)[::-1]], resamples=50)
    >>> overall.votes, round(overall.rho_w, 3), round(overall.tau_w, 3)
    (46, 0.808, 0.632)
    """
    per_area, reps = [], []
    for a, campaign in enumerate(state.campaigns):
        found, replicates = area_agreement(
            campaign, np.asarray(model[a], dtype=np.float64), resamples, seed + a
        )
        per_area.append(found)
        reps.append(replicates)
    valued = [i for i, g in enumerate(per_area) if g.tau_w is not None and g.rho_w is not None]
    if not valued:
        return per_area, Agreement(None, None, items=sum(g.items for g in per_area), votes=state.votes)
    rho = _finite_mean([per_area[i].rho_w for i in valued])
    tau = _finite_mean([per_area[i].tau_w for i in valued])
    mean_reps = [
        (_finite_mean([reps[i][r][0] for i in valued]), _finite_mean([reps[i][r][1] for i in valued]))
        for r in range(resamples)
    ]
    overall = Agreement(
        rho,
        tau,
        bootstrap_interval([r for r, _ in mean_reps], estimate=rho),
        bootstrap_interval([t for _, t in mean_reps], estimate=tau),
        items=sum(g.items for g in per_area),
        votes=state.votes,
        extra={"areas": len(valued)},
    )
    return per_area, overall


def _finite_mean(values: Sequence[float | None]) -> float:
    """The mean of the finite values; NaN when there is none (a replicate where every
    area's ranking came out constant)."""
    finite = [v for v in values if v is not None and np.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


def _finite(value: float) -> float | None:
    return value if np.isfinite(value) else None
