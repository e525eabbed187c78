"""Popularity slices (head / torso / tail / novel): bands, per-slice Eq. 4, the scorer and
/metrics."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import generate_latest

from stream.evaluation.metrics import reval_hit_ratio
from stream.evaluation.neighbours import NeighbourCache
from stream.evaluation.scoring import score_event
from stream.evaluation.slices import SLICES, Bands, columns_by_slice, slice_scores
from stream.intake.records import Recommendation
from stream.synonyms.neighbour_table import NeighbourTable, build_neighbour_table
from workers.adapters.files.annoy_thesaurus import neighbour_cache
from workers.adapters.prometheus.exporter import Exporter, LabelGuard
from workers.adapters.prometheus.quality_metrics import QualityMetrics

NAMES = ["flood", "floods", "rain", "fire", "smoke", "hail"]
COUNTS = [50, 20, 10, 10, 6, 4]  # 100 uses: flood carries 50%, then floods 20%, ...


def table() -> NeighbourTable:
    rng = np.random.default_rng(0)
    unit = rng.normal(size=(len(NAMES), 8))
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    return build_neighbour_table(NAMES, unit, COUNTS, depth=3, method="raw")


def test_bands_follow_cumulative_shares() -> None:
    bands = Bands(NAMES, COUNTS)
    # flood carries 50% (head); floods 20% (torso up to 80%); fire and rain tie at 10%:
    # fire, first by name, still starts below 80% (torso), rain starts at 80% (tail).
    assert [bands.of(h) for h in NAMES] == ["head", "torso", "tail", "torso", "tail", "tail"]
    assert bands.of("sharknado") == "novel"
    # Other shares move the borders; ties are broken by name, so equal counts are stable.
    wide = Bands(NAMES, COUNTS, shares=(0.7, 0.95))
    assert [wide.of(h) for h in NAMES] == ["head", "head", "torso", "torso", "torso", "tail"]
    with pytest.raises(ValueError, match="shares"):
        Bands(NAMES, COUNTS, shares=(0.9, 0.5))
    with pytest.raises(ValueError, match="counts"):
        Bands(NAMES, COUNTS[:2])


def test_a_slice_is_eq4_on_its_ground_truths() -> None:
    th = table()
    cache = NeighbourCache(th, max_k=3)
    bands = Bands(NAMES, COUNTS)
    recommended, truth = ["flood", "hail", "fire"], ["flood", "floods", "rain", "hail", "sharknado"]
    from stream.evaluation.metrics import rank_matrix

    matrix = rank_matrix(recommended, truth, cache.ranks)
    ks = [0, 1, 3]
    got = slice_scores(matrix, columns_by_slice(truth, bands), ks)
    assert set(got) == {"head", "torso", "tail", "novel"}
    for label in got:
        cut = [g for g in truth if bands.of(g) == label]
        for k, value in zip(ks, got[label], strict=True):

            def synonyms(h: str, k: int = k) -> list[str]:
                return [h, *th.neighbours(h, k)] if h in th else [h]

            assert value == pytest.approx(reval_hit_ratio(recommended, cut, synonyms)), (label, k)
    assert got["novel"] == [0.0, 0.0, 0.0]  # unknown: nothing recommended is it
    assert got["head"][0] == 1.0  # flood recommended as is


def test_scorer_and_metrics_carry_the_slices() -> None:
    cache = neighbour_cache(table(), 3)
    assert cache.bands is not None
    event = Recommendation("1", ("flood", "smoke"), ("flood", "sharknado"), recommender="mowe")
    result = score_event(event, ("flood", "sharknado"), cache, ks=(0, 3), rs=(None,))
    assert set(result.slices["all"]) == {"head", "novel"}
    assert result.slices["all"]["head"][0] == 1.0 and result.slices["all"]["novel"][0] == 0.0
    assert result.to_json()["reval_hit_ratio_slices"]["all"]["head"] == {"0": 1.0, "3": 1.0}
    # One band only: the slice is Eq. 4 on the whole ground truth (reused, not recomputed).
    single = score_event(event, ("floods",), cache, ks=(0, 3), rs=(1, None))
    assert {r: list(v) for r, v in single.slices.items()} == {"1": ["torso"], "all": ["torso"]}
    assert all(single.slices[r]["torso"] == single.reval[r] for r in ("1", "all"))
    exporter = Exporter()
    quality = QualityMetrics(
        exporter, ks=(0, 3), rs=(None,), windows=(300,), guard=LabelGuard(), window_label=lambda s: "5m"
    )
    quality.observe(result, event_time=1.0)
    quality.observe(score_event(event, ("rain",), cache, ks=(0, 3), rs=(None,)), event_time=2.0)
    text = generate_latest(exporter.registry).decode()
    lines = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line[:1] != "#"}
    assert lines['reval_hit_ratio_slice_count{k="0",r="all",recommender="mowe",slice="head"}'] == 1
    assert lines['reval_hit_ratio_slice_sum{k="0",r="all",recommender="mowe",slice="head"}'] == 1.0
    assert lines['reval_hit_ratio_slice_count{k="0",r="all",recommender="mowe",slice="novel"}'] == 1
    assert lines['reval_hit_ratio_slice_count{k="3",r="all",recommender="mowe",slice="tail"}'] == 1
    labels = {key.split('slice="')[1].split('"')[0] for key in lines if "reval_hit_ratio_slice" in key}
    assert labels <= set(SLICES)


def test_metrics_of_a_batch_are_the_metrics_one_event_at_a_time() -> None:
    """observe_many: the same counters, sums and rolling windows whatever the batches (one
    event at a time or uneven batches; every sum a running sum in event order)."""
    cache = neighbour_cache(table(), 3)
    rng = np.random.default_rng(1)
    scores, times = [], []
    for i in range(200):
        recommended = tuple(dict.fromkeys(rng.choice([*NAMES, "new"], size=int(rng.integers(0, 5)))))
        truth = tuple(dict.fromkeys(rng.choice([*NAMES, "sharknado"], size=int(rng.integers(0, 4)))))
        event = Recommendation(str(i), recommended, truth, recommender=str(rng.choice(["a", "b", "c d"])))
        scores.append(score_event(event, truth, cache, ks=(0, 1, 3), rs=(1, None)))
        times.append(1000.0 + 7 * i - (400 if i % 9 == 0 else 0))

    def metrics(feed: object) -> list[str]:
        exporter = Exporter()
        quality = QualityMetrics(
            exporter, (0, 1, 3), (1, None), (300, 3600), LabelGuard(), str, clock=lambda: 2000.0
        )
        feed(quality)  # type: ignore[operator]
        text = generate_latest(exporter.registry).decode()
        return sorted(line for line in text.splitlines() if "_created" not in line)

    one_at_a_time = metrics(lambda q: [q.observe(s, t) for s, t in zip(scores, times, strict=True)])
    in_batches = metrics(
        lambda q: [
            q.observe_many(scores[i : i + n], times[i : i + n]) for i, n in ((0, 1), (1, 63), (64, 136))
        ]
    )
    assert in_batches == one_at_a_time
    assert any(line.startswith("reval_hit_ratio_rolling{") for line in one_at_a_time)
