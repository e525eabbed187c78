"""Baseline hashtag recommenders: the paper's MOWE recommender and popularity baselines.

#REval needs *something* that recommends hashtags to evaluate.  The paper (4.2.2)
uses the tweet-similarity recommender of Alsini et al. (2020a), :class:`MoweRecommender`;
the popularity baselines (most used by tweets, by distinct users, and the least
used as a deliberately bad canary) come from the tagging-benchmark literature
(paper ``002_…``).  A pipeline where ``least-popular`` beats ``popular`` leaks
ground truth somewhere.

The one rule every recommender obeys: it never sees the hashtags of the tweet
it recommends for.  :meth:`BaseRecommender.recommend_many` hands the concrete
recommender a :func:`masked` copy of each tweet -- hashtags stripped from the
text, no hashtag list, no raw API payload -- so a subclass cannot leak them
even by accident.

>>> from stream.intake.records import parse_tweet
>>> train = [parse_tweet({"id": str(i), "text": t}) for i, t in enumerate(
...     ["flooding in town #flood", "river flooding #flood #nsw", "fire near me #fire"])]
>>> PopularRecommender().fit(train).recommend(parse_tweet({"id": "9", "text": "hi #x"}), 2)
['flood', 'fire']
>>> masked(parse_tweet({"id": "9", "text": "Big #Flood at #NSW now"})).text
'Big  at  now'
"""

from __future__ import annotations

import dataclasses
import warnings
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, Self, runtime_checkable

import numpy as np
import numpy.typing as npt
import regex

from stream.intake.cleaning import Cleaner, Prepared, clean_text
from stream.intake.records import ErrorLog, Parsed, Tweet

METHODS = ("mowe", "popular", "popular-users", "least-popular", "random")
#: MOWE's similarity threshold, the paper's.  On a feed of ~10^4 tweets averaged Word2Vec
#: vectors point much the same way and 0.5 lets nearly every training tweet count as similar
#: (median 8,360 of 8,767 on the sample feed): MOWE then recommends the popularity list.  0.8
#: does better there (docs/experiment.md), but on a few hundred training tweets it leaves most
#: tweets without a recommendation: a threshold tuned to one feed size, so not the default.
DEFAULT_THRESHOLD = 0.5

# Anything hashtag-like, wherever it sits (also glued to a word, full-width ＃, or
# cut off by truncation): stricter than hashtag extraction, so nothing slips through.
_HASHTAG_TOKEN_RE = regex.compile(r"[#＃][\p{L}\p{M}\p{N}_]*")


# --------------------------------------------------------------------------- hiding


def hide_hashtags(text: str) -> str:
    """``text`` with every hashtag removed (the ``#`` and its body).

    >>> hide_hashtags("Stay safe #Flood x#y ＃東京 #coron…")
    'Stay safe  x  …'
    """
    hidden: str = _HASHTAG_TOKEN_RE.sub("", text)  # the regex package is untyped
    return hidden


def masked(tweet: Tweet) -> Tweet:
    """What a recommender may see of ``tweet``: its text without hashtags, no hashtag
    list and no raw payload (which would carry ``entities.hashtags``)."""
    return dataclasses.replace(tweet, text=hide_hashtags(tweet.text), hashtags=(), extra={})


def visible_tokens(tweet: Tweet) -> list[str]:
    """The cleaned words of ``tweet`` with its hashtags hidden (paper 3.1.1 cleaning).

    >>> from stream.intake.records import parse_tweet
    >>> visible_tokens(parse_tweet({"id": "1", "text": "RT @a: Floods in #QLD!! http://t.co/x #help"}))
    ['floods']
    """
    return [w for w in clean_text(hide_hashtags(tweet.text)).split() if not w.startswith("#")]


# --------------------------------------------------------------------------- API


@runtime_checkable
class Recommender(Protocol):
    """A hashtag recommender: trained on tweets with their hashtags, then asked for
    the top ``r`` hashtags (normalised, ranked, at most ``r``) of tweets it sees
    without theirs."""

    name: str

    def fit(self, tweets: Iterable[Tweet]) -> Self: ...

    def recommend(self, tweet: Tweet, r: int) -> list[str]: ...

    def recommend_many(self, tweets: Sequence[Tweet], r: int) -> list[list[str]]: ...


class NotFittedError(RuntimeError):
    """``recommend`` was called before ``fit``."""


