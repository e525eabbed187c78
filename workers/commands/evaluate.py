"""``reval evaluate``: the paper's experiment (section 4.2), with baselines, seeds and
confidence intervals, on any feed.

1. Pre-process the feed with the core (:class:`stream.intake.cleaning.Cleaner`: hashtagged,
   English, duplicate retweets removed) and embed every kept tweet once (BERTag).
2. For each split (``time``: the earliest 90% train; ``random``: a seeded shuffle) and
   seed: train Word2Vec (the MOWE recommender's, and the ``word2vec`` variant's) and
   FastText on the training tweets; recommend the top max(r) hashtags for every test
   tweet with each recommender -- ``mowe`` (:class:`stream.evaluation.recommenders.MoweRecommender`,
   at each threshold), ``popular``, ``least-popular`` (the canary) and ``random`` (the
   null of the chance correction) -- which never sees the test tweet's hashtags: they
   are the ground truth.
3. Build one thesaurus per embedding variant (``bertag``: the core path, mean BERTag
   embedding per hashtag; ``word2vec`` / ``fasttext``: the unit mean of the tweets' MOWE
   vectors, so the variants differ only in the tweet embedding) from the *training*
   tweets, with each hubness method (:mod:`stream.synonyms.hubness`), through the one builder
   the CLI and the index job use (:func:`workers.adapters.files.annoy_thesaurus.build_from_means`).
4. Score every event with :func:`stream.evaluation.scoring.score_batch` -- the code path of ``reval
   score`` and the scoring worker -- raw, chance-corrected and rank-aware
   (:mod:`stream.evaluation.rank`; mean only, column ``reval_hit_ratio_ranked``), for every (r, k).
5. Means with percentile-bootstrap 95% intervals (events resampled; pooled seeds
   resampled within each seed), and paired differences between recommenders and
   between embeddings on the same resamples.  The chance-corrected score of a cell is
   the kappa of its sums, ``(sum observed - sum expected) / (events - sum expected)``
   (:func:`stream.evaluation.experiment.bootstrap_kappas`), recomputed on each resample.

Outputs (:mod:`workers.commands.evaluate_outputs`): ``results.json`` (with ``cells``),
``results.csv``, ``curves.png``, ``synonyms.md``, ``recommendations.jsonl``, ``timings.json``;
the cells and differences of step 5 are :mod:`workers.commands.evaluate_summary`.  Everything that depends
on chance takes the seeds, so ``results.json`` is the same for the same feed and options.
"""

from __future__ import annotations

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

from stream.evaluation.cores import flips, ranking
from stream.evaluation.experiment import (
    Corpus,
    ExperimentConfig,
    ProgressFactory,
    at_core,
    hashtag_means,
    labelled,
    load_corpus,
    mowe_label,
    no_progress,
    split_corpus,
)
from stream.evaluation.metrics import ExactScores
from stream.evaluation.recommenders import (
    BaseRecommender,
    MoweRecommender,
    make_recommender,
    mean_vectors,
    recommendation_event,
)
from stream.evaluation.scoring import r_label, score_batch
from stream.intake.cleaning import Prepared
from stream.intake.records import Recommendation
from workers.adapters.encoding.word_vectors import train_word_vectors
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus, build_from_means, neighbour_cache
from workers.adapters.files.feeds import read_tweets
from workers.commands.evaluate_summary import Run, Scored, compare, summarise

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
    """Tweet embeddings of the cleaned texts with :class:`~workers.adapters.encoding.encoder.Encoder`."""
    from workers.adapters.encoding.encoder import Encoder  # torch: seconds to import, after the checks

    encoder = Encoder(model, dtype=dtype, batch_size=batch_size)
    out = np.zeros((len(prepared), encoder.dim), dtype=np.float32)
    advance = progress(f"embedding ({Path(model).name or model})", len(prepared))
    for start in range(0, len(prepared), chunk):
        block = prepared[start : start + chunk]
        out[start : start + len(block)] = encoder.encode([p.text for p in block])
        advance(len(block))
    return out, encoder.model_id


