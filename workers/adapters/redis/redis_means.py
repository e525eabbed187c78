"""Redis adapter for the per-hashtag running means (count, sum) of tweet embeddings.

The embed workers add every embedded tweet to the running mean of each of its hashtags; the
periodic index job reads all of them.  The maths lives in :mod:`stream.synonyms.means`; this module
stores it with **exactly-once effect under Kafka redelivery**, safe on Redis Cluster, and with
no float arithmetic and no scripts on the Redis write path (one Redis core serves every embed
worker): each record goes into its hashtag's *log* under its Kafka coordinates (one idempotent
HSET per hashtag and batch); a *fold* moves a log into the stored sum with a compare-and-set on
a fold generation and raises per-partition watermarks, below which later copies count for
nothing.  The bytes stored are :mod:`workers.adapters.redis.means_format`'s.

The caller's contract (the usual at-least-once consumer's): commit a Kafka offset only after
:meth:`RedisMeans.apply` has returned for every record below it; retrying a failed ``apply``
is safe, and so is going on (the next call re-runs the failed one first).  Offsets of a
partition only grow outside redelivery: a re-created topic needs a fresh prefix.

The key layout, why the exactly-once argument holds (zombies, folds racing writes, failover)
and the precision of the stored sums: ``docs/redis-means.md``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, cast

import numpy as np
import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from stream.intake.records import Coordinates
from stream.synonyms.means import RunningMean, Vector
from workers.adapters.redis.means_format import (
    DimensionError,
    HashtagState,
    above_watermark,
    decode_hashtag,
    decode_marks,
    encode_state,
    encode_window,
    stored_dim,
    vectors_bytes,
)
from workers.adapters.redis.redis_client import Command, Replication, replicated, send, settle

Client: TypeAlias = "redis.Redis | RedisCluster"

#: Kafka offsets are int64, Lua numbers are doubles: offsets must stay exactly representable.
MAX_OFFSET = 2**53 - 1
_PREFIX_RE = re.compile(r"[A-Za-z0-9_.:\-]+")
_READ_CHUNK = 500  # keys per pipelined HMGET round trip in read_all

_FOLD_LUA = """
-- Replace a hashtag's folded state by the one the client computed from what it read, and
-- drop the log fields it folded -- unless another fold came first (generation check).
-- KEYS: the hashtag's hash, its log, its windows (hashes with one hash tag: one slot).
-- ARGV: generation read, new s, new m, window TTL (s; 0: none), n, then n pairs (window,
--   folded mean), x, then x expired windows, then the names of the log fields folded.
local g = tonumber(redis.call('HGET', KEYS[1], 'g') or 0)
if g ~= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 's', ARGV[2], 'm', ARGV[3], 'g', g + 1)
local n = tonumber(ARGV[5])
if n > 0 then redis.call('HSET', KEYS[3], unpack(ARGV, 6, 5 + 2 * n)) end
local i = 6 + 2 * n
local x = tonumber(ARGV[i])
if x > 0 then redis.call('HDEL', KEYS[3], unpack(ARGV, i + 1, i + x)) end
if tonumber(ARGV[4]) > 0 and n > 0 then redis.call('EXPIRE', KEYS[3], ARGV[4]) end
for j = i + x + 1, #ARGV, 1000 do  -- HDEL in slices: unpack() is bounded by Lua's C stack
  redis.call('HDEL', KEYS[2], unpack(ARGV, j, math.min(j + 999, #ARGV)))
end
return 1
"""

_TAKE_LUA = """
-- Return and clear the changed-hashtags set atomically (one key).
local members = redis.call('SMEMBERS', KEYS[1])
redis.call('DEL', KEYS[1])
return members
"""


@dataclass(frozen=True, eq=False)
class Contribution:
    """One embedded tweet: its Kafka coordinates (the embed role's topic carries the topic's
    incarnation), its hashtags and its embedding."""

    coordinates: Coordinates
    hashtags: Sequence[str]
    vector: Vector
    time: float | None = None
    """Event time (seconds since the epoch): the window its vector also counts in, when the
    store keeps windows (``window_s``)."""


@dataclass(frozen=True)
class ApplyResult:
    """What :meth:`RedisMeans.apply` did, counted in (tweet, hashtag) updates."""

    applied: int
    """Updates newly written to their hashtag's log.  (Exact but for one race: a record
    redelivered while another process folds that very record counts here again; the means
    never count it twice, since reads and folds drop records at or below the watermark.)"""
    skipped: int
    """Updates already in the log or folded (redelivery), or repeated within the batch."""
    hashtags: frozenset[str]
    """Hashtags whose log got a new record."""
    folded: int = 0
    """Hashtags whose log reached ``fold_after`` records and was folded into the sum."""


@dataclass(frozen=True)
class _Call:
    """All of a batch's records for one hashtag: one HSET on its log (atomic, one slot)."""

    hashtag: str
    keys: tuple[str, str, str]
    fields: tuple[tuple[str, bytes], ...]  # ("topic:partition:offset[/window]", vector bytes)


@dataclass(frozen=True)
class _Plan:
    calls: tuple[_Call, ...]
    duplicates: int  # (tweet, hashtag) updates repeated within the batch itself


class RedisMeans:
    """Per-hashtag running means in Redis, updated exactly once per Kafka record.

    Works with :class:`redis.Redis` and :class:`redis.cluster.RedisCluster` clients
    (``decode_responses`` must be off: the sums are binary).  ``dim`` may be given,
    or is fixed by the first :meth:`apply` (and shared through ``{prefix}:dim``).
    ``fold_after``: log records a hashtag may hold before :meth:`apply` folds them into
    its sum (``read(..., fold=True)`` folds whatever it reads).
    Two stores on one Redis need prefixes that are not ``other + ":..."`` of each
    other, since reads and :meth:`clear` SCAN for ``{prefix}:*``.
    """

    def __init__(
        self,
        client: Client,
        prefix: str = "reval",
        dim: int | None = None,
        fold_after: int = 8,
        window_s: float | None = None,
        window_keep: int = 5,
        replication: Replication | None = None,
    ) -> None:
        if not _PREFIX_RE.fullmatch(prefix):
            raise ValueError(
                f"prefix {prefix!r} must match {_PREFIX_RE.pattern} "
                "(no braces: they would pin all keys to one cluster slot)"
            )
        if client.get_encoder().decode_responses:
            raise ValueError("RedisMeans needs a client with decode_responses=False")
        if dim is not None and dim < 1:
            raise ValueError(f"dim must be positive, got {dim}")
        if fold_after < 1:
            raise ValueError(f"fold_after must be at least 1, got {fold_after}")
        if window_s is not None and not window_s > 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        if window_keep < 1:
            raise ValueError(f"window_keep must be at least 1, got {window_keep}")
        self.client = client
        self.prefix = prefix
        self.fold_after = fold_after
        self.window_s = window_s
        self.window_keep = window_keep
        self.replication = replication
        self._wanted_dim = dim
        self._dim: int | None = None  # set once checked against {prefix}:dim
        self._unfinished: _Plan | None = None  # a plan whose pipeline failed part-way
        # types-redis 4.6 (the stubs installed beside redis-py 8) predates RedisCluster's
        # scripting support and Script.sha; both exist at run time.
        scripting = cast(redis.Redis, client)
        self._fold_script: Any = scripting.register_script(_FOLD_LUA)
        self._take_script: Any = scripting.register_script(_TAKE_LUA)
        self._changed_key = f"{prefix}:changed"
        self._dim_key = f"{prefix}:dim"

    @classmethod
    def from_url(
        cls,
        url: str,
        prefix: str = "reval",
        cluster: bool = False,
        dim: int | None = None,
        **client_kwargs: Any,
    ) -> RedisMeans:
        """Connect from ``redis://[:password@]host:port/db`` or ``rediss://`` (TLS)."""
        client_kwargs["decode_responses"] = False
        client: Client
        if cluster:
            client = RedisCluster.from_url(url, **client_kwargs)
        else:
            client = redis.Redis.from_url(url, **client_kwargs)
        return cls(client, prefix=prefix, dim=dim)

    # -- keys ---------------------------------------------------------------

    def key(self, hashtag: str) -> str:
        """The hash holding ``hashtag``'s folded state (the hashtag is its cluster hash tag)."""
        return f"{self.prefix}:h:{{{hashtag}}}"

    def log_key(self, hashtag: str) -> str:
        """The hash holding ``hashtag``'s log of records not yet folded (same slot)."""
        return f"{self.prefix}:p:{{{hashtag}}}"

    def window_key(self, hashtag: str) -> str:
        """The hash holding ``hashtag``'s folded per-window means (same slot)."""
        return f"{self.prefix}:w:{{{hashtag}}}"

    def window_of(self, time: float) -> int:
        """The number of the event-time window holding ``time`` (``floor(time / window_s)``)."""
        if self.window_s is None:
            raise ValueError("this store keeps no windows (window_s is None)")
        return math.floor(time / self.window_s)

    def _keys(self, hashtag: str) -> tuple[str, str, str]:
        return self.key(hashtag), self.log_key(hashtag), self.window_key(hashtag)

    def _hashtag_of(self, key: bytes | str) -> str:
        text = key.decode() if isinstance(key, bytes) else key
        return text[len(self.prefix) + 4 : -1]

    @property
    def dim(self) -> int | None:
        """The vector dimension, once known (given, or fixed by the first write)."""
        return self._dim if self._dim is not None else self._wanted_dim

    # -- writing --------------------------------------------------------------

    def apply(self, contributions: Sequence[Contribution], riders: Sequence[Command] = ()) -> ApplyResult:
        """Add a batch of embedded tweets to their hashtags' running means, exactly once.

        Two pipelined round trips: the folded watermarks, then one HSET per distinct
        hashtag (its records, keyed by Kafka coordinates, into its log) plus one SADD to
        the changed set; then, for the hashtags whose log reached ``fold_after`` records,
        two more (read, fold).  ``riders``: other stores' idempotent writes of the same batch
        (:class:`~workers.adapters.redis.redis_client.Command`), sent in the second round trip
        (issue 36 §4: one unit of work per batch), in a round trip of their own when the batch
        writes nothing to the means; an error in them is raised after the means' writes.
        Contributions must arrive in offset order per partition across batches (Kafka's
        order); within a batch any order is fine.  Raises :class:`DimensionError` /
        :class:`ValueError` before touching Redis.

        With a :class:`~workers.adapters.redis.redis_client.Replication` it returns only once the
        writes are on the replicas (raising a transient ``ReplicationLagError`` otherwise).

        If a previous call failed part-way (connection lost, timeout, failover), its calls
        are run again first: they are idempotent, and this way a caller that logs the error
        and goes on with the next batch instead of retrying cannot leave a hole below a
        record it writes later.  (So: one instance per consumer.)
        """
        plan = self._plan(contributions)
        if self._unfinished is not None:
            # Once each: a retried batch (with_retry while a failover or the replicas are
            # waited out) brings the very calls that failed, and must not pile them up.
            plan = _Plan(tuple(dict.fromkeys(self._unfinished.calls + plan.calls)), plan.duplicates)
        try:
            with replicated(self.replication):
                result = self._execute(plan, riders=riders)
        except Exception:
            self._unfinished = plan
            raise
        self._unfinished = None
        return result

    def _plan(self, contributions: Sequence[Contribution]) -> _Plan:
        """Validate and group a batch into per-hashtag HSETs (no I/O after the dim check)."""
        dim = self._check_batch(contributions)
        if dim is None:
            return _Plan((), 0)
        self._fix_dim(dim)
        groups: dict[str, dict[str, bytes]] = {}  # hashtag -> field -> vector (first one wins)
        duplicates = 0
        tagged = [c for c in contributions if c.hashtags]
        for c, value in zip(tagged, vectors_bytes([c.vector for c in tagged]), strict=True):
            at = c.coordinates
            name = f"{at.topic}:{int(at.partition)}:{int(at.offset)}"  # numpy integers too
            if self.window_s is not None and c.time is not None:
                name += f"/{self.window_of(c.time)}"  # event time: the same on redelivery
            for tag in dict.fromkeys(c.hashtags):  # a tweet counts once per distinct hashtag
                fields = groups.setdefault(tag, {})
                if name in fields:
                    duplicates += 1
                else:
                    fields[name] = value
        calls = tuple(_Call(tag, self._keys(tag), tuple(f.items())) for tag, f in groups.items())
        return _Plan(calls, duplicates)

    def _check_batch(self, contributions: Sequence[Contribution]) -> int | None:
        """Validate every contribution; return the batch's common dimension (None: no updates)."""
        dim: int | None = None
        for c in contributions:
            if not c.hashtags:
                continue
            at = c.coordinates
            if not isinstance(at.offset, int | np.integer) or not 0 <= at.offset <= MAX_OFFSET:
                raise ValueError(f"offset {at.offset!r} is not an integer in [0, 2**53)")
            if not isinstance(at.partition, int | np.integer) or at.partition < 0:
                raise ValueError(f"partition {at.partition!r} is not a non-negative integer")
            if "\0" in at.topic:
                raise ValueError(f"topic {at.topic!r} contains NUL")
            if any(not isinstance(t, str) or not t for t in c.hashtags):
                raise ValueError(f"hashtags must be non-empty strings, got {list(c.hashtags)!r}")
            shape = np.shape(c.vector)
            if len(shape) != 1 or shape[0] < 1:
                raise DimensionError(f"vector of shape {shape} is not a non-empty 1-d vector")
            expected = dim if dim is not None else self.dim
            if expected is not None and shape[0] != expected:
                raise DimensionError(
                    f"{shape[0]}-d vector at {at}; the store holds {expected}-d running means"
                )
            if c.time is not None and not math.isfinite(c.time):
                raise ValueError(f"non-finite time {c.time!r} at {at}")
            dim = shape[0]
        if dim is not None:  # one check over the batch's vectors, not one per vector
            finite = np.isfinite(np.stack([c.vector for c in contributions if c.hashtags])).all(axis=1)
            if not finite.all():
                bad = [c for c in contributions if c.hashtags][int(np.argmin(finite))]
                raise ValueError(f"non-finite vector at {bad.coordinates}")
        return dim

    def _fix_dim(self, dim: int) -> None:
        """Fix the store dimension on first use (SET NX) or check it; once per instance."""
        if self._dim is None:
            pipe = self.client.pipeline(transaction=False)
            pipe.set(self._dim_key, dim, nx=True)
            pipe.get(self._dim_key)
            _, stored = pipe.execute()
            stored_dim = int(stored)
            if self._wanted_dim is not None and stored_dim != self._wanted_dim:
                raise DimensionError(
                    f"store {self.prefix!r} holds {stored_dim}-d running means, "
                    f"this adapter was built for {self._wanted_dim}-d"
                )
            self._dim = stored_dim
        if dim != self._dim:
            raise DimensionError(
                f"{dim}-d vectors; the store {self.prefix!r} holds {self._dim}-d running means"
            )

    def _execute(self, plan: _Plan, changed: bool = True, riders: Sequence[Command] = ()) -> ApplyResult:
        """Run the plan's HSETs (and the ``riders``) in one pipeline, then fold the logs that
        grew long (the crash tests run subsets of a plan)."""
        if not plan.calls:
            send(self.client, riders)
            return ApplyResult(0, plan.duplicates, frozenset())
        # Round trip 1: the folded watermarks.  A record at or below its partition's was
        # folded already (a redelivery): it is not written again.
        pipe = self.client.pipeline(transaction=False)
        for call in plan.calls:
            pipe.hget(call.keys[0], "m")
        writes, skipped = [], plan.duplicates
        for call, m in zip(plan.calls, pipe.execute(), strict=True):
            marks = decode_marks(m) if m else {}
            fields = [f for f in call.fields if above_watermark(f[0], marks)]
            skipped += len(call.fields) - len(fields)
            if fields:
                writes.append((call, fields))
        # Round trip 2: one HSET per hashtag -- all of this batch's records of it land
        # together or not -- and the log's length, to fold long ones.
        pipe = self.client.pipeline(transaction=False)
        for call, fields in writes:
            pipe.hset(call.keys[1], mapping=dict(fields))
            pipe.hlen(call.keys[1])
        if changed and writes:
            pipe.sadd(self._changed_key, *(call.hashtag for call, _ in writes))
        for rider in riders:
            rider.queue(pipe)
        replies = pipe.execute(raise_on_error=False)
        if riders:  # their NOSCRIPT repaired; any error raised once the means' are checked
            replies, ridden = replies[: len(replies) - len(riders)], replies[len(replies) - len(riders) :]
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        if riders:
            settle(self.client, riders, ridden)
        applied = 0
        touched, long_logs = [], []
        for i, (call, fields) in enumerate(writes):
            new, length = int(replies[2 * i]), int(replies[2 * i + 1])
            applied += new
            skipped += len(fields) - new
            if new:
                touched.append(call.hashtag)
            if length >= self.fold_after:
                long_logs.append(call.hashtag)
        folded = self.fold(long_logs) if long_logs else 0
        return ApplyResult(applied, skipped, frozenset(touched), folded)

    # -- folding --------------------------------------------------------------

    def fold(self, hashtags: Iterable[str]) -> int:
        """Fold the logs of ``hashtags`` into their stored sums; return how many folded.

        Reads each hashtag consistently, sums in float64 here (Redis does no float work),
        rounds once to the stored block floating point, and writes back with a compare-and-
        set on the fold generation: a fold that lost a race to another is dropped, and
        records logged meanwhile stay in the log.  Safe to run from any process, any time.
        """
        return self._fold(self._read_states(list(dict.fromkeys(hashtags))))

    def _fold(self, states: dict[str, HashtagState]) -> int:
        todo = [(tag, st) for tag, st in states.items() if st.fields]
        folded = 0
        for start in range(0, len(todo), _READ_CHUNK):
            pipe = self.client.pipeline(transaction=False)
            for tag, st in todo[start : start + _READ_CHUNK]:
                s, m = encode_state(st.mean, st.marks)
                windows, expired, ttl = self._fold_windows(st)
                # Not Script.__call__: on a Pipeline it adds a SCRIPT EXISTS round trip per
                # execute, and ClusterPipeline blocks the evalsha() method (not the command).
                pipe.execute_command(
                    "EVALSHA", self._fold_script.sha, 3, *self._keys(tag), st.generation, s, m, ttl,
                    len(windows), *(x for pair in windows for x in pair), len(expired), *expired,
                    *st.fields,
                )  # fmt: skip
            replies = pipe.execute(raise_on_error=False)
            if any(isinstance(r, NoScriptError) for r in replies):
                # Script cache flushed or a new node: load and rerun.  A fold that did land
                # moved the generation, so its rerun is refused: folds are safe to repeat.
                self._fold_script.sha = cast(redis.Redis, self.client).script_load(_FOLD_LUA)
                return folded + self._fold(dict(todo[start:]))
            errors = [r for r in replies if isinstance(r, Exception)]
            if errors:
                raise errors[0]
            folded += sum(int(r) for r in replies)
        return folded

    def _fold_windows(self, st: HashtagState) -> tuple[list[tuple[int, bytes]], list[int], int]:
        """A fold's window writes: the windows its log touched, the windows now older than
        the newest ``window_keep``, and the window hash's TTL (memory of idle hashtags)."""
        if not st.windows:
            return [], [], 0
        newest = max(st.windows)
        keep = {w for w in st.windows if w > newest - self.window_keep}
        writes = [(w, encode_window(st.windows[w])) for w in sorted(st.logged_windows & keep)]
        expired = sorted(set(st.windows) - keep)
        ttl = 0 if self.window_s is None else math.ceil(self.window_keep * self.window_s)
        return writes, expired, ttl

    # -- reading --------------------------------------------------------------

    def read(self, hashtags: Iterable[str], fold: bool = False) -> dict[str, RunningMean]:
        """The running means of those ``hashtags`` that have one (pipelined reads).

        ``fold=True`` also folds every log read (what the index job does, so that a
        hashtag's memory comes back to its folded size after each rebuild).
        """
        states = self._read_states(list(dict.fromkeys(hashtags)))
        if fold:
            self._fold(states)
        return {tag: st.mean for tag, st in states.items()}

    def _read_states(self, tags: list[str]) -> dict[str, HashtagState]:
        """Read hashtags consistently without a script: the folded state, the log, and the
        generation again; a fold in between (generation moved) means read that one again."""
        out: dict[str, HashtagState] = {}
        todo = tags
        for _ in range(100):
            if not todo:
                return out
            retry = []
            for start in range(0, len(todo), _READ_CHUNK):
                chunk = todo[start : start + _READ_CHUNK]
                pipe = self.client.pipeline(transaction=False)
                for tag in chunk:
                    h, p, w = self._keys(tag)
                    pipe.hmget(h, "s", "m", "g")
                    pipe.hgetall(p)
                    pipe.hgetall(w)
                    pipe.hget(h, "g")
                replies = pipe.execute()
                for i, tag in enumerate(chunk):
                    (s, m, g), log, windows, g_after = replies[4 * i : 4 * i + 4]
                    if g != g_after:
                        retry.append(tag)
                    elif m is not None or log:
                        dim = self._known_dim(m)
                        out[tag] = decode_hashtag(tag, self.key(tag), dim, s, m, int(g or 0), log, windows)
            todo = retry
        raise RuntimeError(f"{len(todo)} hashtags kept being folded while read: {todo[:5]}")

    def _known_dim(self, m: bytes | None) -> int:
        """The store's dimension: known, else its key, else (a key lost) this folded state's."""
        if self.dim is None:
            stored = self.client.get(self._dim_key)
            if stored is not None:
                self._fix_dim(int(cast(bytes, stored)))
            elif m is not None:
                return stored_dim(m)
            else:
                raise DimensionError(f"store {self.prefix!r} has records but no {self._dim_key} key")
        return cast(int, self.dim)

    def read_all(self, fold: bool = False) -> dict[str, RunningMean]:
        """Every hashtag's running mean (SCAN under the prefix, then pipelined reads).

        Each hashtag is read consistently; the whole is not a snapshot across hashtags
        (writers keep going), which is fine for a periodically rebuilt index.
        """
        return self.read(self.hashtags(), fold=fold)

    def read_windows(self, hashtags: Iterable[str], fold: bool = False) -> dict[str, dict[int, RunningMean]]:
        """Per hashtag, the means of its event-time windows (``window number -> mean``; only
        the newest ``window_keep`` of each hashtag are kept once folded)."""
        states = self._read_states(list(dict.fromkeys(hashtags)))
        if fold:
            self._fold(states)
        return {tag: st.windows for tag, st in states.items() if st.windows}

    def read_all_with_windows(
        self, fold: bool = False
    ) -> tuple[dict[str, RunningMean], dict[str, dict[int, RunningMean]]]:
        """:meth:`read_all` and :meth:`read_windows` of every hashtag, in one read."""
        states = self._read_states(list(dict.fromkeys(self.hashtags())))
        if fold:
            self._fold(states)
        means = {tag: st.mean for tag, st in states.items()}
        return means, {tag: st.windows for tag, st in states.items() if st.windows}

    def hashtags(self) -> Iterator[str]:
        """Names of the stored hashtags, in SCAN order (may repeat: SCAN may)."""
        for key in self.client.scan_iter(match=f"{self.prefix}:[hp]:*", count=1000):
            yield self._hashtag_of(key)

    def watermarks(self, hashtag: str) -> dict[tuple[str, int], int]:
        """``(topic, partition) -> highest offset in the mean`` of ``hashtag`` (for debugging)."""
        state = self._read_states([hashtag]).get(hashtag)
        if state is None:
            return {}
        out = {}
        for pid, offset in state.marks.items():
            topic, _, partition = pid.rpartition(":")
            out[(topic, int(partition))] = offset
        return out

    def memory_usage(self, hashtag: str) -> int | None:
        """Bytes Redis uses for ``hashtag`` (``MEMORY USAGE key SAMPLES 0``: folded state, log
        and windows)."""
        usages = [self.client.memory_usage(key, samples=0) for key in self._keys(hashtag)]
        if all(u is None for u in usages):
            return None
        return sum(int(u) for u in usages if u is not None)

    # -- the index job's trigger ---------------------------------------------

    def changed_count(self) -> int:
        """How many hashtags were applied to since the last :meth:`take_changed`."""
        return int(self.client.scard(self._changed_key))

    def take_changed(self) -> set[str]:
        """Return and clear, atomically, the hashtags changed since the last call."""
        members = self._take_script(keys=[self._changed_key])
        return {m.decode() if isinstance(m, bytes) else str(m) for m in members}

    def restore_changed(self, hashtags: set[str]) -> None:
        """Put taken hashtags back into the changed set: a build that failed after
        :meth:`take_changed` (a full disk, say) leaves them to trigger the next one."""
        if hashtags:
            self.client.sadd(self._changed_key, *sorted(hashtags))

    # -- housekeeping -----------------------------------------------------------

    def clear(self) -> int:
        """Delete every key under the prefix (tests, demos); return how many went."""
        keys = list(dict.fromkeys(self.client.scan_iter(match=f"{self.prefix}:*", count=1000)))
        for start in range(0, len(keys), _READ_CHUNK):
            pipe = self.client.pipeline(transaction=False)
            for key in keys[start : start + _READ_CHUNK]:
                pipe.unlink(key)  # one key per command: cluster-safe
            pipe.execute()
        self._dim = None
        return len(keys)


__all__ = [
    "ApplyResult",
    "Contribution",
    "DimensionError",
    "RedisMeans",
]
