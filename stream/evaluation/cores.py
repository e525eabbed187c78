"""p-cores of hashtag data (paper 002: Doerfel, Jäschke & Stumme, "The Role of Cores in
Recommender Benchmarking for Social Bookmarking Systems", TIST 2016).

A benchmark's verdict can change with the core it is run on; this module computes the
core, :mod:`workers.commands.evaluate` reruns every cell on it.

The **p-core** of a set of tweets (each with its hashtags and, where the feed has one, its
user) is the largest subset of (tweet, hashtag) assignments in which

* each kept hashtag is in at least ``p`` kept tweets,
* each kept tweet keeps at least one hashtag,
* each kept user (where the feed names users) has at least ``p`` kept tweets,

found by removing what breaks a rule until nothing does (the paper's Algorithm 1; the
properties are monotone, so the fixed point is unique and the cores are nested: the
(p+1)-core lies inside the p-core).  This is the paper's *post-graph-core* on tweets:
a kept tweet may lose some of its hashtags ("diminished", the paper's section 2.3.2);
its ground truth is then the hashtags it kept.  The 1-core of hashtagged tweets is the
data itself.

>>> core = p_core([("a", "b"), ("a",), ("b", "c"), ("c",), ("d",)], p=2)
>>> core.tweets, core.hashtags
((0, 1, 2, 3), (('a', 'b'), ('a',), ('b', 'c'), ('c',)))
>>> p_core([("a", "b"), ("a",), ("b", "c"), ("c",), ("d",)], p=3).tweets
()
>>> p_core([("a",), ("a",), ("a",)], p=2, users=["u", "u", "v"]).tweets  # v has one tweet
(0, 1)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations


@dataclass(frozen=True)
class Core:
    """A p-core: the positions of the kept tweets (in input order) and each one's kept
    hashtags (in its own order, duplicates dropped)."""

    p: int
    tweets: tuple[int, ...]
    hashtags: tuple[tuple[str, ...], ...]

    def as_dict(self) -> dict[int, tuple[str, ...]]:
        """Kept tweet position -> its kept hashtags."""
        return dict(zip(self.tweets, self.hashtags, strict=True))


def p_core(hashtags: Sequence[Sequence[str]], p: int, users: Sequence[Hashable | None] | None = None) -> Core:
    """The p-core of tweets given by their hashtags (and users; ``None``: the tweet has no
    known user, and no user rule applies to it).  Linear in the assignments: each removal
    is queued once and updates the counts of what it touches (Batagelj & Zaversnik).

    >>> p_core([("a",), ("b",)], p=1).tweets  # hashtagged tweets: the 1-core is everything
    (0, 1)
    """
    if p < 1:
        raise ValueError(f"a core level is at least 1, got {p}")
    if users is not None and len(users) != len(hashtags):
        raise ValueError(f"{len(users)} users for {len(hashtags)} tweets")
    tags = [list(dict.fromkeys(h)) for h in hashtags]
    alive = [set(t) for t in tags]  # each tweet's kept hashtags
    kept = [bool(t) for t in tags]  # a tweet without hashtags is in no core
    user_of = list(users) if users is not None else [None] * len(tags)
    of_tag: dict[str, list[int]] = defaultdict(list)
    of_user: dict[Hashable, list[int]] = defaultdict(list)
    for i, t in enumerate(tags):
        for h in t:
            of_tag[h].append(i)
        if kept[i] and user_of[i] is not None:
            of_user[user_of[i]].append(i)
    tag_count = {h: len(ts) for h, ts in of_tag.items()}
    user_count = {u: len(ts) for u, ts in of_user.items()}
    # Work lists of what breaks a rule; each removal updates the counts it touches.
    dead_tags = [h for h, n in tag_count.items() if n < p]
    dead_users = [u for u, n in user_count.items() if n < p]
    dead_tweets: list[int] = []
    while dead_tags or dead_users or dead_tweets:
        if dead_tags:
            h = dead_tags.pop()
            for i in of_tag[h]:
                if kept[i] and h in alive[i]:
                    alive[i].discard(h)  # the tweet is diminished: its other tags keep their counts
                    if not alive[i]:
                        dead_tweets.append(i)
        elif dead_users:
            dead_tweets += [i for i in of_user[dead_users.pop()] if kept[i]]
        else:
            i = dead_tweets.pop()
            if not kept[i]:
                continue
            kept[i] = False
            for h in alive[i]:
                tag_count[h] -= 1
                if tag_count[h] == p - 1:  # crosses the level once: queued once
                    dead_tags.append(h)
            alive[i] = set()
            u = user_of[i]
            if u is not None:
                user_count[u] -= 1
                if user_count[u] == p - 1:
                    dead_users.append(u)
    positions = tuple(i for i, k in enumerate(kept) if k)
    return Core(p, positions, tuple(tuple(h for h in tags[i] if h in alive[i]) for i in positions))


Estimate = tuple[float, float, float]
"""A mean with its 95% interval: ``(mean, low, high)``."""


def ranking(means: Mapping[str, float | None]) -> list[str]:
    """Names from best to worst mean (ties by name; names without a value last).

    >>> ranking({"popular": 0.3, "random": 0.1, "least-popular": None, "mowe": 0.3})
    ['mowe', 'popular', 'random', 'least-popular']
    """
    return sorted(means, key=lambda n: (means[n] is None, -(means[n] or 0.0), n))


@dataclass(frozen=True)
class Flip:
    """``above`` beat ``below`` on one core and lost to it on another.  ``clear``: on both
    cores the two 95% intervals are apart (else the flip may be noise)."""

    above: str
    below: str
    clear: bool


def flips(base: Mapping[str, Estimate | None], other: Mapping[str, Estimate | None]) -> list[Flip]:
    """The pairs whose order by mean differs between two cores (``base``'s order first).

    >>> flips({"mowe": (0.30, 0.28, 0.32), "popular": (0.25, 0.23, 0.27), "random": (0.1, 0.05, 0.15)},
    ...       {"mowe": (0.20, 0.18, 0.22), "popular": (0.26, 0.24, 0.28), "random": (0.1, 0.05, 0.15)})
    [Flip(above='mowe', below='popular', clear=True)]
    >>> flips({"a": (0.30, 0.2, 0.4), "b": (0.25, 0.2, 0.3)}, {"a": (0.2, 0.1, 0.3), "b": (0.22, 0.1, 0.3)})
    [Flip(above='a', below='b', clear=False)]
    """
    out = []
    means = {n: None if e is None else e[0] for n, e in base.items()}
    for a, b in combinations(ranking(means), 2):
        x, y, u, v = base.get(a), base.get(b), other.get(a), other.get(b)
        if x is None or y is None or u is None or v is None:
            continue
        if x[0] > y[0] and v[0] > u[0]:
            out.append(Flip(a, b, clear=x[1] > y[2] and v[1] > u[2]))
    return out
