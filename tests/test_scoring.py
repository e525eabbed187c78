from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream.evaluation.metrics import FAR, exact_scores, rank_matrix, reval_hit_ratio
from stream.evaluation.neighbours import NeighbourCache, RowSearch
from stream.evaluation.scoring import parse_ints, r_label, score_batch, score_event
from stream.evaluation.summary import Summary
from stream.intake.records import Recommendation
from stream.synonyms.neighbour_table import NeighbourTable
from stream.synonyms.thesaurus import JsonThesaurus, ThesaurusMetadata

from .oracle import oracle_record
from .test_metrics import TABLE2_SYN

#: The chance-corrected fields of a summary without a null model (a JSON thesaurus).
NO_CHANCE = {
    **dict.fromkeys(
        ("reval_hit_ratio_corrected", "corrected_ci_low", "corrected_ci_high", "reval_hit_ratio_expected")
    ),
    "corrected_null_reason": "no_null_model",
}


class CountingThesaurus(JsonThesaurus):
    calls: list[tuple[str, int]]

    def neighbours(self, hashtag: str, k: int) -> list[str]:
        self.calls.append((hashtag, k))
        return super().neighbours(hashtag, k)


def _thesaurus() -> CountingThesaurus:
    th = CountingThesaurus({h: s[1:] for h, s in TABLE2_SYN.items()})
    th.calls = []
    return th


def test_grid_and_single_query_per_hashtag_at_max_k() -> None:
    th = _thesaurus()
    cache = NeighbourCache(th, max_k=3)
    event = Recommendation("1", ("swim", "exercise", "hockey"), ("sport", "yoga"))
    result = score_event(event, event.ground_truth or (), cache, ks=(0, 1, 3), rs=(1, 2, None))
    assert result.reval["1"] == {0: 0.0, 1: 0.0, 3: 1.0}  # Syn_3(swim) has sport
    assert result.reval["2"][3] == 1.0  # swim→sport, exercise→yoga
    assert result.reval["all"][0] == 0.0
    assert result.exact["all"].hit_rate == 0.0
    assert sorted(th.calls) == [("exercise", 3), ("hockey", 3), ("swim", 3)]  # unknown "yoga" is not asked
    score_event(event, event.ground_truth or (), cache, ks=(0, 1, 3))
    assert len(th.calls) == 3  # cached


def test_unscorable_events() -> None:
    cache = NeighbourCache(_thesaurus(), max_k=3)
    empty_r = score_event(Recommendation("1", (), ("a",)), ("a",), cache)
    empty_g = score_event(Recommendation("2", ("a",), ()), (), cache)
    assert (empty_r.unscorable, empty_g.unscorable) == ("empty_recommended", "empty_ground_truth")
    summary = Summary().update_many([empty_r, empty_g])
    assert summary.get() == {"events": 2, "unscorable": 2, "by_k": {}, "exact": {}}


def test_summary_means_and_unknown_hashtags() -> None:
    cache = NeighbourCache(_thesaurus(), max_k=3)
    events = [
        Recommendation("1", ("hockey", "championship"), ("football", "sport")),
        Recommendation("2", ("newtag",), ("newtag",)),
    ]
    scores = [score_event(e, e.ground_truth or (), cache, ks=(0, 3)) for e in events]
    assert scores[1].unknown_recommended == 1 and scores[0].unknown_recommended == 0
    got = Summary().update_many(scores).get()
    # Rank-aware (DCG): event 1 has hockey at rank 1 with sport at synonym rank 3, so
    # w_syn(3) / (w_rec(1) + w_rec(2)); event 2 is an exact hit at rank 1 (1.0).
    ranked_1 = (1 / math.log2(5)) / (1 + 1 / math.log2(3))
    # Precision form: event 1 has one of its two recommended (hockey, via sport) with a truth
    # among its 3 synonyms and none exactly; event 2 its one, exactly.
    assert got["by_k"] == {  # a JSON thesaurus: no null model, no chance correction
        "0": {
            "reval_hit_ratio": 0.5,
            **NO_CHANCE,
            "reval_hit_ratio_ranked": 0.5,
            "reval_hit_ratio_precision": 0.5,
            "reval_reciprocal_rank": 0.5,  # event 2's exact hit at the top; event 1 none at k = 0
        },
        "3": {
            "reval_hit_ratio": 0.75,
            **NO_CHANCE,
            "reval_hit_ratio_ranked": pytest.approx((ranked_1 + 1.0) / 2),
            "reval_hit_ratio_precision": 0.75,
            "reval_reciprocal_rank": 1.0,  # hockey, first in event 1's list, reaches sport at k = 3
        },
    }
    assert got["exact"]["hit_rate"] == 0.5
    # The event's own record carries the same precision form (event 1: hockey's synonyms reach sport).
    assert scores[0].to_json()["reval_hit_ratio_precision"] == {"all": {"0": 0.0, "3": 0.5}}


