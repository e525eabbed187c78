"""Overlap for the encoder's token-budget path: the host side runs ahead in a thread.

:func:`prefetch` runs the host half (tokenising, sorting, building the batch tensors in
pinned memory) in a background thread that feeds a bounded queue while the calling thread
launches GPU work; its exceptions are raised in the consumer, and a consumer that stops early
stops and joins it.

>>> with prefetch(iter(range(5)), depth=2) as items:
...     list(items)
[0, 1, 2, 3, 4]
>>> list(chunked(5, 2))
[(0, 2), (2, 4), (4, 5)]
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

_DONE = object()


@contextmanager
def prefetch(
    items: Iterable[Any], depth: int = 4, *, name: str = "encoder-feeder"
) -> Iterator[Iterator[Any]]:
    """Iterate ``items`` in a background thread, at most ``depth`` ahead of the consumer.

    The producer's exceptions are raised in the consumer; when the consumer stops
    early (or raises), the producer is told to stop and joined.
    """
    q: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(_DONE)
        except BaseException as exc:  # handed to the consumer
            put(_Failure(exc))

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()

    def consume() -> Iterator[Any]:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item

    try:
        yield consume()
    finally:
        stop.set()
        thread.join()


@dataclass
class _Failure:
    exc: BaseException


def chunked(n: int, size: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of consecutive chunks of ``size`` over ``range(n)``."""
    for start in range(0, n, size):
        yield start, min(n, start + size)


__all__ = ["chunked", "prefetch"]
