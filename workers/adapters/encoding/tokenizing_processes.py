"""Tokenising in processes for the encoder's token-budget path.

The BERTweet normaliser is Python and holds the GIL (one process: ~10,000 new feed tweets/s,
~20,000 with warm caches), so a GPU that embeds ~50,000 tweets/s needs several tokenising
processes beside the thread that launches GPU work.  :class:`TokenizingProcesses` runs the
same tokenizer as the :class:`~workers.adapters.encoding.encoder.Encoder` in ``spawn``-ed processes
(safe beside CUDA and threads) and hands back :class:`~workers.adapters.encoding.gpu_batching.Window`\\ s
in input order, a bounded number of chunks in flight.  Should the processes fail (one killed,
or they cannot start: a main module without an ``if __name__ == "__main__"`` guard), the rest
is tokenised in the calling thread and :attr:`TokenizingProcesses.failed` says so.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from workers.adapters.encoding.bertweet_tokenizer import fast_for
from workers.adapters.encoding.gpu_batching import Window
from workers.adapters.encoding.prefetch import chunked
from workers.adapters.encoding.tokenizer_loading import load_hf_tokenizer

log = logging.getLogger(__name__)


def default_tokenize_workers() -> int:
    """Tokenising processes for a CUDA Encoder when not given: half the cores, at most 8.

    They are ``spawn``-ed, which re-imports the main module: a script using them must guard
    its top level with ``if __name__ == "__main__":`` (the ``reval`` command, pytest and the
    benchmarks do); should the processes fail anyway, the Encoder tokenises in its feeder
    thread instead.
    """
    return min(8, max(1, (os.cpu_count() or 1) // 2))


@dataclass(frozen=True)
class TokenizerSpec:
    """What a process needs to load the Encoder's tokenizer: the model path, whether it is
    BERTweet's, the loader's keyword arguments, ``slow_tokenizer`` and ``max_length``."""

    path: str
    bertweet_hint: bool
    load_kw: dict[str, Any]
    slow: bool
    max_length: int


class TokenizingProcesses:
    """``workers`` tokenising processes (started by :meth:`start` or on first use)."""

    def __init__(self, workers: int, spec: TokenizerSpec) -> None:
        if workers < 1:
            raise ValueError("workers must be positive")
        self.workers = workers
        self.spec = spec
        self.failed = False
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            s = self.spec
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_pool_init,
                initargs=(s.path, s.bertweet_hint, s.load_kw, s.slow, s.max_length),
            )
            weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)
        return self._pool

    def start(self) -> None:
        """Start the processes now (each loads the tokenizer: seconds), not on the first batch."""
        pool = self._executor()
        for _ in range(self.workers):
            pool.submit(_pool_tokenize, ["warm up"])

    def windows(
        self, texts: Sequence[str], chunk: int, fallback: Callable[[Sequence[str]], list[list[int]]]
    ) -> Iterator[Window]:
        """``texts`` tokenised in chunks of ``chunk``, as windows in input order; ``fallback``
        tokenises in this thread whatever is left when the processes fail."""
        in_flight: deque[tuple[int, int, Future[tuple[np.ndarray, np.ndarray]]]] = deque()
        chunks = chunked(len(texts), chunk)
        try:
            pool = self._executor()
            for a, b in chunks:
                in_flight.append((a, b, pool.submit(_pool_tokenize, list(texts[a:b]))))
                if len(in_flight) >= 2 * self.workers:
                    yield _window_of(*in_flight.popleft())
            while in_flight:
                yield _window_of(*in_flight.popleft())
        except BrokenProcessPool as exc:
            log.warning("encoder: tokenising processes failed (%s); tokenising in a thread from now on", exc)
            self.close()
            self.failed = True
            rest = [(a, b) for a, b, _ in in_flight] + list(chunks)
            in_flight.clear()
            for a, b in rest:
                yield Window.from_lists(fallback(texts[a:b]), np.arange(a, b))
        finally:
            for _, _, fut in in_flight:
                fut.cancel()

    def close(self) -> None:
        """Stop the processes (also done when this object is collected)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


_POOL_TOKENIZE: Callable[[list[str]], list[list[int]]] | None = None


def _pool_init(path: str, bertweet_hint: bool, load_kw: dict[str, Any], slow: bool, max_length: int) -> None:
    """In each tokenising process: the same tokenizer as the Encoder's (fast BERTweet one or HF)."""
    global _POOL_TOKENIZE
    torch.set_num_threads(1)
    tokenizer = load_hf_tokenizer(path, bertweet_hint=bertweet_hint, **load_kw)
    fast = fast_for(tokenizer, slow=slow)
    if fast is not None:
        fast_tok = fast

        def run(texts: list[str]) -> list[list[int]]:
            return fast_tok.encode_batch(texts, max_length)
    else:

        def run(texts: list[str]) -> list[list[int]]:
            out = tokenizer(texts, truncation=True, max_length=max_length, add_special_tokens=True)
            return [list(ids) for ids in out["input_ids"]]

    _POOL_TOKENIZE = run


def _pool_tokenize(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Ids concatenated and lengths: numpy arrays pickle far cheaper than lists of lists."""
    assert _POOL_TOKENIZE is not None, "tokenizer process not initialised"
    window = Window.from_lists(_POOL_TOKENIZE(texts), np.arange(len(texts)))
    return window.ids, window.lengths


def _window_of(start: int, stop: int, future: Future[tuple[np.ndarray, np.ndarray]]) -> Window:
    ids, lengths = future.result()
    return Window(ids, lengths, np.arange(start, stop, dtype=np.int64))


__all__ = ["TokenizerSpec", "TokenizingProcesses", "default_tokenize_workers"]
