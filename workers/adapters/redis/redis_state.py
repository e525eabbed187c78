"""Redis adapters for the workers' other shared state: claims (retweet duplicates, event
duplicates) and the recommendation ↔ tweet join.  Every script touches one key, so all of
it is Redis Cluster safe.

``{prefix}:seen:<key>``   -- STRING: the claimant (``topic:partition:offset``) that
    first saw a (content, hashtag) key; expires after ``ttl`` seconds.
``{prefix}:ev:<key>``     -- STRING: the event id that first carried an event key (by
    default tweet id + recommender); a later event with the same key is a duplicate.
``{prefix}:j:{<tweet_id>}`` -- HASH for one tweet id: ``t`` = the tweet's hashtags (JSON),
    ``e:<event id>`` = a recommendation waiting for (or matched to, until settled) the
    tweet, ``d:<event id>`` = an event settled (its score or dead letter acknowledged by
    the broker), so a redelivered event is not scored twice.  Expires ``2 x join
    window`` after its last write.
    With exactly-once scores, ``c:<event id>`` = the *claim* on a matched event: the
    input record (``incarnation|topic|partition|offset``) whose Kafka transaction carries its
    score, or ``expire`` once the expiry took it (see "Claims" below).
``{prefix}:j:deadlines``  -- ZSET of ``<tweet id>\\0<event id>`` by the time the event
    expires unmatched; written in the same pipeline (an index, not state).
``{prefix}:j:bytes``      -- the bytes of waiting events (approximate: the metric of it).
``{prefix}:sample:<bucket>`` -- HASH: a bounded sample of the tweet embeddings of one
    event-time bucket (``claimant`` -> float32 bytes), for the embedding drift test; expires
    after two drift windows.

Delivery: an event is *settled* only after its score (or ``join_expired`` letter) was
acknowledged by the broker (:meth:`RedisJoin.settle`), so a crash at any point before
redelivers it: scores are at-least-once.

Claims (exactly-once scores, ``REVAL_PROCESSING_GUARANTEE=exactly_once``): the join's state is
in Redis, outside the Kafka transaction that delivers a score and commits the offsets of the
record that caused it; a crash between that commit and the settle would leave the event to be
scored again.  So whoever is about to score a matched event claims it for the record its
transaction commits (:meth:`RedisJoin.put_events`, :meth:`RedisJoin.put_tweets` with
``claims``); a claim is replaced only by the same record (read again after a crash or a
rebalance), and an event claimed by another record is scored by nobody else: its claim is
*settled* once that record's offset is committed (the caller asks the consumer group), and
otherwise left to that record's next reading.  The expiry claims an event too (``expire``):
an expired event is never scored, even when its tweet comes meanwhile.

Failover: given a :class:`~workers.adapters.redis.redis_client.Replication`, every method that
writes what a Kafka commit depends on (claims, samples, the join's puts and settles)
returns only once its writes are on the replicas; a lost master makes it raise a transient
error, and the caller's retry writes again (every write here is idempotent).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from workers.adapters.redis.redis_client import (
    Client,
    Command,
    Replication,
    eval_by_slot,
    eval_many,
    replicated,
    send,
)

# KEYS: the keys to claim; ARGV: ttl, then each key's claimant.  Returns, per key, 1 when the
# claimant owns it (claimed now, or before by the same claimant: a redelivery), else 0.
_CLAIM = """
local ttl = ARGV[1]
local out = {}
for i, key in ipairs(KEYS) do
  local claimant = ARGV[i + 1]
  local owner = redis.call('GET', key)
  if not owner then
    redis.call('SET', key, claimant, 'EX', ttl)
    owner = claimant
  end
  out[i] = owner == claimant and 1 or 0