def test_parse_ints() -> None:
    assert parse_ints("0,5,10") == (0, 5, 10)
    assert parse_ints("all,5", allow_all=True) == (5, None)
    with pytest.raises(ValueError, match="whole number"):
        parse_ints("1,x")
    with pytest.raises(ValueError, match="out of range"):
        parse_ints("0", allow_all=True)


VOCAB = [f"h{i}" for i in range(10)]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([*VOCAB, "unknown1", "unknown2"]), min_size=0, max_size=8),
    st.lists(st.sampled_from([*VOCAB, "unknown3"]), min_size=0, max_size=5),
    st.fixed_dictionaries({h: st.permutations([v for v in VOCAB if v != h]) for h in VOCAB}),
)
def test_fast_grid_equals_the_reference_definition(recommended, truth, table) -> None:
    """score_event's rank-matrix shortcut gives exactly reval_hit_ratio / exact_scores."""
    thesaurus = JsonThesaurus({h: list(n) for h, n in table.items()})
    cache = NeighbourCache(thesaurus, max_k=9)
    event = Recommendation("1", tuple(dict.fromkeys(recommended)), tuple(dict.fromkeys(truth)))
    ks, rs = (0, 1, 3, 9), (1, 2, 5, None)
    result = score_event(event, event.ground_truth or (), cache, ks=ks, rs=rs)
    for r in rs:
        top = list(event.recommended[:r] if r is not None else event.recommended)
        for k in ks:

            def syn_k(h: str, k: int = k) -> list[str]:
                return [h, *table.get(h, [])[:k]]

            expected = reval_hit_ratio(top, list(truth), syn_k)
            got = None if result.unscorable else result.reval[r_label(r)][k]
            assert got == expected
        exact = exact_scores(top, list(truth))
        assert (None if result.unscorable else result.exact[r_label(r)]) == exact


def _table(rows: list[list[int]], names: list[str] | None = None) -> NeighbourTable:
    n, depth = len(rows), max((len(r) for r in rows), default=0)
    ids = np.full((n, depth), -1, dtype=np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    metadata = ThesaurusMetadata(
        model_id="t", dimension=1, count=n, built_at="", version="v", n_trees=0, metric="cosine", min_count=1
    )
    names = names or [f"h{i}" for i in range(n)]
    return NeighbourTable(names, ids, np.zeros(ids.shape, np.float32), np.ones(n, np.int64), metadata)


TableCase = tuple[list[list[int]], list[str], list[str], int]


def _table_cases(n: int) -> st.SearchStrategy[TableCase]:
    """n hashtags' rows with gaps (-1), duplicates and the hashtag itself (whatever a table
    file may hold), recommended and true hashtags (some unknown) and a max_k."""
    known = [f"h{i}" for i in range(n)]
    return st.tuples(
        st.lists(st.lists(st.integers(-1, n - 1), min_size=6, max_size=6), min_size=n, max_size=n),
        st.lists(st.sampled_from([*known, "new"]), max_size=7, unique=True),
        st.lists(st.sampled_from([*known, "new", "other"]), max_size=5, unique=True),
        st.integers(0, 8),
    )


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 9).flatmap(_table_cases))
def test_row_search_is_the_rank_dictionaries_matrix(case: TableCase) -> None:
    """The table path (no per-hashtag state) gives the matrix of the per-hashtag dictionaries."""
    rows, recommended, truth, max_k = case
    table = _table(rows)
    if max_k > table.depth and table.depth < len(table) - 1:
        with pytest.raises(ValueError, match="neighbours per hashtag"):
            NeighbourCache(table, max_k)
        return
    cache = NeighbourCache(table, max_k)
    assert cache.matrix(recommended, truth) == rank_matrix(recommended, truth, cache.ranks)
    assert RowSearch(table, max_k).matrix(recommended, truth) == cache.matrix(recommended, truth)


