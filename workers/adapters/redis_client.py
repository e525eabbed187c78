"""Redis: the client the workers share, pipelined script calls, and back-pressure on outages.

The running means (:mod:`workers.adapters.redis_means`) and the other worker state
(:mod:`workers.adapters.redis_state`) use these.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
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
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

Client = redis.Redis | RedisCluster
T = TypeVar("T")
log = logging.getLogger("reval.redis")


def connect(url: str, *, cluster: bool = False) -> Client:
    """A Redis or Redis Cluster client from the URL (``rediss://`` for TLS, password in URL)."""
    # redis-py's own retry rides out a dropped connection or two inside one call; longer
    # outages are waited out by :func:`with_retry`, which can back-pressure and stop.
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), 3)
    if cluster:
        return RedisCluster.from_url(url, retry=retry)
    return redis.Redis.from_url(url, health_check_interval=30, retry=retry)


def eval_many(client: Client, script: Any, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
    """Run ``script`` once per ``(key, args)`` in one pipeline round trip.

    EVALSHA directly (not ``Script.__call__``, which adds a SCRIPT EXISTS round trip
    on a pipeline and is blocked on cluster pipelines); on NOSCRIPT the script is
    loaded and the pipeline re-run -- every script here is idempotent.
    """
    for attempt in (1, 2):
        pipe = client.pipeline(transaction=False)
        for key, args in calls:
            pipe.execute_command("EVALSHA", script.sha, 1, key, *args)
        results = list(pipe.execute(raise_on_error=False))
        if attempt == 1 and any(isinstance(r, NoScriptError) for r in results):
            script.sha = cast(redis.Redis, client).script_load(script.script)
            continue
        for result in results:
            if isinstance(result, Exception):
                raise result
        return results
    raise AssertionError("unreachable")


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
    TryAgainError,
    AskError,
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
        except RedisError as exc:
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


def clear_prefix(url: str, prefix: str) -> int:
    """Delete every key under ``prefix:`` (tests, demos); returns how many went."""
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(f"{prefix}:*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start : start + 1000])
        return len(keys)
    finally:
        client.close()
