"""``reval evaluate``: the paper's experiment (section 4.2), with baselines, seeds and
confidence intervals, on any feed.

1. Pre-process the feed with the core (:class:`stream.cleaning.Cleaner`: hashtagged,
   English, duplicate retweets removed) and embed every kept tweet once (BERTag).
2. For each split (``time``: the earliest 90% train; ``random``: a seeded shuffle) and
   seed: train Word2Vec (the MOWE recommender's, and the ``word2vec`` variant's) and
   FastText on the training tweets; recommend the top max(r) hashtags for every test
   tweet with each recommender -- ``mowe`` (:class:`stream.recommenders.MoweRecommender`,
   at each threshold), ``popular``, ``least-popular`` (the canary) and ``random`` (the
   null of the chance correction) -- which never sees the test tweet's hashtags: they
   are the ground truth.
3. Build one thesaurus per embedding variant (``bertag``: the core path, mean BERTag
   embedding per hashtag; ``word2vec`` / ``fasttext``: the unit mean of the tweets' MOWE
   vectors, so the variants differ only in the tweet embedding) from the *training*
   tweets, with each hubness method (:mod:`stream.hubness`), through the one builder
   the CLI and the index job use (:func:`workers.adapters.store.build_from_means`).
4. Score every event with :func:`stream.scoring.score_event` -- the code path of ``reval
   score`` and the scoring worker -- raw, chance-corrected and rank-aware
   (:mod:`stream.rank`; mean only, column ``reval_hit_ratio_ranked``), for every (r, k).
5. Means with percentile-bootstrap 95% intervals (events resampled; pooled seeds
   resampled within each seed), and paired differences between recommenders and
   between embeddings on the same resamples.  The chance-corrected score of a cell is
   the kappa of its sums, ``(sum observed - sum expected) / (events - sum expected)``
   (:func:`stream.experiment.bootstrap_kappas`), recomputed on each resample.

Outputs: ``results.json`` (with ``cells``), ``results.csv``, ``curves.png``,
``synonyms.md``, ``recommendations.jsonl``, ``timings.json``.  Everything that depends
on chance takes the seeds, so ``results.json`` is the same for the same feed and options.
"""

from __future__ import annotations

import csv
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from gensim.models.callbacks import CallbackAny2Vec

from stream.cleaning import Prepared
from stream.cores import flips, ranking
from stream.experiment import (
    ExperimentConfig,
    ProgressFactory,
    at_core,
    bootstrap_difference,
    bootstrap_kappa_difference,
    bootstrap_kappas,
    bootstrap_means,
    hashtag_means,
    labelled,
    load_corpus,
    mowe_label,
    no_progress,
    resample_counts,
    split_corpus,
)
from stream.hubness import DEFAULT_METHOD
from stream.recommenders import (
    BaseRecommender,
    MoweRecommender,
    make_recommender,
    mean_vectors,
    recommendation_event,
)
from stream.records import Recommendation
from stream.scoring import r_label, score_event
from workers.adapters.feeds import check_output_path, read_tweets
from workers.adapters.store import AnnoyThesaurus, build_from_means, neighbour_cache
from workers.adapters.word_vectors import train_word_vectors

#: The paired differences reported, as (better, worse): the good recommenders against the
#: canary and the null, and MOWE against popularity.
RECOMMENDER_PAIRS = (
    ("popular", "least-popular"),
    ("popular", "random"),
    ("mowe", "popular"),
    ("mowe", "random"),
)
EMBEDDING_PAIRS = (("bertag", "word2vec"), ("bertag", "fasttext"))
LABELS = {"word2vec": "Word2Vec", "fasttext": "FastText"}


def variant_label(variant: str, model: str) -> str:
    if variant == "bertag":
        return f"BERTag ({Path(model).name or model})"
    return LABELS[variant]


class _EpochTicker(CallbackAny2Vec):
    """A gensim callback that advances a progress bar once per epoch."""

    def __init__(self, advance: Callable[[int], None]) -> None:
        self.advance = advance

    def on_epoch_end(self, model: Any) -> None:
        self.advance(1)


