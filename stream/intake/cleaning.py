"""Pre-processing of tweets before embedding (paper 3.1.1).

The steps, in order: keep tweets that have at least one hashtag; drop non-English
ones (the tweet's ``lang`` when present, else an offline identifier); lower-case,
remove mentions, URLs, stop words and punctuation except ``#`` (hashtags stay in
the embedded text); squeeze characters repeated more than three times to three;
remove retweets that repeat an already-seen tweet with the same hashtag.

Everything here is pure except the duplicate memory, which is a small protocol
(:class:`SeenStore`) so the batch tools can keep it in memory and the streaming
workers in Redis -- both run the same code otherwise.
"""

from __future__ import annotations

import functools
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import py3langid
import regex

from stream.intake.records import Tweet

_URL_RE = regex.compile(r"^(?:https?://|www\.)|^\S+\.(?:com|org|net|ly|co)(?:/|$)")
_NOT_KEPT_RE = regex.compile(r"[^\p{L}\p{M}\p{N}\p{S}_#]+")  # punctuation and the like
_REPEAT_RE = regex.compile(r"(.)\1{3,}")
_RT_PREFIX_RE = regex.compile(r"^rt\s+(?:@\w+\s*:?\s*)?", regex.IGNORECASE)
ENGLISH = "en"
UNDETERMINED = {"und", "zxx", "qme", "qht", "qst"}  # Twitter's "no language" codes


@functools.cache
def _word_tools() -> tuple[Any, Any, frozenset[str]]:
    """NLTK's tweet tokenizer, its emoticon pattern and the stop words, imported on first
    use: the two packages take ~2 s to import, which every ``reval`` command would pay
    otherwise."""
    from nltk.tokenize.casual import EMOTICON_RE, TweetTokenizer
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    # Case is folded below, not by the tokenizer: it tests every token against the emoticon
    # pattern, which only a token with an upper-case letter needs (what lower() leaves alone
    # stays as it is either way) -- a third of the cleaning's time, for the same output.
    tokenizer = TweetTokenizer(preserve_case=True, reduce_len=True, strip_handles=True)
    return tokenizer, EMOTICON_RE, frozenset(ENGLISH_STOP_WORDS) | {"rt", "amp", "via"}


def clean_text(text: str) -> str:
    """Text as it is embedded: lower case, no mentions/URLs/stop words/punctuation but ``#``.

    NLTK's ``TweetTokenizer(preserve_case=False, reduce_len=True, strip_handles=True)``, then
    per token: URLs and stop words out, punctuation but ``#`` out, runs of a character cut to
    three.  The cheap tests come first and skip the regular expressions that cannot change a
    token (``tests/test_cleaning.py`` checks the output against the plain steps on every
    tweet of the bundled and a generated feed).

    >>> clean_text("RT @bob: Heeeeello!!! The #Flood in http://t.co/x is BAD… #NSW")
    'heeello #flood bad #nsw'
    """
    tokenizer, emoticon, stop_words = _word_tools()
    words = []
    for raw in tokenizer.tokenize(text):
        token = raw.lower()
        folded = token != raw
        if folded and emoticon.search(raw):  # NLTK keeps an emoticon's case (":D")
            token, folded = raw, False
        if token in stop_words:
            continue
        # _URL_RE needs "http" at the start or a dot.
        if ("." in token or token.startswith("http")) and _URL_RE.search(token):
            continue
        if token.isascii() and token.isalnum():
            word = token  # nothing for _NOT_KEPT_RE to remove
        else:
            word = _NOT_KEPT_RE.sub("", token)
            if word.startswith("#"):
                word = "#" + word.lstrip("#")
            if not word or word == "#" or word in stop_words:
                continue
        # The tokenizer cut every run to three already; folding case or removing characters
        # can join runs again.
        words.append(_REPEAT_RE.sub(r"\1\1\1", word) if folded or word is not token else word)
    return " ".join(words)


def detect_language(text: str) -> str:
    """ISO 639-1 code from py3langid (its model ships in the package: works offline).

    >>> detect_language("The river broke its banks and people need help")
    'en'
    """
    body = " ".join(t for t in text.split() if not t.startswith(("@", "http", "www.")))
    lang, _ = py3langid.classify(body.replace("#", " "))
    return str(lang)


def is_english(tweet: Tweet) -> bool:
    if tweet.lang and tweet.lang not in UNDETERMINED:
        return tweet.lang == ENGLISH or tweet.lang.startswith(ENGLISH + "-")
    return detect_language(tweet.text) == ENGLISH


