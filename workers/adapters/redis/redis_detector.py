"""Redis: each recommender's live change detector (:class:`stream.monitoring.cusum.Detector`), shared by
every score worker, so that its charts run over *all* of the recommender's events whichever
worker scored them, and survive restarts and rebalances.

``{prefix}:detector:<recommender>`` -- HASH: ``v`` the state's version (a counter), ``s`` the
detector's state (JSON), ``t:<alternative>`` the time (Unix seconds, the writer's clock) of
its last alarm of that alternative.

A worker reads the states of the recommenders in its batch (one round trip), feeds each its
events, and writes them back with a compare-and-set on ``v`` (one round trip, one script per
key: Redis Cluster safe); a state another worker wrote meanwhile is read again and the events
fed again to it.  So the events of two workers interleave batch by batch, each batch whole.

How often an event counts: the update runs after the batch's scores are delivered; a crash
between the two leaves that batch out of the charts, and a batch delivered twice (at least
once, after a crash before its offsets are committed) counts twice.  A CUSUM takes either
in its stride -- a few hundred events of one batch neither raise nor hide a change of the
recommender -- so the detector is not part of the exactly-once guarantees.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import redis

from stream.monitoring.cusum import Alarm, Detector
from workers.adapters.redis.redis_client import Client, eval_many

# KEYS[1] the hash; ARGV: the version read ("0": none), the new version, the state, this
# write's token, then (alternative, time) pairs of the alarms raised.  A write that already
# went in (the pipeline re-run after a NOSCRIPT on another node) answers 1 again: idempotent.
_CAS = """
if redis.call('HGET', KEYS[1], 'w') == ARGV[4] then return 1 end
local v = redis.call('HGET', KEYS[1], 'v') or '0'
if v ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 's', ARGV[3], 'w', ARGV[4])
for i = 5, #ARGV, 2 do redis.call('HSET', KEYS[1], 't:' .. ARGV[i], ARGV[i + 1]) end
return 1
"""

Batch = tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]


class RedisDetectors:
    """The recommenders' detectors in Redis (module docstring)."""

    def __init__(
        self,
        client: Client,
        prefix: str,
        make: Callable[[], Detector],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client: Any = client
        self.prefix = f"{prefix}:detector"
        self.make = make
        self.clock = clock
        # types-redis predates RedisCluster's scripting support; it exists at run time.
        self._cas: Any = cast(redis.Redis, client).register_script(_CAS)

    def key(self, recommender: str) -> str:
        return f"{self.prefix}:{recommender}"

    def update(self, batches: Mapping[str, Batch], *, attempts: int = 20) -> dict[str, Updated]:
        """Feed each recommender's detector its events ``(outcome counts, chance)``, in order;
        returns each detector after them, the alarms they raised and when each alternative
        last alarmed."""
        out: dict[str, Updated] = {}
        todo = dict(batches)
        for _ in range(attempts):
            if not todo:
                return out
            names = list(todo)
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                pipe.hgetall(self.key(name))
            calls, staged = [], {}
            for name, raw in zip(names, pipe.execute(), strict=True):
                fields = {_text(k): v for k, v in raw.items()}
                detector = Detector.from_state(json.loads(fields["s"])) if "s" in fields else self.make()
                alarms = detector.update(*todo[name])
                read = int(fields.get("v") or 0)
                now = self.clock()
                last = {k[2:]: float(v) for k, v in fields.items() if k.startswith("t:")}
                state = json.dumps(detector.to_state())
                args: list[Any] = [str(read), str(read + 1), state, uuid.uuid4().hex]
                for alternative in dict.fromkeys(a.alternative for a in alarms):
                    args += [alternative, repr(now)]
                    last[alternative] = now
                calls.append((self.key(name), args))
                staged[name] = Updated(detector, alarms, last)
            for name, written in zip(names, eval_many(self.client, self._cas, calls), strict=True):
                if int(written):
                    out[name] = staged[name]
                    del todo[name]
        raise RuntimeError(f"detector state of {sorted(todo)} kept changing under {attempts} attempts")


@dataclass(frozen=True)
class Updated:
    """A recommender's detector after a batch, the alarms the batch raised, and when each
    alternative last alarmed (Unix seconds)."""

    detector: Detector
    alarms: list[Alarm]
    last_alarms: dict[str, float]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
