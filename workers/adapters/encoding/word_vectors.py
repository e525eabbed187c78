"""Word vectors (gensim Word2Vec / FastText): the MOWE recommender's and the paper's
Word2Vec / FastText thesaurus baselines.

The maths that uses them (mean of word vectors, the recommender) is in
:mod:`stream.evaluation.recommenders`; this adapter only trains them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any, Literal

from gensim.models import FastText, Word2Vec

WordVectorKind = Literal["word2vec", "fasttext"]


def stable_hash(text: str) -> int:
    """A hash that is the same in every process (Python's ``hash`` of a str is salted),
    for gensim's per-word initial vectors: with a seed and one worker, training is
    then reproducible across runs."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def train_word_vectors(
    docs: Sequence[Sequence[str]],
    kind: WordVectorKind = "word2vec",
    *,
    vector_size: int = 100,
    window: int = 2,
    min_count: int = 1,
    epochs: int = 30,
    seed: int = 0,
    workers: int = 1,
    bucket: int = 2_000_000,
    callbacks: Sequence[Any] = (),
) -> Any:
    """Train gensim Word2Vec or FastText on tokenised ``docs`` (one tweet a doc), with the
    paper's settings by default (window 2, min_count 1, 30 epochs); returns the
    ``KeyedVectors``.  ``bucket`` (FastText's n-gram hash buckets) defaults to
    gensim's own.  Deterministic for a seed with ``workers=1``."""
    sentences = [list(d) for d in docs if d]
    if not sentences:
        raise ValueError("no words to train word vectors on")
    common: dict[str, Any] = {
        "vector_size": vector_size,
        "window": window,
        "min_count": min_count,
        "epochs": epochs,
        "seed": seed,
        "workers": workers,
        "hashfxn": stable_hash,
        "callbacks": list(callbacks),
    }
    if kind == "word2vec":
        model: Any = Word2Vec(sentences, **common)
    elif kind == "fasttext":
        model = FastText(sentences, bucket=bucket, **common)
    else:
        raise ValueError(f"kind must be 'word2vec' or 'fasttext', got {kind!r}")
    return model.wv


def trainer(**options: Any) -> Callable[[Sequence[Sequence[str]]], Any]:
    """A ``docs -> KeyedVectors`` function with fixed options (what :class:`MoweRecommender`
    takes to train its own Word2Vec)."""
    return lambda docs: train_word_vectors(docs, "word2vec", **options)
