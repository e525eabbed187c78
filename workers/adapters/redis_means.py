"""Redis adapter for the per-hashtag running means (count, sum) of tweet embeddings.

The embed workers add every embedded tweet to the running mean of each of its
hashtags; the periodic index job reads all of them.  The maths lives in
:mod:`stream.means` (:class:`~stream.means.RunningMean`); this module only
stores it, and adds the one thing memory cannot give: **exactly-once effect
under Kafka redelivery**, safe on Redis Cluster -- with **no float arithmetic
and no scripts on the Redis write path**, since one Redis core serves every
embed worker.

Key layout (``prefix`` defaults to ``reval``)
---------------------------------------------
``{prefix}:p:{<hashtag>}``  -- the hashtag's *log*: a HASH of the records not yet
    folded, field ``"<topic>:<partition>:<offset>"`` (the Kafka coordinates),
    value the tweet's vector as little-endian float32 (float64 if float32 would
    round it).  The braces make the hashtag the Redis Cluster hash tag.

``{prefix}:h:{<hashtag>}``  -- the hashtag's *folded* state, a HASH written only
    by folds (same hash tag, so the same slot as its log):

    ``s``  the first ``min(dim, 766)`` components of the folded sum as int32
           mantissas (see *Precision*).
    ``m``  meta: folded ``count`` (float64, an exact integer), ``dim`` (uint32),
           the shared exponent ``e`` (int32), the remaining ``dim - 766`` int32
           mantissas (2 for 768-d), then one *folded watermark* per Kafka
           partition that ever fed this hashtag: ``"<topic>:<partition>\\0"``
           and the highest offset folded (float64, exact).  (Round 1's layout:
           its keys read as folded states.)
    ``g``  the fold generation (an integer; absent: 0).

    The running mean is the folded state plus the log's records above their
    partition's folded watermark.  Why split the sum over two fields: jemalloc
    (Redis' allocator) rounds an allocation up to its size class, and 3,072
    bytes in one string (+6 bytes of SDS header) land in the 3,584-byte class;
    766 int32 + header fit the 3,072-byte class exactly.  ``MEMORY USAGE`` of a
    folded 768-d hashtag fed by 4 partitions is ~3.4 KB on Redis 7; each further
    partition adds ``len("topic:partition") + 9`` bytes, rounded up to a size
    class.  Each logged record adds ~3.1 KB (768-d float32) until folded.

``{prefix}:changed``  -- a SET of hashtags written to since the index job last
    called :meth:`RedisMeans.take_changed`; only a trigger heuristic (a crash
    may leave it over-full, never the sums wrong).

``{prefix}:dim``  -- the vector dimension, fixed by the first write (SET NX).

Write path and exactly-once design
----------------------------------
A batch is two pipelined round trips: ``HGET`` of each hashtag's ``m`` (its
folded watermarks), then one ``HSET`` per hashtag of its records above them,
plus ``HLEN``.  Writing a record is idempotent by its field name, so redelivery
(any batch boundaries, any crash point: a pipeline applies any subset of its
per-hashtag HSETs, each atomic) adds nothing twice to the log; records already
folded are skipped by the watermark, and a reader ignores any that a race wrote
again (below).  ``bench/bench_redis.py`` measures the server CPU against round
1's script, which decoded, added and re-encoded the 768-d sum in Lua per call.

A *fold* moves a hashtag's log into its folded state: a client reads ``h``,
the log and ``g`` again (equal ``g``: no fold in between, so the two are
consistent; else it reads again), adds the records above the watermarks to the
stored sum in float64 *on the client*, rounds once, and a compare-and-set script
writes the new ``s``, ``m`` (count, watermarks raised to the highest offsets
folded) and ``g + 1``, and deletes the log fields it read -- only if ``g`` is
still what it read.  Records logged meanwhile stay; a fold that lost a race to
another (or a stale one from a slow process) is refused.  The embed worker folds
a hashtag whose log reached ``fold_after`` records (default 8, so a hot
hashtag's log stays ~25 KB); the index job folds everything it reads.

Why raising a watermark to the highest offset folded loses nothing, per
(hashtag, partition): an actor (worker, or its zombie during a rebalance)
writes a hashtag's records of a partition in offset order -- one atomic HSET
per batch, batches one after another, a failed one re-run before the next --
starting from a committed offset below which everything was written before the
commit.  So when a fold reads a record ``o``, every record of that hashtag and
partition below ``o`` is in the same read or was folded before.  A record
redelivered after its fold is skipped at write (its offset is at or below the
watermark read just before); if a fold lands between that check and the HSET,
the record is logged again, ignored by reads, and dropped by the next fold.

Failover (Redis Cluster, or any Redis with replicas): given a
:class:`~workers.adapters.redis_client.Replication`, :meth:`RedisMeans.apply` returns only
once the batch's writes are on the replicas of every master; otherwise it raises a
transient error and is run again (below).  So a record whose offset is committed is in a
log or a folded sum that survives the loss of any one master.  A fold lost in a failover
needs no barrier: the promoted replica holds the state before the fold -- the log it
would have folded, and the old sum -- which reads the same.

What the caller must do (the usual at-least-once consumer contract):
commit a Kafka offset only after :meth:`RedisMeans.apply` has returned for
every record below it.  If ``apply`` raises, retrying the same batch is safe
(it is idempotent, which is also why redis-py's own retry-on-disconnect is
safe here), and so is going on: the next ``apply`` of the same instance first
re-runs the failed calls.  Offsets of a partition must only grow outside
redelivery: recreating a topic under the same name (offsets restart at 0)
needs a fresh prefix.  Without a script on the write path Redis cannot refuse
a vector of another dimension (the writers check ``{prefix}:dim``); a read
names the hashtag instead of mixing dimensions.

Hot hashtags on Redis Cluster: a hashtag's keys live in one slot, so all its
writes go to one node -- one HSET per batch of each worker, the fold's float
work on the worker's CPU, the node's share a memcpy per record.

Precision
---------
The folded sum is stored in 4 bytes per component like float32, but as *block
floating point*: int32 mantissas sharing one exponent per hashtag, chosen on
every fold so the largest component uses 30-31 bits.  A fold rounds each
component to the grid ``2**-e`` (round half to even, so float32 inputs, whose
low bits often fall exactly on a half, are not biased), an absolute error of
at most ``max|sum_i| * 2**-31`` -- about 2**-31 of the sum's norm, ~100x less
than float32's per-component ``2**-24 * |sum_i|`` for the large components
that dominate the unit vector's error.  Logged records are exact, a fold adds
them in double, so there is one rounding per fold (every ``fold_after``
records, or index rebuild), fewer than round 1's one per batch; a test checks
the sums bit for bit against a numpy model of exactly this.  Round 1 measured,
with one rounding per call (768-d, against a float64 batch recomputation), max
per-component error of the unit vector after 10^4 / 10^5 / 3*10^5 calls:
BERT-like vectors 1.8e-8 / 4.8e-8 / 9.5e-8 (float32 storage: 2.1e-7 / 9.3e-7 /
7.2e-6); the worst case, the same vector over and over (a spam bot), 1.3e-7
after 10^4 calls (float32: 9.4e-6); folding less often only lowers these.
Counts are exact.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, cast

import numpy as np
import numpy.typing as npt
import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from stream.means import RunningMean, Vector
from workers.adapters.redis_client import Replication, replicated

Client: TypeAlias = "redis.Redis | RedisCluster"

#: Sum components kept in field ``s``: 4·766 bytes + 6 of SDS header fit jemalloc's 3,072 class.
HEAD_COMPONENTS = 766
#: Kafka offsets are int64, Lua numbers are doubles: offsets must stay exactly representable.
MAX_OFFSET = 2**53 - 1
_PREFIX_RE = re.compile(r"[A-Za-z0-9_.:\-]+")
_META_HEADER = struct.Struct("<dIi")  # count, dim, shared exponent
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


class DimensionError(ValueError):
    """A vector's dimension differs from the one the store was fixed to."""


