"""Batch embedding of a feed, built from the same core steps as the streaming workers:
parsed tweets → clean → embed → per-hashtag running means."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from stream.intake.cleaning import Cleaner, Dropped, Prepared
from stream.intake.records import ErrorLog, Parsed, Tweet
from stream.synonyms.means import HashtagMeans


class ModelLoadError(OSError):
    """An encoder's model could not be loaded (not found, offline, damaged files)."""


class TextEncoder(Protocol):
    """What embedding a feed needs from a model (:class:`workers.adapters.encoding.encoder.Encoder`)."""

    @property
    def dim(self) -> int: ...

    @property
    def model_id(self) -> str: ...

    def encode(self, texts: Sequence[str]) -> npt.NDArray[np.float32]: ...


class TokenEncoder(TextEncoder, Protocol):
    """An encoder that also gives each text's token embeddings (BERTScore coherence)."""

    def encode_tokens(
        self, texts: Sequence[str], *, progress: Callable[[int, int], None] | None = None
    ) -> list[npt.NDArray[np.float32]]: ...


@dataclass
class BuildReport:
    """What a thesaurus build read, kept and dropped."""

    read: int = 0
    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    bad_lines: ErrorLog = field(default_factory=ErrorLog)
    hashtags_seen: int = 0
    hashtags_indexed: int = 0
    seconds: float = 0.0

    @property
    def tweets_per_second(self) -> float:
        return self.read / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "tweets_read": self.read,
            "tweets_kept": self.kept,
            "dropped": dict(self.dropped),
            "bad_lines": self.bad_lines.total,
            "bad_lines_by_reason": self.bad_lines.by_reason,
            "first_bad_lines": self.bad_lines.first,
            "hashtags_seen": self.hashtags_seen,
            "hashtags_indexed": self.hashtags_indexed,
            "seconds": round(self.seconds, 2),
            "tweets_per_second": round(self.tweets_per_second, 1),
        }


def embed_feed(
    items: Iterable[Parsed[Tweet]],
    encoder: TextEncoder,
    *,
    cleaner: Cleaner | None = None,
    chunk: int = 512,
    report: BuildReport | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> HashtagMeans:
    """Clean and embed a feed into per-hashtag running means.

    Tweets are embedded ``chunk`` at a time so the encoder can sort each chunk by
    length; ``on_progress`` gets the number of lines consumed since the last call.
    """
    cleaner = cleaner or Cleaner()
    report = report if report is not None else BuildReport()
    means = HashtagMeans(dim=encoder.dim)
    pending: list[Prepared] = []

    def flush() -> None:
        if pending:
            vectors = encoder.encode([p.text for p in pending])
            means.update_batch([p.hashtags for p in pending], vectors)
            pending.clear()

    for item in items:
        if on_progress is not None:
            on_progress(1)
        if item.error is not None:
            report.bad_lines.add(item)
            continue
        assert item.value is not None
        report.read += 1
        result = cleaner(item.value)
        if isinstance(result, Dropped):
            report.dropped[result.reason] += 1
            continue
        report.kept += 1
        pending.append(result)
        if len(pending) >= chunk:
            flush()
    flush()
    report.hashtags_seen = len(means)
    return means
