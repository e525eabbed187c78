"""Kafka: the one client library for producing and admin (kafka-python).

* :class:`KafkaSink` -- a ``send`` for :func:`stream.feeds.replay.replay` (replays,
  ``reval recommend``): ``acks="all"``, idempotent, bounded in flight.
* :func:`read_topic` -- every record of a topic up to its end now (the audit's vote
  log, small: read whole to derive its state).
* :func:`create_topics` / :func:`topic_partitions` / :func:`ensure_topic` -- topics
  with explicit partition counts (never let a broker auto-create one with its own
  default count: Faust refuses tables whose changelog and source counts differ) and
  settings (the input topics' retention).
* :func:`topic_retention` / :func:`partition_heads` -- what a topic deletes and where a
  group stands on it, for :mod:`stream.feeds.retention`'s checks.

The workers consume through Faust (aiokafka), in :mod:`workers.service`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
from kafka.errors import KafkaError, NoError, SaslAuthenticationFailedError
from kafka.structs import OffsetAndMetadata, TopicPartition

from stream.feeds.replay import Outgoing, ProduceError
from stream.feeds.retention import PartitionHead, TopicRetention

_ERR_NONE = 0
_ERR_TOPIC_ALREADY_EXISTS = 36


class BrokerError(RuntimeError):
    """A Kafka admin request failed or timed out."""


class BrokerUnreachableError(BrokerError):
    """No broker of the bootstrap list answered in time."""


class BrokerAuthError(BrokerUnreachableError):
    """The broker refused the client's credentials (SASL) or its TLS handshake."""

    #: The settings to check, for the one-line error of a command.
    settings = "REVAL_KAFKA_SASL_USERNAME / REVAL_KAFKA_SASL_PASSWORD"


class TopicPartitionMismatchError(BrokerError):
    """A topic exists with a partition count other than the one asked for."""


class KafkaSink:
    """``send`` for :func:`replay`: a kafka-python producer with back-pressure.

    ``acks="all"`` and idempotence (no duplicates or reordering on retries) and a
    short ``linger_ms`` to batch.  In-flight data is bounded here: kafka-python 3
    has no ``buffer_memory`` (its accumulator grows without limit), so ``send``
    blocks while more than ``max_pending_bytes`` / ``max_pending`` records are
    unacknowledged, up to ``max_block_ms`` (then :class:`ProduceError`).  The first
    failed record is remembered by its ``path:line`` and raised as
    :class:`ProduceError` from the next ``send`` or from :meth:`flush`.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        linger_ms: int = 5,
        max_pending: int = 20_000,
        max_pending_bytes: int = 32 * 1024 * 1024,
        max_block_ms: int = 60_000,
        delivery_timeout_ms: int = 120_000,
        client_id: str = "reval-replay",
        **config: Any,
    ) -> None:
        self.topic = topic
        self.acked = 0
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.max_block_s = max_block_ms / 1000
        self._pending = 0
        self._pending_bytes = 0
        self._done = threading.Condition()
        self._failure: ProduceError | None = None
        self._producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            client_id=client_id,
            acks="all",
            enable_idempotence=True,
            max_in_flight_requests_per_connection=5,
            linger_ms=linger_ms,
            max_block_ms=max_block_ms,
            delivery_timeout_ms=delivery_timeout_ms,
            allow_auto_create_topics=False,
            **config,
        )

    @property
    def pending(self) -> int:
        """Records sent and not yet acknowledged (or failed)."""
        return self._pending

    def _settle(self, size: int, where: str, result: Any) -> None:
        # Runs on the producer's I/O thread, once per record: ``result`` is the
        # RecordMetadata, or the exception (errback).
        with self._done:
            self._pending -= 1
            self._pending_bytes -= size
            if isinstance(result, BaseException):
                if self._failure is None:
                    self._failure = ProduceError(where, f"producing to {self.topic!r} failed: {result!r}")
            else:
                self.acked += 1
            self._done.notify_all()

    def _raise_failure(self) -> None:
        with self._done:
            failure = self._failure
        if failure is not None:
            raise failure

    def __call__(self, out: Outgoing) -> None:
        size = len(out.value) + len(out.key or b"")
        with self._done:
            ready = self._done.wait_for(
                lambda: (
                    self._failure is not None
                    or self._pending == 0
                    or (
                        self._pending < self.max_pending
                        and self._pending_bytes + size <= self.max_pending_bytes
                    )
                ),
                timeout=self.max_block_s,
            )
            if self._failure is not None:
                raise self._failure
            if not ready:
                raise ProduceError(
                    out.where,
                    f"{self._pending:,} records unacknowledged by the broker for "
                    f"{self.max_block_s:.0f}s (topic {self.topic!r})",
                )
            self._pending += 1
            self._pending_bytes += size
        try:
            future = self._producer.send(
                self.topic, key=out.key, value=out.value, timestamp_ms=out.timestamp_ms
            )
        except (KafkaError, ValueError, AssertionError) as exc:
            with self._done:
                self._pending -= 1
                self._pending_bytes -= size
            raise ProduceError(out.where, f"producing to {self.topic!r} failed: {exc!r}") from exc
        future.add_both(self._settle, size, out.where)

    def flush(self, timeout: float | None = None) -> None:
        """Wait for every record sent so far; raise the first failure."""
        try:
            self._producer.flush(timeout=timeout)
        except KafkaError as exc:
            raise ProduceError("flush", f"flushing to {self.topic!r} failed: {exc!r}") from exc
        self._raise_failure()

    def close(self, timeout: float = 10.0) -> None:
        self._producer.close(timeout=timeout)

    def __enter__(self) -> KafkaSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _AuthFailures(logging.Handler):
    """Notes the authentication failures kafka-python logs while it bootstraps: it retries them
    until its timeout and then reports only "Unable to bootstrap", which would send the user
    looking for a broker that is up and merely refused the password."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = False
        #: Bootstrap connections the broker dropped after accepting them: on a SASL listener
        #: that is a refused authentication too -- the broker sends its error and closes, and
        #: on a busy machine the close can reach the client before the error does.
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        self.seen = self.seen or "SaslAuthenticationFailed" in text or "AuthenticationFailed" in text
        if "Bootstrap connection" in text and "socket disconnected" in text:
            self.dropped += 1