@dataclass(frozen=True, eq=False)
class Contribution:
    """One embedded tweet: its Kafka coordinates, its hashtags and its embedding."""

    topic: str
    partition: int
    offset: int
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


@dataclass(frozen=True)
class _State:
    """One hashtag as read consistently: its mean, and what a fold of it would write."""

    mean: RunningMean
    generation: int
    fields: tuple[bytes, ...]  # every log field read (valid and stale): a fold drops them
    marks: dict[str, int]  # partition id -> highest offset in the mean
    windows: dict[int, RunningMean]  # window number -> the mean of its tweets
    logged_windows: frozenset[int]  # windows with records in the log: a fold rewrites them


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

    def apply(self, contributions: Sequence[Contribution]) -> ApplyResult:
        """Add a batch of embedded tweets to their hashtags' running means, exactly once.

        Two pipelined round trips: the folded watermarks, then one HSET per distinct
        hashtag (its records, keyed by Kafka coordinates, into its log) plus one SADD to
        the changed set; then, for the hashtags whose log reached ``fold_after`` records,
        two more (read, fold).
        Contributions must arrive in offset order per partition across batches (Kafka's
        order); within a batch any order is fine.  Raises :class:`DimensionError` /
        :class:`ValueError` before touching Redis.

        With a :class:`~workers.adapters.redis_client.Replication` it returns only once the
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
                result = self._execute(plan)
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
        for c in contributions:
            name = f"{c.topic}:{int(c.partition)}:{int(c.offset)}"  # numpy integers too
            if self.window_s is not None and c.time is not None:
                name += f"/{self.window_of(c.time)}"  # event time: the same on redelivery
            value = _vector_bytes(c.vector)
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
            if not isinstance(c.offset, int | np.integer) or not 0 <= c.offset <= MAX_OFFSET:
                raise ValueError(f"offset {c.offset!r} is not an integer in [0, 2**53)")
            if not isinstance(c.partition, int | np.integer) or c.partition < 0:
                raise ValueError(f"partition {c.partition!r} is not a non-negative integer")
            if "\0" in c.topic:
                raise ValueError(f"topic {c.topic!r} contains NUL")
            if any(not isinstance(t, str) or not t for t in c.hashtags):
                raise ValueError(f"hashtags must be non-empty strings, got {list(c.hashtags)!r}")
            shape = np.shape(c.vector)
            if len(shape) != 1 or shape[0] < 1:
                raise DimensionError(f"vector of shape {shape} is not a non-empty 1-d vector")
            expected = dim if dim is not None else self.dim
            if expected is not None and shape[0] != expected:
                raise DimensionError(
                    f"{shape[0]}-d vector at {c.topic}:{c.partition}@{c.offset}; "
                    f"the store holds {expected}-d running means"
                )
            if c.time is not None and not math.isfinite(c.time):
                raise ValueError(f"non-finite time {c.time!r} at {c.topic}:{c.partition}@{c.offset}")
            if not np.all(np.isfinite(c.vector)):
                raise ValueError(f"non-finite vector at {c.topic}:{c.partition}@{c.offset}")
            dim = shape[0]
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

    def _execute(self, plan: _Plan, changed: bool = True) -> ApplyResult:
        """Run the plan's HSETs in one pipeline, then fold the logs that grew long (the crash
        tests run subsets of a plan)."""
        if not plan.calls:
            return ApplyResult(0, plan.duplicates, frozenset())
        # Round trip 1: the folded watermarks.  A record at or below its partition's was
        # folded already (a redelivery): it is not written again.
        pipe = self.client.pipeline(transaction=False)
        for call in plan.calls:
            pipe.hget(call.keys[0], "m")
        writes, skipped = [], plan.duplicates
        for call, m in zip(plan.calls, pipe.execute(), strict=True):
            marks = _decode_marks(m) if m else {}
            fields = [f for f in call.fields if _above(f[0], marks)]
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
        replies = pipe.execute()
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

    def _fold(self, states: dict[str, _State]) -> int:
        todo = [(tag, st) for tag, st in states.items() if st.fields]
        folded = 0
        for start in range(0, len(todo), _READ_CHUNK):
            pipe = self.client.pipeline(transaction=False)
            for tag, st in todo[start : start + _READ_CHUNK]:
                s, m = _encode_state(st.mean, st.marks)
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

    def _fold_windows(self, st: _State) -> tuple[list[tuple[int, bytes]], list[int], int]:
        """A fold's window writes: the windows its log touched, the windows now older than
        the newest ``window_keep``, and the window hash's TTL (memory of idle hashtags)."""
        if not st.windows:
            return [], [], 0
        newest = max(st.windows)
        keep = {w for w in st.windows if w > newest - self.window_keep}
        writes = [(w, _encode_window(st.windows[w])) for w in sorted(st.logged_windows & keep)]
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

    def _read_states(self, tags: list[str]) -> dict[str, _State]:
        """Read hashtags consistently without a script: the folded state, the log, and the
        generation again; a fold in between (generation moved) means read that one again."""
        out: dict[str, _State] = {}
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
                        out[tag] = self._state(tag, s, m, int(g or 0), log, windows)
            todo = retry
        raise RuntimeError(f"{len(todo)} hashtags kept being folded while read: {todo[:5]}")

    def _state(
        self,
        tag: str,
        s: bytes | None,
        m: bytes | None,
        g: int,
        log: dict[bytes, bytes],
        stored_windows: dict[bytes, bytes],
    ) -> _State:
        dim = self._known_dim(m)
        count, exponent, marks = 0, 0, {}
        mantissas = np.zeros(dim, dtype=np.float64)
        if m is not None:
            count, stored_dim, exponent = _META_HEADER.unpack_from(m, 0)
            if stored_dim != dim:
                raise DimensionError(f"{self.key(tag)} holds {stored_dim}-d sums; the store is {dim}-d")
            head = min(dim, HEAD_COMPONENTS)
            if s is not None:
                mantissas[:head] = np.frombuffer(s, dtype="<i4")
            mantissas[head:] = np.frombuffer(m, dtype="<i4", count=dim - head, offset=_META_HEADER.size)
            marks = _decode_marks(m)
        total = np.ldexp(mantissas, -exponent)
        windows = {int(w): _decode_window(v, dim, tag) for w, v in stored_windows.items()}
        records = []
        for name, value in log.items():
            pid, offset, window = _parse_field(name.decode())
            if offset > marks.get(pid, -1):  # at or below: a redelivered copy of a folded record
                records.append((pid, offset, window, value))
        records.sort(key=lambda r: (r[0], r[1]))  # a fixed order: reads are reproducible
        new_marks = dict(marks)
        logged = set()
        for pid, offset, window, value in records:
            vector = _vector_of(value, dim, tag)
            total += vector
            new_marks[pid] = max(offset, new_marks.get(pid, -1))
            if window is not None:
                windows.setdefault(window, RunningMean.empty(dim)).update(vector)
                logged.add(window)
        mean = RunningMean(int(count) + len(records), total)
        return _State(mean, g, tuple(log), new_marks, windows, frozenset(logged))

    def _known_dim(self, m: bytes | None) -> int:
        """The store's dimension: known, else its key, else (a key lost) this folded state's."""
        if self.dim is None:
            stored = self.client.get(self._dim_key)
            if stored is not None:
                self._fix_dim(int(cast(bytes, stored)))
            elif m is not None:
                return int(_META_HEADER.unpack_from(m, 0)[1])
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