class BaseRecommender(ABC):
    """Shared plumbing: argument checks and the masking of every tweet recommended for.

    Subclasses implement :meth:`_fit` (training tweets, hashtags visible) and
    :meth:`_recommend` (masked tweets only).
    """

    method: ClassVar[str] = ""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or self.method
        self._fitted = False

    def fit(self, tweets: Iterable[Tweet]) -> Self:
        """Train on ``tweets`` (their hashtags are the labels); returns ``self``."""
        self._fit(list(tweets))
        self._fitted = True
        return self

    def recommend(self, tweet: Tweet, r: int) -> list[str]:
        """The top ``r`` hashtags for one tweet (possibly fewer)."""
        return self.recommend_many([tweet], r)[0]

    def recommend_many(
        self,
        tweets: Sequence[Tweet],
        r: int,
        *,
        progress: Callable[[int], None] | None = None,
    ) -> list[list[str]]:
        """Top ``r`` hashtags for each tweet; ``progress(n)`` is told of each ``n`` done."""
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise ValueError(f"r must be a positive integer, got {r!r}")
        if not self._fitted:
            raise NotFittedError(f"{type(self).__name__} must be fitted before recommending")
        return self._recommend([masked(t) for t in tweets], r, progress)

    @abstractmethod
    def _fit(self, tweets: Sequence[Tweet]) -> None: ...

    @abstractmethod
    def _recommend(
        self, tweets: Sequence[Tweet], r: int, progress: Callable[[int], None] | None
    ) -> list[list[str]]: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


# --------------------------------------------------------------------------- popularity


def _ranked(counts: Counter[str], *, ascending: bool = False) -> list[str]:
    """Hashtags by count (descending, or ascending), ties by name."""
    sign = 1 if ascending else -1
    return sorted(counts, key=lambda h: (sign * counts[h], h))


class _FixedListRecommender(BaseRecommender):
    """Recommends the same ranked list for every tweet."""

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        self.ranking: list[str] = []

    def _recommend(
        self, tweets: Sequence[Tweet], r: int, progress: Callable[[int], None] | None
    ) -> list[list[str]]:
        top = self.ranking[:r]
        if progress is not None:
            progress(len(tweets))
        return [list(top) for _ in tweets]


class PopularRecommender(_FixedListRecommender):
    """The r hashtags used by the most training tweets (ties by name)."""

    method = "popular"

    def _fit(self, tweets: Sequence[Tweet]) -> None:
        self.counts = Counter(h for t in tweets for h in dict.fromkeys(t.hashtags))
        self.ranking = _ranked(self.counts)


class PopularByUsersRecommender(_FixedListRecommender):
    """The r hashtags used by the most distinct users (ties by tweet count, then name).

    Tweets without a user id count as a user of their own.  When no training tweet
    has a user id, this is :class:`PopularRecommender` and a warning says so.
    """

    method = "popular-users"

    def _fit(self, tweets: Sequence[Tweet]) -> None:
        tweet_counts = Counter(h for t in tweets for h in dict.fromkeys(t.hashtags))
        self.has_users = any(t.user_id for t in tweets)
        if not self.has_users:
            warnings.warn(
                "popular-users: the training tweets carry no user ids; "
                "ranking by tweet count instead (same as 'popular')",
                UserWarning,
                stacklevel=3,
            )
        users: dict[str, set[str]] = {}
        for t in tweets:
            who = f"user:{t.user_id}" if t.user_id else f"tweet:{t.id}"
            for h in t.hashtags:
                users.setdefault(h, set()).add(who)
        self.counts = Counter({h: len(u) for h, u in users.items()})
        self.ranking = sorted(self.counts, key=lambda h: (-self.counts[h], -tweet_counts[h], h))


class LeastPopularRecommender(_FixedListRecommender):
    """The r hashtags used by the *fewest* training tweets (ties by name): a canary
    that any working evaluation must score below :class:`PopularRecommender`."""

    method = "least-popular"

    def _fit(self, tweets: Sequence[Tweet]) -> None:
        self.counts = Counter(h for t in tweets for h in dict.fromkeys(t.hashtags))
        self.ranking = _ranked(self.counts, ascending=True)


