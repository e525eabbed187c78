"""Redis: a bounded sample of tweet texts per hashtag, for the thesaurus's coherence
(:mod:`stream.auditing.coherence`), written by the embed workers and read by the index job.

``{prefix}:reservoir:t:<hashtag>`` -- ZSET: at most ``size`` texts (:func:`stream.auditing.coherence.
coherence_text` of the cleaned tweet), each scored by :func:`stream.auditing.coherence.sample_priority`
of (hashtag, text) and, below it, the event-time hour the text was first seen (the score
packs both: the priority's top 33 bits, then 20 bits of hour since 1970, exact in a
double); the ``size`` lowest scores are kept.  The priority orders the sample; the hour
only says when each kept text was first used, so a mover's examples can be split into
before and after (``ZADD LT``: a text seen again keeps its earliest hour, whatever the
order of arrival).  The ``t:`` marks this format: keys of the earlier one
(``{prefix}:reservoir:<hashtag>``, priority alone) are no longer read and may be deleted.

Why a bottom-k sketch and not the textbook reservoir (Vitter's algorithm R): algorithm R
replaces a random slot with probability size/n, so a batch redelivered after a crash would
draw again and push its tweets in a second time -- the sample would over-represent
whatever was redelivered.  Here a tweet's score is fixed by its content: writing it again
(a redelivery, a retry, a second worker) is a no-op, the kept set is the ``size`` smallest
of all distinct texts ever seen, whatever the order or interleaving of writers (every ZADD
is followed by its trim, in one pipeline), and it is a uniform sample of the hashtag's
distinct texts.  ``reval thesaurus coherence`` computes the same sample from a feed.

Every command touches one key: Redis Cluster safe.  Memory: ``size`` x (text + 8 bytes)
per hashtag; texts are cut at :data:`MAX_TEXT_BYTES`.  Why the sample holds few recent
texts of a hashtag with a long history: it is uniform over all of the hashtag's texts, so a
side with a small share of them has few examples (:meth:`RedisReservoir.dated_samples`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from stream.auditing.coherence import BottomK, sample_priority
from workers.adapters.redis.redis_client import Client, Command, send

MAX_TEXT_BYTES = 1024
#: The score's layout: the priority's top PRIORITY_BITS, then HOUR_BITS of event-time hour.
PRIORITY_BITS, HOUR_BITS = 33, 20
_HOUR_MASK = (1 << HOUR_BITS) - 1


def _cut(text: str) -> str:
    data = text.encode()
    return text if len(data) <= MAX_TEXT_BYTES else data[:MAX_TEXT_BYTES].decode(errors="ignore")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _hour(event_time: float) -> int:
    return min(max(int(event_time // 3600), 0), _HOUR_MASK)


def sample_score(hashtag: str, text: str, event_time: float) -> float:
    """The ZSET score of (hashtag, text) first seen at ``event_time`` (epoch seconds): ordered
    by :func:`~stream.auditing.coherence.sample_priority` first, then by the hour.

    >>> sample_score("a", "x", 7200.0) - sample_score("a", "x", 3600.0)
    1.0
    >>> (sample_score("a", "x", 0.0) < sample_score("a", "y", 0.0)) == (
    ...     sample_priority("a", "x") < sample_priority("a", "y"))
    True
    """
    priority = int(sample_priority(hashtag, text) * (1 << PRIORITY_BITS))
    return float((priority << HOUR_BITS) | _hour(event_time))


def first_seen(score: float) -> float:
    """The start (epoch seconds) of the hour a sampled text was first seen, from its score."""
    return float((int(score) & _HOUR_MASK) * 3600)


class RedisReservoir:
    """Per-hashtag bottom-k samples of tweet texts (module docstring)."""

    def __init__(self, client: Client, prefix: str = "reval", size: int = 20) -> None:
        if size < 1:
            raise ValueError(f"the reservoir size must be at least 1, got {size}")
        self.client = client
        self.prefix = f"{prefix}:reservoir:t"
        self.size = size

    def key(self, hashtag: str) -> str:
        return f"{self.prefix}:{hashtag}"

    def add(self, items: Iterable[tuple[Sequence[str], str, float]]) -> int:
        """``(hashtags, text, event time)`` per tweet (empty texts skipped); one round trip,
        one ZADD and one trim per hashtag.  Returns how many (hashtag, text) writes were sent."""
        commands = self.commands(items)
        send(self.client, commands)
        return sum((len(c.args) - 3) // 2 for c in commands if c.args[0] == "ZADD")

    def commands(self, items: Iterable[tuple[Sequence[str], str, float]]) -> list[Command]:
        """:meth:`add`'s writes, for a caller that sends them in its own pipeline.  Only the
        batch's own bottom-k of a hashtag is sent: the stored sample is the bottom-k of the
        union, which no text outside the batch's can enter."""
        sample = BottomK(self.size)
        earliest: dict[tuple[str, str], float] = {}
        pairs = []
        for hashtags, text, when in items:
            if not text:
                continue
            cut = _cut(text)
            for hashtag in hashtags:
                pair = (hashtag, cut)
                pairs.append(pair)
                if when < earliest.get(pair, when + 1):
                    earliest[pair] = when
        sample.update(pairs)
        commands = []
        for hashtag, texts in sample.get().items():
            key = self.key(hashtag)
            # LT: a text already kept keeps the earliest hour it was seen at.
            scored = [(sample_score(hashtag, text, earliest[hashtag, text]), text) for text in texts]
            commands.append(Command("ZADD", key, "LT", *(x for pair in scored for x in pair)))
            commands.append(Command("ZREMRANGEBYRANK", key, self.size, -1))
        return commands

    def hashtags(self) -> set[str]:
        """Every hashtag with a sample (a SCAN: call it once per index build)."""
        start = len(self.prefix) + 1
        return {_text(k)[start:] for k in self.client.scan_iter(match=f"{self.prefix}:*", count=1000)}

    def samples(self, hashtags: Iterable[str]) -> dict[str, list[str]]:
        """The samples of ``hashtags`` (lowest priority first); one round trip."""
        return {name: [text for text, _ in dated] for name, dated in self.dated_samples(hashtags).items()}

    def dated_samples(self, hashtags: Iterable[str]) -> dict[str, list[tuple[str, float]]]:
        """The samples of ``hashtags`` with the hour each text was first seen (epoch seconds
        of its start), lowest priority first -- so the texts of any stretch of time, taken in
        this order, are a uniform sample of the hashtag's texts first seen then.  One round
        trip."""
        names = list(hashtags)
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.zrange(self.key(name), 0, -1, withscores=True)
        return {
            name: [(_text(t), first_seen(score)) for t, score in rows]
            for name, rows in zip(names, pipe.execute(), strict=True)
        }
