"""``reval thesaurus coherence``: are a thesaurus's synonym sets about one thing?

Paper 003's exhaustive coherence (:mod:`stream.auditing.coherence`) of the cluster "a hashtag's
tweets with its top-k synonyms' tweets", against the same with k random hashtags of
matched popularity, on the tweets of the given feeds: TF-IDF cosine and BERTScore F1 with
the thesaurus's own model.  Each hashtag's tweets are the bottom-k sample the live
reservoir keeps (``--per-hashtag``, as ``REVAL_COHERENCE_RESERVOIR``), so the numbers
match what the index job exports for the same tweets.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stream.auditing.audit import replay
from stream.auditing.coherence import (
    METRICS,
    BottomK,
    Pairing,
    bertscore_coherence,
    bottom_k,
    cluster_texts,
    coherence_lift,
    coherence_text,
    eligible,
    pair_clusters,
    score_pairings,
    tfidf_coherence,
)
from stream.feeds.batch import TokenEncoder
from stream.intake.cleaning import Cleaner, Dropped, Prepared
from stream.intake.records import ErrorLog
from stream.synonyms.thesaurus import Thesaurus
from workers.adapters.files.feeds import read_tweets
from workers.service.thesaurus_audit import latest_audit, version_agreement, version_coherence
from workers.settings import Settings

ProgressFactory = Callable[[str, int | None], Callable[[int], None]]


@dataclass(frozen=True)
class CoherenceConfig:
    k: int = 10
    min_tweets: int = 5
    sample: int = 200
    seed: int = 0
    per_hashtag: int = 20
    model: str | None = None  # default: the thesaurus's model
    resamples: int = 2000

    def check(self) -> CoherenceConfig:
        if self.k < 1:
            raise ValueError(f"-k must be at least 1, got {self.k}")
        if self.min_tweets < 2:
            raise ValueError(
                f"--min-tweets must be at least 2 (a cluster needs pairs), got {self.min_tweets}"
            )
        if self.sample < 1:
            raise ValueError(f"--sample must be at least 1, got {self.sample}")
        if self.per_hashtag < self.min_tweets:
            raise ValueError(
                f"--per-hashtag {self.per_hashtag} is below --min-tweets {self.min_tweets}: no hashtag "
                "could qualify"
            )
        return self


@dataclass
class FeedSample:
    """The feeds' tweets as coherence sees them: per-hashtag bottom-k samples of the
    hashtag-free cleaned texts, and every hashtag's tweet count (its popularity)."""

    samples: dict[str, list[str]]
    counts: dict[str, int]
    tweets: int
    errors: ErrorLog


def read_sample(feeds: Sequence[Path], per_hashtag: int, progress: Callable[[int], None]) -> FeedSample:
    """Clean the feeds as ``thesaurus build`` does and sample each hashtag's texts."""
    cleaner, errors = Cleaner(), ErrorLog()
    counts: Counter[str] = Counter()
    pairs: list[tuple[str, str]] = []
    tweets = 0
    for item in read_tweets(feeds):
        progress(1)
        if item.error is not None:
            errors.add(item)
            continue
        assert item.value is not None
        prepared = cleaner(item.value)
        if isinstance(prepared, Dropped):
            continue
        tweets += 1
        text = coherence_text(prepared.text)
        for tag in prepared.hashtags:
            counts[tag] += 1
            if text:
                pairs.append((tag, text))
    samples = bottom_k(pairs, per_hashtag)
    return FeedSample(samples, {h: counts[h] for h in samples}, tweets, errors)


def plan(sample: FeedSample, thesaurus: Thesaurus, config: CoherenceConfig) -> tuple[list[Pairing], int]:
    """The scored hashtags (a seeded sample of those with enough tweets that the thesaurus
    knows) paired with their synonyms and random hashtags; and how many were eligible."""
    rng = np.random.default_rng(config.seed)
    candidates = [h for h in eligible(sample.samples, config.min_tweets) if h in thesaurus]
    chosen = sorted(
        str(h) for h in rng.choice(candidates, min(config.sample, len(candidates)), replace=False)
    )
    return pair_clusters(chosen, thesaurus.neighbours, sample.counts, config.k, rng), len(candidates)


def token_scorer(
    encoder: TokenEncoder,
    pairings: Sequence[Pairing],
    samples: dict[str, list[str]],
    progress: ProgressFactory,
) -> Callable[[Sequence[str]], float]:
    """BERTScore coherence over the token embeddings of every text the clusters hold,
    each text encoded once."""
    texts = sorted(
        {
            t
            for p in pairings
            for tags in ((p.hashtag, *p.synonyms), (p.hashtag, *p.random))
            for t in cluster_texts(tags, samples)
        }
    )
    advance = progress("token embeddings", len(texts))
    done = [0]

    def tick(finished: int, _total: int) -> None:
        advance(finished - done[0])
        done[0] = finished

    vectors = encoder.encode_tokens(texts, progress=tick)
    by_text = dict(zip(texts, vectors, strict=True))
    return lambda cluster: bertscore_coherence([by_text[t] for t in cluster])