@contextmanager
def _timed(timings: dict[str, float], name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = round(timings.get(name, 0.0) + time.perf_counter() - started, 2)


def bertag_vectors(
    prepared: Sequence[Prepared],
    model: str,
    *,
    dtype: str = "float32",
    batch_size: int = 32,
    chunk: int = 512,
    progress: ProgressFactory = no_progress,
) -> tuple[npt.NDArray[np.float32], str]:
    """Tweet embeddings of the cleaned texts with :class:`~workers.adapters.encoder.Encoder`."""
    from workers.adapters.encoder import Encoder  # torch: seconds to import, after the checks

    encoder = Encoder(model, dtype=dtype, batch_size=batch_size)
    out = np.zeros((len(prepared), encoder.dim), dtype=np.float32)
    advance = progress(f"embedding ({Path(model).name or model})", len(prepared))
    for start in range(0, len(prepared), chunk):
        block = prepared[start : start + chunk]
        out[start : start + len(block)] = encoder.encode([p.text for p in block])
        advance(len(block))
    return out, encoder.model_id


# --------------------------------------------------------------------------- one split


@dataclass
class Scored:
    """Per-event scores of one recommender on one thesaurus: events x (r, k) cells, NaN
    where the event is unscorable."""

    raw: npt.NDArray[np.float64]
    #: the null recommender's expectation (stream.chance) per event and cell: the corrected
    #: score of any set of events is the kappa of the sums of ``raw`` and ``expected``
    expected: npt.NDArray[np.float64]
    exact_hit_ratio: npt.NDArray[np.float64]  # events x r
    ranked: npt.NDArray[np.float64]  # events x (r, k), rank-aware #REval (stream.rank)


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


def _recommenders(config: ExperimentConfig, seed: int, w2v: Any) -> dict[str, BaseRecommender]:
    out: dict[str, BaseRecommender] = {}
    for name in config.recommenders:
        if name == "mowe":
            for t in config.mowe_thresholds:
                label = mowe_label(t, config.mowe_thresholds[0])
                out[label] = MoweRecommender(label, threshold=t, word_vectors=w2v)
        else:
            out[name] = make_recommender(name, seed=seed)
    return out


def run_split(
    config: ExperimentConfig,
    split: str,
    seed: int,
    prepared: list[Prepared],
    bertag: tuple[npt.NDArray[np.float32], str] | None,
    timings: dict[str, float],
    progress: ProgressFactory,
) -> Run:
    """Recommend, build the thesauri and score, for one split and seed."""
    train, test = split_corpus(prepared, split, seed=seed, train_fraction=config.train_fraction)  # type: ignore[arg-type]
    where = {id(p): i for i, p in enumerate(prepared)}
    train_tweets = [labelled(p) for p in train]
    train_docs = [p.text.split() for p in train]
    gensim_kw: dict[str, Any] = {
        "vector_size": config.vector_size,
        "window": config.window,
        "min_count": 1,
        "epochs": config.epochs,
        "seed": seed,
        "workers": 1,
    }
    tag = f"{split} split, seed {seed}"
    with _timed(timings, "train_word2vec"):
        tick = progress(f"Word2Vec, {tag} (epochs)", config.epochs)
        w2v = train_word_vectors(train_docs, "word2vec", callbacks=[_EpochTicker(tick)], **gensim_kw)
    recommended: dict[str, list[list[str]]] = {}
    similar: list[int] = []
    with _timed(timings, "recommend"):
        for name, recommender in _recommenders(config, seed, w2v).items():
            advance = progress(f"recommending ({name}), {tag}", len(test))
            recommender.fit(train_tweets)
            recommended[name] = recommender.recommend_many(
                [p.tweet for p in test], max(config.rs), progress=advance
            )
            if isinstance(recommender, MoweRecommender) and name == "mowe":
                similar = recommender.last_similar_counts
    thesauri: dict[tuple[str, str], AnnoyThesaurus] = {}
    for variant in config.embeddings:
        with _timed(timings, f"thesaurus_{variant}"):
            if variant == "bertag":
                assert bertag is not None
                vectors, model_id = bertag[0][[where[id(p)] for p in train]], bertag[1]
            else:
                if variant == "word2vec":
                    words = w2v
                else:
                    tick = progress(f"FastText, {tag} (epochs)", config.epochs)
                    words = train_word_vectors(
                        train_docs,
                        "fasttext",
                        bucket=config.fasttext_bucket,
                        callbacks=[_EpochTicker(tick)],
                        **gensim_kw,
                    )
                vectors, model_id = mean_vectors(train_docs, words), variant
            means = hashtag_means(train, vectors)
            for method in config.hubness:
                built = build_from_means(
                    means,
                    model_id=model_id,
                    method=method,
                    depth=max(max(config.ks), 1),
                    n_trees=config.n_trees,
                    seed=seed,
                )
                if built is None:
                    raise ValueError(f"no hashtag of the training tweets has a {variant} embedding")
                thesauri[variant, method] = built
    run = Run(
        split,
        seed,
        train,
        test,
        recommended,
        thesauri,
        similar_median=float(np.median(similar)) if similar else None,
    )
    with _timed(timings, "score"):
        score_run(config, run, progress)
    return run


def score_run(config: ExperimentConfig, run: Run, progress: ProgressFactory) -> None:
    """Every recommender on every thesaurus of ``run``: per-event raw and corrected scores."""
    ks, rs = list(config.ks), list(config.rs)
    truths = [p.hashtags for p in run.test]
    for (variant, method), thesaurus in run.thesauri.items():
        cache = neighbour_cache(thesaurus, max(ks))
        advance = progress(
            f"scoring ({variant}, {method}), {run.split} split, seed {run.seed}", len(run.recommended)
        )
        for name, lists in run.recommended.items():
            raw = np.full((len(run.test), len(rs) * len(ks)), np.nan)
            expected = np.full_like(raw, np.nan)
            ranked = np.full_like(raw, np.nan)
            exact = np.full((len(run.test), len(rs)), np.nan)
            for i, (p, recs) in enumerate(zip(run.test, lists, strict=True)):
                event = Recommendation(p.tweet.id, tuple(recs), truths[i], name, p.tweet.created_at)
                score = score_event(event, truths[i], cache, ks, rs)
                if score.unscorable is not None:
                    continue
                for j, r in enumerate(rs):
                    label = r_label(r)
                    raw[i, j * len(ks) : (j + 1) * len(ks)] = [score.reval[label][k] for k in ks]
                    if score.expected:
                        expected[i, j * len(ks) : (j + 1) * len(ks)] = [score.expected[label][k] for k in ks]
                    ranked[i, j * len(ks) : (j + 1) * len(ks)] = [score.ranked[label][k] for k in ks]
                    exact[i, j] = score.exact[label].hit_ratio
            run.scored[variant, method, name] = Scored(raw, expected, exact, ranked)
            advance(1)


# --------------------------------------------------------------------------- the whole run


@dataclass
class Experiment:
    """Everything a run produced (what :func:`write_outputs` writes)."""

    config: ExperimentConfig
    feeds: list[str]
    data: dict[str, Any]
    cells: list[dict[str, Any]]
    differences: list[dict[str, Any]]
    thesauri: dict[str, dict[str, Any]]
    labels: dict[str, str]
    synonyms: dict[str, dict[str, list[str]]]
    hubs: dict[str, list[tuple[str, int]]]
    top_hashtags: list[tuple[str, int]]
    events: list[dict[str, Any]]
    timings: dict[str, float]
    #: The first split's and seed's thesauri, by "variant-method" (``--save-thesauri``).
    built: dict[str, AnnoyThesaurus] = field(default_factory=dict)

    def cell(
        self,
        *,
        variant: str,
        recommender: str,
        r: int,
        k: int,
        split: str | None = None,
        hubness: str | None = None,
        seed: int | str = "all",
        core: int | None = None,
    ) -> dict[str, Any]:
        split = split or self.config.splits[0]
        hubness = hubness or self.config.hubness[0]
        core = core or self.config.cores[0]
        want = (core, split, variant, hubness, recommender, seed, str(r), k)
        try:
            return self._by_key[want]
        except KeyError:
            raise KeyError(want) from None

    @cached_property
    def _by_key(self) -> dict[tuple[Any, ...], dict[str, Any]]:
        keys = ("core", "split", "variant", "hubness", "recommender", "seed", "r", "k")
        return {tuple(c[key] for key in keys): c for c in self.cells}

    def core_flips(self) -> list[dict[str, Any]]:
        """Where the ranking of recommenders on a p-core differs from the first core's (seeds
        pooled), per metric, split, embedding, hubness, r and k (:func:`stream.cores.flips`)."""
        config, out = self.config, []
        base = config.cores[0]
        for core in config.cores[1:]:
            for metric, low, high in (
                ("reval_hit_ratio", "ci_low", "ci_high"),
                ("reval_hit_ratio_corrected", "corrected_ci_low", "corrected_ci_high"),
            ):
                for split, variant, method, r, k in product(
                    config.splits, config.embeddings, config.hubness, config.rs, config.ks
                ):
                    at = {}
                    for level in (base, core):
                        cells = {
                            n: self.cell(
                                variant=variant,
                                recommender=n,
                                r=r,
                                k=k,
                                split=split,
                                hubness=method,
                                core=level,
                            )
                            for n in config.recommender_names
                        }
                        at[level] = {
                            n: None if c[metric] is None else (c[metric], c[low], c[high])
                            for n, c in cells.items()
                        }
                    found = flips(at[base], at[core])
                    if found:
                        out.append(
                            {
                                "metric": metric,
                                "split": split,
                                "variant": variant,
                                "hubness": method,
                                "r": str(r),
                                "k": k,
                                "from_core": base,
                                "to_core": core,
                                "ranking": {
                                    str(level): ranking({n: e and e[0] for n, e in at[level].items()})
                                    for level in (base, core)
                                },
                                "flips": [
                                    {"above": f.above, "below": f.below, "clear": f.clear} for f in found
                                ],
                            }
                        )
        return out

    def value(self, variant: str, r: int, k: int, recommender: str = "mowe") -> float | None:
        """The pooled mean #REval-hit-ratio of a cell (first split, first hubness method)."""
        value: float | None = self.cell(variant=variant, recommender=recommender, r=r, k=k)["reval_hit_ratio"]
        return value

    @property
    def rows(self) -> list[dict[str, Any]]:
        """``results.json``'s ``results``: the paper's table -- the default recommender (mowe),
        first split and hubness method, seeds pooled."""
        main = self.config.recommender_names[0]
        return [
            {
                "variant": c["variant"],
                "r": int(c["r"]),
                "k": c["k"],
                "reval_hit_ratio": c["reval_hit_ratio"],
                "events": c["events"],
                "unscorable": c["unscorable"],
            }
            for c in self.cells
            if c["recommender"] == main
            and c["core"] == self.config.cores[0]
            and c["seed"] == "all"
            and c["split"] == self.config.splits[0]
            and c["hubness"] == self.config.hubness[0]
        ]

    def results_json(self) -> dict[str, Any]:
        main = self.config.recommender_names[0]
        first = self.config.embeddings[0]
        exact = {
            str(r): {"hit_ratio": self.cell(variant=first, recommender=main, r=r, k=0)["exact_hit_ratio"]}
            for r in self.config.rs
        }
        return {
            "config": self.config.to_json(),
            "feeds": self.feeds,
            "data": self.data,
            "recommender": {
                "method": main,
                "thresholds": list(self.config.mowe_thresholds),
                "word2vec": {
                    "vector_size": self.config.vector_size,
                    "window": self.config.window,
                    "min_count": 1,
                    "epochs": self.config.epochs,
                    "seeds": list(self.config.seeds),
                },
            },
            "thesauri": self.thesauri,
            "results": self.rows,
            "exact": exact,
            "synonyms": self.synonyms,
            "hubs": {key: [[h, n] for h, n in hubs] for key, hubs in self.hubs.items()},
            "cells": self.cells,
            "differences": self.differences,
            "core_flips": self.core_flips(),
        }


def run_experiment(
    feeds: Sequence[str | Path],
    config: ExperimentConfig | None = None,
    *,
    progress: ProgressFactory = no_progress,
) -> Experiment:
    """Run the experiment on ``feeds``; see the module docstring."""
    config = config or ExperimentConfig()
    timings: dict[str, float] = {}
    started = time.perf_counter()
    with _timed(timings, "read_and_clean"):
        corpus = load_corpus(
            read_tweets(feeds), limit=config.limit, language_filter=config.language_filter, progress=progress
        )
    if len(corpus.prepared) < 2:
        raise ValueError(f"only {len(corpus.prepared)} tweets left after pre-processing: nothing to split")
    bertag = None
    if "bertag" in config.embeddings:
        with _timed(timings, "embed_bertag"):  # once per run, reused by every split and seed
            bertag = bertag_vectors(
                corpus.prepared,
                config.model,
                dtype=config.dtype,
                batch_size=config.batch_size,
                progress=progress,
            )
    cells: list[dict[str, Any]] = []
    differences: list[dict[str, Any]] = []
    cores: dict[int, dict[str, Any]] = {}
    for level in config.cores:  # every cell again on each p-core (paper 002)
        prepared, where = at_core(corpus.prepared, level)
        if len(prepared) < 2:
            raise ValueError(
                f"the {level}-core holds {len(prepared)} tweets: nothing to split (lower --cores)"
            )
        vectors = None if bertag is None else (bertag[0][where], bertag[1])
        runs = [
            run_split(config, split, seed, prepared, vectors, timings, progress)
            for split in config.splits
            for seed in config.seeds
        ]
        with _timed(timings, "bootstrap"):
            cells += [{"core": level, **c} for c in summarise(config, runs)]
            differences += [{"core": level, **d} for d in compare(config, runs)]
        cores[level] = {"tweets": len(prepared), "hashtags": len({h for x in prepared for h in x.hashtags})}
        if level == config.cores[0]:  # the outputs beside the cells describe the first core
            base_runs = runs
    first = base_runs[0]
    popularity = Counter(h for p in first.train for h in p.hashtags)
    top = sorted(popularity.items(), key=lambda kv: (-kv[1], kv[0]))[: config.top_hashtags]
    thesauri_info: dict[str, dict[str, Any]] = {}
    synonyms: dict[str, dict[str, list[str]]] = {}
    hubs: dict[str, list[tuple[str, int]]] = {}
    for (variant, method), th in first.thesauri.items():
        key = f"{variant}/{method}"
        report = th.metadata.hubness or {}
        thesauri_info[key] = {
            "label": variant_label(variant, config.model),
            "variant": variant,
            "hubness_method": method,
            "model_id": th.metadata.model_id,
            "hashtags": len(th),
            "version": th.version,
            "hubness": report,
        }
        synonyms[key] = {h: th.neighbours(h, config.n_synonyms) for h, _ in top}
        hubs[key] = [(str(h), int(n)) for h, n in report.get("hubs", [])]
    main = config.recommender_names[0]
    events = [
        recommendation_event(p.tweet, recs, main, with_truth=True)
        for p, recs in zip(first.test, first.recommended[main], strict=True)
    ]
    test_tags = [h for p in first.test for h in p.tweet.hashtags]
    data = {
        "lines_read": corpus.lines_read,
        "bad_lines": corpus.errors.total,
        "dropped": dict(sorted(corpus.dropped.items())),
        "tweets_kept": len(corpus.prepared),
        "splits": {
            f"{run.split}/{run.seed}": {
                "train_tweets": len(run.train),
                "test_tweets": len(run.test),
                "train_period": _period(run.train),
                "test_period": _period(run.test),
                "empty_recommendations": {
                    n: sum(1 for x in lists if not x) for n, lists in run.recommended.items()
                },
                "similar_training_tweets_median": run.similar_median,
            }
            for run in base_runs
        },
        "train_tweets": len(first.train),
        "test_tweets": len(first.test),
        "train_hashtags": len(popularity),
        "test_hashtag_uses": len(test_tags),
        "test_hashtag_uses_seen_in_training": sum(1 for h in test_tags if h in popularity),
        "cores": {str(level): info for level, info in cores.items()},
    }
    timings["total"] = round(time.perf_counter() - started, 2)
    return Experiment(
        config=config,
        feeds=[str(f) for f in feeds],
        data=data,
        cells=cells,
        differences=differences,
        thesauri=thesauri_info,
        labels={v: variant_label(v, config.model) for v in config.embeddings},
        synonyms=synonyms,
        hubs=hubs,
        top_hashtags=top,
        events=events,
        timings=timings,
        built={f"{variant}-{method}": th for (variant, method), th in first.thesauri.items()},
    )


def _period(prepared: Sequence[Prepared]) -> list[str | None]:
    times = [p.tweet.created_at for p in prepared if p.tweet.created_at is not None]
    return [min(times).isoformat(), max(times).isoformat()] if times else [None, None]


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
            variant, method, name = key
            for j, r in enumerate(rs):
                for i, k in enumerate(ks):
                    e, c = raw[j * len(ks) + i], corrected[j * len(ks) + i]
                    cells.append(
                        {
                            "split": split,
                            "seed": seed,
                            "variant": variant,
                            "hubness": method,
                            "recommender": name,
                            "r": str(r),
                            "k": k,
                            "reval_hit_ratio": e.mean,
                            "ci_low": e.low,
                            "ci_high": e.high,
                            "reval_hit_ratio_corrected": c.mean,
                            "corrected_ci_low": c.low,
                            "corrected_ci_high": c.high,
                            # null: no null model, or no room above chance in this cell
                            "corrected_null_reason": None
                            if c.mean is not None
                            else "no_room"
                            if np.any(~np.isnan(scored.expected[:, j * len(ks) + i]))
                            else "no_null_model",
                            "exact_hit_ratio": exact[j].mean,
                            "reval_hit_ratio_ranked": ranked[j * len(ks) + i].mean,
                            "events": e.events,
                            "unscorable": e.unscorable,
                        }
                    )
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


# --------------------------------------------------------------------------- outputs


RESULT_FILES = frozenset(
    {
        "results.json",
        "results.csv",
        "recommendations.jsonl",
        "synonyms.md",
        "curves.png",
        "timings.json",
        "cores.md",
        "thesauri",
    }
)


def check_results_dir(
    out: Path, *, replace: bool, files: frozenset[str] = RESULT_FILES, command: str = "reval evaluate"
) -> None:
    """Refuse to write results anywhere but a new or empty directory, or -- with
    ``replace`` -- one holding only ``files`` of an earlier run (never the user's files)."""
    if not out.exists() and not out.is_symlink():
        check_output_path(out)
        return
    if not out.is_dir():
        raise ValueError(f"{out} exists and is not a directory")
    present = {p.name for p in out.iterdir()}
    foreign = sorted(present - files)
    if foreign:
        raise ValueError(
            f"{out} holds files not written by {command} ({', '.join(foreign[:3])}): "
            "refusing to write there (choose a new directory)"
        )
    if present and not replace:
        raise ValueError(f"{out} already holds results: pass --force to replace them")


def write_outputs(experiment: Experiment, out_dir: str | Path, *, save_thesauri: bool = False) -> Path:
    """Write results.json/.csv, curves.png, synonyms.md, recommendations.jsonl, timings.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(
        json.dumps(experiment.results_json(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    columns = [
        "core",
        "split",
        "seed",
        "variant",
        "hubness",
        "recommender",
        "r",
        "k",
        "reval_hit_ratio",
        "ci_low",
        "ci_high",
        "reval_hit_ratio_corrected",
        "corrected_ci_low",
        "corrected_ci_high",
        "corrected_null_reason",
        "exact_hit_ratio",
        "reval_hit_ratio_ranked",
        "events",
        "unscorable",
    ]
    with open(out / "results.csv", "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        for cell in experiment.cells:
            writer.writerow(
                [
                    "" if cell[c] is None else (f"{cell[c]:.6f}" if isinstance(cell[c], float) else cell[c])
                    for c in columns
                ]
            )
    with open(out / "recommendations.jsonl", "w", encoding="utf-8") as fh:
        for event in experiment.events:
            fh.write(json.dumps(event, ensure_ascii=False) + "\n")
    (out / "synonyms.md").write_text(synonyms_markdown(experiment), encoding="utf-8")
    if len(experiment.config.cores) > 1:
        (out / "cores.md").write_text(cores_markdown(experiment), encoding="utf-8")
    plot_curves(experiment, out / "curves.png")
    (out / "timings.json").write_text(json.dumps(experiment.timings, indent=2) + "\n", encoding="utf-8")
    if save_thesauri:
        for name, thesaurus in experiment.built.items():
            thesaurus.save(out / "thesauri" / name, replace=True)
    return out


def cores_markdown(experiment: Experiment) -> str:
    """Where the ranking of recommenders flips from the first p-core to the others."""
    config, found = experiment.config, experiment.core_flips()
    sizes = experiment.data["cores"]
    lines = [
        "# The ranking of recommenders on p-cores (paper 002)",
        "",
        "The p-core keeps each hashtag used in at least p kept tweets, each tweet with at least one "
        "kept hashtag (its ground truth: the hashtags it kept), each user with at least p kept tweets "
        "where the feed names users; every cell is recomputed on it (seeds pooled). A flip is a pair "
        "of recommenders in the opposite order by mean; *clear*: on both cores the two 95% intervals "
        "are apart.",
        "",
        "| core | tweets | hashtags |",
        "|---:|---:|---:|",
        *(f"| {level} | {info['tweets']:,} | {info['hashtags']:,} |" for level, info in sizes.items()),
        "",
    ]
    if not found:
        return "\n".join([*lines, f"The ranking never flips against the {config.cores[0]}-core.", ""])
    clear = sum(1 for f in found for pair in f["flips"] if pair["clear"])
    lines += [
        f"{len(found)} cells flip ({clear} clear pair flips); rankings best first.",
        "",
        "| metric | embedding, hubness | r | k | cores | ranking before | ranking after | flips |",
        "|---|---|---:|---:|---|---|---|---|",
    ]
    for f in found:
        before, after = (f["ranking"][str(f[key])] for key in ("from_core", "to_core"))
        pairs = ", ".join(
            f"{p['above']} > {p['below']}" + (" (clear)" if p["clear"] else "") for p in f["flips"]
        )
        metric = "corrected" if f["metric"] == "reval_hit_ratio_corrected" else "#REval"
        split = f", {f['split']} split" if len(config.splits) > 1 else ""
        lines.append(
            f"| {metric}{split} | {f['variant']}, {f['hubness']} | {f['r']} | {f['k']} | "
            f"{f['from_core']} → {f['to_core']} | {', '.join(before)} | {', '.join(after)} | {pairs} |"
        )
    return "\n".join(lines) + "\n"


def synonyms_markdown(experiment: Experiment) -> str:
    """The paper's Table 5 for the most used training hashtags, and each thesaurus's hubs."""
    n = experiment.config.n_synonyms
    keys = list(experiment.synonyms)
    lines = [
        f"# The {n} nearest synonyms of the {len(experiment.top_hashtags)} most used training hashtags",
        "",
        f"First split and seed ({experiment.config.splits[0]}, {experiment.config.seeds[0]}).",
        "",
        "| Hashtag (training tweets) | " + " | ".join(_key_label(experiment, k) for k in keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    for tag, count in experiment.top_hashtags:
        cells = [", ".join(f"#{s}" for s in experiment.synonyms[k][tag]) for k in keys]
        lines.append(f"| #{tag} ({count}) | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Hubs: the hashtags among the 10 nearest of the most others (N_10)",
        "",
        "| thesaurus | skewness of N_10 | largest N_10 (share) | lists reaching a top-10 hub | top hubs |",
        "|---|---:|---:|---:|---|",
    ]
    for key in keys:
        report = experiment.thesauri[key]["hubness"]
        hubs = ", ".join(f"#{h} ({c})" for h, c in experiment.hubs[key][:10])
        lines.append(
            f"| {_key_label(experiment, key)} | {report['skewness']:.2f} | {report['max']} "
            f"({100 * report['max_share']:.1f}%) | {100 * report['share_with_hub']:.1f}% | {hubs} |"
        )
    return "\n".join(lines) + "\n"


def _key_label(experiment: Experiment, key: str) -> str:
    info = experiment.thesauri[key]
    return f"{info['label']}, {info['hubness_method']}"


_STYLE = {"bertag": ("tab:blue", "o"), "word2vec": ("tab:green", "s"), "fasttext": ("tab:orange", "^")}
_BASELINE_STYLE = {"popular": ("black", "-"), "least-popular": ("tab:red", ":"), "random": ("tab:gray", "--")}


def _series(
    experiment: Experiment, variant: str, recommender: str, r: int, fields: tuple[str, str, str]
) -> list[list[float]]:
    """The mean, low and high of a curve over k (NaN where unscorable)."""
    cells = [
        experiment.cell(variant=variant, recommender=recommender, r=r, k=k) for k in experiment.config.ks
    ]
    return [[np.nan if c[name] is None else c[name] for c in cells] for name in fields]


def plot_curves(experiment: Experiment, path: str | Path) -> None:
    """#REval-hit-ratio (top row) and its chance-corrected value (bottom row) against k,
    one panel per r: the main recommender per embedding with 95% bands, and on the first
    embedding the baselines -- popular, the least-popular canary, the random null."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    config = experiment.config
    rs, ks = list(config.rs), list(config.ks)
    main = config.recommender_names[0]
    fig, axes = plt.subplots(2, len(rs), figsize=(4.4 * len(rs), 7.2), sharex=True, squeeze=False)
    for row, (metric, low, high) in enumerate(
        (
            ("reval_hit_ratio", "ci_low", "ci_high"),
            ("reval_hit_ratio_corrected", "corrected_ci_low", "corrected_ci_high"),
        )
    ):
        for ax, r in zip(axes[row], rs, strict=True):
            fields = (metric, low, high)
            for variant in config.embeddings:
                colour, marker = _STYLE[variant]
                ys, lo, hi = _series(experiment, variant, main, r, fields)
                ax.plot(ks, ys, marker=marker, color=colour, label=f"{main}, {experiment.labels[variant]}")
                ax.fill_between(ks, lo, hi, color=colour, alpha=0.15, linewidth=0)
            first = config.embeddings[0]
            for name in config.recommender_names[1:]:
                colour, style = _BASELINE_STYLE.get(name, ("tab:purple", "-."))
                ys, lo, hi = _series(experiment, first, name, r, fields)
                ax.plot(ks, ys, linestyle=style, color=colour, label=f"{name}, {experiment.labels[first]}")
                ax.fill_between(ks, lo, hi, color=colour, alpha=0.08, linewidth=0)
            if row == 1:
                ax.axhline(0.0, color="tab:gray", linewidth=0.8)
                ax.set_xlabel("k (number of synonyms)")
            ax.set_title(f"top-{r} recommendations")
            ax.set_xticks(ks)
            ax.grid(alpha=0.3)
        axes[row][0].set_ylabel("#REval-hit-ratio" if row == 0 else "chance-corrected #REval")
    axes[0][-1].legend(loc="upper left", fontsize="x-small")
    d = experiment.data
    fig.suptitle(
        f"{config.splits[0]} split, seeds {', '.join(map(str, config.seeds))} pooled, hubness "
        f"{config.hubness[0]}: {d['train_tweets']:,} training / {d['test_tweets']:,} test tweets per seed; "
        "bands: 95% bootstrap",
        fontsize="medium",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


__all__ = ["DEFAULT_METHOD", "Experiment", "run_experiment", "write_outputs"]
