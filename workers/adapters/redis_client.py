"""Redis: the client the workers share, pipelined script calls, and back-pressure on outages.

The running means (:mod:`workers.adapters.redis_means`) and the other worker state
(:mod:`workers.adapters.redis_state`) use these.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import redis
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

Client = redis.Redis | RedisCluster
T = TypeVar("T")
log = logging.getLogger("reval.redis")


def connect(url: str, *, cluster: bool = False) -> Client:
    """A Redis or Redis Cluster client from the URL (``rediss://`` for TLS, password in URL)."""
    if cluster:
        return RedisCluster.from_url(url)
    return redis.Redis.from_url(url, health_check_interval=30)


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


def with_retry(what: str, call: Callable[[], T], *, attempts: int | None = None) -> T:
    """Retry a Redis round trip on connection trouble, with back-off.

    While this waits the batch is not acknowledged, so the consumer stops
    pulling (back-pressure) and nothing is committed that was not applied.
    """
    delay, tried = 0.2, 0
    while True:
        try:
            return call()
        except (RedisConnectionError, RedisTimeoutError) as exc:
            tried += 1
            if attempts is not None and tried >= attempts:
                raise
            log.warning("%s: Redis unavailable (%s); retrying in %.1fs", what, exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


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
