"""The paper's experiment (section 4.2), rerun on any feed: ``reval evaluate``.

1. Pre-process the feed with the core (:class:`stream.cleaning.Cleaner`: hashtagged,
   English, duplicate retweets removed) and split it 90/10 into training and
   test tweets (``time``: the earliest 90% train; ``random``: a seeded shuffle).
2. Train the MOWE recommender (:class:`stream.recommenders.MoweRecommender`) on the
   training tweets and recommend the top max(r) hashtags for each test tweet,
   whose own hashtags it never sees; they are the ground truth.
3. Build one thesaurus per embedding variant from the *training* tweets:

   * ``bertag``: the core path -- clean -> :class:`workers.adapters.encoder.Encoder` ->
     :class:`stream.means.HashtagMeans` -> :class:`workers.adapters.store.AnnoyThesaurus`;
   * ``word2vec`` / ``fasttext``: gensim (window 2, min_count 1, 30 epochs) on the
     same cleaned text; a tweet is the unit mean of its word vectors (MOWE) and a
     hashtag the unit mean of its tweets, exactly as BERTag averages tweets, so
     the variants differ only in the tweet embedding.  The Word2Vec model is the
     recommender's own (same data, same settings).

4. Score every (variant, r, k) with :func:`stream.scoring.score_event` and
   :class:`stream.scoring.Summary` -- the code path of ``reval score`` and the
   scoring worker -- and write ``results.json``, ``results.csv``, ``curves.png``
   (the paper's Figure 3), ``synonyms.md`` (its Table 5), the scored
   ``recommendations.jsonl`` (``reval score`` input) and ``timings.json``.

Everything that depends on chance takes the seed (the split, gensim with one
worker and a process-independent word hash, Annoy), so ``results.json`` is the
same for the same feed, options and seed.  Timings live in ``timings.json``.
"""

from __future__ import annotations

import csv
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from stream.cleaning import Prepared
from stream.experiment import (
    ExperimentConfig,
    ProgressFactory,
    hashtag_means,
    labelled,
    load_corpus,
    no_progress,
    split_corpus,
)
from stream.recommenders import MoweRecommender, mean_vectors, recommendation_event
from stream.records import Recommendation
from stream.scoring import Summary, r_label, score_event
from workers.adapters.encoder import Encoder
from workers.adapters.feeds import read_tweets
from workers.adapters.store import AnnoyThesaurus, build_from_means, neighbour_cache
from workers.adapters.word_vectors import train_word_vectors


def bertag_vectors(
    prepared: Sequence[Prepared],
    model: str,
    *,
    dtype: str = "float32",
    batch_size: int = 32,
    chunk: int = 512,
    progress: ProgressFactory = no_progress,
) -> tuple[npt.NDArray[np.float32], str]:
    """Tweet embeddings of the cleaned texts with the core :class:`~workers.adapters.encoder.Encoder`."""
    encoder = Encoder(model, dtype=dtype, batch_size=batch_size)
    out = np.zeros((len(prepared), encoder.dim), dtype=np.float32)
    advance = progress(f"embedding ({Path(model).name or model})", len(prepared))
    for start in range(0, len(prepared), chunk):
        block = prepared[start : start + chunk]
        out[start : start + len(block)] = encoder.encode([p.text for p in block])
        advance(len(block))
    return out, encoder.model_id


class _EpochTicker:
    """A gensim callback that advances a progress bar once per epoch."""

    def __init__(self, advance: Callable[[int], None]) -> None:
        self.advance = advance

    def on_epoch_end(self, model: Any) -> None:
        self.advance(1)

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("on_"):  # on_train_begin, on_epoch_begin, ... do nothing
            return lambda *args, **kwargs: None
        raise AttributeError(name)


# --------------------------------------------------------------------------- experiment


@dataclass
class Experiment:
    """Everything a run produced (what :func:`write_outputs` writes)."""

    config: ExperimentConfig
    feeds: list[str]
    data: dict[str, Any]
    rows: list[dict[str, Any]]
    exact: dict[str, dict[str, float | None]]
    thesauri: dict[str, AnnoyThesaurus]
    labels: dict[str, str]
    synonyms: dict[str, dict[str, list[str]]]
    top_hashtags: list[tuple[str, int]]
    events: list[dict[str, Any]]
    timings: dict[str, float]

    def value(self, variant: str, r: int, k: int) -> float | None:
        for row in self.rows:
            if (row["variant"], row["r"], row["k"]) == (variant, r, k):
                value: float | None = row["reval_hit_ratio"]
                return value
        raise KeyError((variant, r, k))

    def results_json(self) -> dict[str, Any]:
        return {
            "config": self.config.to_json(),
            "feeds": self.feeds,
            "data": self.data,
            "recommender": {"method": "mowe", "threshold": self.config.threshold,
                            "word2vec": {"vector_size": self.config.vector_size,
                                         "window": self.config.window, "min_count": 1,
                                         "epochs": self.config.epochs, "seed": self.config.seed}},
            "thesauri": {
                v: {"label": self.labels[v], "model_id": th.metadata.model_id,
                    "hashtags": len(th), "version": th.version}
                for v, th in self.thesauri.items()
            },
            "results": self.rows,
            "exact": self.exact,
            "synonyms": self.synonyms,
        }


