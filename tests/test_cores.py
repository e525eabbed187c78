"""p-cores (paper 002): the fast construction against the definition, and the core's laws
(a fixed point, idempotent, nested in p) on random tagging data."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream.evaluation.cores import Flip, flips, p_core, ranking

TAGS = st.sampled_from("abcdefgh")
TWEETS = st.lists(st.lists(TAGS, max_size=4), max_size=40)
USERS = st.sampled_from(["u1", "u2", "u3", "u4", None])
#: Random tagging data: the tweets' hashtags, their users (or none at all) and p.
Case = tuple[list[list[str]], list[str | None] | None, int]


@st.composite
def data(draw: st.DrawFn) -> Case:
    tweets = draw(TWEETS)
    users = draw(st.one_of(st.none(), st.lists(USERS, min_size=len(tweets), max_size=len(tweets))))
    return tweets, users, draw(st.integers(1, 6))


def naive(tweets: list[list[str]], users: list[str | None] | None, p: int) -> dict[int, tuple[str, ...]]:
    """The definition as written: drop what breaks a rule, recount, until nothing does."""
    kept = {i: tuple(dict.fromkeys(t)) for i, t in enumerate(tweets) if t}
    user_of = users or [None] * len(tweets)
    while True:
        tag_n = Counter(h for hs in kept.values() for h in hs)
        user_n = Counter(user_of[i] for i in kept if user_of[i] is not None)
        new = {
            i: tuple(h for h in hs if tag_n[h] >= p)
            for i, hs in kept.items()
            if user_of[i] is None or user_n[user_of[i]] >= p
        }
        new = {i: hs for i, hs in new.items() if hs}
        if new == kept:
            return kept
        kept = new


def holds(core: dict[int, tuple[str, ...]], users: list[str | None] | None, p: int) -> bool:
    tag_n = Counter(h for hs in core.values() for h in hs)
    user_n = Counter(users[i] for i in core if users and users[i] is not None)
    return (
        all(hs for hs in core.values())
        and all(n >= p for n in tag_n.values())
        and all(n >= p for n in user_n.values())
    )


@settings(max_examples=300, deadline=None)
@given(data())
def test_the_core_is_the_definitions_fixed_point(case: Case) -> None:
    tweets, users, p = case
    core = p_core(tweets, p, users).as_dict()
    assert core == naive(tweets, users, p)
    assert holds(core, users, p)
    for i, hs in core.items():  # a kept tweet keeps a subset of its hashtags, in its order
        assert list(hs) == [h for h in dict.fromkeys(tweets[i]) if h in hs]


@settings(max_examples=200, deadline=None)
@given(data())
def test_the_core_is_idempotent_and_nested_in_p(case: Case) -> None:
    tweets, users, p = case
    core = p_core(tweets, p, users)
    again = p_core(list(core.hashtags), p, [users[i] for i in core.tweets] if users else None)
    assert [core.tweets[i] for i in again.tweets] == list(core.tweets)
    assert again.hashtags == core.hashtags
    inner = p_core(tweets, p + 1, users).as_dict()
    outer = core.as_dict()
    assert all(i in outer and set(hs) <= set(outer[i]) for i, hs in inner.items())


def test_level_one_is_the_hashtagged_data() -> None:
    tweets = [["a", "b", "a"], [], ["c"]]
    core = p_core(tweets, 1, ["u", "u", "v"])
    assert core.tweets == (0, 2) and core.hashtags == (("a", "b"), ("c",))
    with pytest.raises(ValueError, match="at least 1"):
        p_core(tweets, 0)
    with pytest.raises(ValueError, match="users"):
        p_core(tweets, 2, ["u"])


def test_a_removal_cascades_through_users_and_hashtags() -> None:
    # d is rare: tweet 3 loses it and keeps c; then user w has 1 tweet at p=2 and goes,
    # taking c below 2 tweets, which empties tweet 2.
    tweets = [["a"], ["a"], ["c"], ["c", "d"]]
    users = ["u", "u", None, "w"]
    assert p_core(tweets, 2, users).as_dict() == {0: ("a",), 1: ("a",)}
    assert p_core(tweets, 2).as_dict() == {0: ("a",), 1: ("a",), 2: ("c",), 3: ("c",)}


def test_flips_and_ranking() -> None:
    assert ranking({"x": None, "y": 0.0}) == ["y", "x"]
    base = {"popular": (0.3, 0.28, 0.32), "mowe": (0.2, 0.18, 0.22), "random": None}
    assert flips(base, {"popular": (0.1, 0.0, 0.2), "mowe": (0.15, 0.1, 0.2)}) == [
        Flip("popular", "mowe", clear=False)
    ]
    assert flips(base, base) == []