def run_coherence(
    feeds: Sequence[Path],
    thesaurus: Thesaurus,
    encoder: TokenEncoder,
    config: CoherenceConfig,
    progress: ProgressFactory,
) -> dict[str, Any]:
    """Everything ``--json`` prints (module docstring); ValueError when nothing qualifies."""
    sample = read_sample(feeds, config.per_hashtag, progress("reading + cleaning", None))
    pairings, eligible_count = plan(sample, thesaurus, config)
    if not pairings:
        raise ValueError(
            f"no hashtag to score: {eligible_count} hashtags of the thesaurus have at least "
            f"{config.min_tweets} tweets with text in the feeds, none with a synonym that has tweets "
            "(lower --min-tweets, or use feeds the thesaurus was built from)"
        )
    scorers = {
        "tfidf": tfidf_coherence,
        "bertscore": token_scorer(encoder, pairings, sample.samples, progress),
    }
    scores: dict[str, tuple[list[float], list[float]]] = {}
    metrics: dict[str, Any] = {}
    for name in METRICS:
        advance = progress(f"coherence ({name})", len(pairings))
        syn, rnd = [], []
        for p in pairings:
            s, r = score_pairings([p], sample.samples, scorers[name])
            syn.append(s[0])
            rnd.append(r[0])
            advance(1)
        scores[name] = (syn, rnd)
        lift = coherence_lift(syn, rnd, resamples=config.resamples, seed=config.seed)
        metrics[name] = None if lift is None else lift.to_dict()
    rows = [_row(p, i, scores, sample) for i, p in enumerate(pairings)]
    rows.sort(key=lambda row: (_key(row["bertscore"]["synonyms"]), _key(row["tfidf"]["synonyms"])))
    return {
        "metrics": metrics,
        "hashtags": rows,
        "k": config.k,
        "seed": config.seed,
        "thesaurus_version": thesaurus.version,
        "model": encoder.model_id,
        "tweets": sample.tweets,
        "eligible_hashtags": eligible_count,
        "per_hashtag": config.per_hashtag,
    }


def _key(value: float | None) -> float:
    return np.inf if value is None else value


def _num(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def _row(
    p: Pairing, i: int, scores: dict[str, tuple[list[float], list[float]]], sample: FeedSample
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "hashtag": p.hashtag,
        "synonyms": list(p.synonyms),
        "random": list(p.random),
        "tweets": len(cluster_texts([p.hashtag, *p.synonyms], sample.samples)),
    }
    for name, (syn, rnd) in scores.items():
        out[name] = {"synonyms": _num(syn[i]), "random": _num(rnd[i])}
    return out


class RefitAudit:
    """The audit of each thesaurus a backtest builds (``reval backtest``): the coherence
    lift over the tweets seen so far, sampled as the live reservoir samples them, and,
    given an audit's events (the ``votes`` topic dumped as JSON lines), the agreement
    with the votes -- what the index job exports for each live version."""

    def __init__(self, votes: Path | None = None) -> None:
        defaults = Settings()
        self.k, self.sample, self.min_tweets = (
            defaults.coherence_k,
            defaults.coherence_sample,
            defaults.coherence_min_tweets,
        )
        self.reservoir = BottomK(defaults.coherence_reservoir)
        self.state = latest_audit(replay(_events(votes))) if votes is not None else None

    def update(self, prepared: Sequence[Prepared]) -> None:
        """Sample the tweets since the last refit."""
        texts = ((p.hashtags, coherence_text(p.text)) for p in prepared)
        self.reservoir.update((tag, text) for tags, text in texts if text for tag in tags)

    def row(self, thesaurus: Any, counts: Mapping[str, int], seed: int) -> dict[str, Any]:
        """The refit's ``audit``: ``coherence`` (TF-IDF lift) and ``agreement`` (or None)."""
        samples = self.reservoir.get()
        coherence = version_coherence(
            thesaurus,
            {h: n for h, n in counts.items() if h in samples},
            lambda tags: {t: samples[t] for t in tags if t in samples},
            k=self.k,
            sample=self.sample,
            min_tweets=self.min_tweets,
            seed=seed,
        )
        return {"coherence": {"tfidf": coherence}, "agreement": version_agreement(self.state, thesaurus)}


def _events(path: Path) -> list[dict[str, Any]]:
    """An audit's events from a JSON-lines file (one event per line, as in the topic)."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                raise ValueError(f"{path}:{number}: not a JSON event") from None
            if isinstance(event, dict):
                out.append(event)
    return out
