"""Thematic coherence of synonym sets (paper 003, Bilal et al. 2021), against chance.

A hashtag's synonym set is judged by what its tweets say: the *cluster* of a hashtag h
is the tweets of h together with the tweets of its top-k synonyms, and its coherence is
the paper's **exhaustive** approach (its section 4.1): the mean of a pairwise score over
every pair of tweets in the cluster,

    f(C) = 1 / C(|T|, 2) · Σ_{i<j} m(tweet_i, tweet_j).

Two scores m, the paper's best surface metric and its best embedding-based family:

* ``tfidf``: cosine of TF-IDF vectors fitted *within the cluster* (003's footnote 8),
  with scikit-learn's ``TfidfVectorizer`` defaults (tokens ``\\b\\w\\w+\\b``, smooth idf,
  l2 rows), written out in numpy (:func:`tfidf_rows`; the tests check it against
  scikit-learn).  Over unit rows the exhaustive mean needs no pair loop:
  Σ_{i<j} x_i·x_j = (‖Σ x_i‖² − Σ ‖x_i‖²) / 2 (:func:`mean_pairwise_cosine`).
* ``bertscore``: BERTScore F1 (Zhang et al. 2019), greedy matching of token embeddings
  of the thesaurus's own model, the TGM the paper found best on the election data and
  close to best on PHEME.  Chosen over the mean pairwise cosine of tweet embeddings
  because the thesaurus *picked* its synonyms by cosine of mean tweet embeddings: that
  score would partly grade the index by its own construction, where token alignment
  asks a different question (do the tweets say the same things?).

The tweets are the cleaned texts the thesaurus embeds (:func:`stream.intake.cleaning.prepare`)
with every hashtag removed (:func:`coherence_text`): a cluster is built from its tags,
so the tags would make any synonym set look coherent (and co-occurring tags are how the
embedding found the synonyms); what is left is what the tweets say.  Texts left empty
are dropped; the same tweet under several hashtags of a cluster counts once.

**Chance.** The same cluster built with k random hashtags of *matched popularity*
(:class:`PopularityIndex`: each synonym replaced by a hashtag drawn from its neighbours in
the popularity order) is the baseline; the *lift* is the mean over hashtags of the
paired difference synonyms − random, with a percentile-bootstrap 95% interval over
hashtags (:func:`coherence_lift`).  Lift > 0 with the interval above 0: the synonyms are
more coherent than chance.

**Samples.** A hashtag's tweets are a bounded uniform sample of its distinct texts: the
``m`` with the smallest :func:`sample_priority`, a hash of (hashtag, text) -- a bottom-k
sketch.  The same sample comes out whatever the order, batching or repetition of the
arrivals, so the live reservoir in Redis (``workers.adapters.redis.redis_reservoir``) and
``reval thesaurus coherence`` on the same feed hold the same tweets.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import regex

from stream.evaluation.experiment import bootstrap_difference, resample_counts

#: scikit-learn's default ``token_pattern`` (words of two or more characters).
TOKEN_PATTERN = regex.compile(r"(?u)\b\w\w+\b")
_HASHTAG = regex.compile(r"#[\p{L}\p{M}\p{N}_]*")
METRICS = ("tfidf", "bertscore")

FloatArray = npt.NDArray[np.float64]


def coherence_text(cleaned: str) -> str:
    """A cleaned tweet without its hashtags (the cluster's labels), spaces squeezed.

    >>> coherence_text("#sandy flooding subway #nyc tonight")
    'flooding subway tonight'
    >>> coherence_text("#prayforboston #boston")
    ''
    """
    return " ".join(_HASHTAG.sub(" ", cleaned).split())


def sample_priority(hashtag: str, text: str) -> float:
    """A pseudo-random number in [0, 1) fixed by (hashtag, text): the key of the bottom-k
    sample.  The same tweet redelivered gets the same number, so it is in or out of the
    sample exactly as the first time.

    >>> sample_priority("sandy", "flooding subway") == sample_priority("sandy", "flooding subway")
    True
    >>> 0.0 <= sample_priority("sandy", "x") < 1.0
    True
    """
    digest = hashlib.blake2b(f"{hashtag}\0{text}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


class BottomK:
    """Per hashtag, the ``m`` distinct texts of smallest :func:`sample_priority`: a uniform
    sample without replacement of its distinct texts, the same whatever the order or
    repetition of the arrivals (the live reservoir's rule, kept in memory).

    >>> sample = BottomK(5)
    >>> sample.update([("a", "x"), ("a", "y"), ("a", "x"), ("b", "z")])
    >>> sorted(sample.get()["a"]), sample.get()["b"]
    (['x', 'y'], ['z'])
    """

    def __init__(self, m: int) -> None:
        if m < 1:
            raise ValueError(f"the sample size must be at least 1, got {m}")
        self.m = m
        self._heaps: dict[str, list[tuple[float, str]]] = {}
        self._members: dict[str, set[str]] = {}

    def update(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Offer ``(hashtag, text)`` pairs."""
        for hashtag, text in pairs:
            seen = self._members.setdefault(hashtag, set())
            if text in seen:
                continue
            heap = self._heaps.setdefault(hashtag, [])
            key = (-sample_priority(hashtag, text), text)  # a max-heap of the m smallest
            if len(heap) < self.m:
                heapq.heappush(heap, key)
                seen.add(text)
            elif key > heap[0]:
                _, dropped = heapq.heapreplace(heap, key)
                seen.discard(dropped)
                seen.add(text)

    def get(self) -> dict[str, list[str]]:
        """Every hashtag's sample, smallest priority first."""
        return {h: [t for _, t in sorted(heap, reverse=True)] for h, heap in self._heaps.items()}


def bottom_k(pairs: Iterable[tuple[str, str]], m: int) -> dict[str, list[str]]:
    """:class:`BottomK` of ``pairs`` in one call.

    >>> len(bottom_k([("a", str(i)) for i in range(100)], m=3)["a"])
    3
    """
    sample = BottomK(m)
    sample.update(pairs)
    return sample.get()


# --------------------------------------------------------------------------- scores


def tfidf_rows(texts: Sequence[str]) -> FloatArray:
    """TF-IDF rows of ``texts`` fitted on ``texts`` alone, as scikit-learn's
    ``TfidfVectorizer()`` computes them: idf = ln((1 + n) / (1 + df)) + 1, rows scaled to
    unit length (a text without a token stays a zero row).

    >>> rows = tfidf_rows(["flood water", "flood rescue", "music"])
    >>> rows.shape, np.round(np.linalg.norm(rows, axis=1), 6).tolist()
    ((3, 4), [1.0, 1.0, 1.0])
    """
    docs = [TOKEN_PATTERN.findall(t.lower()) for t in texts]
    vocabulary = {w: i for i, w in enumerate(sorted({w for d in docs for w in d}))}
    counts = np.zeros((len(docs), len(vocabulary)))
    for row, doc in enumerate(docs):
        for word, n in Counter(doc).items():
            counts[row, vocabulary[word]] = n
    df = (counts > 0).sum(axis=0)
    idf = np.log((1.0 + len(docs)) / (1.0 + df)) + 1.0
    weighted = counts * idf
    norms = np.linalg.norm(weighted, axis=1, keepdims=True)
    unit: npt.NDArray[np.float64] = np.divide(weighted, norms, out=np.zeros_like(weighted), where=norms > 0)
    return unit


def mean_pairwise_cosine(rows: FloatArray) -> float:
    """The exhaustive mean of ``rows[i] · rows[j]`` over the pairs i < j of unit (or zero)
    rows, in O(n·d): (‖Σ x‖² − Σ ‖x‖²) / (n (n − 1)).  NaN below two rows.

    >>> x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    >>> round(mean_pairwise_cosine(x), 6)  # pairs: 0, 1, 0
    0.333333
    """
    n = len(rows)
    if n < 2:
        return float("nan")
    total = rows.sum(axis=0)
    return float((total @ total - np.einsum("ij,ij->", rows, rows)) / (n * (n - 1)))


def tfidf_coherence(texts: Sequence[str]) -> float:
    """003's exhaustive TF-IDF coherence of a cluster of texts.

    >>> round(tfidf_coherence(["flood water rising", "flood water everywhere", "flood rescue"]), 4)
    0.3046
    >>> tfidf_coherence(["a b", "c d"])  # no token of two characters: zero rows
    0.0
    """
    return mean_pairwise_cosine(tfidf_rows(texts))


def greedy_f1(a: FloatArray, b: FloatArray) -> float:
    """BERTScore F1 of two texts given their token embeddings (unit rows): recall = mean
    over a's tokens of the best cosine in b, precision the same from b, F1 their harmonic
    mean -- 0 when either is not positive (a harmonic mean of a negative number means
    nothing; transformer token cosines are nearly always positive anyway).

    >>> a = np.array([[1.0, 0.0], [0.0, 1.0]]); b = np.array([[1.0, 0.0]])
    >>> greedy_f1(a, b)  # recall 0.5, precision 1
    0.6666666666666666
    """
    sims = a @ b.T
    recall, precision = float(sims.max(axis=1).mean()), float(sims.max(axis=0).mean())
    if recall <= 0 or precision <= 0:
        return 0.0
    return 2.0 * recall * precision / (recall + precision)


def bertscore_coherence(tokens: Sequence[npt.NDArray[np.floating]], block: int = 2048) -> float:
    """003's exhaustive BERTScore (F1) coherence of a cluster: the mean of
    :func:`greedy_f1` over every pair of texts, from one token-by-token similarity matrix
    computed ``block`` rows at a time (memory ``block x tokens``).  Texts without tokens
    are left out; NaN below two texts.

    >>> e = np.eye(3)
    >>> t = [e[[0]], e[[0, 1]], e[[2]]]
    >>> pairs = [greedy_f1(t[0], t[1]), greedy_f1(t[0], t[2]), greedy_f1(t[1], t[2])]
    >>> bool(np.isclose(bertscore_coherence(t), np.mean(pairs)))
    True
    """
    kept = [np.asarray(t, dtype=np.float32) for t in tokens if len(t)]
    n = len(kept)
    if n < 2:
        return float("nan")
    lengths = np.array([len(t) for t in kept])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    stacked = np.vstack(kept)
    # best[t, j] = the best cosine of token t in text j
    best = np.empty((len(stacked), n), dtype=np.float32)
    for lo in range(0, len(stacked), block):
        sims = stacked[lo : lo + block] @ stacked.T
        best[lo : lo + block] = np.maximum.reduceat(sims, starts, axis=1)
    # match[i, j] = mean over text i's tokens of their best cosine in text j: R(ref i, cand j)
    match = np.add.reduceat(best.astype(np.float64), starts, axis=0) / lengths[:, None]
    total = match + match.T
    positive = (match > 0) & (match.T > 0)
    f1 = np.divide(2.0 * match * match.T, total, out=np.zeros_like(total), where=positive)
    upper = np.triu_indices(n, k=1)
    return float(f1[upper].mean())


# --------------------------------------------------------------------------- chance


class PopularityIndex:
    """Hashtags in popularity order, to draw random hashtags of matched popularity.

    :meth:`draw` replaces a hashtag by one of the ``window`` hashtags on either side of it
    in the order of tweet counts (ties broken by name), never one excluded; the window
    widens when all of them are.

    >>> index = PopularityIndex({"a": 1, "b": 2, "c": 3, "d": 50, "e": 60}, window=1)
    >>> index.draw("d", exclude={"d"}, rng=np.random.default_rng(0)) in {"c", "e"}
    True
    """

    def __init__(self, counts: Mapping[str, int], window: int = 25) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.names = sorted(counts, key=lambda h: (counts[h], h))
        self.position = {h: i for i, h in enumerate(self.names)}
        self.counts = dict(counts)
        self.window = window

    def __contains__(self, hashtag: object) -> bool:
        return hashtag in self.position

    def draw(self, hashtag: str, exclude: set[str], rng: np.random.Generator) -> str | None:
        """A random hashtag near ``hashtag`` in popularity, not in ``exclude``; None when
        every hashtag is excluded."""
        centre = self.position.get(hashtag)
        if centre is None:
            raise KeyError(hashtag)
        window = self.window
        while True:
            lo, hi = max(0, centre - window), min(len(self.names), centre + window + 1)
            options = [h for h in self.names[lo:hi] if h not in exclude]
            if options:
                return options[int(rng.integers(len(options)))]
            if lo == 0 and hi == len(self.names):
                return None
            window *= 2


def matched_random(
    targets: Sequence[str], index: PopularityIndex, exclude: Iterable[str], rng: np.random.Generator
) -> list[str]:
    """One random hashtag of matched popularity per target, distinct, none in ``exclude``
    nor among the targets.

    >>> index = PopularityIndex({c: i for i, c in enumerate("abcdefghij")}, window=2)
    >>> drawn = matched_random(["c", "h"], index, ["a"], np.random.default_rng(1))
    >>> len(drawn), set(drawn) & {"a", "c", "h"}
    (2, set())
    """
    taken = {*exclude, *targets}
    out = []
    for target in targets:
        found = index.draw(target, taken, rng)
        if found is None:
            break
        taken.add(found)
        out.append(found)
    return out


def cluster_texts(tags: Sequence[str], samples: Mapping[str, Sequence[str]]) -> list[str]:
    """The cluster of ``tags``: their sampled texts, each distinct text once, empty ones
    left out (the texts are :func:`coherence_text` already).

    >>> cluster_texts(["a", "b"], {"a": ["x y", "z"], "b": ["x y", ""]})
    ['x y', 'z']
    """
    seen: dict[str, None] = {}
    for tag in tags:
        for text in samples.get(tag, ()):
            if text:
                seen.setdefault(text, None)
    return list(seen)


@dataclass(frozen=True)
class Pairing:
    """A scored hashtag: its synonyms with tweets, and as many random hashtags of matched
    popularity (the chance cluster is the hashtag's tweets with theirs)."""

    hashtag: str
    synonyms: tuple[str, ...]
    random: tuple[str, ...]


def pair_clusters(
    hashtags: Sequence[str],
    neighbours: Callable[[str, int], Sequence[str]],
    counts: Mapping[str, int],
    k: int,
    rng: np.random.Generator,
    *,
    window: int = 25,
) -> list[Pairing]:
    """For each of ``hashtags``: its top-``k`` synonyms among the hashtags with tweets
    (the keys of ``counts``: tweets per hashtag in the whole source, not in the bounded
    samples), and for each synonym a random hashtag with tweets of close popularity.
    Hashtags without a synonym with tweets are left out.

    >>> counts = {c: i + 1 for i, c in enumerate("abcdefgh")}
    >>> syn = {"a": ["b", "c", "zz"]}
    >>> [p] = pair_clusters(["a"], lambda h, k: syn[h][:k], counts, 3, np.random.default_rng(0))
    >>> p.synonyms, len(p.random), set(p.random) & {"a", "b", "c"}
    (('b', 'c'), 2, set())
    """
    index = PopularityIndex({h: n for h, n in counts.items() if n > 0}, window=window)
    out = []
    for hashtag in hashtags:
        synonyms = [s for s in neighbours(hashtag, k) if s != hashtag and s in index]
        if not synonyms:
            continue
        drawn = matched_random(synonyms, index, [hashtag], rng)
        synonyms = synonyms[: len(drawn)]  # a tiny vocabulary: as many of each
        if synonyms:
            out.append(Pairing(hashtag, tuple(synonyms), tuple(drawn)))
    return out


def tags_of(pairings: Iterable[Pairing]) -> set[str]:
    """Every hashtag whose tweets the pairings' clusters need.

    >>> sorted(tags_of([Pairing("a", ("b",), ("c",))]))
    ['a', 'b', 'c']
    """
    return {t for p in pairings for t in (p.hashtag, *p.synonyms, *p.random)}


@dataclass(frozen=True)
class Lift:
    """One metric over the scored hashtags: mean coherence of the synonym clusters and of
    the random ones, and the mean paired difference with its 95% interval."""

    synonyms: float
    random: float
    lift: float
    lift_ci_low: float
    lift_ci_high: float
    hashtags: int

    def to_dict(self) -> dict[str, float | int]:
        return {
            "synonyms": self.synonyms,
            "random": self.random,
            "lift": self.lift,
            "lift_ci_low": self.lift_ci_low,
            "lift_ci_high": self.lift_ci_high,
            "hashtags": self.hashtags,
        }


def coherence_lift(
    synonyms: Sequence[float] | FloatArray,
    random: Sequence[float] | FloatArray,
    *,
    resamples: int = 2000,
    seed: int = 0,
) -> Lift | None:
    """Paired lift synonyms − random over hashtags (NaN pairs left out), with a percentile
    bootstrap interval over hashtags; None when no hashtag has both.

    >>> lift = coherence_lift([0.3, 0.4, 0.5, 0.35], [0.1, 0.2, 0.1, 0.15], seed=1)
    >>> round(lift.lift, 3), lift.lift_ci_low > 0, lift.hashtags
    (0.25, True, 4)
    """
    a, b = np.asarray(synonyms, dtype=np.float64), np.asarray(random, dtype=np.float64)
    both = np.isfinite(a) & np.isfinite(b)
    if not both.any():
        return None
    a, b = a[both], b[both]
    counts = resample_counts(len(a), None, resamples, seed=seed)
    diff, low, high = bootstrap_difference(a[:, None], b[:, None], counts)[0]
    assert diff is not None and low is not None and high is not None
    return Lift(float(a.mean()), float(b.mean()), diff, low, high, len(a))


Scorer = Callable[[Sequence[str]], float]


def score_pairings(
    pairings: Sequence[Pairing], samples: Mapping[str, Sequence[str]], scorer: Scorer
) -> tuple[list[float], list[float]]:
    """The coherence of each pairing's synonym cluster and of its random cluster.

    >>> samples = {"a": ["flood water"], "b": ["flood rescue"], "c": ["music tonight"]}
    >>> syn, rnd = score_pairings([Pairing("a", ("b",), ("c",))], samples, tfidf_coherence)
    >>> [round(x, 4) for x in syn], rnd
    ([0.3361], [0.0])
    """
    synonyms, random = [], []
    for p in pairings:
        synonyms.append(scorer(cluster_texts([p.hashtag, *p.synonyms], samples)))
        random.append(scorer(cluster_texts([p.hashtag, *p.random], samples)))
    return synonyms, random


def eligible(samples: Mapping[str, Sequence[str]], min_tweets: int) -> list[str]:
    """Hashtags with at least ``min_tweets`` non-empty texts in their sample, sorted.

    >>> eligible({"a": ["x", "y"], "b": ["x", ""], "c": []}, 2)
    ['a']
    """
    return sorted(h for h, texts in samples.items() if sum(1 for t in texts if t) >= min_tweets)
