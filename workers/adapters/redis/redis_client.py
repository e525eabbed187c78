"""Redis: the client the workers share, pipelined script calls, back-pressure on outages,
and the replication barrier that keeps a failover from losing acknowledged writes.

The running means (:mod:`workers.adapters.redis.redis_means`) and the other worker state
(:mod:`workers.adapters.redis.redis_state`, :mod:`workers.adapters.redis.redis_thesaurus`) use these.

Replication and failover
------------------------
Redis replicates asynchronously: a master acknowledges a write before any replica has it.
If the master then dies and a replica that lacks the write is promoted (Redis Cluster
failover, or Sentinel), the write is gone -- while the worker that made it may already
have committed its Kafka offset: a running mean would silently miss tweets.

:class:`Replication` closes that window.  Each adapter method that writes what a Kafka
commit depends on runs its writes inside :meth:`Replication.barrier`, which ends with, on
every master, a write to a small marker key and ``WAIT replicas timeout`` *on the same
connection*.  ``WAIT``
waits for the replication offset of its own connection's last write; a master's
replication stream is one ordered log, and the marker is written after every write of the
call had its reply, so the marker's offset covers them all (and any unreplicated write of
another client that the call read).  Only when every master reports ``replicas`` replicas
at that offset does the method return -- and only then is the batch acknowledged.

When a master cannot confirm (a replica paused, cut off or dead: fewer acknowledgements
than asked within the timeout), or the set of masters changed while the call ran (a
failover: the writes may have gone to the master that died), the method raises
:class:`ReplicationLagError`, a transient error: :func:`with_retry` waits and runs the
*whole* call again -- writes and barrier -- which is safe because every write here is
idempotent.  So a batch is acknowledged only once its writes are on ``replicas`` replicas
of the masters that serve them now; while that cannot be had, the workers stall
(back-pressure, ``reval_redis_unavailable`` = 1) rather than go on unprotected.

What the barrier cannot prevent -- a master and its replicas lost together, a restart from
an old append-only file, or any failover with the barrier turned off -- is detected: the
marker write is an ``INCR`` of a counter of this process' own, which only grows; a count
that went back is a rollback of writes this process had acknowledged, logged and counted
(``reval_redis_rollbacks_total``).  The writes being idempotent, replaying the input from
before the fault repairs it (deploy/README.md, "RevalRedisLostWrites").

Why each call has its own barrier rather than one per batch: what is decided on a write
must not outlive it.  The embed worker claims a retweet's keys, then writes the means of
the tweets it owns; were the claims lost with the means written, a redo could let another
worker win them and both tweets would count.  The claims' barrier passes first.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from typing import Any, TypeVar, cast

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

Client = redis.Redis | RedisCluster
T = TypeVar("T")
log = logging.getLogger("reval.redis")


def connect(url: str, *, cluster: bool = False, timeout: float | None = None) -> Client:
    """A Redis or Redis Cluster client from the URL (``rediss://`` for TLS, password in URL).

    ``timeout``: the longest wait for one reply (and for a connection).  Without one, a
    network partition that drops packets without a reset leaves a call blocked in its read
    until TCP gives up (~15 minutes): the worker would neither report Redis unavailable nor
    stop in bounded time.  With it the call fails as a timeout, which :func:`with_retry`
    waits out like any outage."""
    # redis-py's own retry rides out a dropped connection or two inside one call; longer
    # outages are waited out by :func:`with_retry`, which can back-pressure and stop.
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), 3)
    timeouts = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if cluster:
        return RedisCluster.from_url(url, retry=retry, **timeouts)
    return redis.Redis.from_url(url, health_check_interval=30, retry=retry, **timeouts)


def eval_many(client: Client, script: Any, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
    """Run ``script`` once per ``(key, args)`` in one pipeline round trip."""
    return _eval_pipelined(client, script, [([key], args) for key, args in calls])


def eval_by_slot(
    client: Client, script: Any, keys: Sequence[str], args: Sequence[Any], shared: Sequence[Any] = ()
) -> list[Any]:
    """Run ``script`` over many keys in one round trip: once with every key on a single Redis,
    once per hash slot on a cluster (a script's keys must share a slot there).  Each call gets
    its keys as KEYS, ``shared`` then each of its keys' ``args`` as ARGV, and returns one value
    per key; the values come back in the order of ``keys``."""
    if not keys:
        return []
    groups: dict[int, list[int]] = {}
    if isinstance(client, RedisCluster):
        for i, key in enumerate(keys):
            groups.setdefault(client.keyslot(key), []).append(i)
    else:
        groups[0] = list(range(len(keys)))
    members = list(groups.values())
    calls = [([keys[i] for i in at], [*shared, *(args[i] for i in at)]) for at in members]
    out: list[Any] = [None] * len(keys)
    for at, result in zip(members, _eval_pipelined(client, script, calls), strict=True):
        for i, value in zip(at, result, strict=True):
            out[i] = value
    return out


def _eval_pipelined(
    client: Client, script: Any, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
) -> list[Any]:
    """Run ``script`` once per ``(keys, args)`` in one pipeline round trip (:func:`send`)."""
    return send(client, [Command.eval(script, keys, args) for keys, args in calls])


class Command:
    """One command of a store's writes, built without I/O so that whoever sends the batch's
    writes can send it in its own pipeline (one round trip for several stores; issue 36 §4):
    a plain command, or a script run by EVALSHA -- the script kept, so that a NOSCRIPT reply
    (the script cache flushed, a new node) can be repaired by loading it and sending again.

    EVALSHA directly, not ``Script.__call__``: that adds a SCRIPT EXISTS round trip on a
    pipeline and is blocked on cluster pipelines."""

    __slots__ = ("args", "script")

    def __init__(self, *args: Any, script: Any = None) -> None:
        self.args, self.script = args, script

    @classmethod
    def eval(cls, script: Any, keys: Sequence[str], args: Sequence[Any]) -> Command:
        return cls(len(keys), *keys, *args, script=script)

    def queue(self, pipe: Any) -> None:
        if self.script is None:
            pipe.execute_command(*self.args)
        else:
            pipe.execute_command("EVALSHA", self.script.sha, *self.args)


def send(client: Client, commands: Sequence[Command]) -> list[Any]:
    """Send ``commands`` in one pipeline round trip; their replies, in order."""
    if not commands:
        return []
    pipe = client.pipeline(transaction=False)
    for command in commands:
        command.queue(pipe)
    return settle(client, commands, list(pipe.execute(raise_on_error=False)))


def settle(client: Client, commands: Sequence[Command], replies: list[Any]) -> list[Any]:
    """The replies of ``commands`` sent in a pipeline (``raise_on_error=False``): a script the
    server did not know is loaded and its commands sent again (every script here is
    idempotent), once; any other error raised."""
    missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if missing:
        scripts = {id(commands[i].script): commands[i].script for i in missing}
        for script in scripts.values():
            script.sha = cast(redis.Redis, client).script_load(script.script)
        pipe = client.pipeline(transaction=False)
        for i in missing:
            commands[i].queue(pipe)
        for i, reply in zip(missing, pipe.execute(raise_on_error=False), strict=True):
            replies[i] = reply
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


class ReplicationLagError(RedisError):
    """Writes not yet confirmed on enough replicas, or the masters changed while they were
    made: transient (:func:`with_retry` runs the writes and the barrier again)."""


class Replication:
    """The replication barrier and the rollback check (see the module docstring).

    After a call's writes, on every master: ``INCR`` of this process' marker key there,
    then (``replicas`` > 0) ``WAIT replicas timeout`` on the same connection.  The barrier
    holds the call until ``replicas`` replicas of every master have what was written; the
    marker's count, which only ever grows, tells when a master went back in time -- lost
    writes this process had acknowledged (``replicas=0``, or a fault beyond one node:
    a master and its replica lost together, a restart from an old append-only file).  Such
    a rollback is logged and handed to ``on_rollback(master, marker key)``; the call goes on.

    ``replicas=0``: the check only (a single Redis without replicas; or an operator's choice
    to trade the failover guarantee for availability while replicas are missing).
    ``timeout_s`` bounds one ``WAIT``; a shortfall raises :class:`ReplicationLagError`.
    Marker keys: ``{prefix}:sync:{<n>}:<process token>``, one per master and process, a few
    bytes each, expiring ``marker_ttl_s`` after the process' last write.
    """

    def __init__(
        self,
        client: Client,
        replicas: int,
        *,
        timeout_s: float = 1.0,
        prefix: str = "reval",
        on_rollback: Callable[[str, str], None] | None = None,
        marker_ttl_s: float = 7 * 86400.0,
    ) -> None:
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.client = client
        self.replicas = replicas
        self.timeout_ms = max(1, round(timeout_s * 1000))
        self.prefix = prefix
        self.on_rollback = on_rollback
        self.marker_ttl_ms = max(1000, round(marker_ttl_s * 1000))
        self.token = uuid.uuid4().hex[:12]  # this process' markers: its own writes, its own count
        self._markers: dict[str, str] = {}  # master name -> a marker key in its slots
        self._counts: dict[str, int] = {}  # marker key -> its count when last confirmed

    def masters(self) -> tuple[str, ...]:
        """The masters the client routes to now (``host:port``; empty for a single Redis)."""
        if isinstance(self.client, RedisCluster):
            return tuple(sorted(node.name for node in self.client.get_primaries()))
        return ()

    @contextmanager
    def barrier(self) -> Iterator[None]:
        """``with replication.barrier(): <writes>``: after the writes, :meth:`wait`; the
        masters must be the same as before the writes."""
        before = self.masters()
        yield
        self.wait(before)

    def wait(self, masters: tuple[str, ...] | None = None) -> None:
        """Until every master's replication stream so far is on ``replicas`` replicas (and
        check each master's marker for a rollback).

        ``masters``: the masters before the writes (:meth:`masters`); if they changed
        (a failover), raise :class:`ReplicationLagError` at once -- the writes may have
        gone to a master that died.
        """
        if isinstance(self.client, RedisCluster):
            now = self.masters()
            if not now:
                raise ReplicationLagError("the Redis Cluster client knows no master now: writing again")
            if masters is not None and now != masters:
                # A failover: choose the markers again on a whole, fresh slot map (a map patched
                # slot by slot can still give some of the old master's slots to it, and the
                # search would then take another key for the new master -- one with no count
                # to compare, and the rollback would go unseen).
                self._markers.clear()
                self._reload_slots()
                raise ReplicationLagError(
                    f"the Redis Cluster's masters changed during the writes ({', '.join(masters)} -> "
                    f"{', '.join(now)}): writing again"
                )
            for name in now:
                self._wait_on(name)
        else:
            self._wait_on("")

    def _wait_on(self, name: str) -> None:
        key = self._marker(name)
        if isinstance(self.client, RedisCluster):
            node = self.client.get_node(node_name=name)
            if node is None:
                raise ReplicationLagError(f"Redis master {name} left the cluster: writing again")
            connection: redis.Redis = self.client.get_redis_connection(node)
        else:
            connection = self.client
        # One pipeline = one connection: WAIT counts the writes of the connection it is sent on.
        pipe = connection.pipeline(transaction=False)
        pipe.incr(key)
        pipe.pexpire(key, self.marker_ttl_ms)
        if self.replicas:
            pipe.execute_command("WAIT", self.replicas, self.timeout_ms)
        try:
            count, _, *waited = pipe.execute()
        except RedisError:
            self._markers.pop(name, None)  # the slot may have moved: choose the marker again
            self._refresh(key)
            raise
        where = f"Redis master {name}" if name else "Redis"
        acked = int(waited[0]) if waited else 0
        if acked < self.replicas:  # unconfirmed: the count is not ours to remember yet
            raise ReplicationLagError(
                f"{where}: {acked} of {self.replicas} replicas acknowledged the writes within "
                f"{self.timeout_ms / 1000:g} s (REVAL_REDIS_REPLICAS): holding the batch until they do"
            )
        last = self._counts.get(key)
        if last is not None and int(count) <= last:
            log.error(
                "%s lost writes this worker had acknowledged: its marker %s went back from %d to %d "
                "(a failover to a replica without them, or a restart from older data); what was "
                "written there may be missing -- runbook: deploy/README.md, RevalRedisLostWrites",
                where, key, last, int(count),
            )  # fmt: skip
            if self.on_rollback is not None:
                self.on_rollback(name, key)
        self._counts[key] = int(count)

    def _marker(self, name: str) -> str:
        """This process' marker key whose slot the master ``name`` serves (one key for a
        single Redis): the first ``n`` that hashes there, found in a few tries per master --
        the same key for the replica that takes over the master's slots."""
        if name in self._markers:
            return self._markers[name]
        if not isinstance(self.client, RedisCluster):
            self._markers[name] = f"{self.prefix}:sync:{self.token}"
            return self._markers[name]
        for key in self._counts:  # a marker with a count to compare, now served by ``name``
            with suppress(SlotNotCoveredError):
                if self.client.get_node_from_key(key).name == name:
                    self._markers[name] = key
                    return key
        wanted = set(self.masters())
        for n in range(100_000):
            key = f"{self.prefix}:sync:{{{n}}}:{self.token}"
            try:
                owner = self.client.get_node_from_key(key).name
            except SlotNotCoveredError:
                continue
            if owner in wanted:
                self._markers.setdefault(owner, key)
            if name in self._markers and len(self._markers) >= len(wanted):
                break
        if name not in self._markers:
            raise ReplicationLagError(f"Redis master {name} serves no slot now: writing again")
        return self._markers[name]

    def _refresh(self, key: str) -> None:
        """Let the cluster client learn the whole topology anew.  A MOVED on a marker (sent on a
        node's own connection, which redis-py's cluster routing never sees) means a failover:
        the client's map still gives the old master's slots to it, and patching it one slot per
        MOVED (what a routed command does) took a retry per slot -- thousands after a failover.
        So reload the map from the cluster (``NodesManager.initialize``, what redis-py itself
        does after ``reinitialize_steps`` redirections), then route one command by slot."""
        if isinstance(self.client, RedisCluster):
            self._reload_slots()
            with suppress(RedisError, SlotNotCoveredError):
                self.client.exists(key)

    def _reload_slots(self) -> None:
        if isinstance(self.client, RedisCluster):
            with suppress(RedisError, SlotNotCoveredError):
                self.client.nodes_manager.initialize()


class Stopping(Exception):
    """The process is shutting down: a Redis wait gives up instead of blocking shutdown."""


#: Set when the worker shuts down (SIGTERM, Ctrl-C): every :func:`with_retry` wait ends.
stopping = threading.Event()

#: Errors that mean "Redis cannot answer now, but will": wait and try again, never give up
#: on the record.  Connection loss and timeouts; LOADING after a restart; READONLY after a
#: failover; OOM at maxmemory; BUSY (a long script); cluster MOVED/ASK/TRYAGAIN/CLUSTERDOWN.
_TRANSIENT = (
    RedisConnectionError,
    RedisTimeoutError,
    BusyLoadingError,
    ReadOnlyError,
    OutOfMemoryError,  # redis-py strips the "OOM" from its message: match the class
    ClusterDownError,
    ClusterError,  # redis-py gave up following redirections: the cluster is reconfiguring
    TryAgainError,
    AskError,
    ReplicationLagError,
    SlotNotCoveredError,  # not a RedisError: redis-py raises it mid-failover
)
_TRANSIENT_REPLIES = (
    "OOM",
    "BUSY",
    "LOADING",
    "READONLY",
    "MOVED",
    "ASK",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MASTERDOWN",
)


def is_transient(exc: BaseException) -> bool:
    """Whether a Redis error is one to wait out (see ``_TRANSIENT``); a wrong password is not.

    >>> is_transient(RedisConnectionError("refused")), is_transient(ResponseError("OOM command not allowed"))
    (True, True)
    >>> is_transient(OutOfMemoryError("command not allowed when used memory > 'maxmemory'."))
    True
    >>> is_transient(AuthenticationError("invalid password")), is_transient(ResponseError("WRONGTYPE"))
    (False, False)
    """
    if isinstance(exc, AuthenticationError | AuthorizationError):
        return False
    if isinstance(exc, _TRANSIENT):
        return True
    return isinstance(exc, ResponseError) and str(exc).split(" ", 1)[0].upper() in _TRANSIENT_REPLIES


Report = Callable[[str, BaseException | None], None]
"""``report(what, error)``: told of each wait (the error) and of the recovery (None)."""


def replicated(replication: Replication | None) -> AbstractContextManager[None]:
    """``replication.barrier()``, or nothing when there is no :class:`Replication`."""
    return replication.barrier() if replication is not None else nullcontext()


def with_retry(what: str, call: Callable[[], T], *, report: Report | None = None, cap: float = 10.0) -> T:
    """``call()``, waiting out transient Redis errors with exponential back-off (redis-py's
    :class:`~redis.backoff.ExponentialBackoff`, capped at ``cap`` seconds) until it answers.

    While this waits the batch is not acknowledged, so the consumer stops pulling
    (back-pressure) and nothing is committed that was not applied.  Any other error is
    raised at once.  :data:`stopping` ends the wait with :class:`Stopping`.
    """
    backoff = ExponentialBackoff(cap=cap, base=0.1)
    failures = 0
    while True:
        if stopping.is_set():
            raise Stopping(f"{what}: shutting down")
        try:
            result = call()
        except (RedisError, SlotNotCoveredError) as exc:
            if not is_transient(exc):
                raise
            failures += 1
            delay = backoff.compute(failures)
            log.warning("%s: Redis cannot answer (%s); retrying in %.1fs", what, exc, delay)
            if report is not None:
                report(what, exc)
            if stopping.wait(delay):
                raise Stopping(f"{what}: shutting down while Redis was unavailable") from exc
            continue
        if failures and report is not None:
            report(what, None)
        return result


def clear_prefix(url: str, prefix: str, *, cluster: bool = False) -> int:
    """Delete every key under ``prefix:`` (tests, demos); returns how many went.  On a Redis
    Cluster the SCAN covers every master and each key is deleted by its own command (keys of
    different slots cannot share one)."""
    client = connect(url, cluster=cluster)
    try:
        keys = list(dict.fromkeys(client.scan_iter(match=f"{prefix}:*", count=1000)))
        for start in range(0, len(keys), 1000):
            pipe = client.pipeline(transaction=False)
            for key in keys[start : start + 1000]:
                pipe.unlink(key)
            pipe.execute()
        return len(keys)
    finally:
        client.close()
