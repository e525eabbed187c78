"""Hashtag extraction and normalisation.

Hashtags are compared after normalisation: NFC, lower case, ``#`` dropped, cut at
the first character that cannot be part of a hashtag (so ``#Covid19:`` and
``#Covid19…Don't`` both give ``covid19``).  Unicode letters, marks, digits and
``_`` are kept (``#東京``, ``#1``).  A hashtag that the tweet's own truncation cut
off (``... #coron…`` at the end of a clipped retweet) is not a real hashtag and
is dropped rather than counted under a wrong name.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from functools import lru_cache

import regex

_WORD = r"[\p{L}\p{M}\p{N}_]"
# ``#`` or the full-width ``＃`` not glued to a preceding word character or ``&``
# (HTML entities such as ``&#39;``), then the hashtag body.
_HASHTAG_RE = regex.compile(rf"(?<![\p{{L}}\p{{M}}\p{{N}}_&/])[#＃]({_WORD}+)")
_ELLIPSIS_RE = regex.compile(r"(?:…|\.\.\.)")
# What may follow a truncation ellipsis up to the end of the text: nothing but
# whitespace and links (Twitter appends the link to the full tweet).
_TRAILER_RE = regex.compile(r"(?:\s+(?:https?://\S+|www\.\S+))*\s*\Z")
_BODY_RE = regex.compile(rf"{_WORD}+")


def _is_truncated(text: str, end: int) -> bool:
    """True when the hashtag ending at ``end`` is followed by an ellipsis that ends the text."""
    ellipsis = _ELLIPSIS_RE.match(text, end)
    return ellipsis is not None and _TRAILER_RE.match(text, ellipsis.end()) is not None


def normalise_hashtag(raw: str) -> str | None:
    """Normalise one hashtag as written by a user, an API or a recommender.

    Returns ``None`` when nothing hashtag-like is left or the hashtag was cut off
    by truncation.

    >>> normalise_hashtag("#Covid19…Don't"), normalise_hashtag("#Covid19:")
    ('covid19', 'covid19')
    >>> normalise_hashtag("#coron…") is None, normalise_hashtag("東京")
    (True, '東京')
    """
    body = raw.lstrip("#")
    if body.isascii() and body.replace("_", "a").isalnum():
        # The usual hashtag, ASCII word characters only: NFC leaves it as it is, the body is
        # all of it and nothing follows to truncate it -- what the general path gives, ~10x
        # faster (a feed's novel hashtags miss the cache below).
        return body.lower()
    return _normalise_any(raw)


def _normalise_any(raw: str) -> str | None:
    """:func:`normalise_hashtag` of any string, by the definition."""
    text = unicodedata.normalize("NFC", raw.strip()).lstrip("#＃")
    body = _BODY_RE.match(text)
    if body is None or _is_truncated(text, body.end()):
        return None
    found: str = body.group()  # the regex package is untyped
    return found.lower()


def extract_hashtags(text: str) -> list[str]:
    """Normalised hashtags of a tweet's text, in order of first appearance, without duplicates.

    >>> extract_hashtags("Stay safe #Flood #flood #NSW… more at http://t.co/x #coron…")
    ['flood', 'nsw']
    """
    text = unicodedata.normalize("NFC", text)
    found: dict[str, None] = {}
    for match in _HASHTAG_RE.finditer(text):
        if not _is_truncated(text, match.end()):
            found.setdefault(match.group(1).lower(), None)
    return list(found)


#: :func:`normalise_hashtag` remembered for the most recent hashtags: a feed repeats the same
#: few thousand (Zipf), and normalising one (NFC, two regex matches) cost ~5 µs, a tenth of
#: the score worker's step (BENCHMARKS.md).
_normalised = lru_cache(maxsize=1 << 16)(normalise_hashtag)


def normalise_all(raw: Iterable[str]) -> list[str]:
    """Normalise a list of hashtags, dropping invalid ones and duplicates (order kept).

    >>> normalise_all(["#Flood", "flood", "#coron…", "", "Help!"])
    ['flood', 'help']
    """
    # No Python frame per hashtag: the cache, the filter (a tag is never empty) and the
    # de-duplication are C loops.
    return list(dict.fromkeys(filter(None, map(_normalised, raw))))
