"""The offline commands' work, without the CLI: build a thesaurus from feed files,
and write recommendation events to a file and/or Kafka."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Self

from stream.feeds.batch import BuildReport, TextEncoder, embed_feed
from stream.feeds.replay import Outgoing, timestamp_ms
from stream.intake.cleaning import Cleaner
from stream.synonyms.hubness import DEFAULT_METHOD
from stream.synonyms.means import HashtagMeans
from workers.adapters.files.annoy_thesaurus import DEFAULT_DEPTH, AnnoyThesaurus, build_from_means
from workers.adapters.files.feeds import read_tweets
from workers.adapters.kafka.kafka_client import KafkaSink


class NothingToBuildError(ValueError):
    """The feeds held no hashtag to index (a runtime failure, not a usage error)."""


def build_thesaurus(
    paths: Sequence[str | Path],
    encoder: TextEncoder,
    *,
    min_count: int = 1,
    n_trees: int = 50,
    method: str = DEFAULT_METHOD,
    depth: int = DEFAULT_DEPTH,
    cleaner: Cleaner | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> tuple[AnnoyThesaurus, HashtagMeans, BuildReport]:
    """``reval thesaurus build``: feed files → Annoy thesaurus of hashtag embeddings."""
    started = time.perf_counter()
    report = BuildReport()
    means = embed_feed(read_tweets(paths), encoder, cleaner=cleaner, report=report, on_progress=on_progress)
    thesaurus = build_from_means(
        means, min_count=min_count, model_id=encoder.model_id, n_trees=n_trees, method=method, depth=depth
    )
    if thesaurus is None:
        bad = report.bad_lines
        why = (
            f"; all {bad.total} lines were bad ({', '.join(f'{n} {r}' for r, n in bad.by_reason.items())})"
            if bad.total and not report.read
            else f"; {bad.total} bad lines"
            if bad.total
            else ""
        )
        raise NothingToBuildError(
            f"no hashtag reached min_count={min_count} in {', '.join(map(str, paths))}: read "
            f"{report.read} tweets, kept {report.kept}, dropped {dict(report.dropped)}{why}"
        )
    report.hashtags_indexed = len(thesaurus)
    report.seconds = time.perf_counter() - started
    return thesaurus, means, report


class EventSink:
    """Writes recommendation events to a JSON-lines file and/or a Kafka topic; Kafka goes
    through :class:`~workers.adapters.kafka.kafka_client.KafkaSink` (key = tweet id, timestamp = the
    tweet's time, bounded in flight, errors raised)."""

    def __init__(
        self,
        path: Path | None = None,
        *,
        topic: str | None = None,
        broker: str | None = None,
        **kafka_options: Any,
    ) -> None:
        if path is None and topic is None:
            raise ValueError("give a file to write, a topic to produce to, or both")
        self.count = 0
        self._file: IO[str] | None = None
        self._kafka: Any = None
        if topic is not None:
            self._kafka = KafkaSink(
                broker or "127.0.0.1:9092", topic, client_id="reval-recommend", **kafka_options
            )
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("w", encoding="utf-8")

    def write(self, event: Mapping[str, Any]) -> None:
        line = json.dumps(event, ensure_ascii=False)
        if self._file is not None:
            self._file.write(line + "\n")
        if self._kafka is not None:
            ts = event.get("ts")
            when = timestamp_ms(datetime.fromisoformat(ts)) if ts else int(time.time() * 1000)
            key = str(event["tweet_id"]).encode()
            self._kafka(Outgoing(key, line.encode(), when, f"event {self.count + 1}"))
        self.count += 1

    def close(self) -> None:
        try:
            if self._kafka is not None:
                self._kafka.flush()  # raises the broker's error, if any
        finally:
            if self._kafka is not None:
                self._kafka.close()
                self._kafka = None
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
