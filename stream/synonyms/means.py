"""Per-hashtag running means of tweet embeddings (BERTag, paper 3.1.2-3.1.4).

The paper's Eq. 1 re-normalises after every update, which makes the result
depend on arrival order.  We keep the count and the *unnormalised* sum instead
and normalise only when reading, so a streamed value equals the batch
definition -- the unit-length mean of all the hashtag's tweet embeddings --
whatever the order or batching of arrivals, and two partial states merge
exactly (which is what lets several workers or partitions share the work).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.floating]


def unit(vector: Vector) -> npt.NDArray[np.float32]:
    """Scale ``vector`` to unit length as float32; a zero vector stays zero."""
    v = np.asarray(vector, dtype=np.float64)
    norm = float(np.linalg.norm(v))
    return (v / norm if norm > 0 else v).astype(np.float32)


@dataclass
class RunningMean:
    """Count and float64 sum of one hashtag's tweet embeddings.

    >>> m = RunningMean.empty(2)
    >>> m.update(np.array([1.0, 0.0]))
    >>> m.update(np.array([0.0, 1.0]))
    >>> m.count, [round(float(x), 4) for x in m.get()]
    (2, [0.7071, 0.7071])
    """

    count: int
    total: npt.NDArray[np.float64]

    @classmethod
    def empty(cls, dim: int) -> RunningMean:
        return cls(0, np.zeros(dim, dtype=np.float64))

    @property
    def dim(self) -> int:
        return int(self.total.shape[0])

    def update(self, vector: Vector, weight: int = 1) -> None:
        """Add one tweet embedding (``weight`` copies of it)."""
        self.count += weight
        self.total += weight * np.asarray(vector, dtype=np.float64)

    def merge(self, other: RunningMean) -> RunningMean:
        """Combine two partial states of the same hashtag exactly (in place)."""
        if other.dim != self.dim:
            raise ValueError(f"cannot merge a {other.dim}-d state into a {self.dim}-d one")
        self.count += other.count
        self.total += other.total
        return self

    def mean(self) -> npt.NDArray[np.float64]:
        """The unnormalised arithmetic mean (zeros when empty)."""
        return self.total / self.count if self.count else np.zeros_like(self.total)

    def get(self) -> npt.NDArray[np.float32]:
        """The hashtag embedding: the mean scaled to unit length."""
        return unit(self.total)


@dataclass
class HashtagMeans:
    """Running means for many hashtags; the in-memory twin of the Redis table.

    A tweet with m hashtags counts once for each of them (paper 3.1.2).

    >>> table = HashtagMeans(dim=2)
    >>> table.update(["flood", "help"], np.array([1.0, 0.0]))
    >>> table.update(["flood"], np.array([0.0, 1.0]))
    >>> table["flood"].count, table["help"].count
    (2, 1)
    """

    dim: int
    states: dict[str, RunningMean] = field(default_factory=dict)

    def update(self, hashtags: Iterable[str], vector: Vector) -> None:
        for tag in dict.fromkeys(hashtags):  # a tweet counts once per distinct hashtag
            state = self.states.get(tag)
            if state is None:
                state = self.states[tag] = RunningMean.empty(self.dim)
            state.update(vector)

    def update_batch(self, hashtags: Sequence[Sequence[str]], vectors: Vector) -> None:
        """Add a batch: ``hashtags[i]`` are the hashtags of the tweet embedded as ``vectors[i]``."""
        if len(hashtags) != len(vectors):
            raise ValueError(f"{len(hashtags)} hashtag lists for {len(vectors)} vectors")
        for tags, vector in zip(hashtags, vectors, strict=True):
            self.update(tags, vector)

    def merge(self, other: HashtagMeans | Mapping[str, RunningMean]) -> HashtagMeans:
        states = other.states if isinstance(other, HashtagMeans) else other
        for tag, state in states.items():
            mine = self.states.get(tag)
            if mine is None:
                self.states[tag] = RunningMean(state.count, state.total.copy())
            else:
                mine.merge(state)
        return self

    def __getitem__(self, hashtag: str) -> RunningMean:
        return self.states[hashtag]

    def __contains__(self, hashtag: object) -> bool:
        return hashtag in self.states

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[str]:
        return iter(self.states)

    def resultants(self, names: Sequence[str]) -> npt.NDArray[np.float64]:
        """The length of each hashtag's mean before normalisation: for unit tweet embeddings,
        1 when all its tweets point one way, near 0 when they are spread everywhere
        (:mod:`stream.synonyms.shift_test`).

        >>> table = HashtagMeans(dim=2)
        >>> table.update(["a"], np.array([1.0, 0.0])); table.update(["a"], np.array([0.0, 1.0]))
        >>> table.resultants(["a"]).round(3).tolist()
        [0.707]
        """
        return np.array([float(np.linalg.norm(self.states[h].mean())) for h in names], dtype=np.float64)

    def matrix(self, min_count: int = 1) -> tuple[list[str], npt.NDArray[np.float32], list[int]]:
        """Names, unit vectors (one row each) and counts of the hashtags seen >= ``min_count``
        times, sorted by name so the same state always yields the same index.

        A hashtag whose mean is the zero vector (its tweets' embeddings cancel out, or a
        word-vector tweet with no known word) has no direction, so no cosine: it is left out.

        >>> table = HashtagMeans(dim=2)
        >>> table.update(["b", "a"], np.array([3.0, 4.0])); table.update(["z"], np.zeros(2))
        >>> names, vectors, counts = table.matrix()
        >>> names, [[round(float(x), 2) for x in row] for row in vectors], counts
        (['a', 'b'], [[0.6, 0.8], [0.6, 0.8]], [1, 1])
        """
        names = sorted(t for t, s in self.states.items() if s.count >= min_count and np.any(s.total != 0.0))
        vectors = np.zeros((len(names), self.dim), dtype=np.float32)
        for i, name in enumerate(names):
            vectors[i] = self.states[name].get()
        return names, vectors, [self.states[n].count for n in names]