def _ms(timeout: float) -> int:
    """A timeout in seconds as kafka-python's milliseconds, at least one second."""
    return max(int(timeout * 1000), 1000)


def _client_timeouts(timeout: float) -> dict[str, int]:
    """A kafka-python client's request and bootstrap timeouts, both ``timeout`` seconds."""
    return {"request_timeout_ms": _ms(timeout), "bootstrap_timeout_ms": _ms(timeout)}


def admin_client(bootstrap: str, *, timeout: float = 30.0, **options: Any) -> KafkaAdminClient:
    """A kafka-python admin client; ``options``: TLS/SASL (``Settings.kafka_client_options``).

    Raises :class:`BrokerAuthError` when the broker answered but refused the credentials,
    :class:`BrokerUnreachableError` when nobody answered in time."""
    watcher = _AuthFailures()
    library = logging.getLogger("kafka")
    library.addHandler(watcher)
    try:
        return KafkaAdminClient(
            bootstrap_servers=bootstrap,
            client_id="reval-stream-admin",
            **_client_timeouts(timeout),
            **options,
        )
    except KafkaError as exc:  # NoBrokersAvailable, KafkaTimeoutError while bootstrapping
        if watcher.seen or isinstance(exc, SaslAuthenticationFailedError):
            raise BrokerAuthError(
                f"the broker at {bootstrap} refused the credentials (SASL authentication failed; "
                "REVAL_KAFKA_SASL_MECHANISM must match the broker's too)"
            ) from None
        if watcher.dropped and options.get("sasl_mechanism"):
            raise BrokerAuthError(
                f"the broker at {bootstrap} accepted every connection and dropped it during SASL "
                f"authentication ({watcher.dropped} times): the credentials were most likely refused "
                "(REVAL_KAFKA_SASL_MECHANISM must match the broker's too)"
            ) from None
        raise BrokerUnreachableError(
            f"no Kafka broker answered at {bootstrap} within {timeout:g} s ({exc})"
        ) from exc
    finally:
        library.removeHandler(watcher)


@contextlib.contextmanager
def _admin(bootstrap: str, *, timeout: float, **options: Any) -> Iterator[Any]:
    admin = admin_client(bootstrap, timeout=timeout, **options)
    try:
        yield admin
    finally:
        admin.close()


