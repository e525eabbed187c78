"""The embed role's admission -- parse, clean, language, dedup keys -- in worker processes.

One process prepares ~6,000-8,000 feed tweets/s (``stream.intake.cleaning.prepare``: NLTK's
tokenizer regex, language identification, BLAKE2b per hashtag; BENCHMARKS.md), an encoder on
one H100 takes ~97,000: one embed worker could use a few percent of its GPU.  The work is
pure and per tweet, so :class:`Preparer` cuts a batch into one chunk per process and hands
the chunks to ``REVAL_PREPARE_WORKERS`` spawned processes (the pattern of arroyo's
``RunTaskWithMultiprocessing``: the consumer stays one process, only the pure step fans out),
then puts the results back in the batch's order.  With 0 processes (the default: on a CPU
the encoder, not this step, bounds the worker, and extra processes would take its cores) the
same function runs in the role's thread.  Either way the output is that of
:func:`prepare_values`, so the two are the same by construction.

What comes back from a process is a :class:`~stream.intake.cleaning.Prepared` or
:class:`~stream.intake.cleaning.Dropped` whose tweet has no ``extra`` (the raw JSON object, which no
step after admission reads and which would triple the bytes pickled back), or a
:class:`Rejected` for a record that does not parse.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace

from stream.intake.cleaning import Dropped, Prepared, prepare
from stream.intake.records import RecordError, Tweet, parse_tweet
from workers.service.runtime import FailStop


@dataclass(frozen=True)
class Rejected:
    """A record that does not parse (:class:`~stream.intake.records.RecordError`'s reason and detail:
    the exception itself does not pickle)."""

    reason: str
    detail: str


Admitted = Prepared | Dropped | Rejected

#: A chunk smaller than this is prepared in the role's thread: pickling it both ways would
#: cost more than it saves.
MIN_CHUNK = 64


def prepare_values(values: Sequence[bytes], language_filter: bool) -> list[Admitted]:
    """Each record's bytes parsed and prepared, in order."""
    out: list[Admitted] = []
    for value in values:
        try:
            tweet = parse_tweet(value)
        except RecordError as exc:
            out.append(Rejected(exc.reason, exc.detail))
            continue
        result = prepare(_bare(tweet), language_filter=language_filter)
        out.append(result)
    return out


def _bare(tweet: Tweet) -> Tweet:
    return replace(tweet, extra={}) if tweet.extra else tweet


def _start() -> None:
    """A process's start: end with the worker (a worker ended by ``kill -9`` or a fail-stop's
    ``os._exit`` leaves its pool's processes waiting on a queue they hold both ends of), then
    the first tweet -- the imports and the tokenizer's compiled patterns."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="reval-prepare-watch", daemon=True).start()
    prepare_values([b'{"id": "0", "text": "warm #up"}'], True)


class Preparer:
    """:func:`prepare_values` over a batch, in ``workers`` processes (0: in the caller's thread)."""

    def __init__(self, workers: int, *, language_filter: bool) -> None:
        self.workers = workers
        self.language_filter = language_filter
        self._pool: ProcessPoolExecutor | None = None
        if workers > 0:
            # spawn, not fork: the parent holds threads (the event loop, Redis, the encoder's
            # feeder) and, on a GPU, a CUDA context, neither of which survives a fork.
            self._pool = ProcessPoolExecutor(
                workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start
            )

    def __call__(self, values: Sequence[bytes]) -> list[Admitted]:
        started = self.submit(values)
        return self.collect(started) if started is not None else prepare_values(values, self.language_filter)

    def submit(self, values: Sequence[bytes]) -> list[Future[list[Admitted]]] | None:
        """Start preparing ``values`` in the processes, one chunk each; None where there are
        no processes or the batch is too small to be worth it (prepare it in the thread)."""
        if self._pool is None or len(values) < 2 * MIN_CHUNK:
            return None
        n = min(self.workers, len(values) // MIN_CHUNK)
        size = -(-len(values) // n)
        try:
            return [
                self._pool.submit(prepare_values, list(values[i : i + size]), self.language_filter)
                for i in range(0, len(values), size)
            ]
        except BrokenProcessPool as exc:
            raise FailStop(f"a preparing process died: {exc}") from exc

    def collect(self, started: Sequence[Future[list[Admitted]]]) -> list[Admitted]:
        """The results of :meth:`submit`, in the batch's order (waits for them)."""
        try:
            return [admitted for future in started for admitted in future.result()]
        except BrokenProcessPool as exc:
            # A process died (killed, out of memory): not the records' fault, and every later
            # batch would fail the same way -- stop, and take the batch again after the restart.
            raise FailStop(f"a preparing process died: {exc}") from exc

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
