"""Redis: a bounded sample of tweet texts per hashtag, for the thesaurus's coherence
(:mod:`stream.coherence`), written by the embed workers and read by the index job.

``{prefix}:reservoir:<hashtag>`` -- ZSET: at most ``size`` texts (:func:`stream.coherence.
coherence_text` of the cleaned tweet), each scored by :func:`stream.coherence.sample_priority`
of (hashtag, text); the ``size`` lowest scores are kept.

Why a bottom-k sketch and not the textbook reservoir (Vitter's algorithm R): algorithm R
replaces a random slot with probability size/n, so a batch redelivered after a crash would
draw again and push its tweets in a second time -- the sample would over-represent
whatever was redelivered.  Here a tweet's score is fixed by its content: writing it again
(a redelivery, a retry, a second worker) is a no-op, the kept set is the ``size`` smallest
of all distinct texts ever seen, whatever the order or interleaving of writers (every ZADD
is followed by its trim, in one pipeline), and it is a uniform sample of the hashtag's
distinct texts.  ``reval thesaurus coherence`` computes the same sample from a feed.

Every command touches one key: Redis Cluster safe.  Memory: ``size`` x (text + 8 bytes)
per hashtag; texts are cut at :data:`MAX_TEXT_BYTES`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from stream.coherence import BottomK, sample_priority
from workers.adapters.redis_client import Client

MAX_TEXT_BYTES = 1024


def _cut(text: str) -> str:
    data = text.encode()
    return text if len(data) <= MAX_TEXT_BYTES else data[:MAX_TEXT_BYTES].decode(errors="ignore")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisReservoir:
    """Per-hashtag bottom-k samples of tweet texts (module docstring)."""

    def __init__(self, client: Client, prefix: str = "reval", size: int = 20) -> None:
        if size < 1:
            raise ValueError(f"the reservoir size must be at least 1, got {size}")
        self.client = client
        self.prefix = f"{prefix}:reservoir"
        self.size = size

    def key(self, hashtag: str) -> str:
        return f"{self.prefix}:{hashtag}"

    def add(self, items: Iterable[tuple[Sequence[str], str]]) -> int:
        """``(hashtags, text)`` per tweet (empty texts skipped); one round trip, one ZADD and
        one trim per hashtag.  Only the batch's own bottom-k of a hashtag is sent: the stored
        sample is the bottom-k of the union, which no text outside the batch's can enter.
        Returns how many (hashtag, text) writes were sent."""
        sample = BottomK(self.size)
        sample.update((hashtag, _cut(text)) for hashtags, text in items if text for hashtag in hashtags)
        kept = sample.get()
        if not kept:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for hashtag, texts in kept.items():
            key = self.key(hashtag)
            pipe.zadd(key, {text: sample_priority(hashtag, text) for text in texts})
            pipe.zremrangebyrank(key, self.size, -1)
        pipe.execute()
        return sum(len(texts) for texts in kept.values())

    def hashtags(self) -> set[str]:
        """Every hashtag with a sample (a SCAN: call it once per index build)."""
        start = len(self.prefix) + 1
        return {_text(k)[start:] for k in self.client.scan_iter(match=f"{self.prefix}:*", count=1000)}

    def samples(self, hashtags: Iterable[str]) -> dict[str, list[str]]:
        """The samples of ``hashtags`` (lowest score first); one round trip."""
        names = list(hashtags)
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.zrange(self.key(name), 0, -1)
        return {name: [_text(t) for t in texts] for name, texts in zip(names, pipe.execute(), strict=True)}