def _vector_bytes(vector: Vector) -> bytes:
    """A record's vector for the log: float32 when that is exact (an encoder's output), else
    float64 -- never a rounding before the float64 sum."""
    wide = np.asarray(vector, dtype="<f8")
    narrow = wide.astype("<f4")
    return narrow.tobytes() if np.array_equal(narrow, wide) else wide.tobytes()


def _parse_field(field: str) -> tuple[str, int, int | None]:
    """A log field ``"topic:partition:offset[/window]"`` as (``"topic:partition"``, offset,
    window or None)."""
    coords, slash, window = field.rpartition("/")
    if not slash or ":" in window:  # no window suffix (a topic may hold "/", never after ":")
        coords, window = field, ""
    pid, _, offset = coords.rpartition(":")
    return pid, int(offset), int(window) if window else None


def _above(field: str, marks: dict[str, int]) -> bool:
    """Whether a log field's record lies above its partition's folded watermark."""
    pid, offset, _ = _parse_field(field)
    return offset > marks.get(pid, -1)


_WINDOW_HEADER = struct.Struct("<dIi")  # count, dim, shared exponent


def _encode_window(mean: RunningMean) -> bytes:
    """A window's mean as one field: count, dim, exponent, then int32 mantissas."""
    exponent, mantissas = _block(mean.total)
    return _WINDOW_HEADER.pack(float(mean.count), len(mean.total), exponent) + mantissas.tobytes()