def list_topics(bootstrap: str, *, timeout: float = 30.0, **options: Any) -> list[str]:
    """The broker's topic names (a metadata round trip)."""
    with _admin(bootstrap, timeout=timeout, **options) as admin:
        return sorted(admin.list_topics())


def _partition_counts(admin: Any, names: Iterable[str]) -> dict[str, int | None]:
    """Partition count of each topic, None where the broker does not know it."""
    counts: dict[str, int | None] = {}
    for desc in admin.describe_topics(sorted(set(names))):
        ok = desc.get("error_code", 0) == _ERR_NONE
        counts[desc["name"]] = len(desc.get("partitions") or []) if ok else None
    return counts


def topic_partitions(
    bootstrap: str, topics: Iterable[str], *, timeout: float = 30.0, **options: Any
) -> dict[str, int | None]:
    """Partition count of each named topic (None where it does not exist).

    Uses a plain metadata request, which does not auto-create topics.
    """
    names = list(topics)
    with _admin(bootstrap, timeout=timeout, **options) as admin:
        counts = _partition_counts(admin, names)
    return {name: counts.get(name) for name in names}


def create_topics(
    bootstrap: str,
    topics: Mapping[str, int],
    *,
    replication: int = 1,
    timeout: float = 30.0,
    configs: Mapping[str, Mapping[str, str]] | None = None,
    **options: Any,
) -> None:
    """Create topics with explicit partition counts; idempotent.

    ``topics`` maps a topic name to its partition count; ``configs`` a topic name to the
    topic settings it is created with (a topic that exists keeps its own). A topic that already exists
    is fine as long as its partition count matches; otherwise (for instance a topic
    the broker auto-created with its own default count when something produced to it
    first) :class:`TopicPartitionMismatchError` is raised. Waits until every topic
    is visible in the broker's metadata with the expected count.
    """
    wanted = dict(topics)
    if not wanted:
        return
    for name, partitions in wanted.items():
        if not name or not isinstance(partitions, int) or partitions < 1:
            raise ValueError(f"bad topic spec {name!r}: {partitions!r} (need a name and >= 1)")
    if replication < 1:
        raise ValueError(f"replication must be >= 1, not {replication}")

    deadline = time.monotonic() + timeout
    with _admin(bootstrap, timeout=timeout, **options) as admin:
        response = admin.create_topics(
            {
                name: {
                    "num_partitions": n,
                    "replication_factor": replication,
                    "configs": dict((configs or {}).get(name, {})),
                }
                for name, n in wanted.items()
            },
            timeout_ms=_ms(timeout),
            raise_errors=False,
        )
        failures = [
            f"{t['name']}: error {t['error_code']} {t.get('error_message') or ''}".strip()
            for t in response.get("topics", [])
            if t.get("error_code", 0) not in (_ERR_NONE, _ERR_TOPIC_ALREADY_EXISTS)
        ]
        if failures:
            raise BrokerError(f"creating topics on {bootstrap} failed: " + "; ".join(failures))

        # Verify (metadata can lag behind creation on a real multi-broker cluster).
        while True:
            counts = _partition_counts(admin, wanted)
            missing = [n for n in wanted if not counts.get(n)]
            mismatched = {
                n: (wanted[n], counts[n]) for n in wanted if counts.get(n) and counts[n] != wanted[n]
            }
            if mismatched:
                detail = ", ".join(
                    f"{n!r} has {got} partitions, wanted {want}"
                    for n, (want, got) in sorted(mismatched.items())
                )
                raise TopicPartitionMismatchError(
                    f"topics on {bootstrap} exist with other partition counts: {detail}. "
                    "They were probably auto-created (Tansu/Kafka default count) by a "
                    "producer or consumer before create_topics ran; delete them or "
                    "restart the broker, and create topics before starting clients."
                )
            if not missing:
                return
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"topics {missing} not visible in {bootstrap} metadata after {timeout:.0f}s"
                )
            time.sleep(0.1)


def ensure_topic(
    bootstrap: str,
    topic: str,
    partitions: int,
    *,
    timeout: float = 30.0,
    configs: Mapping[str, Mapping[str, str]] | None = None,
    **options: Any,
) -> bool:
    """Create ``topic`` with ``partitions`` (and its entry of ``configs``) if it does not
    exist (never let the broker auto-create it with its own default count); True when it
    was created."""
    if topic_partitions(bootstrap, [topic], timeout=timeout, **options).get(topic):
        return False
    create_topics(bootstrap, {topic: partitions}, timeout=timeout, configs=configs, **options)
    return True


