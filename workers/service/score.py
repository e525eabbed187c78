"""Role ``score``: recommendation events (and tweets, for the join) → one score per event
on the scores topic, and the quality metrics on /metrics.

Delivery (``REVAL_PROCESSING_GUARANTEE``):

* ``at_least_once`` (the default, every broker): an event is settled in the join only after
  its score (or its ``join_expired`` letter) was acknowledged by the broker, so a crash at
  any point redelivers it; a redelivered event may be scored twice, with the same result
  when the thesaurus version is the same.
* ``exactly_once`` (Apache Kafka): each batch's scores and dead letters commit atomically
  with its input offsets (:mod:`workers.service.transactions`); a ``read_committed`` reader
  of the scores topic sees each event's score once.  The join's state lives in Redis,
  outside those transactions, so an event matched to its ground truth is *claimed* for the
  record whose transaction scores it (:mod:`workers.adapters.redis.redis_state`, "Claims"): an
  event another record holds is scored only by that record, and settled once that record's
  offset is committed -- a crash between a transaction's commit and the settle scores
  nothing twice.  The ``join_expired`` letters of the expiry timer, which consumes no input,
  stay at least once: a crash between producing them and settling their events writes them
  again (an expired event is never scored, though).

Events that repeat an event key (by default tweet id + recommender: the same bytes produced
twice) within ``REVAL_EVENT_DEDUP_WINDOW_S`` are scored once and counted as ``duplicate``.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import faust
import numpy as np

from stream.evaluation.neighbours import NeighbourCache
from stream.evaluation.scoring import CellRows, ScoredBatch, score_batch
from stream.intake.records import Coordinates, Recommendation, Tweet, parse_recommendation, parse_tweet
from stream.monitoring.cusum import Detector, batch_outcomes, units_of
from stream.synonyms.thesaurus import JsonThesaurus, ThesaurusSource
from workers.adapters.files.annoy_thesaurus import neighbour_cache
from workers.adapters.files.store import ThesaurusStore, version_number
from workers.adapters.kafka.kafka_client import TopicIdentity
from workers.adapters.prometheus.exporter import Exporter, LabelGuard
from workers.adapters.prometheus.quality_metrics import QualityMetrics
from workers.adapters.redis.redis_client import Client, with_retry
from workers.adapters.redis.redis_detector import Batch, RedisDetectors
from workers.adapters.redis.redis_state import RedisClaims, RedisJoin, Waiting
from workers.service.consumer import BatchConsumer, host
from workers.service.incarnation import Incarnations, batch_group
from workers.service.kafka_records import Record, admit
from workers.service.parked import Parked
from workers.service.runtime import Outcome, Output, Runtime, Step, Topics, encode_floats, encode_json, letter
from workers.service.stores import replication_of, thesauri_of
from workers.service.transactions import Transactions
from workers.settings import ScoreSettings, window_label

log = logging.getLogger("reval.workers")

EMPTY = JsonThesaurus({}, source="no index yet", built_at="1970-01-01T00:00:00Z")
EventItem = tuple[Record, Recommendation]
TweetItem = tuple[Record, Tweet]


class Detection:
    """Feeds the recommenders' change detectors (shared in Redis:
    :mod:`workers.adapters.redis.redis_detector`) off the scoring path: one thread, batches in the
    order they were scored, so that scoring never waits for the detector's Redis round trips
    or for a recommender's one-time calibration (~1.7 s).  Sets the detector gauges and logs
    each alarm.  A batch it cannot apply (the queue full, an error) is left out and logged:
    the detector is not part of the exactly-once guarantees."""

    def __init__(self, detectors: RedisDetectors, exporter: Exporter, *, backlog: int = 1000) -> None:
        self.detectors, self.x = detectors, exporter
        self.queue: queue.Queue[dict[str, Batch]] = queue.Queue(maxsize=backlog)
        self._thread: threading.Thread | None = None

    def put(self, batches: dict[str, Batch]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="reval-detector", daemon=True)
            self._thread.start()
        try:
            self.queue.put_nowait(batches)
        except queue.Full:
            log.warning("detector: %d batches behind; this one left out", self.queue.maxsize)

    def _run(self) -> None:
        while True:
            batches = self.queue.get()
            try:
                updated = with_retry("detector", partial(self.detectors.update, batches))
            except Exception as exc:  # the thread must outlive any one batch
                log.warning("detector: batch left out (%s: %s)", type(exc).__name__, exc)
                continue
            for name, result in updated.items():
                self.x.set_detector(name, result.detector, result.last_alarms)
                for alarm in result.alarms:
                    log.warning(
                        "detector: recommender %s %s (chart %s crossed its threshold at its event %d)",
                        name,
                        alarm.alternative.replace("_", " "),
                        alarm.chart,
                        alarm.event,
                    )


def encode_scores(batch: ScoredBatch, extras: Sequence[dict[str, Any]]) -> list[bytes | dict[str, Any]]:
    """Each event's scores record (:meth:`ScoredBatch.records` with its ``extras`` after) as the
    bytes :func:`~workers.service.runtime.encode_json` would write, assembled from the columns:
    each distinct cell formatted once (a signal's rows of floats through one orjson call and a
    template, no dicts), each event a join of its fragments.  An event with a field JSON cannot
    carry (a string that is not valid Unicode) gets its record as a dict instead, for the
    delivery to dead-letter as unserialisable."""
    n = len(batch)
    parts: list[Sequence[bytes | None]] = []
    columns = batch.columns()
    for at, (key, column) in enumerate(columns.items()):
        prefix = (b"{" if at == 0 else b",") + encode_json(key) + b":"
        if isinstance(column, CellRows):
            made = [prefix + cell for cell in _formatted(column)] + [prefix + b"{}"]
            index = column.index
        else:
            parts.append(_fields(prefix, column))
            continue
        fragments = np.empty(len(made), dtype=object)
        fragments[:] = made
        parts.append(fragments[index].tolist())  # -1 (unscorable): the last, {}
    if any(not columns.keys().isdisjoint(extra) for extra in extras):
        raise ValueError("an extra field repeats a record key")
    tails = [_tail(extra) for extra in extras]
    parts.append(tails)
    out: list[bytes | dict[str, Any]] = []
    for i, row in enumerate(zip(*parts, strict=True)):
        if None in row:  # the slow way, for its dead letter
            out.append({**batch.take([i]).records()[0], **extras[i]})
        else:
            out.append(b"".join(row))
    assert len(out) == n
    return out


def _formatted(cells: CellRows) -> list[bytes]:
    """Each distinct row of ``cells`` as its cell's JSON (:class:`CellRows`): the floats as
    orjson writes them (NaN as null, as a None), set into a template of the keys -- one
    template per set of groups a row has."""
    if not len(cells.rows) or cells.rows.shape[1] <= len(cells.groups):
        return [encode_json({label: {} for label in cells.rs})] * len(cells.rows)

    def key(name: str) -> bytes:  # a "%" in a key is not a placeholder
        return encode_json(name).replace(b"%", b"%%")

    inner = b"{" + b",".join(key(k) + b":%b" for k in cells.keys) + b"}"

    def fill(places: list[tuple[str | None, int]]) -> bytes:
        if places and places[0][0] is None:  # no groups: {key: value}
            return inner
        return b"{" + b",".join(key(str(group)) + b":" + inner for group, _ in places) + b"}"

    rows, n_groups = cells.rows, len(cells.groups)
    # Rows that events share (most of a signal's, rarely the expectations') are ratios of a
    # few counts: their numbers repeat.
    numbers = encode_floats(rows, repeated=len(rows) * 4 <= len(cells.index) * 3)
    if n_groups:
        flags = rows[:, :n_groups] != 0
        # Only the values of the groups a row flags go into its template, in its order.
        shape = (len(rows), len(cells.rs), n_groups, len(cells.keys))
        values = np.broadcast_to(flags[:, None, :, None], shape).reshape(len(rows), -1)
        keep = np.concatenate([np.zeros_like(flags), values], axis=1)
        numbers = list(itertools.compress(numbers, keep.ravel().tolist()))
        patterns = [tuple(row) for row in flags.tolist()]
    else:
        patterns = [()] * len(rows)
    templates: dict[tuple[bool, ...], bytes] = {}
    for pattern in dict.fromkeys(patterns):
        layout = cells.layout(pattern)
        templates[pattern] = (
            b"{" + b",".join(key(label) + b":" + fill(places) for label, places in layout) + b"}"
        )
    # Every row's template in one, each ended by a NUL (never in JSON text: orjson escapes
    # it), filled by one "%" and cut apart again.
    return (b"\0".join([templates[p] for p in patterns]) % tuple(numbers)).split(b"\0")


def _fields(prefix: bytes, values: Sequence[Any]) -> list[bytes | None]:
    """``prefix`` + each value's JSON (None where it has none), each distinct value once."""
    made: dict[tuple[type, Any], bytes | None] = {}
    out: list[bytes | None] = []
    for value in values:
        key = (type(value), value)
        if key not in made:
            try:
                made[key] = prefix + encode_json(value)
            except TypeError:
                made[key] = None
        out.append(made[key])
    return out