class RandomRecommender(BaseRecommender):
    """r distinct training hashtags drawn at random, each with probability proportional
    to its training popularity (successive sampling without replacement), independently
    per tweet and reproducibly for a ``seed``.

    It is the null recommender of the chance-corrected #REval (:mod:`stream.evaluation.chance`),
    so its corrected score is 0 in expectation: a second canary, and the chance line of
    every plot.

    >>> from stream.intake.records import parse_tweet
    >>> train = [parse_tweet({"id": str(i), "text": f"x #{h}"}) for i, h in enumerate("aabbbc")]
    >>> rec = RandomRecommender(seed=1).fit(train)
    >>> [sorted(r) for r in rec.recommend_many(train[:2], 2)]
    [['a', 'b'], ['a', 'b']]
    """

    method = "random"

    def __init__(self, name: str | None = None, *, seed: int = 0) -> None:
        super().__init__(name)
        self.seed = seed
        self.hashtags: list[str] = []
        self._weights = np.zeros(0)

    def _fit(self, tweets: Sequence[Tweet]) -> None:
        self._popularity(Counter(h for t in tweets for h in dict.fromkeys(t.hashtags)))

    def fit_popularity(self, counts: Mapping[str, float]) -> Self:
        """Draw from these popularities instead of training tweets' -- e.g. a thesaurus
        version's hashtags and counts, which makes this recommender that version's null.

        >>> from stream.intake.records import parse_tweet
        >>> rec = RandomRecommender(seed=3).fit_popularity({"a": 1, "b": 0, "c": 2})
        >>> sorted(rec.recommend_many([parse_tweet({"id": "1", "text": "x"})], 5)[0])
        ['a', 'c']
        """
        self._popularity({h: w for h, w in counts.items() if w > 0})
        self._fitted = True
        return self

    def _popularity(self, counts: Mapping[str, float]) -> None:
        self.hashtags = sorted(counts)
        self._weights = np.array([counts[h] for h in self.hashtags], dtype=np.float64)

    def _recommend(
        self, tweets: Sequence[Tweet], r: int, progress: Callable[[int], None] | None
    ) -> list[list[str]]:
        rng = np.random.default_rng(self.seed)
        want = min(r, len(self.hashtags))
        out: list[list[str]] = []
        chunk = max(1, (1 << 22) // max(len(self.hashtags), 1))
        for start in range(0, len(tweets), chunk):
            rows = min(chunk, len(tweets) - start)
            if want == 0:
                out.extend([] for _ in range(rows))
                continue
            # Exponential clocks: the want smallest Exp(1) / w are a successive weighted sample.
            keys = rng.exponential(size=(rows, len(self.hashtags))) / self._weights
            top = np.argpartition(keys, want - 1, axis=1)[:, :want]
            order = np.take_along_axis(top, np.argsort(np.take_along_axis(keys, top, 1), axis=1), 1)
            out.extend([self.hashtags[j] for j in row] for row in order.tolist())
            if progress is not None:
                progress(rows)
        return out


# --------------------------------------------------------------------------- word vectors


def mean_vectors(
    docs: Sequence[Sequence[str]], word_vectors: Any, *, normalise: bool = True
) -> npt.NDArray[np.float32]:
    """MOWE: each doc as the mean of its words' vectors (one row a doc).

    Unknown words are skipped by Word2Vec vectors; FastText vectors build them
    from character n-grams.  A doc with no usable word is a zero row.  Rows are
    scaled to unit length when ``normalise`` (zero rows stay zero).
    """
    index: dict[str, int] = word_vectors.key_to_index
    matrix = np.asarray(word_vectors.vectors, dtype=np.float32)
    dim = matrix.shape[1]
    ids: list[int] = []  # known words' rows of ``matrix``, doc after doc
    starts = np.zeros(len(docs) + 1, dtype=np.int64)
    extra: dict[int, list[str]] = {}
    oov_capable = bool(getattr(word_vectors, "bucket", 0))  # FastText n-grams
    for i, doc in enumerate(docs):
        for word in doc:
            j = index.get(word)
            if j is not None:
                ids.append(j)
            elif oov_capable:
                extra.setdefault(i, []).append(word)
        starts[i + 1] = len(ids)
    n_words = np.diff(starts).astype(np.float32)
    sums = np.zeros((len(docs), dim), dtype=np.float32)
    if ids:
        rows = matrix[np.asarray(ids, dtype=np.int64)]
        filled = np.flatnonzero(n_words > 0)
        sums[filled] = np.add.reduceat(rows, starts[filled], axis=0)
    for i, words in extra.items():
        for word in words:
            sums[i] += np.asarray(word_vectors.get_vector(word), dtype=np.float32)
        n_words[i] += len(words)
    out = np.divide(sums, np.maximum(n_words, 1.0)[:, None], dtype=np.float32)
    if normalise:
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out = np.divide(out, norms, out=np.zeros_like(out), where=norms > 0)
    return out


# --------------------------------------------------------------------------- MOWE


class MoweRecommender(BaseRecommender):
    """Alsini et al. (2020a), as the #REval paper uses it (4.2.2).

    Word2Vec (window 2, min_count 1, 30 epochs) is trained on the training tweets'
    cleaned text by ``trainer`` (``docs -> word vectors``; the gensim one is
    :func:`workers.adapters.encoding.word_vectors.trainer`), unless ``word_vectors`` are
    given; every tweet is the mean of its word vectors (MOWE).  For a tweet
    to recommend for, the training tweets with cosine similarity >= ``threshold``
    (:data:`DEFAULT_THRESHOLD`, the paper's 0.5) are its similar tweets; their hashtags
    are ranked by popularity among them (ties: popularity in the whole training set, then name) and the top r
    recommended -- so possibly fewer than r, and none when nothing is similar.

    Both sides are compared on their words only: hashtags are hidden from the
    tweet recommended for, so the training tweets' vectors leave theirs out too
    (they are still in the text Word2Vec learns from).  Similarities are one
    matrix product per chunk of tweets (about ``chunk_elements`` similarities at
    a time) and the hashtag counts sums over each hashtag's tweets, so 10^5
    training tweets are fine.
    """

    method = "mowe"

    def __init__(
        self,
        name: str | None = None,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        trainer: Callable[[Sequence[Sequence[str]]], Any] | None = None,
        word_vectors: Any | None = None,
        chunk_elements: int = 1 << 24,
    ) -> None:
        super().__init__(name)
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold is a cosine similarity in (0, 1], got {threshold!r}")
        if trainer is None and word_vectors is None:
            raise ValueError("MoweRecommender needs word vectors or a trainer for them")
        self.threshold = threshold
        self.trainer = trainer
        self.chunk_elements = chunk_elements
        #: Pre-trained KeyedVectors to use instead of training (``fit`` then only indexes).
        self.word_vectors: Any | None = word_vectors
        self.hashtags: list[str] = []
        self.last_similar_counts: list[int] = []

    def _fit(self, tweets: Sequence[Tweet]) -> None:
        if self.word_vectors is None:
            assert self.trainer is not None
            self.word_vectors = self.trainer([clean_text(t.text).split() for t in tweets])
        labelled = [t for t in tweets if t.hashtags]
        popularity = Counter(h for t in labelled for h in dict.fromkeys(t.hashtags))
        # Hashtag ids in global popularity order (ties by name): a lower id wins a tie.
        self.hashtags = sorted(popularity, key=lambda h: (-popularity[h], h))
        self.popularity = popularity
        ids = {h: i for i, h in enumerate(self.hashtags)}
        vectors = mean_vectors([visible_tokens(t) for t in labelled], self.word_vectors)
        usable = np.flatnonzero(np.linalg.norm(vectors, axis=1) > 0)
        self._train = np.ascontiguousarray(vectors[usable])
        # (training row, hashtag id) pairs grouped by hashtag: a hashtag's votes are the
        # sum of the similarity indicators of its rows (np.add.reduceat over the groups).
        rows = np.array(
            [r for r, i in enumerate(usable) for _ in dict.fromkeys(labelled[i].hashtags)], dtype=np.int64
        )
        cols = np.array([ids[h] for i in usable for h in dict.fromkeys(labelled[i].hashtags)], dtype=np.int64)
        order = np.argsort(cols, kind="stable")
        self._vote_rows = rows[order]
        self._voted, starts = np.unique(cols[order], return_index=True)  # hashtags with a row
        self._vote_starts = starts
        self.n_indexed = len(usable)

    def tweet_vectors(self, tweets: Sequence[Tweet]) -> npt.NDArray[np.float32]:
        """Unit MOWE vectors of what the recommender sees of ``tweets`` (hashtags hidden)."""
        assert self.word_vectors is not None
        return mean_vectors([visible_tokens(t) for t in tweets], self.word_vectors)

    def _recommend(
        self, tweets: Sequence[Tweet], r: int, progress: Callable[[int], None] | None
    ) -> list[list[str]]:
        queries = self.tweet_vectors(tweets)
        n_tags = len(self.hashtags)
        #: How many training tweets were similar to each tweet of the last call (diagnostics).
        self.last_similar_counts = []
        if n_tags == 0:
            if progress is not None:
                progress(len(tweets))
            return [[] for _ in tweets]
        # Rank key: more votes first, then the lower id (= globally more popular, then name).
        tie_break = np.arange(n_tags - 1, -1, -1, dtype=np.int64)
        want = min(r, n_tags)
        out: list[list[str]] = []
        chunk = max(1, self.chunk_elements // max(self.n_indexed, n_tags, 1))
        for start in range(0, len(tweets), chunk):
            block = queries[start : start + chunk]
            similar = (block @ self._train.T >= self.threshold).astype(np.float32)
            self.last_similar_counts.extend(int(x) for x in similar.sum(axis=1))
            votes = np.zeros((block.shape[0], n_tags), dtype=np.float32)  # similar tweets per hashtag
            if len(self._vote_rows):
                votes[:, self._voted] = np.add.reduceat(
                    similar[:, self._vote_rows], self._vote_starts, axis=1
                )
            key = votes.astype(np.int64) * n_tags + tie_break
            top = np.argpartition(-key, want - 1, axis=1)[:, :want]
            top = np.take_along_axis(top, np.argsort(-np.take_along_axis(key, top, 1), axis=1), 1)
            top_votes = np.take_along_axis(votes, top, 1)
            for ids, counts in zip(top.tolist(), top_votes.tolist(), strict=True):
                out.append([self.hashtags[j] for j, c in zip(ids, counts, strict=True) if c > 0])
            if progress is not None:
                progress(block.shape[0])
        return out


# --------------------------------------------------------------------------- events


def labelled_tweets(
    items: Iterable[Parsed[Tweet]],
    *,
    language_filter: bool = True,
    errors: ErrorLog | None = None,
    limit: int | None = None,
) -> list[Tweet]:
    """Training tweets after the core pre-processing (paper 3.1.1): hashtagged, English,
    duplicate retweets removed; each with the hashtags that pre-processing kept.
    Bad lines go to ``errors``."""
    cleaner = Cleaner(language_filter=language_filter)
    out: list[Tweet] = []
    for item in items:
        if item.error is not None:
            if errors is not None:
                errors.add(item)
            continue
        assert item.value is not None
        result = cleaner(item.value)
        if isinstance(result, Prepared):
            out.append(dataclasses.replace(result.tweet, hashtags=result.hashtags))
            if limit is not None and len(out) >= limit:
                break
    return out


def recommendation_event(
    tweet: Tweet, recommended: Sequence[str], recommender: str, *, with_truth: bool = False
) -> dict[str, Any]:
    """One event as ``reval score`` and the scoring worker read it.

    >>> from stream.intake.records import parse_tweet
    >>> t = parse_tweet({"id": "7", "created_at": "2013-01-01T00:00:00Z", "text": "x #Flood"})
    >>> event = recommendation_event(t, ["flood", "nsw"], "mowe", with_truth=True)
    >>> event["recommended"], event["ground_truth"], event["ts"]
    (['flood', 'nsw'], ['flood'], '2013-01-01T00:00:00+00:00')
    """
    event: dict[str, Any] = {
        "tweet_id": tweet.id,
        "recommender": recommender,
        "recommended": list(recommended),
    }
    if with_truth:
        event["ground_truth"] = list(tweet.hashtags)
    if tweet.created_at is not None:
        event["ts"] = tweet.created_at.isoformat()
    return event


# --------------------------------------------------------------------------- factory


def make_recommender(
    method: str,
    *,
    name: str | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    trainer: Callable[[Sequence[Sequence[str]]], Any] | None = None,
    seed: int = 0,
) -> BaseRecommender:
    """A recommender by its CLI name: ``mowe``, ``popular``, ``popular-users``,
    ``least-popular``, ``random`` (``seed``: its draws).

    >>> make_recommender("least-popular", name="canary")
    LeastPopularRecommender(name='canary')
    """
    if method == "mowe":
        return MoweRecommender(name, threshold=threshold, trainer=trainer)
    if method == "random":
        return RandomRecommender(name, seed=seed)
    classes: dict[str, type[_FixedListRecommender]] = {
        "popular": PopularRecommender,
        "popular-users": PopularByUsersRecommender,
        "least-popular": LeastPopularRecommender,
    }
    if method not in classes:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    return classes[method](name)