_RETENTION_KEYS = (
    "retention.ms",
    "retention.bytes",
    "message.timestamp.type",
    "message.timestamp.before.max.ms",
    "cleanup.policy",
)


def topic_retention(
    bootstrap: str, topics: Iterable[str], *, timeout: float = 30.0, **options: Any
) -> dict[str, TopicRetention | None]:
    """The retention settings of each existing topic (None where it does not exist).

    Raises :class:`BrokerError` when the broker does not describe topic configurations
    (Tansu, in memory, has no retention to describe)."""
    names = sorted(set(topics))
    with _admin(bootstrap, timeout=timeout, **options) as admin:
        counts = _partition_counts(admin, names)
        present = [n for n in names if counts.get(n)]
        if not present:
            return {n: None for n in names}
        resources = [
            ConfigResource(ConfigResourceType.TOPIC, n, dict.fromkeys(_RETENTION_KEYS)) for n in present
        ]
        try:
            described = admin.describe_configs(resources, config_filter="all").get("topic", {})
        except KafkaError as exc:
            raise BrokerError(f"the broker at {bootstrap} does not describe topic settings: {exc}") from exc
    out: dict[str, TopicRetention | None] = {n: None for n in names}
    for name in present:
        entries = described.get(name)
        if not entries:
            raise BrokerError(f"the broker at {bootstrap} described no settings of topic {name!r}")
        values = {
            key: str(entry["value"]) for key, entry in entries.items() if entry.get("value") is not None
        }
        out[name] = TopicRetention.of(name, values, partitions=counts[name] or 1)
    return out


def partition_heads(
    bootstrap: str, group: str, topic: str, *, timeout: float = 30.0, **options: Any
) -> list[PartitionHead]:
    """Where ``group`` stands on each partition of ``topic``: the log's start and end, its
    committed offset, and the timestamp of the first record it has not read (one fetch per
    partition with unread records; nothing is committed)."""
    committed = {
        p: o
        for (t, p), o in group_offsets(bootstrap, group, timeout=timeout, **options).items()
        if t == topic
    }
    consumer = _reader(bootstrap, "reval-retention-check", timeout, options)
    try:
        partitions = sorted(consumer.partitions_for_topic(topic) or ())
        assigned = [TopicPartition(topic, p) for p in partitions]
        if not assigned:
            return []
        consumer.assign(assigned)
        starts = consumer.beginning_offsets(assigned)
        ends = consumer.end_offsets(assigned)
        heads = []
        for tp in assigned:
            head = PartitionHead(tp.partition, starts[tp], ends[tp], committed.get(tp.partition))
            heads.append(_with_first_timestamp(consumer, tp, head, timeout))
        return heads
    finally:
        consumer.close()


def _with_first_timestamp(
    consumer: Any, tp: TopicPartition, head: PartitionHead, timeout: float
) -> PartitionHead:
    """``head`` with the timestamp of the record at its position (when there is one)."""
    if not head.unread:
        return head
    consumer.pause(*[p for p in consumer.assignment() if p != tp])
    consumer.resume(tp)
    consumer.seek(tp, head.position)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for record in consumer.poll(timeout_ms=500, max_records=1).get(tp, []):
            return PartitionHead(head.partition, head.log_start, head.end, head.committed, record.timestamp)
    return head


def copy_groups(
    bootstrap: str, renames: dict[str, str], skip_topic: str, *, timeout: float = 30.0, **options: Any
) -> dict[str, int]:
    """Commit, in each new group of ``renames`` (old -> new), the old group's committed
    offsets on every topic but ``skip_topic`` (which the new group reads from its start);
    returns new group -> partitions copied.

    New groups have no members, so Kafka accepts offsets for them at any time.
    """
    copied: dict[str, int] = {}
    with _admin(bootstrap, timeout=timeout, **options) as admin:
        for old, new in renames.items():
            committed = admin.list_group_offsets(old).get(old, {})
            offsets = {
                tp: OffsetAndMetadata(meta.offset, "", -1)
                for tp, meta in committed.items()
                if tp.topic != skip_topic and meta.offset >= 0
            }
            if offsets:
                result = admin.alter_group_offsets(new, offsets)
                failed = {f"{tp.topic}:{tp.partition}": err.__name__ for tp, err in result.items()}
                failed = {tp: name for tp, name in failed.items() if name != NoError.__name__}
                if failed:
                    raise BrokerError(f"consumer group {new} refused offsets copied from {old}: {failed}")
            copied[new] = len(offsets)
    return copied