def _tail(extra: dict[str, Any]) -> bytes | None:
    """``extra``'s fields as the end of a record: ``,"a":1}`` (``}`` when there are none)."""
    try:
        text = encode_json(extra)
    except TypeError:
        return None
    return b"}" if text == b"{}" else b"," + text[1:]


class Scorer:
    """Scores recommendation events (joined with their tweets when they carry no ground
    truth) with the newest published thesaurus, and feeds the quality metrics."""

    def __init__(
        self, settings: ScoreSettings, exporter: Exporter, client: Client, incarnations: Incarnations
    ) -> None:
        self.settings = settings
        self.x = exporter
        self._key_fields = settings.event_key_fields  # parsed once, read per event
        self.ks = settings.k_values
        self.rs = settings.r_values
        self.incarnations = incarnations
        self.store: ThesaurusSource = (
            thesauri_of(client, settings)
            if settings.thesaurus_source == "redis"
            else ThesaurusStore(Path(settings.index_dir), keep=settings.index_keep)
        )
        replication = replication_of(client, settings, exporter)  # claims, join: outlive a failover
        self.join = RedisJoin(
            client, settings.redis_prefix, window=settings.join_window_s, replication=replication
        )
        self.events = RedisClaims(
            client, settings.redis_prefix, "ev", max(1, settings.event_dedup_window_s), replication
        )
        guard = LabelGuard(
            settings.recommender_allowlist,
            settings.max_recommenders,
            max_length=settings.max_label_length,
            on_capped=lambda reason: exporter.labels_capped.labels(reason).inc(),
        )
        self.quality = QualityMetrics(
            exporter,
            self.ks,
            self.rs,
            settings.window_seconds,
            guard,
            window_label,
            max_future_skew=settings.max_future_skew_s,
            max_lateness=settings.max_lateness_s,
        )
        # The change detector (stream.monitoring.cusum.Detector) of each recommender, shared in Redis; its
        # label values bounded as the quality metrics' are (a guard of its own: the same values).
        self.detection = (
            Detection(
                RedisDetectors(
                    client,
                    settings.redis_prefix,
                    partial(Detector, settings.detector_arl0, reference=settings.detector_reference),
                ),
                exporter,
            )
            if settings.detector_arl0
            else None
        )
        self.detector_names = LabelGuard(
            settings.recommender_allowlist, settings.max_recommenders, max_length=settings.max_label_length
        )
        detector_r = settings.detector_at[1]
        self.detector_r = None if detector_r == "all" else int(detector_r)
        self.exactly_once = settings.processing_guarantee == "exactly_once"
        #: The consumer group's committed offset of a partition (exactly once: whether the
        #: record holding a claim is settled); set by the consumer.
        self.committed: Callable[[str, int], int | None] | None = None
        self.index_version: str | None = None  # the store's name of the loaded version
        self.cache = NeighbourCache(EMPTY, max_k=max(self.ks))
        self.missing = False  # versions are published, none could be loaded: events wait
        self._checked = 0.0
        self._rejected: set[str] = set()  # versions refused (not retried: a version never changes)
        self.reload(force=True)

    def _retry(self, what: str, call: Any) -> Any:
        return with_retry(what, call, report=self.x.redis_report)

    def reload(self, *, force: bool = False) -> bool:
        """Switch to the newest intact thesaurus version (no restart needed); True on a switch.

        The current version first; when it cannot be loaded (damaged, pruned) the newest older
        one that can, and the scorer says so: the log, ``reval_thesaurus_fallbacks_total`` and
        each score's ``index_version``.  With versions published and none loadable
        (``reval_scoring_thesaurus_missing`` = 1) :meth:`ready` is False and events wait:
        never a score against a thesaurus the scorer does not have.  Before the first version
        is published the thesaurus is empty (every hashtag its only synonym: exact match),
        and the scores say ``index_version: null``.
        """
        now = time.monotonic()
        if not force and now - self._checked < self.settings.reload_interval_s:
            return False
        self._checked = now
        try:
            current = self._retry("thesaurus", self.store.current_version)
        except (OSError, ValueError) as exc:  # a damaged pointer: the versions are still there
            log.error("thesaurus: the current version cannot be read (%s); trying the newest", exc)
            current = None
        listed = self._retry("thesaurus versions", self.store.versions)
        newest_first = sorted({*listed, *([current] if current else [])}, key=version_number, reverse=True)
        if current is not None:  # never a version newer than the current one
            newest_first = [v for v in newest_first if version_number(v) <= version_number(current)]
        self._rejected &= set(newest_first)
        for version in newest_first:
            if version == self.index_version:
                break  # already on the newest intact version
            if version in self._rejected:
                continue
            try:  # the neighbour table is all a scorer needs
                thesaurus = self._retry("thesaurus", partial(self.store.load, version, index=False))
                cache = neighbour_cache(thesaurus, max(self.ks))
            except (OSError, ValueError) as exc:  # damaged or unreadable
                self._rejected.add(version)
                self.x.thesaurus_rejected.labels("score").inc()
                log.error("thesaurus %s rejected (%s)", version, exc)
                continue
            self.cache, self.index_version, self.missing = cache, version, False
            self.x.thesaurus_loaded.set(version_number(version))
            self.x.thesaurus_missing.set(0)
            if version != current:
                self.x.thesaurus_fallbacks.inc()
                log.warning(
                    "scoring with thesaurus %s, the newest intact one (current: %s)", version, current
                )
            else:
                log.info("scoring with thesaurus %s (%d hashtags)", version, len(thesaurus))
            return True
        if self.index_version is None and newest_first and not self.missing:
            log.error(
                "no thesaurus version can be loaded (%s refused): events wait until one can",
                ", ".join(newest_first),
            )
        self.missing = self.index_version is None and bool(newest_first)
        self.x.thesaurus_missing.set(int(self.missing))
        return False

    def ready(self) -> bool:
        """Whether events can be scored: a version is loaded, or none was ever published."""
        self.reload()
        return not self.missing

    def hold_events(self) -> bool:
        """The score agent's back-pressure: no usable thesaurus, or the join is full."""
        return not self.ready() or self.join_full()

    def _score(
        self,
        jobs: Sequence[tuple[Recommendation, Sequence[str], Record, Record | None]],
        outcome: Outcome,
    ) -> None:
        """Score ``(event, truth, source, via)`` jobs as one batch
        (:func:`stream.evaluation.scoring.score_batch`): one output each, in order (``via``: the input
        record that answered the event, when not its own); the quality metrics once the
        outputs are delivered."""
        if not jobs:
            return
        batch = score_batch([(event, truth) for event, truth, _, _ in jobs], self.cache, self.ks, self.rs)
        units = [units_of(event.recommended, truth, self.detector_r) for event, truth, _, _ in jobs]
        times = [event.ts.timestamp() if event.ts else source.time for event, _, source, _ in jobs]
        extras = [  # index_version: the store's name; thesaurus_version is the content
            {"index_version": self.index_version, "event_time": event_time, "ground_truth": list(truth)}
            for (_, truth, _, _), event_time in zip(jobs, times, strict=True)
        ]
        outputs = [
            Output("scores", event.tweet_id.encode(), value, source, via=via)
            for (event, _, source, via), value in zip(jobs, encode_scores(batch, extras), strict=True)
        ]
        outcome.outputs += outputs
        outcome.after.append(partial(self._observe, outputs, batch, times, units))

    def _observe(
        self, outputs: Sequence[Output], batch: ScoredBatch, times: Sequence[float], units: Sequence[int]
    ) -> None:
        """The quality metrics and the change detector of the scores delivered as scores (one
        the broker refused went as a dead letter, and is counted as that)."""
        if any(o.dead_lettered for o in outputs):
            kept = [i for i, o in enumerate(outputs) if not o.dead_lettered]
            batch, times, units = batch.take(kept), [times[i] for i in kept], [units[i] for i in kept]
        self.quality.observe_batch(batch, times)
        self._detect(batch, units)

    def _detect(self, batch: ScoredBatch, units: Sequence[int]) -> None:
        """Each recommender's events of the batch, for its change detector (:class:`Detection`)."""
        if self.detection is None:
            return
        k, r = self.settings.detector_at
        outcomes, chance = batch_outcomes(batch, units, k=k, r=r)
        groups: dict[str, list[int]] = {}
        for i, (name, n) in enumerate(
            zip(map(self.detector_names, batch.recommenders), outcomes.units, strict=True)
        ):
            if n > 0:  # scorable, with a unit to judge
                groups.setdefault(name, []).append(i)
        if not groups:
            return
        self.detection.put({name: (outcomes.counts[rows], chance[rows]) for name, rows in groups.items()})

    def _event_ids(self, records: Sequence[Record]) -> list[str]:
        """``incarnation:partition:offset`` per record; the incarnation is asked once per
        topic and batch (a broker metadata request and a Redis read), never per record."""
        current = {topic: self.incarnations.current(topic) for topic in {r.topic for r in records}}
        return [r.coordinates.event_id(current[r.topic]) for r in records]

    def _claims(self, sources: Sequence[Coordinates]) -> list[str]:
        """The join claim of each record: ``incarnation|topic|partition|offset``."""
        current = {topic: self.incarnations.current(topic) for topic in {c.topic for c in sources}}
        return [c.claim(current[c.topic]) for c in sources]

    def _settled(self, claim: str) -> bool:
        """Whether the record holding a claim is settled: its offset committed in the consumer
        group (its transaction delivered the score), or its topic re-created since (that
        record is never read again).  Not settled: in flight, or aborted -- the record's next
        reading scores the event."""
        short, source = Coordinates.from_claim(claim)
        if short != self.incarnations.current(source.topic):
            return True
        assert self.committed is not None, "exactly once needs the consumer's committed offsets"
        committed = self.committed(source.topic, source.partition)
        return committed is not None and committed > source.offset

    def _event_key(self, event: Recommendation) -> str:
        fields = {"tweet_id": event.tweet_id, "recommender": event.recommender}
        parts = [fields.get(name, "") for name in self._key_fields]
        return hashlib.blake2b("\0".join(parts).encode(), digest_size=12).hexdigest()

    # -- recommendation events --------------------------------------------------------------

    def admit_events(self, records: Sequence[Record]) -> tuple[list[EventItem], list[Output]]:
        parsed, rejected = admit(records, parse_recommendation, self.x, "score")
        return parsed, [letter(r, e.reason, e.detail, "score") for r, e in rejected]

    def apply_events(self, items: Sequence[EventItem]) -> Outcome:
        """Score events with ground truth; offer the others to the join.  Idempotent."""
        self.reload()
        outcome = Outcome()
        ids = self._event_ids([record for record, _ in items])
        fresh = list(zip(items, ids, strict=True))
        if self.settings.event_dedup_window_s > 0:
            owned = self._retry(
                "event keys",
                lambda: self.events.claim_many([([self._event_key(e)], eid) for (_, e), eid in fresh]),
            )
            fresh = [pair for pair, own in zip(fresh, owned, strict=True) if own[0]]
            for (_, event), own in zip(items, owned, strict=True):
                if not own[0]:
                    name = self.quality.guard(event.recommender)
                    outcome.after.append(partial(_inc, self.x.events, name, "duplicate"))
        self._score(
            [
                (event, event.ground_truth, record, None)
                for (record, event), _ in fresh
                if event.ground_truth is not None
            ],
            outcome,
        )
        waiting: list[tuple[Parked, str, bytes]] = []
        for (record, event), eid in fresh:
            if event.ground_truth is not None:
                continue
            parked = Parked.of(record, event)
            payload = parked.to_bytes()
            if len(payload) > self.settings.join_max_event_bytes:
                outcome.outputs.append(
                    letter(record, "join_event_too_large", "too large to wait in the join", "score")
                )
                outcome.after.append(partial(_inc, self.x.rejected, record.topic, "join_event_too_large"))
                continue
            waiting.append((parked, eid, payload))
        if waiting:
            offers = [(p.event.tweet_id, eid, payload) for p, eid, payload in waiting]
            # Exactly once: a match is claimed for the event's own record (see the module doc).
            claims = self._claims([p.coordinates for p, _, _ in waiting]) if self.exactly_once else None
            replies = self._retry("join", lambda: self.join.put_events(offers, time.time(), claims))
            settle = []
            matched = []
            joined: Counter[str] = Counter()
            for (parked, eid, _), (status, truth) in zip(waiting, replies, strict=True):
                if status == "claimed":  # another record scores it: settled, or its to score
                    if self._settled(truth):
                        settle.append((parked.event.tweet_id, eid))
                    status = "dup"
                joined[_JOIN_OUTCOME.get(status, "duplicate")] += 1
                if status == "dup":  # settled before: an event's outcome is counted once
                    name = self.quality.guard(parked.event.recommender)
                    outcome.after.append(partial(_inc, self.x.events, name, "duplicate"))
                if status == "match":
                    assert truth is not None
                    matched.append((parked.event, truth, parked.source, None))
                    settle.append((parked.event.tweet_id, eid))
            self._score(matched, outcome)
            for name, n in joined.items():
                outcome.after.append(partial(_inc, self.x.join, name, n=n))
            if settle:
                outcome.after.append(lambda: self._retry("join settle", lambda: self.join.settle(settle)))
        return outcome

    # -- tweets, for the join -----------------------------------------------------------------

    def admit_tweets(self, records: Sequence[Record]) -> tuple[list[TweetItem], list[Output]]:
        """Tweets for the join; malformed ones are the embed role's to dead-letter, not ours."""
        items = []
        for record in records:
            try:
                items.append((record, parse_tweet(record.value)))
            except ValueError:
                continue
        return items, []

    def apply_tweets(self, items: Sequence[TweetItem]) -> Outcome:
        """Record the tweets' hashtags; score the events that waited for them (each with its
        tweet's record as ``via``: exactly once, it commits with that record).  Idempotent."""
        self.reload()
        outcome = Outcome()
        tweets = [(tweet.id, list(tweet.hashtags)) for _, tweet in items]
        claims = self._claims([record.coordinates for record, _ in items]) if self.exactly_once else None
        answered: list[Waiting] = self._retry("join", lambda: self.join.put_tweets(tweets, claims))
        jobs, done, elsewhere = [], [], []
        for item in answered:
            if item.held_by is not None:  # another record scores it: settled, or its to score
                if self._settled(item.held_by):
                    elsewhere.append((item.tweet_id, item.event_id))
                continue
            parked = Parked.from_bytes(item.payload)
            jobs.append((parked.event, item.truth or [], parked.source, items[item.call][0]))
            done.append((item.tweet_id, item.event_id))
        self._score(jobs, outcome)
        if done:
            outcome.after.append(lambda: self.x.join.labels("matched").inc(len(done)))
        if done or elsewhere:
            settle = done + elsewhere
            outcome.after.append(lambda: self._retry("join settle", lambda: self.join.settle(settle)))
        return outcome

    # -- expiry ---------------------------------------------------------------------------------

    def expire(self) -> Outcome:
        """Dead-letter the events whose tweet did not come within the join window (settled
        once their letters are acknowledged)."""
        due: list[Waiting] = self._retry(
            "join expiry", lambda: self.join.due(time.time(), claim=self.exactly_once)
        )
        outcome = Outcome()
        topics = []
        for item in due:
            parked = Parked.from_bytes(item.payload)
            detail = f"no tweet {item.tweet_id} within {self.settings.join_window_s:g}s"
            outcome.outputs.append(parked.letter("join_expired", detail))
            topics.append(parked.coordinates.topic)
        if due:
            done = [(a.tweet_id, a.event_id) for a in due]

            def settle() -> None:
                self._retry("join settle", lambda: self.join.settle(done))
                for topic in topics:
                    self.x.join.labels("expired").inc()
                    self.x.rejected.labels(topic, "join_expired").inc()

            outcome.after.append(settle)
        return outcome

    def join_full(self) -> bool:
        """Whether the join holds its maximum of waiting events (the scorer stops pulling);
        also refreshes the join gauges."""
        pending = self._retry("join size", self.join.pending)
        self.x.join_pending.set(pending)
        self.x.join_bytes.set(self._retry("join size", self.join.stored_bytes))
        return bool(pending >= self.settings.join_max_pending)


