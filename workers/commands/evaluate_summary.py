"""The cells of ``reval evaluate``: each recommender's per-event scores (:class:`Scored`) of one
(split, seed) :class:`Run`, summarised per cell with bootstrap 95% intervals and the chance
correction (:func:`summarise`), and the paired differences between recommenders and between
embeddings on the same resamples (:func:`compare`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from stream.evaluation.experiment import (
    ExperimentConfig,
    bootstrap_difference,
    bootstrap_kappa_difference,
    bootstrap_kappas,
    bootstrap_means,
    resample_counts,
)
from stream.intake.cleaning import Prepared
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus

#: The paired differences reported, as (better, worse): the good recommenders against the
#: canary and the null, and MOWE against popularity.
RECOMMENDER_PAIRS = (
    ("popular", "least-popular"),
    ("popular", "random"),
    ("mowe", "popular"),
    ("mowe", "random"),
)
EMBEDDING_PAIRS = (("bertag", "word2vec"), ("bertag", "fasttext"))


@dataclass
class Scored:
    """Per-event scores of one recommender on one thesaurus: events x (r, k) cells, NaN
    where the event is unscorable."""

    raw: npt.NDArray[np.float64]
    #: the null recommender's expectation (stream.evaluation.chance) per event and cell: the corrected
    #: score of any set of events is the kappa of the sums of ``raw`` and ``expected``
    expected: npt.NDArray[np.float64]
    exact_hit_ratio: npt.NDArray[np.float64]  # events x r
    ranked: npt.NDArray[np.float64]  # events x (r, k), rank-aware #REval (stream.evaluation.rank)


@dataclass
class Run:
    """One (split, seed): its events and every recommender's scores on every thesaurus."""

    split: str
    seed: int
    train: list[Prepared]
    test: list[Prepared]
    recommended: dict[str, list[list[str]]]
    thesauri: dict[tuple[str, str], AnnoyThesaurus]  # (variant, hubness)
    scored: dict[tuple[str, str, str], Scored] = field(default_factory=dict)  # (variant, hubness, rec)
    similar_median: float | None = None


@dataclass(frozen=True)
class Cell:
    """One cell of ``results.json``; its fields, in order, are also the columns of
    ``results.csv`` (after the p-core the cell was computed on)."""

    split: str
    seed: int | str  # "all": the split's seeds pooled
    variant: str
    hubness: str
    recommender: str
    r: str
    k: int
    reval_hit_ratio: float | None
    ci_low: float | None
    ci_high: float | None
    reval_hit_ratio_corrected: float | None
    corrected_ci_low: float | None
    corrected_ci_high: float | None
    #: Why the corrected score is null: no null model, or no room above chance in this cell.
    corrected_null_reason: str | None
    exact_hit_ratio: float | None
    reval_hit_ratio_ranked: float | None
    events: int
    unscorable: int


def _grouped(config: ExperimentConfig, runs: list[Run]) -> Iterator[tuple[str, int | str, list[Run]]]:
    """(split, seed, runs): each run alone, and each split's seeds pooled (seed "all")."""
    for split in config.splits:
        of_split = [run for run in runs if run.split == split]
        for run in of_split:
            yield split, run.seed, [run]
        if len(of_split) > 1:
            yield split, "all", of_split
    if len(config.seeds) == 1:  # one seed: its cells are also the pooled ones
        for split in config.splits:
            yield split, "all", [run for run in runs if run.split == split]


def _stack(runs: list[Run], key: tuple[str, str, str]) -> tuple[Scored, npt.NDArray[np.int64]]:
    parts = [run.scored[key] for run in runs]
    strata = np.concatenate([np.full(len(run.test), i, dtype=np.int64) for i, run in enumerate(runs)])
    return Scored(
        np.vstack([p.raw for p in parts]),
        np.vstack([p.expected for p in parts]),
        np.vstack([p.exact_hit_ratio for p in parts]),
        np.vstack([p.ranked for p in parts]),
    ), strata