def group_offsets(
    bootstrap: str, group: str, *, timeout: float = 30.0, **options: Any
) -> dict[tuple[str, int], int]:
    """The committed offsets of consumer group ``group``, ``(topic, partition) -> offset``
    (empty for a group that never committed)."""
    deadline = time.monotonic() + timeout
    with _admin(bootstrap, timeout=timeout, **options) as admin:
        while True:
            try:
                committed = admin.list_group_offsets(group).get(group, {})
                break
            except KafkaError as exc:
                # A fresh cluster has no group coordinator until __consumer_offsets exists:
                # retriable (CoordinatorNotAvailable, coordinator loading), for a while.
                if not exc.retriable or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    return {(tp.topic, tp.partition): meta.offset for tp, meta in committed.items() if meta.offset >= 0}


def list_groups(bootstrap: str, prefix: str, *, timeout: float = 30.0, **options: Any) -> list[str]:
    """The consumer groups named ``prefix*``."""
    with _admin(bootstrap, timeout=timeout, **options) as admin:
        return sorted(g["group_id"] for g in admin.list_groups() if g["group_id"].startswith(prefix))


class TopicIdentity:
    """Which incarnation of a topic the consumed records come from.

    Offsets only identify a record within one incarnation of a topic: deleted and
    re-created, it starts again at offset 0.  The broker's topic id (a UUID per
    incarnation) tells them apart; :meth:`of` returns it (cached for ``ttl`` seconds).
    """

    def __init__(self, bootstrap: str, *, ttl: float = 0.0, **options: Any) -> None:
        self._admin = admin_client(bootstrap, **options)
        self.ttl = ttl
        self._cache: dict[str, tuple[float, str]] = {}

    def of(self, topic: str) -> str:
        now = time.monotonic()
        cached = self._cache.get(topic)
        if cached is not None and now - cached[0] < self.ttl:
            return cached[1]
        (desc,) = self._admin.describe_topics([topic])
        topic_id = str(desc.get("topic_id") or "")
        if desc.get("error_code", 0) != _ERR_NONE or not topic_id:
            raise BrokerError(f"no topic id for {topic!r} (error {desc.get('error_code')})")
        self._cache[topic] = (now, topic_id)
        return topic_id

    def close(self) -> None:
        self._admin.close()


def _reader(bootstrap: str, client_id: str, timeout: float, options: Mapping[str, Any]) -> KafkaConsumer:
    """A consumer without a group (it commits nothing) that never creates a topic."""
    return KafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        group_id=None,
        enable_auto_commit=False,
        allow_auto_create_topics=False,
        **_client_timeouts(timeout),
        **options,
    )


def read_topic(
    bootstrap: str, topic: str, *, timeout: float = 30.0, **options: Any
) -> list[tuple[int, int, bytes | None, bytes]]:
    """Every record of ``topic`` from its start up to its end offsets as of now, as
    ``(partition, offset, key, value)`` in offset order per partition (partitions one after
    the other).  No consumer group: nothing is committed.  Raises :class:`BrokerError`
    when the topic does not exist or the end is not reached within ``timeout``."""
    try:
        consumer = _reader(bootstrap, "reval-read-topic", timeout, options)
    except KafkaError as exc:
        raise BrokerUnreachableError(f"no Kafka broker answered at {bootstrap}: {exc}") from exc
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise BrokerError(f"topic {topic!r} does not exist on {bootstrap}")
        assigned = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(assigned)
        consumer.seek_to_beginning(*assigned)
        ends = consumer.end_offsets(assigned)
        out: dict[int, list[tuple[int, int, bytes | None, bytes]]] = {tp.partition: [] for tp in assigned}
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < ends[tp] for tp in assigned):
            if time.monotonic() > deadline:
                raise BrokerError(f"reading {topic!r} did not reach its end within {timeout:g} s")
            for tp, records in consumer.poll(timeout_ms=500).items():
                for r in records:
                    if r.offset < ends[tp]:
                        out[tp.partition].append((tp.partition, r.offset, r.key, r.value))
        return [row for p in sorted(out) for row in out[p]]
    finally:
        consumer.close()
