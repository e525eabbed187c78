"""Redis adapter for the per-hashtag running means (count, sum) of tweet embeddings.

The embed workers add every embedded tweet to the running mean of each of its
hashtags; the periodic index job reads all of them.  The maths lives in
:mod:`stream.means` (:class:`~stream.means.RunningMean`); this module only
stores it, and adds the one thing memory cannot give: **exactly-once effect
under Kafka redelivery**, atomically, one network round trip per batch, safe
on Redis Cluster -- with **no float arithmetic on the Redis server**, whose one
core is shared by every embed worker.

Key layout (``prefix`` defaults to ``reval``)
---------------------------------------------
``{prefix}:h:{<hashtag>}``  -- one HASH per hashtag; the braces make the
    hashtag the Redis Cluster hash tag.  Binary fields, little-endian:

    ``s``  the first ``min(dim, 766)`` components of the *folded* sum as int32
           mantissas (see *Precision*); absent until the first fold (zero).
    ``m``  meta: ``count`` (float64, an exact integer), ``dim`` (uint32), the
           shared exponent ``e`` (int32), the remaining ``dim - 766`` int32
           mantissas (2 for 768-d), then one *watermark* per Kafka partition
           that ever fed this hashtag: ``"<topic>:<partition>\\0"`` and the
           highest offset already applied to this hashtag (float64, exact).
    ``g``  the fold generation (an integer; absent: 0).

``{prefix}:p:{<hashtag>}``  -- the hashtag's *pending log*: a STRING of float64
    ``dim``-vectors appended since the last fold.  Same hash tag, so the same
    cluster slot as the hash: every script touches these two keys only.

    The running sum is ``s * 2**-e`` + the log's vectors (added in log order).
    Why split the sum over two fields: jemalloc (Redis' allocator) rounds an
    allocation up to its size class, and 3,072 bytes in one string (+6 bytes of
    SDS header) land in the 3,584-byte class; 766 int32 + header fit the
    3,072-byte class exactly.  ``MEMORY USAGE`` of a folded 768-d hashtag fed by
    4 partitions is ~3.4 KB on Redis 7; each further partition adds
    ``len("topic:partition") + 9`` bytes, rounded up to a size class.  A pending
    log adds 6 KB per delta (768-d) until it is folded.

``{prefix}:changed``  -- a SET of hashtags applied to since the index job last
    called :meth:`RedisMeans.take_changed`.  Written with one SADD in the same
    pipeline as the scripts, *not* atomically with them: it is only a trigger
    heuristic (a crash may leave it over-full, never the sums wrong).

``{prefix}:dim``  -- the vector dimension, fixed by the first write (SET NX).

Exactly-once design
-------------------
Kafka delivers each partition in offset order and, after a crash, redelivers
from the last *committed* offset, with batch boundaries that need not match
the old ones.  Each hashtag's ``m`` field keeps, per (topic, partition), the
watermark ``W`` = highest offset applied to *this hashtag*.  A batch becomes
one script call per hashtag, carrying for each partition that hashtag's items
``o_1 < ... < o_k`` and the float64 *suffix sums* ``d_j = v_j + ... + v_k``.
The script (atomic, one slot) finds the first ``j`` with ``o_j > W``, appends
``d_j`` to the pending log as raw bytes, adds ``k - j + 1`` to the count, and
sets ``W = o_k``.  It decodes no vector: its cost is the meta field and a
memcpy, not 768 Lua numbers (round 1's read-modify-write script spent ~100 µs
of server CPU per update on exactly that; ``bench/bench_redis.py`` compares).

Invariant, per (hashtag, partition): the records applied are exactly those of
that hashtag with offset ``<= W``.  It holds because an actor (worker, or a
zombie of it during a rebalance) submits a record only after its own earlier
records of that partition were applied or skipped (earlier batch calls have
completed; earlier items of the same call come first), and everything below
the offset it started from was committed, i.e. applied.  So when an item with
``o > W`` arrives, nothing between ``W`` and ``o`` is missing, and applying it
keeps the invariant; an item with ``o <= W`` is already in.  Hence a crash at
any point of a pipeline (any *subset* of its per-hashtag calls applied -- a
cluster pipeline runs per node), followed by redelivery with any new batch
boundaries, gives every hashtag the (count, sum) of a batch recomputation.

Folding changes the representation, never the value: a client reads ``s``,
``m``, ``g`` and the log atomically, adds them in float64 *on the client*,
rounds once, and a compare-and-set script replaces ``s``/``e``/tail and the
first ``L`` bytes of the log (``L`` = what it read) -- only if ``g`` is still
what it read, then ``g + 1``.  Deltas appended meanwhile lie past ``L`` and
stay; a fold that lost a race to another (or a stale one from a slow process)
is refused.  The writer folds a hashtag whose log reached ``fold_after``
deltas (default 8: a hot hashtag's log stays under 48 KB at 768-d); the index
job folds everything it reads, so between rebuilds only hashtags written since
the last one hold a log.

What the caller must do (the usual at-least-once consumer contract):
commit a Kafka offset only after :meth:`RedisMeans.apply` has returned for
every record below it.  If ``apply`` raises, retrying the same batch is safe
(it is idempotent, which is also why redis-py's own retry-on-disconnect is
safe here), and so is going on: the next ``apply`` of the same instance first
re-runs the failed calls, so even a caller that swallows the error leaves no
hole below a watermark.  Offsets of a partition must only grow outside
redelivery: recreating a topic under the same name (offsets restart at 0)
needs a fresh prefix.

Hot hashtags on Redis Cluster: a hashtag's two keys live in one slot, so all
its updates go to one node, one script call per batch and partition group --
a trending hashtag costs its node one memcpy-sized call per batch of each
worker, not one per tweet, and the fold runs on the worker's CPU.

Precision
---------
The folded sum is stored in 4 bytes per component like float32, but as *block
floating point*: int32 mantissas sharing one exponent per hashtag, chosen on
every fold so the largest component uses 30-31 bits.  A fold rounds each
component to the grid ``2**-e`` (round half to even, so float32 inputs, whose
low bits often fall exactly on a half, are not biased), an absolute error of
at most ``max|sum_i| * 2**-31`` -- about 2**-31 of the sum's norm, ~100x less
than float32's per-component ``2**-24 * |sum_i|`` for the large components
that dominate the unit vector's error.  The logged deltas are float64 suffix
sums, exact to float64, and a fold adds them in double, so there is one
rounding per fold (every ``fold_after`` deltas or index rebuild), fewer than
round 1's one per script call; a test checks the stored sums bit for bit
against a numpy model of exactly this.  Round 1 measured, with one rounding
per call (768-d, against a float64 batch recomputation), max per-component
error of the unit vector after 10^4 / 10^5 / 3*10^5 calls: BERT-like vectors
1.8e-8 / 4.8e-8 / 9.5e-8 (float32 storage: 2.1e-7 / 9.3e-7 / 7.2e-6); the
worst case, the same vector over and over (a spam bot), 1.3e-7 after 10^4
calls (float32: 9.4e-6); folding less often only lowers these.  Counts are
exact.
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
from redis.exceptions import NoScriptError, ResponseError

from stream.means import RunningMean, Vector

Client: TypeAlias = "redis.Redis | RedisCluster"

#: Sum components kept in field ``s``: 4·766 bytes + 6 of SDS header fit jemalloc's 3,072 class.
HEAD_COMPONENTS = 766
#: Kafka offsets are int64, Lua numbers are doubles: offsets must stay exactly representable.
MAX_OFFSET = 2**53 - 1
_PREFIX_RE = re.compile(r"[A-Za-z0-9_.:\-]+")
_META_HEADER = struct.Struct("<dIi")  # count, dim, shared exponent
_READ_CHUNK = 500  # keys per pipelined HMGET round trip in read_all

_APPLY_LUA = """
-- Add one batch's contributions to ONE hashtag's running mean, exactly once, without a
-- single float operation: the chosen float64 suffix sums are appended, as raw bytes, to the
-- hashtag's pending log; the count and the watermarks move in the same atomic call.
-- KEYS[1]: the hashtag's hash; KEYS[2]: its pending log (a string, same hash tag and slot).
-- ARGV: dim, head, ngroups, then per partition group: id ("topic:partition"), k, offsets
--   o_1 < ... < o_k, then k float64 LE suffix sums d_j = v_j + ... + v_k.  Applies the
--   items with offset > the stored watermark.  Returns {applied, skipped, log bytes}.
local dim = tonumber(ARGV[1])
local ntail = dim - tonumber(ARGV[2])
local ngroups = tonumber(ARGV[3])
local m = redis.call('HGET', KEYS[1], 'm')
local count, e, tail = 0, 0, string.rep('\\0', 4 * ntail)
local marks, names = {}, {}
if m then
  local d, pos
  count, d, e, pos = struct.unpack('<dI4i4', m)
  if d ~= dim then
    return redis.error_reply('REVALDIM ' .. KEYS[1] .. ' holds ' .. d ..
      '-d sums, got ' .. dim .. '-d vectors')
  end
  tail = string.sub(m, pos, pos + 4 * ntail - 1)
  pos = pos + 4 * ntail
  local name, off
  while pos <= #m do
    name, off, pos = struct.unpack('<sd', m, pos)
    marks[name] = off
    names[#names + 1] = name
  end
end
-- Per partition: the suffix sum of the items above the watermark, which moves to o_k.
local picked = {}
local applied, skipped = 0, 0
local i = 4
for g = 1, ngroups do
  local name = ARGV[i]
  local k = tonumber(ARGV[i + 1])
  local mark = marks[name]
  local first = 1
  if mark then
    while first <= k and tonumber(ARGV[i + 1 + first]) <= mark do first = first + 1 end
  end
  if first <= k then
    picked[#picked + 1] = ARGV[i + 1 + k + first]
    if not mark then names[#names + 1] = name end
    marks[name] = tonumber(ARGV[i + 1 + k])
    applied = applied + k - first + 1
  end
  skipped = skipped + first - 1
  i = i + 2 + 2 * k
end
if applied == 0 then return {0, skipped, redis.call('STRLEN', KEYS[2])} end
local logged = redis.call('APPEND', KEYS[2], table.concat(picked))
local parts = {struct.pack('<dI4i4', count + applied, dim, e), tail}
for _, name in ipairs(names) do parts[#parts + 1] = struct.pack('<sd', name, marks[name]) end
redis.call('HSET', KEYS[1], 'm', table.concat(parts))
return {applied, skipped, logged}
"""

_FOLD_LUA = """
-- Replace a hashtag's stored sum and the first L bytes of its pending log by their total,
-- computed by the client from what it read -- unless another fold came first.
-- KEYS as the apply script.  ARGV: fold generation read, L, head mantissas, exponent, tail
-- mantissas.  The count and the watermarks are not touched.  Returns 1 if folded.
local g = tonumber(redis.call('HGET', KEYS[1], 'g') or 0)
local m = redis.call('HGET', KEYS[1], 'm')
if g ~= tonumber(ARGV[1]) or not m then return 0 end
local count, dim = struct.unpack('<dI4', m)
local tail = ARGV[5]
redis.call('HSET', KEYS[1], 's', ARGV[3], 'g', g + 1, 'm',
  struct.pack('<dI4i4', count, dim, tonumber(ARGV[4])) .. tail .. string.sub(m, 17 + #tail))
local L = tonumber(ARGV[2])
if redis.call('STRLEN', KEYS[2]) <= L then
  redis.call('DEL', KEYS[2])
else
  redis.call('SET', KEYS[2], redis.call('GETRANGE', KEYS[2], L, -1))
end
return 1
"""

_READ_LUA = """
-- One hashtag's state, atomically across its two keys: s, m, fold generation, pending log.
local v = redis.call('HMGET', KEYS[1], 's', 'm', 'g')
return {v[1], v[2], v[3], redis.call('GET', KEYS[2])}
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


@dataclass(frozen=True)
class ApplyResult:
    """What :meth:`RedisMeans.apply` did, counted in (tweet, hashtag) updates."""

    applied: int
    """Updates added to a running mean."""
    skipped: int
    """Updates already applied before (redelivery) or repeated within the batch."""
    hashtags: frozenset[str]
    """Hashtags whose running mean changed."""
    folded: int = 0
    """Hashtags whose pending log reached ``fold_after`` deltas and was folded into the sum."""


@dataclass(frozen=True)
class _Call:
    """One script call: all of a batch's items for one hashtag (its two keys, one slot)."""

    hashtag: str
    keys: tuple[str, str]
    args: tuple[bytes | int | str, ...]


@dataclass(frozen=True)
class _Plan:
    calls: tuple[_Call, ...]
    duplicates: int  # (tweet, hashtag) updates repeated within the batch itself


@dataclass(frozen=True)
class _State:
    """One hashtag's keys as read atomically: what a fold starts from."""

    mean: RunningMean
    generation: int
    logged: int  # bytes of pending log included in ``mean``


class RedisMeans:
    """Per-hashtag running means in Redis, updated exactly once per Kafka record.

    Works with :class:`redis.Redis` and :class:`redis.cluster.RedisCluster` clients
    (``decode_responses`` must be off: the sums are binary).  ``dim`` may be given,
    or is fixed by the first :meth:`apply` (and shared through ``{prefix}:dim``).
    ``fold_after``: pending deltas a hashtag's log may reach before :meth:`apply` folds
    it into the stored sum (``read(..., fold=True)`` folds whatever it reads).
    Two stores on one Redis need prefixes that are not ``other + ":..."`` of each
    other, since reads and :meth:`clear` SCAN for ``{prefix}:*``.
    """

    def __init__(
        self, client: Client, prefix: str = "reval", dim: int | None = None, fold_after: int = 8
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
        self.client = client
        self.prefix = prefix
        self.fold_after = fold_after
        self._wanted_dim = dim
        self._dim: int | None = None  # set once checked against {prefix}:dim
        self._unfinished: _Plan | None = None  # a plan whose pipeline failed part-way
        # types-redis 4.6 (the stubs installed beside redis-py 8) predates RedisCluster's
        # scripting support and Script.sha; both exist at run time.
        scripting = cast(redis.Redis, client)
        self._scripts: dict[str, Any] = {
            name: scripting.register_script(lua)
            for name, lua in (("apply", _APPLY_LUA), ("fold", _FOLD_LUA), ("read", _READ_LUA))
        }
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
        """The hash holding ``hashtag``'s state (the hashtag is its cluster hash tag)."""
        return f"{self.prefix}:h:{{{hashtag}}}"

    def log_key(self, hashtag: str) -> str:
        """The string holding ``hashtag``'s pending log (same hash tag, same cluster slot)."""
        return f"{self.prefix}:p:{{{hashtag}}}"

    def _keys(self, hashtag: str) -> tuple[str, str]:
        return self.key(hashtag), self.log_key(hashtag)

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

        One pipelined round trip: one atomic script call per distinct hashtag plus one
        SADD to the changed set; then, for the hashtags whose pending log reached
        ``fold_after`` deltas, two more (read, fold).  Contributions must arrive in offset
        order per partition across batches (Kafka's order); within a batch any order is
        fine.  Raises :class:`DimensionError` / :class:`ValueError` before touching Redis.

        If a previous call failed part-way (connection lost, timeout, failover), its calls
        are run again first, in the same pipeline: they are idempotent, and this way a
        caller that logs the error and goes on with the next batch instead of retrying
        cannot leave a hole below a watermark.  (So: one instance per consumer.)
        """
        plan = self._plan(contributions)
        if self._unfinished is not None:
            plan = _Plan(self._unfinished.calls + plan.calls, plan.duplicates)
        try:
            result = self._execute(plan)
        except DimensionError:  # the server refused a key's dimension: retrying cannot help
            self._unfinished = None
            raise
        except Exception:
            self._unfinished = plan
            raise
        self._unfinished = None
        return result

    def _plan(self, contributions: Sequence[Contribution]) -> _Plan:
        """Validate and group a batch into per-hashtag script calls (no I/O after the dim check)."""
        dim = self._check_batch(contributions)
        if dim is None:
            return _Plan((), 0)
        self._fix_dim(dim)
        # hashtag -> partition id -> offset -> vector (first occurrence wins)
        groups: dict[str, dict[str, dict[int, npt.NDArray[np.float64]]]] = {}
        duplicates = 0
        for c in contributions:
            pid = f"{c.topic}:{int(c.partition)}"
            offset = int(c.offset)  # numpy integers too
            vector = np.asarray(c.vector, dtype=np.float64)
            for tag in dict.fromkeys(c.hashtags):  # a tweet counts once per distinct hashtag
                items = groups.setdefault(tag, {}).setdefault(pid, {})
                if offset in items:
                    duplicates += 1
                else:
                    items[offset] = vector
        calls = []
        head = min(dim, HEAD_COMPONENTS)
        for tag, partitions in groups.items():
            args: list[bytes | int | str] = [dim, head, len(partitions)]
            for pid, items in partitions.items():
                offsets = sorted(items)
                args.append(pid)
                args.append(len(offsets))
                args.extend(offsets)
                args.extend(_suffix_sums([items[o] for o in offsets]))
            calls.append(_Call(tag, self._keys(tag), tuple(args)))
        return _Plan(tuple(calls), duplicates)

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
        """Run the plan's calls in one pipeline, then fold the logs that grew long (the crash
        tests run subsets of a plan)."""
        if not plan.calls:
            return ApplyResult(0, plan.duplicates, frozenset())
        results = self._run_pipeline(plan, changed)
        if any(isinstance(r, NoScriptError) for r in results):
            # Script cache flushed or a new node: load it and run the whole pipeline again,
            # which is safe because every call is idempotent (the watermarks skip what ran).
            self._load_scripts()
            results = self._run_pipeline(plan, changed)
        errors = [r for r in results if isinstance(r, Exception)]
        if errors:
            first = errors[0]
            if isinstance(first, ResponseError) and "REVALDIM" in str(first):
                raise DimensionError(str(first)) from first
            raise first
        applied = skipped = 0
        touched, long_logs = [], []
        limit = self.fold_after * 8 * int(self.dim or 1)
        for call, (n_applied, n_skipped, logged) in zip(plan.calls, results, strict=False):
            applied += int(n_applied)
            skipped += int(n_skipped)
            if n_applied:
                touched.append(call.hashtag)
            if int(logged) >= limit:
                long_logs.append(call.hashtag)
        folded = self.fold(long_logs) if long_logs else 0
        return ApplyResult(applied, skipped + plan.duplicates, frozenset(touched), folded)

    def _run_pipeline(self, plan: _Plan, changed: bool) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        sha = self._scripts["apply"].sha
        for call in plan.calls:
            # Not Script.__call__: on a Pipeline it adds a SCRIPT EXISTS round trip per
            # execute, and ClusterPipeline blocks the evalsha() method (not the command).
            pipe.execute_command("EVALSHA", sha, 2, *call.keys, *call.args)
        if changed:
            pipe.sadd(self._changed_key, *(call.hashtag for call in plan.calls))
        return list(pipe.execute(raise_on_error=False))

    def _evalsha_all(self, script: str, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
        """One pipelined EVALSHA of ``script`` per (hashtag, args); reloads after NOSCRIPT."""
        for attempt in (0, 1):
            pipe = self.client.pipeline(transaction=False)
            for tag, args in calls:
                pipe.execute_command("EVALSHA", self._scripts[script].sha, 2, *self._keys(tag), *args)
            results = list(pipe.execute(raise_on_error=False))
            if attempt or not any(isinstance(r, NoScriptError) for r in results):
                break
            self._load_scripts()  # read and fold scripts are safe to rerun
        errors = [r for r in results if isinstance(r, Exception)]
        if errors:
            raise errors[0]
        return results

    def _load_scripts(self) -> None:
        # SCRIPT LOAD goes to every primary on a cluster client.
        for name, lua in (("apply", _APPLY_LUA), ("fold", _FOLD_LUA), ("read", _READ_LUA)):
            self._scripts[name].sha = cast(redis.Redis, self.client).script_load(lua)

    # -- folding --------------------------------------------------------------

    def fold(self, hashtags: Iterable[str]) -> int:
        """Fold the pending logs of ``hashtags`` into their stored sums; return how many folded.

        Reads each hashtag atomically, sums in float64 here (Redis does no float work),
        rounds once to the stored block floating point, and writes back with a compare-and-
        set on the fold generation: a fold that lost a race to another is dropped, and
        deltas appended meanwhile stay in the log.  Safe to run from any process, any time.
        """
        return self._fold(self._read_states(list(dict.fromkeys(hashtags))))

    def _fold(self, states: dict[str, _State]) -> int:
        todo = [(tag, st) for tag, st in states.items() if st.logged]
        if not todo:
            return 0
        calls = []
        for tag, st in todo:
            head, exponent, tail = _encode_sum(st.mean.total)
            calls.append((tag, [st.generation, st.logged, head, exponent, tail]))
        results = []
        for start in range(0, len(calls), _READ_CHUNK):
            results += self._evalsha_all("fold", calls[start : start + _READ_CHUNK])
        return sum(int(r) for r in results)

    # -- reading --------------------------------------------------------------

    def read(self, hashtags: Iterable[str], fold: bool = False) -> dict[str, RunningMean]:
        """The running means of those ``hashtags`` that have one (pipelined atomic reads).

        ``fold=True`` also folds every pending log read (what the index job does, so that
        a hashtag's memory comes back to its folded size after each rebuild).
        """
        states = self._read_states(list(dict.fromkeys(hashtags)))
        if fold:
            self._fold(states)
        return {tag: st.mean for tag, st in states.items()}

    def _read_states(self, tags: list[str]) -> dict[str, _State]:
        out: dict[str, _State] = {}
        for start in range(0, len(tags), _READ_CHUNK):
            chunk = tags[start : start + _READ_CHUNK]
            replies = self._evalsha_all("read", [(tag, []) for tag in chunk])
            for tag, (s, m, g, pending) in zip(chunk, replies, strict=True):
                if m is not None:
                    out[tag] = _State(_decode(s, m, pending), int(g or 0), len(pending or b""))
        return out

    def read_all(self, fold: bool = False) -> dict[str, RunningMean]:
        """Every hashtag's running mean (SCAN under the prefix, then pipelined reads).

        Each hashtag is read atomically; the whole is not a snapshot across hashtags
        (writers keep going), which is fine for a periodically rebuilt index.
        """
        return self.read(self.hashtags(), fold=fold)

    def hashtags(self) -> Iterator[str]:
        """Names of the stored hashtags, in SCAN order (may repeat: SCAN may)."""
        for key in self.client.scan_iter(match=f"{self.prefix}:h:*", count=1000):
            yield self._hashtag_of(key)

    def watermarks(self, hashtag: str) -> dict[tuple[str, int], int]:
        """``(topic, partition) -> highest offset applied`` to ``hashtag`` (for debugging)."""
        m = self.client.hget(self.key(hashtag), "m")
        if m is None:
            return {}
        return _decode_marks(cast(bytes, m))  # a binary client: decode_responses is off

    def memory_usage(self, hashtag: str) -> int | None:
        """Bytes Redis uses for ``hashtag``'s keys (``MEMORY USAGE key SAMPLES 0``, both keys)."""
        usages = [self.client.memory_usage(key, samples=0) for key in self._keys(hashtag)]
        if usages[0] is None:
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


def _suffix_sums(vectors: Sequence[npt.NDArray[np.float64]]) -> list[bytes]:
    """``d_j = v_j + ... + v_k`` as float64 little-endian bytes, for j = 1..k."""
    if len(vectors) == 1:
        return [vectors[0].astype("<f8").tobytes()]
    stacked = np.stack(vectors)
    sums = np.cumsum(stacked[::-1], axis=0)[::-1].astype("<f8")
    return [row.tobytes() for row in sums]


def _decode(s: bytes | None, m: bytes, pending: bytes | None) -> RunningMean:
    """Rebuild a :class:`RunningMean` from the ``s`` and ``m`` fields and the pending log.

    The stored sum (zero before the first fold) plus the logged deltas, added in log order
    in float64: the order the tests' model of the store uses.
    """
    count, dim, exponent = _META_HEADER.unpack_from(m, 0)
    head = min(dim, HEAD_COMPONENTS)
    mantissas = np.zeros(dim, dtype=np.float64)
    if s is not None:
        mantissas[:head] = np.frombuffer(s, dtype="<i4")
    mantissas[head:] = np.frombuffer(m, dtype="<i4", count=dim - head, offset=_META_HEADER.size)
    total = np.ldexp(mantissas, -exponent)
    if pending:
        for delta in np.frombuffer(pending, dtype="<f8").reshape(-1, dim):
            total += delta
    return RunningMean(int(count), total)


def _encode_sum(total: npt.NDArray[np.float64]) -> tuple[bytes, int, bytes]:
    """A sum as block floating point: (head int32 mantissas, shared exponent, tail mantissas).

    The exponent puts the largest |component| in [2**30, 2**31) (capped so that ``2**e``
    stays a normal double); each component rounds half to even onto the grid ``2**-e``.
    """
    mx = float(np.abs(total).max())
    exponent = 0
    if mx > 0:
        exponent = min(31 - math.frexp(mx)[1], 1000)
        if np.rint(math.ldexp(mx, exponent)) >= 2**31:
            exponent -= 1
    mantissas = np.rint(np.ldexp(total, exponent)).astype("<i4")
    head = min(len(total), HEAD_COMPONENTS)
    return mantissas[:head].tobytes(), exponent, mantissas[head:].tobytes()


def _decode_marks(m: bytes) -> dict[tuple[str, int], int]:
    _, dim, _ = _META_HEADER.unpack_from(m, 0)
    pos = _META_HEADER.size + 4 * (dim - min(dim, HEAD_COMPONENTS))
    marks: dict[tuple[str, int], int] = {}
    while pos < len(m):
        end = m.index(b"\0", pos)
        topic, _, partition = m[pos:end].decode().rpartition(":")
        (offset,) = struct.unpack_from("<d", m, end + 1)
        marks[(topic, int(partition))] = int(offset)
        pos = end + 9
    return marks


__all__ = [
    "HEAD_COMPONENTS",
    "ApplyResult",
    "Contribution",
    "DimensionError",
    "RedisMeans",
]