def test_row_search_beyond_two_byte_characters() -> None:
    """Ids past 0xFFFF and in the surrogate range are characters of the string too."""
    n = 70_000
    picks = [0, 5, 0xD7FE, 0xD7FF, 0xD800, 0xDBFF, 0xDFFF, 0xE000, 0xFFFE, 0xFFFF, 0x10000, n - 1]
    rows: list[list[int]] = [[] for _ in range(n)]
    for i, h in enumerate(picks):
        rows[h] = [picks[(i + d) % len(picks)] for d in (1, 3, 5, 7)]
    table = _table(rows)
    cache = NeighbourCache(table, 4)
    names = [f"h{i}" for i in picks]
    assert cache.matrix(names, names) == rank_matrix(names, names, cache.ranks)
    assert cache.matrix(names, names)[0] == [0, 1, FAR, 2, FAR, 3, FAR, 4, FAR, FAR, FAR, FAR]


def test_a_table_needs_no_state_per_hashtag() -> None:
    """Scoring on a neighbour table asks the thesaurus nothing: the first event of a version
    costs what the next ones cost (issue 12 §4)."""
    table = _table([[1, 2], [0, 2], [1, 0]], ["swim", "dive", "sport"])
    cache = NeighbourCache(table, 2)
    score = score_event(Recommendation("1", ("swim", "golf")), ("sport",), cache, ks=(0, 1, 2))
    assert score.reval["all"] == {0: 0.0, 1: 0.0, 2: 1.0}
    assert cache.queries == 0 and not cache._ranks


@st.composite
def _batches(draw: st.DrawFn) -> tuple[NeighbourTable, list[tuple[Recommendation, tuple[str, ...]]], int]:
    """A table (gaps, duplicates, the hashtag itself in its own row, popularity counts) and a
    batch of events of every shape: unknown hashtags on both sides, equal unknowns, empty R or
    G, lists past 16 hashtags (another padding group), repeated events."""
    n = draw(st.integers(2, 30))
    depth = draw(st.integers(1, 8))
    rows = draw(
        st.lists(st.lists(st.integers(-1, n - 1), min_size=depth, max_size=depth), min_size=n, max_size=n)
    )
    table = _table(rows)
    counts = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
    table = NeighbourTable(table.hashtags, table.neighbour_ids, table.distances, counts, table.metadata)
    pool = [*table.hashtags, "new1", "new2", "new3"]
    hashtags = st.lists(st.sampled_from(pool), max_size=20)
    events = draw(
        st.lists(st.tuples(hashtags, hashtags), min_size=1, max_size=40).map(
            lambda pairs: [(Recommendation(str(i), tuple(r)), tuple(g)) for i, (r, g) in enumerate(pairs)]
        )
    )
    max_k = draw(st.integers(0, depth if depth < n - 1 else depth + 3))
    return table, events, max_k


