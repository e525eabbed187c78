"""The paper's experiment (section 4.2) as pure steps: its configuration, the 90/10
split and the per-hashtag means of embedded training tweets.

``reval evaluate`` (:mod:`workers.commands.evaluate`) runs it with the encoder,
gensim and the thesaurus store.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from stream.cleaning import Cleaner, Dropped, Prepared
from stream.means import HashtagMeans
from stream.records import ErrorLog, Parsed, Tweet
from stream.scoring import DEFAULT_KS

VARIANTS = ("bertag", "word2vec", "fasttext")
Split = Literal["time", "random"]

#: ``progress(description, total)`` opens a progress task and returns its ``advance(n)``.
ProgressFactory = Callable[[str, int | None], Callable[[int], None]]


def no_progress(description: str, total: int | None) -> Callable[[int], None]:
    del description, total
    return lambda n: None


@dataclass(frozen=True)
class ExperimentConfig:
    """The options of one run (all of them end up in ``results.json``)."""

    split: Split = "time"
    seed: int = 0
    train_fraction: float = 0.9
    embeddings: tuple[str, ...] = VARIANTS
    model: str = "vinai/bertweet-base"
    #: Encoder dtype.  float32 by default: the reference numbers, the same on any CPU;
    #: ``"auto"`` is the core's fast choice (bf16 / int8 where the CPU has them).
    dtype: str = "float32"
    rs: tuple[int, ...] = (1, 5, 10)
    ks: tuple[int, ...] = DEFAULT_KS
    limit: int | None = None
    language_filter: bool = True
    threshold: float = 0.5
    vector_size: int = 100
    window: int = 2
    epochs: int = 30
    fasttext_bucket: int = 2_000_000
    batch_size: int = 32
    n_trees: int = 50
    top_hashtags: int = 8
    n_synonyms: int = 5

    def __post_init__(self) -> None:
        if self.split not in ("time", "random"):
            raise ValueError(f"split must be 'time' or 'random', got {self.split!r}")
        unknown = [e for e in self.embeddings if e not in VARIANTS]
        if unknown or not self.embeddings:
            raise ValueError(
                f"embeddings must be among {', '.join(VARIANTS)}, got {', '.join(self.embeddings)}"
            )
        if len(set(self.embeddings)) != len(self.embeddings):
            raise ValueError("an embedding variant is listed twice")
        if not self.rs or any(r < 1 for r in self.rs):
            raise ValueError("r values must be positive")
        if not self.ks or any(k < 0 for k in self.ks):
            raise ValueError("k values must be non-negative")
        if not 0.0 < self.train_fraction < 1.0:
            raise ValueError("train_fraction must be between 0 and 1")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold is a cosine similarity in (0, 1], got {self.threshold}")
        if self.limit is not None and self.limit < 2:
            raise ValueError("limit must be at least 2 (a training and a test tweet)")

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["embeddings"] = list(self.embeddings)
        out["rs"], out["ks"] = list(self.rs), list(self.ks)
        return out


# --------------------------------------------------------------------------- data


@dataclass
class Corpus:
    """The pre-processed feed: kept tweets in feed order and what was dropped."""

    prepared: list[Prepared]
    lines_read: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    errors: ErrorLog = field(default_factory=ErrorLog)


def load_corpus(
    items: Iterable[Parsed[Tweet]],
    *,
    limit: int | None = None,
    language_filter: bool = True,
    progress: ProgressFactory = no_progress,
) -> Corpus:
    """Pre-process parsed feed lines; stop after ``limit`` kept tweets."""
    cleaner = Cleaner(language_filter=language_filter)
    corpus = Corpus([])
    advance = progress("reading + cleaning", None)
    for item in items:
        corpus.lines_read += 1
        advance(1)
        if item.error is not None:
            corpus.errors.add(item)
            continue
        assert item.value is not None
        result = cleaner(item.value)
        if isinstance(result, Dropped):
            corpus.dropped[result.reason] += 1
            continue
        corpus.prepared.append(result)
        if limit is not None and len(corpus.prepared) >= limit:
            break
    return corpus


def split_corpus(
    prepared: Sequence[Prepared], how: Split, *, seed: int = 0, train_fraction: float = 0.9
) -> tuple[list[Prepared], list[Prepared]]:
    """90/10 (``train_fraction``) split.  ``time``: the earliest tweets train (ties and
    tweets without a time keep feed order); ``random``: a shuffle seeded by ``seed``.

    >>> from stream.cleaning import prepare
    >>> from stream.records import parse_tweet
    >>> ps = [prepare(parse_tweet({"id": str(i), "text": f"w{i} #t", "lang": "en",
    ...       "created_at": 1_350_000_000 - i})) for i in range(10)]
    >>> train, test = split_corpus(ps, "time")
    >>> [p.tweet.id for p in test]
    ['0']
    """
    n = len(prepared)
    if n < 2:
        raise ValueError(f"need at least 2 pre-processed tweets to split, got {n}")
    if how == "time":
        if any(p.tweet.created_at is None for p in prepared):
            warnings.warn(
                "some tweets have no created_at: the time split keeps feed order",
                UserWarning,
                stacklevel=2,
            )
            order = list(range(n))
        else:
            order = sorted(range(n), key=lambda i: (prepared[i].tweet.created_at, i))
    elif how == "random":
        order = [int(i) for i in np.random.default_rng(seed).permutation(n)]
    else:
        raise ValueError(f"split must be 'time' or 'random', got {how!r}")
    cut = min(max(int(n * train_fraction), 1), n - 1)
    return [prepared[i] for i in order[:cut]], [prepared[i] for i in order[cut:]]


def labelled(p: Prepared) -> Tweet:
    """The tweet with the hashtags pre-processing kept (a re-retweet may lose some)."""
    return dataclasses.replace(p.tweet, hashtags=p.hashtags)


# --------------------------------------------------------------------------- thesauri


def hashtag_means(
    prepared: Sequence[Prepared], vectors: npt.NDArray[np.floating]
) -> HashtagMeans:
    """BERTag's per-hashtag running means over tweets embedded as ``vectors``."""
    means = HashtagMeans(dim=int(vectors.shape[1]))
    means.update_batch([p.hashtags for p in prepared], vectors)
    return means

