"""Small real thesauri for the tests (built with the real Annoy builder, no mock)."""

from __future__ import annotations

import numpy as np

from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus


def paired_thesaurus() -> AnnoyThesaurus:
    """Ten hashtags in pairs of near neighbours: flood~floods, help~rescue, sandy~hurricane,
    quake~earthquake, news~media (5 synonyms each: a scorer's REVAL_KS must stop at 5)."""
    rng = np.random.default_rng(4)
    base = rng.normal(size=(5, 16))
    names = [
        "flood",
        "floods",
        "help",
        "rescue",
        "sandy",
        "hurricane",
        "quake",
        "earthquake",
        "news",
        "media",
    ]
    vectors = np.repeat(base, 2, axis=0) + rng.normal(scale=0.01, size=(10, 16))
    return AnnoyThesaurus.build(names, vectors, counts=[5] * 10, depth=5, n_trees=5)