end
return out
"""

# One script per join step serves both guarantees: ``claim`` is the record's claim with
# exactly-once scores and '' without (then nothing is claimed and nothing comes back held).

# ARGV: hashtags json, ttl, claim.  Returns {eid1, payload1, held1, ...}: the events waiting
# for it (left in place until settled), each claimed for this tweet's record unless another
# record holds it (then that record's claim comes back as held, and the event is not this
# record's to score); held is '' otherwise.
_PUT_TWEET = """
redis.call('HSET', KEYS[1], 't', ARGV[1])
local out = {}
local fields = redis.call('HKEYS', KEYS[1])
for _, f in ipairs(fields) do
  if string.sub(f, 1, 2) == 'e:' then
    local eid = string.sub(f, 3)
    local held = ''
    if ARGV[3] ~= '' then
      held = redis.call('HGET', KEYS[1], 'c:' .. eid)
      if not held or held == ARGV[3] then
        redis.call('HSET', KEYS[1], 'c:' .. eid, ARGV[3])
        held = ''
      end
    end
    table.insert(out, eid)
    table.insert(out, redis.call('HGET', KEYS[1], f))
    table.insert(out, held)
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return out
"""

# ARGV: eid, payload, ttl, claim.  Returns {'dup'} | {'match', hashtags json} | {'wait'} |
# {'claimed', claim}.  A match stores the event too, until settled: a crash before its score
# is acknowledged leaves it to be answered again.  With a claim, a match is claimed for the
# event's own record, or comes back {'claimed', claim} when another record holds it.
_PUT_EVENT = """
if redis.call('HEXISTS', KEYS[1], 'd:' .. ARGV[1]) == 1 then return {'dup'} end
redis.call('HSET', KEYS[1], 'e:' .. ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
local truth = redis.call('HGET', KEYS[1], 't')
if not truth then return {'wait'} end
if ARGV[4] ~= '' then
  local held = redis.call('HGET', KEYS[1], 'c:' .. ARGV[1])
  if held and held ~= ARGV[4] then return {'claimed', held} end
  redis.call('HSET', KEYS[1], 'c:' .. ARGV[1], ARGV[4])
end
return {'match', truth}
"""

#: The claim of an event the expiry took.
EXPIRED = "expire"

# ARGV: eid, ttl.  Marks an event settled; returns the bytes its payload held (0 if none).
_SETTLE = """
local payload = redis.call('HGET', KEYS[1], 'e:' .. ARGV[1])
redis.call('HDEL', KEYS[1], 'e:' .. ARGV[1], 'c:' .. ARGV[1])
redis.call('HSET', KEYS[1], 'd:' .. ARGV[1], '1')
redis.call('EXPIRE', KEYS[1], ARGV[2])
if payload then return string.len(payload) end
return 0
"""

# ARGV: eid, claim.  The payload of an event still waiting and unmatched (false when it was
# settled, or its tweet came: then the join answers it).  A claim ('expire', or '') claims it
# for the expiry: no tweet will score it now.
_DUE = """
if redis.call('HEXISTS', KEYS[1], 't') == 1 then return false end
local payload = redis.call('HGET', KEYS[1], 'e:' .. ARGV[1])
if payload and ARGV[2] ~= '' then redis.call('HSET', KEYS[1], 'c:' .. ARGV[1], ARGV[2]) end
return payload
"""


# ARGV: field, vector bytes, cap, ttl.  Adds one sampled embedding unless the bucket is
# full; a redelivered one (same field) is already in.  Returns 1 when added.
_SAMPLE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"""


class RedisSamples:
    """Bounded samples of tweet embeddings per event-time bucket, for the embedding drift
    test (:mod:`stream.monitoring.mmd`) the index job runs.

    Whether a tweet is sampled is decided by a hash of its claimant (``topic:partition:
    offset``), so a redelivered batch samples the same tweets, and each tweet is one field:
    exactly once in the sample, like the means.  A bucket keeps at most ``cap`` tweets (the
    first sampled), so memory is bounded by ``cap x dim x 4`` bytes per bucket whatever the
    traffic.  Every script touches one key: cluster safe.
    """

    def __init__(
        self,
        client: Client,
        prefix: str = "reval",
        *,
        rate: float = 0.1,
        cap: int = 300,
        bucket_s: int = 3600,
        window_s: int = 86400,
        replication: Replication | None = None,
    ) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"sample rate must be within [0, 1], got {rate}")
        self.client = client
        self.prefix = f"{prefix}:sample"
        self.rate, self.cap, self.bucket_s, self.window_s = rate, cap, bucket_s, window_s
        self.ttl = 2 * window_s + bucket_s
        self.replication = replication
        self._add = cast(Any, client).register_script(_SAMPLE)

    def sampled(self, claimant: str) -> bool:
        return zlib.crc32(claimant.encode()) < self.rate * 2**32

    def add(self, items: Sequence[tuple[str, float, npt.NDArray[np.floating[Any]]]]) -> int:
        """``(claimant, event time in seconds, vector)`` of embedded tweets; one round trip.
        Returns how many went into a sample."""
        commands = self.commands(items)
        if not commands:
            return 0
        with replicated(self.replication):
            return sum(int(x) for x in send(self.client, commands))

    def commands(self, items: Sequence[tuple[str, float, npt.NDArray[np.floating[Any]]]]) -> list[Command]:
        """:meth:`add`'s writes (one script call per sampled tweet), for a caller that sends
        them in its own pipeline."""
        return [
            Command.eval(
                self._add,
                [f"{self.prefix}:{int(when // self.bucket_s)}"],
                (claimant, np.asarray(vector, dtype="<f4").tobytes(), self.cap, self.ttl),
            )
            for claimant, when, vector in items
            if self.sampled(claimant)
        ]

    def windows(self) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """(reference, recent): the samples of the last ``window_s`` of event time, ending at
        the newest bucket (event time, not the clock: a replay is judged at its own dates),
        and of the ``window_s`` before them."""
        names = (_text(key).rsplit(":", 1)[1] for key in self.client.scan_iter(match=f"{self.prefix}:*"))
        # A set: SCAN may return a key twice (when Redis rehashes its table during the scan,
        # as it does under other writers), and a bucket read twice would count its samples twice.
        buckets = sorted({int(name) for name in names if name.lstrip("-").isdigit()})
        if not buckets:
            empty = np.zeros((0, 0), dtype=np.float32)
            return empty, empty
        span = max(1, self.window_s // self.bucket_s)
        newest = buckets[-1]
        recent = [b for b in buckets if newest - span < b <= newest]
        reference = [b for b in buckets if newest - 2 * span < b <= newest - span]
        return self._read(reference), self._read(recent)

    def _read(self, buckets: Sequence[int]) -> npt.NDArray[np.float32]:
        pipe = self.client.pipeline(transaction=False)
        for bucket in buckets:
            pipe.hvals(f"{self.prefix}:{bucket}")
        rows = [np.frombuffer(v, dtype="<f4") for values in pipe.execute() for v in values]
        return np.vstack(rows) if rows else np.zeros((0, 0), dtype=np.float32)


class RedisClaims:
    """First-claimant-wins keys with a time to live: the first ``claimant`` of a key owns
    it, and claiming again with the same claimant (a redelivery) still returns True."""

    def __init__(
        self, client: Client, prefix: str, namespace: str, ttl: int, replication: Replication | None = None
    ) -> None:
        self.client = client
        self.prefix = f"{prefix}:{namespace}"
        self.ttl = ttl
        self.replication = replication
        self._claim = cast(Any, client).register_script(_CLAIM)

    def claim_many(self, requests: Sequence[tuple[Sequence[str], str]]) -> list[list[bool]]:
        """Claims for a whole batch in one round trip and one script call (per cluster slot):
        per request, per key, owned or not."""
        keys = [f"{self.prefix}:{key}" for keys, _ in requests for key in keys]
        if not keys:
            return [[] for _ in requests]
        claimants = [claimant for keys, claimant in requests for _ in keys]
        with replicated(self.replication):  # what is decided on a claim must survive a failover
            owned = iter(eval_by_slot(self.client, self._claim, keys, claimants, (self.ttl,)))
        return [[next(owned) == 1 for _ in keys] for keys, _ in requests]


class RedisSeen(RedisClaims):
    """:class:`stream.intake.cleaning.SeenStore` in Redis: claims survive restarts and are shared
    by all embed workers, so duplicate retweets are removed exactly as in a batch run."""

    def __init__(
        self,
        client: Client,
        prefix: str = "reval",
        ttl: int = 7 * 86400,
        replication: Replication | None = None,
    ) -> None:
        super().__init__(client, prefix, "seen", ttl, replication)

    def claim(self, keys: Sequence[str], claimant: str) -> list[bool]:
        return self.claim_many([(keys, claimant)])[0]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _claims(claims: Sequence[str] | None, n: int) -> Sequence[str]:
    """The scripts' claim argument per call: '' (claim nothing) without exactly-once."""
    return [""] * n if claims is None else claims


@dataclass(frozen=True)
class Waiting:
    """An event in the join: answered by its tweet (``truth``) or due to expire (``truth`` None).

    ``call``: which tweet of :meth:`RedisJoin.put_tweets` answered it; ``held_by``: the claim of
    another record that holds it (claiming calls only; None: this call's to score)."""

    tweet_id: str
    event_id: str
    payload: str
    truth: list[str] | None
    call: int = -1
    held_by: str | None = None


class RedisJoin:
    """Joins recommendation events without ground truth to the tweet of the same id.

    The two may arrive in either order and at different workers; the first to arrive
    waits in Redis up to ``window`` seconds.  Nothing is settled here until the caller
    says the outputs are acknowledged (:meth:`settle`).
    """

    def __init__(
        self,
        client: Client,
        prefix: str = "reval",
        window: float = 300.0,
        replication: Replication | None = None,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.window = window
        self.replication = replication
        self.ttl = max(60, int(2 * window))
        self.deadlines = f"{prefix}:j:deadlines"
        self.bytes_key = f"{prefix}:j:bytes"
        self._put_tweet = cast(Any, client).register_script(_PUT_TWEET)
        self._put_event = cast(Any, client).register_script(_PUT_EVENT)
        self._settle = cast(Any, client).register_script(_SETTLE)
        self._due = cast(Any, client).register_script(_DUE)

    def key(self, tweet_id: str) -> str:
        return f"{self.prefix}:j:{{{tweet_id}}}"

    def put_tweets(
        self, tweets: Sequence[tuple[str, Sequence[str]]], claims: Sequence[str] | None = None
    ) -> list[Waiting]:
        """Record tweets' hashtags; returns the events waiting for them (not yet settled).
        ``claims`` (one per tweet: its record): claim each event for its tweet's record, or
        say which other record holds it (:attr:`Waiting.held_by`)."""
        if not tweets:
            return []
        calls: list[tuple[str, tuple[Any, ...]]] = [
            (self.key(t), (json.dumps(list(tags)), self.ttl, claim))
            for (t, tags), claim in zip(tweets, _claims(claims, len(tweets)), strict=True)
        ]
        with replicated(self.replication):
            replies = eval_many(self.client, self._put_tweet, calls)
        found = []
        for call, ((tweet_id, hashtags), reply) in enumerate(zip(tweets, replies, strict=True)):
            for i in range(0, len(reply), 3):
                held = _text(reply[i + 2])
                found.append(
                    Waiting(
                        tweet_id, _text(reply[i]), _text(reply[i + 1]), list(hashtags), call, held or None
                    )
                )
        return found

    def put_events(
        self, events: Sequence[tuple[str, str, str | bytes]], now: float, claims: Sequence[str] | None = None
    ) -> list[tuple[str, Any]]:
        """Offer events ``(tweet_id, event_id, payload)``; per event: ``("match", truth)``,
        ``("wait", None)`` or ``("dup", None)`` for one settled before (a redelivery).
        ``claims`` (one per event: its record): a match is claimed for it, or comes back as
        ``("claimed", claim)`` when another record holds the event."""
        if not events:
            return []
        calls: list[tuple[str, tuple[Any, ...]]] = [
            (self.key(t), (e, payload, self.ttl, claim))
            for (t, e, payload), claim in zip(events, _claims(claims, len(events)), strict=True)
        ]
        with replicated(self.replication):
            return self._put_events(events, calls, now, self._put_event)

    def _put_events(
        self,
        events: Sequence[tuple[str, str, str | bytes]],
        calls: list[tuple[str, tuple[Any, ...]]],
        now: float,
        script: Any,
    ) -> list[tuple[str, Any]]:
        replies = eval_many(self.client, script, calls)
        out: list[tuple[str, Any]] = []
        waiting: dict[str, float] = {}
        stored = 0
        for (tweet_id, event_id, payload), reply in zip(events, replies, strict=True):
            status = _text(reply[0])
            if status == "match":
                out.append((status, json.loads(_text(reply[1]))))
            elif status == "claimed":
                out.append((status, _text(reply[1])))
            else:
                out.append((status, None))
            if status != "dup":
                waiting[f"{tweet_id}\0{event_id}"] = now + self.window
                stored += len(payload)
        if waiting:
            pipe = self.client.pipeline(transaction=False)
            pipe.zadd(self.deadlines, waiting)
            pipe.incrby(self.bytes_key, stored)
            pipe.execute()
        return out

    def settle(self, answered: Sequence[tuple[str, str]]) -> None:
        """Mark events ``(tweet_id, event_id)`` done: their outputs are acknowledged."""
        if not answered:
            return
        calls = [(self.key(t), (e, self.ttl)) for t, e in answered]
        with replicated(self.replication):  # a settle lost in a failover would score it again
            freed = sum(int(n) for n in eval_many(self.client, self._settle, calls))
            pipe = self.client.pipeline(transaction=False)
            pipe.zrem(self.deadlines, *(f"{t}\0{e}" for t, e in answered))
            if freed:
                pipe.decrby(self.bytes_key, freed)
            pipe.execute()

    def due(self, now: float, limit: int = 1000, *, claim: bool = False) -> list[Waiting]:
        """Events whose window has passed without their tweet (not yet settled: the caller
        dead-letters them, then settles).  Events whose tweet came are left to the join and
        their deadline moves one window on.  ``claim``: each due event is claimed for the
        expiry (:data:`EXPIRED`): its tweet, coming now, does not score it."""
        members = self.client.zrangebyscore(self.deadlines, "-inf", now, start=0, num=limit)
        if not members:
            return []
        pairs = [_text(m).split("\0", 1) for m in members]
        flag = EXPIRED if claim else ""
        with replicated(self.replication if claim else None):
            replies = eval_many(self.client, self._due, [(self.key(t), (e, flag)) for t, e in pairs])
        out, answered_elsewhere, gone = [], {}, []
        for member, (tweet_id, event_id), payload in zip(members, pairs, replies, strict=True):
            if payload:
                out.append(Waiting(tweet_id, event_id, _text(payload), None))
            elif self.client.hexists(self.key(tweet_id), f"e:{event_id}"):
                answered_elsewhere[_text(member)] = now + self.window  # the join settles it
            else:
                gone.append(member)  # settled, or the hash expired
        if answered_elsewhere or gone:
            pipe = self.client.pipeline(transaction=False)
            if answered_elsewhere:
                pipe.zadd(self.deadlines, answered_elsewhere)
            if gone:
                pipe.zrem(self.deadlines, *(_text(m) for m in gone))
            pipe.execute()
        return out

    def pending(self) -> int:
        return int(self.client.zcard(self.deadlines))

    def stored_bytes(self) -> int:
        return max(0, int(self.client.get(self.bytes_key) or 0))