def summarise(config: ExperimentConfig, runs: list[Run]) -> list[dict[str, Any]]:
    """One cell per (split, seed or "all", embedding, hubness, recommender, r, k)."""
    cells = []
    ks, rs = list(config.ks), list(config.rs)
    for split, seed, group in _grouped(config, runs):
        keys = list(group[0].scored)
        n = sum(len(run.test) for run in group)
        for key in keys:
            scored, strata = _stack(group, key)
            counts = resample_counts(n, strata if len(group) > 1 else None, config.bootstrap, seed=17)
            raw = bootstrap_means(scored.raw, counts)
            corrected = bootstrap_kappas(scored.raw, scored.expected, counts)
            exact = bootstrap_means(scored.exact_hit_ratio, counts)
            ranked = bootstrap_means(scored.ranked, counts)
            for j, r in enumerate(rs):
                for i, k in enumerate(ks):
                    e, c = raw[j * len(ks) + i], corrected[j * len(ks) + i]
                    cell = Cell(
                        split,
                        seed,
                        *key,  # variant, hubness, recommender
                        str(r),
                        k,
                        reval_hit_ratio=e.mean,
                        ci_low=e.low,
                        ci_high=e.high,
                        reval_hit_ratio_corrected=c.mean,
                        corrected_ci_low=c.low,
                        corrected_ci_high=c.high,
                        corrected_null_reason=None
                        if c.mean is not None
                        else "no_room"
                        if np.any(~np.isnan(scored.expected[:, j * len(ks) + i]))
                        else "no_null_model",
                        exact_hit_ratio=exact[j].mean,
                        reval_hit_ratio_ranked=ranked[j * len(ks) + i].mean,
                        events=e.events,
                        unscorable=e.unscorable,
                    )
                    cells.append(asdict(cell))
    return cells


def compare(config: ExperimentConfig, runs: list[Run]) -> list[dict[str, Any]]:
    """Paired bootstrap differences, seeds pooled: recommenders on the same thesaurus,
    embeddings for the same recommender (raw and corrected)."""
    out = []
    ks, rs = list(config.ks), list(config.rs)
    names = set(config.recommender_names)
    for split, seed, group in _grouped(config, runs):
        if seed != "all":
            continue
        n = sum(len(run.test) for run in group)
        counts = resample_counts(
            n,
            np.concatenate([np.full(len(run.test), i, dtype=np.int64) for i, run in enumerate(group)]),
            config.bootstrap,
            seed=23,
        )
        pairs: list[tuple[str, tuple[str, str, str], tuple[str, str, str]]] = []
        for variant in config.embeddings:
            for method in config.hubness:
                pairs += [
                    ("recommenders", (variant, method, a), (variant, method, b))
                    for a, b in RECOMMENDER_PAIRS
                    if a in names and b in names
                ]
        for method in config.hubness:
            for name in config.recommender_names:
                pairs += [
                    ("embeddings", (a, method, name), (b, method, name))
                    for a, b in EMBEDDING_PAIRS
                    if a in config.embeddings and b in config.embeddings
                ]
        for what, a, b in pairs:
            sa, _ = _stack(group, a)
            sb, _ = _stack(group, b)
            for metric, diffs in (
                ("reval_hit_ratio", bootstrap_difference(sa.raw, sb.raw, counts)),
                (
                    "reval_hit_ratio_corrected",
                    bootstrap_kappa_difference((sa.raw, sa.expected), (sb.raw, sb.expected), counts),
                ),
            ):
                for j, r in enumerate(rs):
                    for i, k in enumerate(ks):
                        d, low, high = diffs[j * len(ks) + i]
                        out.append(
                            {
                                "split": split,
                                "compare": what,
                                "metric": metric,
                                "a": "/".join(a),
                                "b": "/".join(b),
                                "r": str(r),
                                "k": k,
                                "difference": d,
                                "ci_low": low,
                                "ci_high": high,
                            }
                        )
    return out