def _decode_window(value: bytes, dim: int, hashtag: str) -> RunningMean:
    count, stored_dim, exponent = _WINDOW_HEADER.unpack_from(value, 0)
    if stored_dim != dim:
        raise DimensionError(f"a window of {hashtag!r} holds {stored_dim}-d sums; the store is {dim}-d")
    mantissas = np.frombuffer(value, dtype="<i4", offset=_WINDOW_HEADER.size).astype(np.float64)
    return RunningMean(int(count), np.ldexp(mantissas, -exponent))


def _vector_of(value: bytes, dim: int, hashtag: str) -> npt.NDArray[np.float64]:
    if len(value) == 4 * dim:
        return np.frombuffer(value, dtype="<f4").astype(np.float64)
    if len(value) == 8 * dim:
        return np.frombuffer(value, dtype="<f8")
    raise DimensionError(
        f"a log record of {hashtag!r} holds {len(value)} bytes: not a {dim}-d float32/float64 vector"
    )


def _block(total: npt.NDArray[np.float64]) -> tuple[int, npt.NDArray[np.int32]]:
    """A sum as block floating point: the shared exponent and the int32 mantissas.

    The exponent puts the largest |component| in [2**30, 2**31) (capped so that ``2**e``
    stays a normal double); each component rounds half to even onto the grid ``2**-e``.
    """
    mx = float(np.abs(total).max())
    exponent = 0
    if mx > 0:
        exponent = min(31 - math.frexp(mx)[1], 1000)
        if np.rint(math.ldexp(mx, exponent)) >= 2**31:
            exponent -= 1
    return exponent, np.rint(np.ldexp(total, exponent)).astype("<i4")