@dataclass(frozen=True)
class Prepared:
    """A tweet ready to embed.  ``dedup_keys[i]`` identifies (content, ``hashtags[i]``)."""

    tweet: Tweet
    text: str
    hashtags: tuple[str, ...]
    dedup_keys: tuple[str, ...]


@dataclass(frozen=True)
class Dropped:
    tweet: Tweet
    reason: str  # no_hashtags | not_english | empty_text | duplicate_retweet


def content_key(cleaned: str, hashtag: str) -> str:
    """Key of "this content was seen with this hashtag" (16 hex chars of BLAKE2b)."""
    digest = hashlib.blake2b(f"{hashtag}\x00{cleaned}".encode(), digest_size=8)
    return digest.hexdigest()


def prepare(tweet: Tweet, *, language_filter: bool = True) -> Prepared | Dropped:
    """Everything but the duplicate check: pure, and the same for stream and batch."""
    if not tweet.hashtags:
        return Dropped(tweet, "no_hashtags")
    if language_filter and not is_english(tweet):
        return Dropped(tweet, "not_english")
    text = clean_text(tweet.text)
    if not text:
        return Dropped(tweet, "empty_text")
    # The duplicate key ignores the "RT @user:" prefix so a retweet matches its original.
    stripped = _RT_PREFIX_RE.sub("", tweet.text)
    body = text if stripped == tweet.text else clean_text(stripped)
    keys = tuple(content_key(body, tag) for tag in tweet.hashtags)
    return Prepared(tweet, text, tweet.hashtags, keys)


class SeenStore(Protocol):
    """Remembers which (content, hashtag) keys were claimed and by which record.

    ``claim`` returns, per key, whether ``claimant`` owns it: the first claimant
    of a key owns it forever, and claiming again with the same claimant (a
    redelivery after a crash) still returns True, which keeps retries idempotent.
    """

    def claim(self, keys: Sequence[str], claimant: str) -> list[bool]: ...


class MemorySeen:
    """Bounded in-memory :class:`SeenStore`: forgets the least recently used keys.

    >>> seen = MemorySeen(max_keys=2)
    >>> seen.claim(["a", "b"], "t1"), seen.claim(["a"], "t2"), seen.claim(["a"], "t1")
    ([True, True], [False], [True])
    """

    def __init__(self, max_keys: int = 1_000_000) -> None:
        self.max_keys = max_keys
        self._owners: OrderedDict[str, str] = OrderedDict()

    def claim(self, keys: Sequence[str], claimant: str) -> list[bool]:
        out = []
        for key in keys:
            owner = self._owners.setdefault(key, claimant)
            self._owners.move_to_end(key)
            out.append(owner == claimant)
        while len(self._owners) > self.max_keys:
            self._owners.popitem(last=False)
        return out

    def __len__(self) -> int:
        return len(self._owners)


def dedup(prepared: Prepared, owned: Sequence[bool]) -> Prepared | Dropped:
    """Apply a claim result: an original keeps all hashtags; a retweet loses the hashtags
    whose content was already seen, and is dropped when none is left."""
    if not prepared.tweet.is_retweet or all(owned):
        return prepared
    kept = [i for i, ok in enumerate(owned) if ok]
    if not kept:
        return Dropped(prepared.tweet, "duplicate_retweet")
    return Prepared(
        prepared.tweet,
        prepared.text,
        tuple(prepared.hashtags[i] for i in kept),
        tuple(prepared.dedup_keys[i] for i in kept),
    )


class Cleaner:
    """The whole pre-processing for one feed, in arrival order (batch tools, replay).

    >>> from stream.intake.records import parse_tweet
    >>> c = Cleaner(seen=MemorySeen())
    >>> a = parse_tweet({"id": "1", "text": "Big #flood near the river", "lang": "en"})
    >>> b = parse_tweet({"id": "2", "text": "RT @x: Big #flood near the river", "lang": "en"})
    >>> type(c(a)).__name__, c(b).reason
    ('Prepared', 'duplicate_retweet')
    """

    def __init__(self, seen: SeenStore | None = None, *, language_filter: bool = True) -> None:
        self.seen: SeenStore = seen if seen is not None else MemorySeen()
        self.language_filter = language_filter

    def __call__(self, tweet: Tweet) -> Prepared | Dropped:
        result = prepare(tweet, language_filter=self.language_filter)
        if isinstance(result, Dropped):
            return result
        return dedup(result, self.seen.claim(result.dedup_keys, tweet.id))
