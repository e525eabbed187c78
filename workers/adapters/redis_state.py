"""Redis adapters for the workers' other shared state: retweet-duplicate claims and the
recommendation ↔ tweet join.  Every script touches one key, so both are Redis Cluster safe.

``{prefix}:seen:<key>``   -- STRING: the claimant (``topic:partition:offset``) that
    first saw a (content, hashtag) key; expires after ``ttl`` seconds.
``{prefix}:j:{<tweet_id>}`` -- HASH for one tweet id: ``t`` = the tweet's hashtags (JSON),
    ``e:<event id>`` = a recommendation waiting for the tweet, ``d:<event id>`` = an
    event already answered (scored or expired), so a redelivered event is not
    scored twice.  Expires ``2 x join window`` after its last write.
``{prefix}:j:deadlines``  -- ZSET of ``<tweet id>\\0<event id>`` by the time the
    event expires unmatched; written in the same pipeline (an index, not state).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from workers.adapters.redis_client import Client, eval_many

_CLAIM = """
local owner = redis.call('GET', KEYS[1])
if owner then return owner end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return ARGV[1]
"""

# ARGV: hashtags json, ttl.  Returns {eid1, payload1, eid2, payload2, ...} now answered.
_PUT_TWEET = """
redis.call('HSET', KEYS[1], 't', ARGV[1])
local out = {}
local fields = redis.call('HKEYS', KEYS[1])
for _, f in ipairs(fields) do
  if string.sub(f, 1, 2) == 'e:' then
    local eid = string.sub(f, 3)
    table.insert(out, eid)
    table.insert(out, redis.call('HGET', KEYS[1], f))
    redis.call('HDEL', KEYS[1], f)
    redis.call('HSET', KEYS[1], 'd:' .. eid, '1')
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return out
"""

# ARGV: eid, payload, ttl.  Returns {'dup'} | {'match', hashtags json} | {'wait'}.
_PUT_EVENT = """
if redis.call('HEXISTS', KEYS[1], 'd:' .. ARGV[1]) == 1 then return {'dup'} end
local truth = redis.call('HGET', KEYS[1], 't')
if truth then
  redis.call('HSET', KEYS[1], 'd:' .. ARGV[1], '1')
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  return {'match', truth}
end
redis.call('HSET', KEYS[1], 'e:' .. ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return {'wait'}
"""

# ARGV: eid.  Pops a still-pending event; returns its payload or false.
_EXPIRE = """
local payload = redis.call('HGET', KEYS[1], 'e:' .. ARGV[1])
if not payload then return false end
redis.call('HDEL', KEYS[1], 'e:' .. ARGV[1])
redis.call('HSET', KEYS[1], 'd:' .. ARGV[1], '1')
return payload
"""


class RedisSeen:
    """:class:`stream.cleaning.SeenStore` in Redis: claims survive restarts and are shared
    by all embed workers, so duplicate retweets are removed exactly as in a batch run."""

    def __init__(self, client: Client, prefix: str = "reval", ttl: int = 7 * 86400) -> None:
        self.client = client
        self.prefix = prefix
        self.ttl = ttl
        self._claim = cast(Any, client).register_script(_CLAIM)

    def claim(self, keys: Sequence[str], claimant: str) -> list[bool]:
        return self.claim_many([(keys, claimant)])[0]

    def claim_many(self, requests: Sequence[tuple[Sequence[str], str]]) -> list[list[bool]]:
        """Claims for a whole batch in one round trip."""
        calls = [
            (f"{self.prefix}:seen:{key}", (claimant, self.ttl)) for keys, claimant in requests for key in keys
        ]
        owners = iter(eval_many(self.client, self._claim, calls) if calls else [])
        return [[_text(next(owners)) == claimant for _ in keys] for keys, claimant in requests]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Answered:
    """A pending event answered by its tweet (``truth``) or by expiry (``truth`` None)."""

    tweet_id: str
    event_id: str
    payload: str
    truth: list[str] | None


class RedisJoin:
    """Joins recommendation events without ground truth to the tweet of the same id.

    The two may arrive in either order and at different workers; the first to
    arrive waits in Redis up to ``window`` seconds.
    """

    def __init__(self, client: Client, prefix: str = "reval", window: float = 300.0) -> None:
        self.client = client
        self.prefix = prefix
        self.window = window
        self.ttl = max(60, int(2 * window))
        self.deadlines = f"{prefix}:j:deadlines"
        self._put_tweet = cast(Any, client).register_script(_PUT_TWEET)
        self._put_event = cast(Any, client).register_script(_PUT_EVENT)
        self._expire = cast(Any, client).register_script(_EXPIRE)

    def key(self, tweet_id: str) -> str:
        return f"{self.prefix}:j:{{{tweet_id}}}"

    def put_tweets(self, tweets: Sequence[tuple[str, Sequence[str]]]) -> list[Answered]:
        """Record tweets' hashtags; returns the events that were waiting for them."""
        if not tweets:
            return []
        calls = [(self.key(t), (json.dumps(list(tags)), self.ttl)) for t, tags in tweets]
        answered = []
        for (tweet_id, hashtags), reply in zip(
            tweets, eval_many(self.client, self._put_tweet, calls), strict=True
        ):
            for i in range(0, len(reply), 2):
                answered.append(Answered(tweet_id, _text(reply[i]), _text(reply[i + 1]), list(hashtags)))
        if answered:
            self.client.zrem(self.deadlines, *(f"{a.tweet_id}\0{a.event_id}" for a in answered))
        return answered

    def put_events(
        self, events: Sequence[tuple[str, str, str]], now: float
    ) -> list[tuple[str, list[str] | None]]:
        """Offer events ``(tweet_id, event_id, payload)``; per event: ``("match", truth)``,
        ``("wait", None)`` or ``("dup", None)`` for one answered before (a redelivery)."""
        if not events:
            return []
        calls = [(self.key(t), (e, payload, self.ttl)) for t, e, payload in events]
        replies = eval_many(self.client, self._put_event, calls)
        out: list[tuple[str, list[str] | None]] = []
        waiting: dict[str, float] = {}
        for (tweet_id, event_id, _), reply in zip(events, replies, strict=True):
            status = _text(reply[0])
            out.append((status, json.loads(_text(reply[1])) if status == "match" else None))
            if status == "wait":
                waiting[f"{tweet_id}\0{event_id}"] = now + self.window
        if waiting:
            self.client.zadd(self.deadlines, waiting)  # type: ignore[arg-type]
        return out

    def expire(self, now: float, limit: int = 1000) -> list[Answered]:
        """Pop events whose window has passed (each is returned to exactly one caller)."""
        members = self.client.zrangebyscore(self.deadlines, "-inf", now, start=0, num=limit)
        if not members:
            return []
        pairs = [_text(m).split("\0", 1) for m in members]
        calls = [(self.key(t), (e,)) for t, e in pairs]
        expired = [
            Answered(tweet_id, event_id, _text(payload), None)
            for (tweet_id, event_id), payload in zip(
                pairs, eval_many(self.client, self._expire, calls), strict=True
            )
            if payload
        ]
        self.client.zrem(self.deadlines, *members)
        return expired

    def pending(self) -> int:
        return int(self.client.zcard(self.deadlines))