def _encode_state(mean: RunningMean, marks: dict[str, int]) -> tuple[bytes, bytes]:
    """The ``s`` and ``m`` fields of a folded mean (:func:`_block`), with its watermarks."""
    total = mean.total
    exponent, mantissas = _block(total)
    head = min(len(total), HEAD_COMPONENTS)
    m = [_META_HEADER.pack(float(mean.count), len(total), exponent), mantissas[head:].tobytes()]
    m += [pid.encode() + b"\0" + struct.pack("<d", offset) for pid, offset in sorted(marks.items())]
    return mantissas[:head].tobytes(), b"".join(m)


def _decode_marks(m: bytes) -> dict[str, int]:
    """The folded watermarks in ``m``: ``"topic:partition" -> highest offset folded``."""
    _, dim, _ = _META_HEADER.unpack_from(m, 0)
    pos = _META_HEADER.size + 4 * (dim - min(dim, HEAD_COMPONENTS))
    marks: dict[str, int] = {}
    while pos < len(m):
        end = m.index(b"\0", pos)
        (offset,) = struct.unpack_from("<d", m, end + 1)
        marks[m[pos:end].decode()] = int(offset)
        pos = end + 9
    return marks


__all__ = [
    "HEAD_COMPONENTS",
    "ApplyResult",
    "Contribution",
    "DimensionError",
    "RedisMeans",
]