@contextmanager
def _timed(timings: dict[str, float], name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = round(time.perf_counter() - started, 2)


def variant_label(variant: str, model: str) -> str:
    if variant == "bertag":
        return f"BERTag ({Path(model).name or model})"
    return {"word2vec": "Word2Vec", "fasttext": "FastText"}[variant]


def run_experiment(
    feeds: Sequence[str | Path],
    config: ExperimentConfig | None = None,
    *,
    progress: ProgressFactory = no_progress,
) -> Experiment:
    """Run the paper's experiment (4.2) on ``feeds``; see the module docstring."""
    config = config or ExperimentConfig()
    timings: dict[str, float] = {}
    started = time.perf_counter()

    with _timed(timings, "read_and_clean"):
        corpus = load_corpus(
            read_tweets(feeds), limit=config.limit, language_filter=config.language_filter, progress=progress
        )
    train, test = split_corpus(
        corpus.prepared, config.split, seed=config.seed, train_fraction=config.train_fraction
    )
    train_tweets = [labelled(p) for p in train]
    train_docs = [p.text.split() for p in train]
    gensim_kw: dict[str, Any] = {
        "vector_size": config.vector_size, "window": config.window, "min_count": 1,
        "epochs": config.epochs, "seed": config.seed, "workers": 1,
    }

    # The recommender (its Word2Vec is also the word2vec variant's).
    with _timed(timings, "train_word2vec"):
        tick = progress("training Word2Vec (epochs)", config.epochs)
        w2v = train_word_vectors(train_docs, "word2vec", callbacks=[_EpochTicker(tick)], **gensim_kw)
    with _timed(timings, "recommend"):
        recommender = MoweRecommender(threshold=config.threshold, word_vectors=w2v).fit(train_tweets)
        advance = progress("recommending (MOWE)", len(test))
        recommended = recommender.recommend_many(
            [p.tweet for p in test], max(config.rs), progress=advance
        )
    events = [
        recommendation_event(p.tweet, recs, "mowe", with_truth=True)
        for p, recs in zip(test, recommended, strict=True)
    ]

    thesauri: dict[str, AnnoyThesaurus] = {}
    for variant in config.embeddings:
        with _timed(timings, f"thesaurus_{variant}"):
            if variant == "bertag":
                vectors, model_id = bertag_vectors(
                    train, config.model, dtype=config.dtype, batch_size=config.batch_size,
                    progress=progress,
                )
            else:
                if variant == "word2vec":
                    word_vectors = w2v
                else:
                    tick = progress("training FastText (epochs)", config.epochs)
                    word_vectors = train_word_vectors(
                        train_docs, "fasttext", bucket=config.fasttext_bucket,
                        callbacks=[_EpochTicker(tick)], **gensim_kw,
                    )
                vectors, model_id = mean_vectors(train_docs, word_vectors), variant
            built = build_from_means(
                hashtag_means(train, vectors), model_id=model_id, n_trees=config.n_trees, seed=config.seed
            )
            if built is None:
                raise ValueError(f"no hashtag of the training tweets has a {variant} embedding")
            thesauri[variant] = built

    # Score: the code path of `reval score` and the scoring worker.
    ks, rs = list(config.ks), list(config.rs)
    rows: list[dict[str, Any]] = []
    summaries: dict[str, Summary] = {}
    with _timed(timings, "score"):
        parsed = [
            Recommendation(
                tweet_id=p.tweet.id, recommended=tuple(recs), ground_truth=p.tweet.hashtags,
                recommender="mowe", ts=p.tweet.created_at,
            )
            for p, recs in zip(test, recommended, strict=True)
        ]
        for variant, thesaurus in thesauri.items():
            cache = neighbour_cache(thesaurus, max(ks))
            summary = Summary()
            advance = progress(f"scoring ({variant})", len(parsed))
            for event in parsed:
                assert event.ground_truth is not None
                summary.update(score_event(event, event.ground_truth, cache, ks, rs))
                advance(1)
            summaries[variant] = summary
            for r in rs:
                by_k = summary.get(r)["by_k"]
                for k in ks:
                    rows.append({
                        "variant": variant, "r": r, "k": k,
                        "reval_hit_ratio": by_k[str(k)]["reval_hit_ratio"] if str(k) in by_k else None,
                        "events": summary.events, "unscorable": summary.unscorable,
                    })
    first = summaries[config.embeddings[0]]
    exact = {r_label(r): first.get(r)["exact"] for r in rs}

    popularity = Counter(h for p in train for h in p.hashtags)
    top = sorted(popularity.items(), key=lambda kv: (-kv[1], kv[0]))[: config.top_hashtags]
    synonyms = {
        variant: {h: th.neighbours(h, config.n_synonyms) for h, _ in top}
        for variant, th in thesauri.items()
    }
    test_tags = [h for p in test for h in p.tweet.hashtags]
    data = {
        "lines_read": corpus.lines_read,
        "bad_lines": corpus.errors.total,
        "dropped": dict(sorted(corpus.dropped.items())),
        "tweets_kept": len(corpus.prepared),
        "train_tweets": len(train),
        "test_tweets": len(test),
        "train_hashtags": len(popularity),
        "test_hashtag_uses": len(test_tags),
        "test_hashtag_uses_seen_in_training": sum(1 for h in test_tags if h in popularity),
        "train_period": _period(train),
        "test_period": _period(test),
        "empty_recommendations": sum(1 for recs in recommended if not recs),
        "training_tweets_indexed": recommender.n_indexed,
        "similar_training_tweets_median": (
            float(np.median(recommender.last_similar_counts)) if test else None
        ),
    }
    timings["total"] = round(time.perf_counter() - started, 2)
    return Experiment(
        config=config,
        feeds=[str(f) for f in feeds],
        data=data,
        rows=rows,
        exact=exact,
        thesauri=thesauri,
        labels={v: variant_label(v, config.model) for v in thesauri},
        synonyms=synonyms,
        top_hashtags=top,
        events=events,
        timings=timings,
    )


def _period(prepared: Sequence[Prepared]) -> list[str | None]:
    times = [p.tweet.created_at for p in prepared if p.tweet.created_at is not None]
    if not times:
        return [None, None]
    return [min(times).isoformat(), max(times).isoformat()]


# --------------------------------------------------------------------------- outputs


def write_outputs(experiment: Experiment, out_dir: str | Path, *, save_thesauri: bool = False) -> Path:
    """Write results.json/.csv, curves.png, synonyms.md, recommendations.jsonl, timings.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(
        json.dumps(experiment.results_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    with open(out / "results.csv", "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["variant", "r", "k", "reval_hit_ratio", "events", "unscorable"])
        for row in experiment.rows:
            value = row["reval_hit_ratio"]
            writer.writerow([row["variant"], row["r"], row["k"],
                             "" if value is None else f"{value:.6f}",
                             row["events"], row["unscorable"]])
    with open(out / "recommendations.jsonl", "w", encoding="utf-8") as fh:
        for event in experiment.events:
            fh.write(json.dumps(event, ensure_ascii=False) + "\n")
    (out / "synonyms.md").write_text(synonyms_markdown(experiment), encoding="utf-8")
    plot_curves(experiment, out / "curves.png")
    (out / "timings.json").write_text(json.dumps(experiment.timings, indent=2) + "\n", encoding="utf-8")
    if save_thesauri:
        for variant, thesaurus in experiment.thesauri.items():
            thesaurus.save(out / "thesauri" / variant)
    return out


def synonyms_markdown(experiment: Experiment) -> str:
    """The paper's Table 5 for the most used training hashtags."""
    n = experiment.config.n_synonyms
    variants = list(experiment.thesauri)
    lines = [
        f"# The {n} nearest synonyms of the {len(experiment.top_hashtags)} most used "
        "training hashtags",
        "",
        "| Hashtag (training tweets) | " + " | ".join(experiment.labels[v] for v in variants) + " |",
        "|---|" + "---|" * len(variants),
    ]
    for tag, count in experiment.top_hashtags:
        cells = [", ".join(f"#{s}" for s in experiment.synonyms[v][tag]) for v in variants]
        lines.append(f"| #{tag} ({count}) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


_COLOURS = {"bertag": "tab:blue", "word2vec": "tab:green", "fasttext": "tab:orange"}
_MARKERS = {"bertag": "o", "word2vec": "s", "fasttext": "^"}


def plot_curves(experiment: Experiment, path: str | Path) -> None:
    """Average #REval-hit-ratio against k: one panel per r, one line per embedding."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs, ks = list(experiment.config.rs), list(experiment.config.ks)
    fig, axes = plt.subplots(1, len(rs), figsize=(4.2 * len(rs), 3.8), sharey=True, squeeze=False)
    for ax, r in zip(axes[0], rs, strict=True):
        for variant in experiment.thesauri:
            ys = [experiment.value(variant, r, k) for k in ks]
            ax.plot(ks, [np.nan if y is None else y for y in ys], marker=_MARKERS[variant],
                    color=_COLOURS[variant], label=experiment.labels[variant])
        ax.set_title(f"top-{r} recommendations")
        ax.set_xlabel("k (number of synonyms)")
        ax.set_xticks(ks)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("average #REval-hit-ratio")
    axes[0][0].set_ylim(bottom=0)
    axes[0][-1].legend(loc="lower right", fontsize="small")
    d = experiment.data
    fig.suptitle(
        f"MOWE recommender, {experiment.config.split} split: {d['train_tweets']:,} training / "
        f"{d['test_tweets']:,} test tweets", fontsize="medium",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