@settings(max_examples=150, deadline=None)
@given(
    _batches(),
    st.lists(st.integers(0, 12), min_size=1, max_size=5),
    st.lists(st.one_of(st.none(), st.integers(1, 25)), min_size=1, max_size=4),
    st.booleans(),
    st.sampled_from(["dcg", "top", "flat"]),
)
def test_a_batch_scores_exactly_as_the_oracle_one_event_at_a_time(batch, ks, rs, huge_k, scheme) -> None:
    """score_batch (the rank matrices of the whole batch in one array, every signal in numpy
    passes) gives the per-event definitions' results (tests/oracle.py) to the last bit: every
    record, and the JSON written; each event alone (score_event) gives the same."""
    import orjson

    from stream.evaluation.chance import ChanceModel
    from stream.evaluation.rank import SCHEMES
    from stream.evaluation.slices import Bands

    table, events, max_k = batch
    ks = [min(k, max_k) for k in ks] + ([10**15] if huge_k else [])
    weights = SCHEMES[scheme]

    def cache() -> NeighbourCache:
        return NeighbourCache(
            table, max_k, chance=ChanceModel(table), bands=Bands(table.hashtags, table.counts)
        )

    batched = score_batch(events, cache(), ks, rs, weights).records()
    single = cache()
    oracle = [oracle_record(e, truth, single, ks, rs, weights) for e, truth in events]
    assert batched == oracle
    assert [orjson.dumps(s) for s in batched] == [orjson.dumps(s) for s in oracle]
    # The score worker writes the records' bytes from the columns: the same bytes.
    from workers.service.score import encode_scores

    extras = [
        {"index_version": "v1", "event_time": 1.5 * i, "ground_truth": list(t)}
        for i, (_, t) in enumerate(events)
    ]
    written = encode_scores(score_batch(events, cache(), ks, rs, weights), extras)
    assert written == [orjson.dumps({**o, **x}) for o, x in zip(oracle, extras, strict=True)]
    one = cache()
    assert [score_event(e, truth, one, ks, rs, weights).to_json() for e, truth in events[:5]] == oracle[:5]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from([*VOCAB, "unknown1"]), max_size=8),
            st.lists(st.sampled_from([*VOCAB, "unknown1", "unknown3"]), max_size=5),
        ),
        min_size=1,
        max_size=20,
    ),
    st.fixed_dictionaries({h: st.permutations([v for v in VOCAB if v != h]) for h in VOCAB}),
)
def test_a_batch_on_a_thesaurus_without_a_table_scores_as_the_oracle(pairs, table) -> None:
    """The rank-dictionary path (a JSON thesaurus: no table, no null model, no slices)."""
    thesaurus = JsonThesaurus({h: list(n) for h, n in table.items()})
    events = [(Recommendation(str(i), tuple(r)), tuple(g)) for i, (r, g) in enumerate(pairs)]
    ks, rs = (0, 1, 3, 9), (1, 2, None)
    batched = score_batch(events, NeighbourCache(thesaurus, max_k=9), ks, rs).records()
    cache = NeighbourCache(thesaurus, max_k=9)
    assert batched == [oracle_record(e, t, cache, ks, rs) for e, t in events]


def test_reciprocal_rank_of_the_first_hit() -> None:
    """reval_reciprocal_rank: 1/i for the first recommended hashtag (list order, duplicates
    dropped, the first occurrence keeping its place) with a ground truth among its k synonyms,
    0 if none; unscorable as Eq. 4; its mean in reval score's summary."""
    cache = NeighbourCache(_thesaurus(), max_k=3)
    # golf (no synonym: unknown), swim (sport is its 3rd synonym), golf again (dropped: exercise
    # is the 3rd hashtag, not the 4th), exercise (yoga is its 2nd synonym).
    event = Recommendation("1", ("golf", "swim", "golf", "exercise"), ("sport", "yoga"))
    score = score_event(event, event.ground_truth or (), cache, ks=(0, 2, 3), rs=(1, None))
    assert score.values["reval_reciprocal_rank"] == {
        "1": {0: 0.0, 2: 0.0, 3: 0.0},
        "all": {0: 0.0, 2: 1 / 3, 3: 0.5},
    }
    assert score.to_json()["reval_reciprocal_rank"]["all"] == {"0": 0.0, "2": 1 / 3, "3": 0.5}
    exact = Recommendation("2", ("yoga", "swim"), ("yoga",))
    empty = Recommendation("3", (), ("yoga",))
    summary = Summary().update_many(
        score_event(e, e.ground_truth or (), cache, ks=(0, 3)) for e in (exact, empty)
    )
    assert summary.get()["by_k"]["0"]["reval_reciprocal_rank"] == 1.0
    assert summary.get()["unscorable"] == 1


def test_the_worker_writes_a_record_json_cannot_carry_as_a_dict_for_its_dead_letter() -> None:
    """A tweet id that is not valid Unicode (a lone surrogate, which a JSON parser accepts)
    cannot be written: that event's record stays a dict, which the delivery dead-letters as
    unserialisable; its neighbours are written as bytes."""
    import orjson

    from workers.service.score import encode_scores

    cache = NeighbourCache(_thesaurus(), max_k=3)
    events = [(Recommendation(i, ("swim",)), ("sport",)) for i in ("1", "\ud800", "3")]
    batch = score_batch(events, cache, ks=(0, 3), rs=(None,))
    written = encode_scores(batch, [{"event_time": 1.0}] * 3)
    assert isinstance(written[1], dict) and written[1]["tweet_id"] == "\ud800"
    assert written[0] == orjson.dumps({**batch.records()[0], "event_time": 1.0})
    assert isinstance(written[2], bytes) and orjson.loads(written[2])["tweet_id"] == "3"
    with pytest.raises(TypeError):
        orjson.dumps(written[1])
