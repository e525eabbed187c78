"""Role ``embed``: tweets → cleaned text → embeddings → per-hashtag running means in Redis.

Exactly-once effect on the means: every update is keyed by (topic incarnation, partition,
offset) and applied by :class:`~workers.adapters.redis.redis_means.RedisMeans` only above the
hashtag's watermark; the batch is acknowledged only after that.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import faust

from stream.auditing.coherence import coherence_text
from stream.feeds.batch import TextEncoder
from stream.intake.cleaning import Dropped, Prepared, dedup
from stream.intake.records import Coordinates
from workers.adapters.kafka.kafka_client import TopicIdentity
from workers.adapters.prometheus.exporter import Exporter
from workers.adapters.redis.redis_client import Client, replicated, with_retry
from workers.adapters.redis.redis_means import ApplyResult, Contribution
from workers.adapters.redis.redis_reservoir import RedisReservoir
from workers.adapters.redis.redis_state import RedisSeen
from workers.service.consumer import BatchConsumer, host
from workers.service.incarnation import Incarnations, batch_group
from workers.service.kafka_records import Record, count_admission
from workers.service.preparing import Preparer, Rejected
from workers.service.runtime import Outcome, Output, Runtime, Step, Topics, letter
from workers.service.stores import means_of, replication_of, samples_of
from workers.service.transactions import Transactions
from workers.settings import EmbedSettings, EncoderSettings

Item = tuple[Record, Prepared]


class Embedder:
    """Embeds batches of tweets into the running means."""

    def __init__(
        self,
        settings: EmbedSettings,
        exporter: Exporter,
        client: Client,
        encoder: TextEncoder,
        incarnations: Incarnations,
    ) -> None:
        self.settings = settings
        self.x = exporter
        self.encoder = encoder
        self.incarnations = incarnations
        # Two barriers per batch: the claims must be on the replicas before anything is
        # written on what they decided (on a cluster they live on other masters than the
        # means); the means, samples and reservoir -- one pipeline -- share the second (one
        # WAIT per master).
        self.replication = replication_of(client, settings, exporter)
        self.means = means_of(client, settings, dim=encoder.dim)
        self.seen = RedisSeen(
            client, settings.redis_prefix, ttl=settings.dedup_ttl_s, replication=self.replication
        )
        self.samples = samples_of(client, settings)
        self.reservoir = RedisReservoir(client, settings.redis_prefix, settings.coherence_reservoir)
        self.prepare = Preparer(settings.prepare_workers, language_filter=settings.language_filter)

    def prefetch(self, values: Sequence[bytes]) -> Any:
        """Start a batch's preparation in the preparing processes (the batch consumer calls
        it for the next batch while this one is applied); None when there are none."""
        return self.prepare.submit(values)

    def admit(self, records: Sequence[Record], prefetched: Any = None) -> tuple[list[Item], list[Output]]:
        """Parse and pre-process once (in the preparing processes, if any; already started
        where ``prefetched``): the tweets to embed, and the dead letters."""
        items: list[Item] = []
        rejected: list[tuple[Record, Rejected]] = []
        dropped: Counter[str] = Counter()
        started = time.perf_counter()
        if prefetched is not None:
            prepared = self.prepare.collect(prefetched)
        else:
            prepared = self.prepare([r.value for r in records])
        # With a prefetch, only the wait the apply did not hide.
        self.x.admit_seconds.observe(time.perf_counter() - started)
        for record, result in zip(records, prepared, strict=True):
            if isinstance(result, Prepared):
                items.append((record, result))
            elif isinstance(result, Dropped):
                dropped[result.reason] += 1
            else:
                rejected.append((record, result))
        count_admission(records, [(r, e.reason) for r, e in rejected], self.x)
        for reason, n in dropped.items():
            self.x.dropped.labels(reason).inc(n)
        return items, [letter(r, e.reason, e.detail, "embed") for r, e in rejected]

    def apply(self, items: Sequence[Item]) -> Outcome:
        """Claims, embedding, running means: idempotent (a retry or a redelivery adds nothing twice)."""
        if not items:
            return Outcome()
        current = {topic: self.incarnations.current(topic) for topic in {r.topic for r, _ in items}}
        scope = {topic: f"{topic}@{incarnation}" for topic, incarnation in current.items()}

        def claimant(record: Record) -> str:
            return record.coordinates.scoped(current[record.topic])

        started = time.perf_counter()
        claims = with_retry(
            "claims",
            lambda: self.seen.claim_many([(p.dedup_keys, claimant(r)) for r, p in items]),
            report=self.x.redis_report,
        )
        self.x.redis_seconds.labels("claim").observe(time.perf_counter() - started)
        kept: list[Item] = []
        duplicates = 0
        for (record, prepared), owned in zip(items, claims, strict=True):
            result = dedup(prepared, owned)
            if isinstance(result, Dropped):
                duplicates += 1
            else:
                kept.append((record, result))
        outcome = Outcome()
        if duplicates:
            outcome.after.append(lambda: self.x.dropped.labels("duplicate_retweet").inc(duplicates))
        if not kept:
            return outcome

        started = time.perf_counter()
        vectors = self.encoder.encode([p.text for _, p in kept])
        seconds = time.perf_counter() - started
        contributions = [
            Contribution(Coordinates(scope[r.topic], r.partition, r.offset), p.hashtags, v, _event_time(r, p))
            for (r, p), v in zip(kept, vectors, strict=True)
        ]
        # The embedding drift test's sample: idempotent too (one field per claimant).
        sample = [(claimant(r), _event_time(r, p), v) for (r, p), v in zip(kept, vectors, strict=True)]
        # The coherence sample (stream.auditing.coherence): a bottom-k sketch, so a redelivered tweet
        # writes the same member with the same score -- a no-op, like the means' watermark.
        # With its event time: a mover's examples are split into before and after by it.
        texts = [(p.hashtags, coherence_text(p.text), _event_time(r, p)) for r, p in kept]

        # The drift sample and the reservoir ride in the means' write round trip: one unit of
        # work per batch, closed by one replication barrier.
        riders = [*self.samples.commands(sample), *self.reservoir.commands(texts)]

        def write() -> tuple[ApplyResult, list[float]]:
            times = [time.perf_counter()]
            with replicated(self.replication):
                result = self.means.apply(contributions, riders)
                times.append(time.perf_counter())
            times.append(time.perf_counter())
            return result, times

        # Every write is idempotent, so a retry (a failover, replicas waited out) redoes them all.
        applied, times = with_retry("running means and samples", write, report=self.x.redis_report)
        steps = ("apply", "barrier")
        for op, start, end in zip(steps, times, times[1:], strict=False):
            self.x.redis_seconds.labels(op).observe(end - start)

        def count() -> None:  # once, when the batch is through
            self.x.embed_seconds.observe(seconds)
            self.x.batch_size.observe(len(kept))
            self.x.embedded.inc(len(kept))
            self.x.updates.labels("applied").inc(applied.applied)
            self.x.updates.labels("duplicate").inc(applied.skipped)

        outcome.after.append(count)
        return outcome


def _event_time(record: Record, prepared: Prepared) -> float:
    """The tweet's time (``created_at``), else the Kafka timestamp: the sample's bucket."""
    created = prepared.tweet.created_at
    return created.timestamp() if created is not None else record.time


def load_encoder(settings: EncoderSettings) -> TextEncoder:
    """The encoder the settings name (loaded once per worker process)."""
    from workers.adapters.encoding.encoder import Encoder  # lazy: torch loads only in embed workers

    return Encoder(
        settings.model,
        device=settings.device,
        dtype=settings.dtype,
        pooling=settings.pooling,  # type: ignore[arg-type]
        batch_size=settings.embed_batch_size,
        token_budget=settings.token_budget,
        tokenize_workers=settings.tokenize_workers,
    )


def register(
    app: faust.App, topics: Topics, rt: Runtime, generation: int = 0, encoder: TextEncoder | None = None
) -> None:
    """The embed role: its batch consumer of tweets (:mod:`workers.service.consumer`) through
    :class:`Embedder`.  ``generation``: the consumer group's (:mod:`workers.service.incarnation`)."""
    settings = rt.settings
    identity = TopicIdentity(settings.broker.split(",")[0], **settings.kafka_client_options())
    incarnations = Incarnations(identity, rt.client, settings.redis_prefix, rt.exporter)
    embedder = Embedder(settings, rt.exporter, rt.client, encoder or load_encoder(settings), incarnations)
    step = Step(
        "embed",
        embedder.admit,
        embedder.apply,
        source=lambda item: item[0],
        prefetch=embedder.prefetch if settings.prepare_workers else None,
    )
    incarnations.watch(app, [settings.topic_tweets])
    group = batch_group(settings.app_id, "embed", generation)
    exactly_once = settings.processing_guarantee == "exactly_once"
    consumer = BatchConsumer(
        rt,
        {settings.topic_tweets: step},
        group=group,
        size=settings.embed_batch_size,
        within=settings.embed_max_wait_s,
        # The means are exactly once by their watermarks either way; the transactions make
        # the dead letters exactly once too.
        transactions=Transactions(rt, group, settings.aiokafka_options()) if exactly_once else None,
        legacy_group=app.conf.id,
        lag_topics=[settings.topic_tweets],
    )
    host(app, consumer)
