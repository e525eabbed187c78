"""The chance-corrected score on /metrics: the scorer exports the sums (observed, expected,
events), and every window's corrected value is the kappa of its sums."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import generate_latest

from stream.evaluation.chance import CorrectedSum
from stream.evaluation.scoring import score_event
from stream.intake.records import Recommendation
from stream.synonyms.neighbour_table import build_neighbour_table
from workers.adapters.files.annoy_thesaurus import neighbour_cache
from workers.adapters.prometheus.exporter import Exporter, LabelGuard
from workers.adapters.prometheus.quality_metrics import QualityMetrics

NAMES = [f"h{i}" for i in range(40)]


def scores_and_times() -> tuple[list, list[float]]:
    rng = np.random.default_rng(4)
    unit = rng.normal(size=(len(NAMES), 8))
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    counts = np.minimum(rng.zipf(1.5, size=len(NAMES)), 50)
    cache = neighbour_cache(build_neighbour_table(NAMES, unit, counts, depth=5, method="raw"), 5)
    scores, times = [], []
    for i in range(300):
        recommended = tuple(dict.fromkeys(rng.choice(NAMES, size=int(rng.integers(1, 6)))))
        truth = tuple(dict.fromkeys(rng.choice([*NAMES, "novel"], size=int(rng.integers(1, 4)))))
        event = Recommendation(str(i), recommended, truth, recommender=str(rng.choice(["a", "b"])))
        scores.append(score_event(event, truth, cache, ks=(0, 5), rs=(1, None)))
        times.append(1000.0 + 10 * i)
    return scores, times


def scrape(exporter: Exporter) -> dict[str, float]:
    text = generate_latest(exporter.registry).decode()
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line[:1] != "#"}


def test_the_counters_are_the_sums_and_the_rolling_value_their_kappa() -> None:
    scores, times = scores_and_times()
    exporter = Exporter()
    quality = QualityMetrics(
        exporter, (0, 5), (1, None), (600,), LabelGuard(), lambda s: "10m", clock=lambda: 1e4
    )
    quality.observe_many(scores, times)
    lines = scrape(exporter)
    for name in ("a", "b"):
        # Each recommender's window: the 60 slots of 10 s up to the slot of its newest event.
        newest = max(t for s, t in zip(scores, times, strict=True) if s.recommender == name) // 10
        for r in ("1", "all"):
            for k in (0, 5):
                sums, window = CorrectedSum(), CorrectedSum()
                for s, t in zip(scores, times, strict=True):
                    if s.recommender == name and s.unscorable is None:
                        sums.update(s.reval[r][k], s.expected[r][k])
                        if t // 10 > newest - 60:
                            window.update(s.reval[r][k], s.expected[r][k])
                labels = f'k="{k}",r="{r}",recommender="{name}"'
                assert lines[f"reval_corrected_observed_total{{{labels}}}"] == pytest.approx(sums.observed)
                assert lines[f"reval_corrected_expected_total{{{labels}}}"] == pytest.approx(sums.expected)
                assert lines[f"reval_corrected_events_total{{{labels}}}"] == sums.count
                rolling = lines.get(f'reval_hit_ratio_corrected_rolling{{{labels},window="10m"}}')
                assert rolling == pytest.approx(window.get()), (name, r, k)
    # The per-event-mean family is gone: nothing averages per-event kappas any more.
    assert not any("shortfall" in key for key in lines)


def test_a_window_with_no_room_above_chance_exports_no_corrected_value() -> None:
    """An event whose expectation is 1 (the null cannot miss): the window has no room, so
    no rolling value (never observed - 1, never a division by ~0)."""
    # Two hashtags, each the other's nearest: at k=1 every draw of the null is a synonym of a.
    table = build_neighbour_table(["a", "b"], np.eye(2), [5, 5], depth=1, method="raw")
    cache = neighbour_cache(table, 1)
    event = Recommendation("1", ("b",), ("a",), recommender="x")
    score = score_event(event, ("a",), cache, ks=(1,), rs=(None,))
    assert score.expected["all"][1] == pytest.approx(1.0) and score.corrected["all"][1] is None
    exporter = Exporter()
    quality = QualityMetrics(
        exporter, (1,), (None,), (600,), LabelGuard(), lambda s: "10m", clock=lambda: 1e4
    )
    quality.observe(score, 1000.0)
    lines = scrape(exporter)
    assert lines['reval_corrected_events_total{k="1",r="all",recommender="x"}'] == 1
    assert not any(key.startswith("reval_hit_ratio_corrected_rolling") for key in lines)