# --------------------------------------------------------------------------- one split


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
    with _timed(timings, "recommend"):
        recommended, similar = _recommend(config, seed, w2v, train_tweets, test, tag, progress)
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


def _recommend(
    config: ExperimentConfig,
    seed: int,
    w2v: Any,
    train_tweets: list[Any],
    test: list[Prepared],
    tag: str,
    progress: ProgressFactory,
) -> tuple[dict[str, list[list[str]]], list[int]]:
    """Each recommender fitted and run on the test tweets: (its lists by name, MOWE's counts of
    similar training tweets)."""
    recommended: dict[str, list[list[str]]] = {}
    similar: list[int] = []
    for name, recommender in _recommenders(config, seed, w2v).items():
        advance = progress(f"recommending ({name}), {tag}", len(test))
        recommender.fit(train_tweets)
        recommended[name] = recommender.recommend_many(
            [p.tweet for p in test], max(config.rs), progress=advance
        )
        if isinstance(recommender, MoweRecommender) and name == "mowe":
            similar = recommender.last_similar_counts
    return recommended, similar


#: Events scored together (:func:`stream.evaluation.scoring.score_batch`).
SCORE_CHUNK = 1024


def _cells(
    values: npt.NDArray[np.float64], ok: npt.NDArray[np.bool_], r_at: list[int], k_at: list[int]
) -> npt.NDArray[np.float64]:
    """The (r, k) cells of the scorable rows of a batch's |B| x |r| x |k| array, r-major (the
    layout of :class:`workers.commands.evaluate_summary.Scored`)."""
    picked: npt.NDArray[np.float64] = values[ok][:, r_at][:, :, k_at].reshape(int(ok.sum()), -1)
    return picked


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
            events = [
                (Recommendation(p.tweet.id, tuple(recs), truths[i], name, p.tweet.created_at), truths[i])
                for i, (p, recs) in enumerate(zip(run.test, lists, strict=True))
            ]
            for lo in range(0, len(events), SCORE_CHUNK):
                batch = score_batch(events[lo : lo + SCORE_CHUNK], cache, ks, rs)
                ok = batch.scorable
                rows = np.arange(lo, lo + len(batch))[ok]
                r_at = [batch.rs.index(r_label(r)) for r in rs]
                k_at = [batch.ks.index(k) for k in ks]
                raw[rows] = _cells(batch.values["reval_hit_ratio"], ok, r_at, k_at)
                if batch.expected is not None:
                    expected[rows] = _cells(batch.expected, ok, r_at, k_at)
                ranked[rows] = _cells(batch.values["reval_hit_ratio_ranked"], ok, r_at, k_at)
                exact[rows] = batch.exact[ok][:, r_at, ExactScores.NAMES.index("hit_ratio")]
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
        pooled), per metric, split, embedding, hubness, r and k (:func:`stream.evaluation.cores.flips`)."""
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
    thesauri_info, synonyms, hubs = _describe_thesauri(config, first, top)
    main = config.recommender_names[0]
    events = [
        recommendation_event(p.tweet, recs, main, with_truth=True)
        for p, recs in zip(first.test, first.recommended[main], strict=True)
    ]
    data = _data_summary(corpus, base_runs, popularity, cores)
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


def _describe_thesauri(
    config: ExperimentConfig, first: Run, top: list[tuple[str, int]]
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, list[str]]], dict[str, list[tuple[str, int]]]]:
    """Per thesaurus of the first run: what it is, the top hashtags' synonyms, its hubs."""
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
    return thesauri_info, synonyms, hubs


def _data_summary(
    corpus: Corpus, base_runs: list[Run], popularity: Counter[str], cores: dict[int, dict[str, Any]]
) -> dict[str, Any]:
    """What was read, kept and split (``results.json``'s ``data``)."""
    first = base_runs[0]
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
    return data


def _period(prepared: Sequence[Prepared]) -> list[str | None]:
    times = [p.tweet.created_at for p in prepared if p.tweet.created_at is not None]
    return [min(times).isoformat(), max(times).isoformat()] if times else [None, None]