_JOIN_OUTCOME = {"match": "matched", "wait": "waiting"}


def _inc(metric: Any, *labels: str, n: int = 1) -> None:
    metric.labels(*labels).inc(n)


#: Container allocations between two collections of the youngest generation (CPython: 700).
GC_YOUNG_THRESHOLD = 50_000


def collect_less_often() -> None:
    """Run the cyclic garbage collector less often in this process.

    Scoring allocates a few hundred short-lived containers per event (the rank matrix, the
    score dicts, the output) and a batch's outputs live until the broker acknowledges them,
    so at CPython's default thresholds (700, 10, 10) the collector ran ~60 times a second
    and walked the whole heap every few seconds: 12% of the worker's time (bench_score_worker,
    BENCHMARKS.md).  Nearly all of that garbage is freed by reference counting anyway;
    collecting the young generation every 50,000 allocations cut the collector to <1%.
    Only ever raises the thresholds (a process that set higher ones keeps them).
    """
    young, middle, old = gc.get_threshold()
    if young and young < GC_YOUNG_THRESHOLD:  # 0: collection is off, leave it off
        gc.set_threshold(GC_YOUNG_THRESHOLD, max(middle, 20), max(old, 100))


def register(app: faust.App, topics: Topics, rt: Runtime, generation: int = 0) -> None:
    """The score role: its batch consumer of events (``score`` step) and tweets (the join's
    step) (:mod:`workers.service.consumer`), the expiry timer (leader only) and the thesaurus
    reload timer.  ``generation``: the consumer groups' (:mod:`workers.service.incarnation`)."""
    settings = rt.settings
    collect_less_often()
    identity = TopicIdentity(settings.broker.split(",")[0], **settings.kafka_client_options())
    incarnations = Incarnations(identity, rt.client, settings.redis_prefix, rt.exporter)
    scorer = Scorer(settings, rt.exporter, rt.client, incarnations)
    size = max(settings.embed_batch_size, settings.score_batch_size)
    events_step = Step(
        "score",
        scorer.admit_events,
        scorer.apply_events,
        source=lambda item: item[0],
        hold=scorer.hold_events,
    )
    # Tweets drain the join, so a full join does not hold them; a missing thesaurus does
    # (the events they answer are scored).
    tweets_step = Step(
        "score",
        scorer.admit_tweets,
        scorer.apply_tweets,
        source=lambda item: item[0],
        hold=lambda: not scorer.ready(),
    )
    incarnations.watch(app, [settings.topic_recommendations, settings.topic_tweets])
    group = batch_group(settings.app_id, "score", generation)
    exactly_once = settings.processing_guarantee == "exactly_once"
    # The tweets' lag is the embed role's to report where it runs too (its own group).
    lag_topics = [settings.topic_recommendations, *([] if "embed" in rt.roles else [settings.topic_tweets])]
    consumer = BatchConsumer(
        rt,
        {settings.topic_recommendations: events_step, settings.topic_tweets: tweets_step},
        group=group,
        size=size,
        within=0.2,
        transactions=Transactions(rt, group, settings.aiokafka_options()) if exactly_once else None,
        legacy_group=app.conf.id,
        lag_topics=lag_topics,
    )

    scorer.committed = consumer.committed_offset

    host(app, consumer)

    @app.timer(interval=settings.reload_interval_s)
    async def reload() -> None:
        try:
            await rt.run("score", scorer.reload)
        except Exception:  # a failed reload must not stop the timer (Stopping included)
            log.exception("thesaurus reload failed")

    @app.timer(interval=settings.join_window_s / 4, on_leader=True)
    async def expire_joins() -> None:
        try:
            await rt.finish("score", await rt.run("score", scorer.expire), consumer.deliver)
            await rt.run("score", scorer.join_full)  # the gauges
        except Exception:  # a failed round must not stop the timer
            log.exception("join expiry failed")
