"""The Faust service: one App, its topics, and the consumers and timers of the roles asked for.

    tweets ──► embed consumer ──► Redis running means ──► index timer ──► thesaurus store
    recommendations ──► score consumer ──► scores (+ /metrics)
    tweets ──► (the score consumer's join) ──┘ (ground truth for events that carry none)

Every consuming role reads in its own consumer group (``<app_id>-<role>-batch``,
:mod:`workers.service.consumer`), so each sees the whole stream and can be scaled on its
own; Faust hosts the consumers, the timers and the index job's leader election.  Each role
module (:mod:`~workers.service.embed`, :mod:`~workers.service.index`,
:mod:`~workers.service.score`) holds the role's logic and registers its consumer and timers.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import tracemalloc
from collections.abc import Iterable
from pathlib import Path

import faust

from stream.feeds.batch import TextEncoder
from workers.adapters.prometheus.exporter import Exporter
from workers.adapters.prometheus.prometheus_rules import DEFAULT_PORTS
from workers.adapters.redis.redis_client import connect
from workers.service import embed, faust_compat, index, score
from workers.service.incarnation import group_generation, group_id
from workers.service.runtime import Runtime, Topics
from workers.settings import Settings

ROLES = ("embed", "index", "score")
__all__ = ["DEFAULT_PORTS", "ROLES", "create_app"]


def create_app(
    settings: Settings,
    roles: Iterable[str],
    *,
    exporter: Exporter | None = None,
    encoder: TextEncoder | None = None,
) -> faust.App:
    """The App for ``roles`` (any of embed, index, score).

    ``encoder`` lets tests and the demo pass a loaded encoder; by default the
    embed role loads ``settings.model``.
    """
    chosen = sorted(set(roles))
    unknown = set(chosen) - set(ROLES)
    if unknown or not chosen:
        raise ValueError(f"roles must be among {', '.join(ROLES)}; got {', '.join(chosen) or 'none'}")
    exporter = exporter or Exporter()
    client = connect(settings.redis_url, cluster=settings.redis_cluster, timeout=settings.redis_timeout_s)
    generation = group_generation(client, settings.redis_prefix)
    app_id = group_id(settings.app_id, chosen, generation)
    datadir = Path(settings.data_dir) / app_id
    datadir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        app_id,
        broker=[f"kafka://{host}" for host in settings.broker.split(",")],
        store="memory://",
        web_enabled=False,
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication,
        consumer_auto_offset_reset="earliest",
        broker_commit_every=1000,
        broker_commit_interval=1.0,
        producer_acks=-1,
        datadir=str(datadir),
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 3),
        producer_max_request_size=settings.max_message_bytes,
        # One producer batch per partition can hold a whole step batch's outputs (256 scores
        # of ~2.4 KB): aiokafka keeps one batch per partition in flight, so at its 16 KB
        # default a batch's outputs went out in ~10 broker round trips one after another.
        # The broker's message.max.bytes bounds a batch as it does a record.
        producer_max_batch_size=settings.max_message_bytes,
        **settings.faust_options(),
        **faust_compat.app_settings(),
    )
    topics = Topics.declare(app, settings)
    rt = Runtime(settings, exporter, client, chosen)
    rt.attach(topics)

    if "embed" in chosen:
        embed.register(app, topics, rt, generation, encoder)
    if "index" in chosen:
        index.register(app, rt)
    if "score" in chosen:
        score.register(app, topics, rt, generation)
    if settings.memory_report_s > 0:
        report_memory(app, settings.memory_report_s)
    return app


def report_memory(app: faust.App, every: float, top: int = 10) -> None:
    """A diagnosis of a growing worker (``REVAL_MEMORY_REPORT_S``): log every ``every`` seconds
    its RSS, split into anonymous memory (heaps) and file pages (mapped files: the model, the
    thesaurus's Annoy index; the kernel can drop them), its RSS after glibc's ``malloc_trim(0)``
    (which hands free heap pages back: what it removes is the allocator's fragmentation, what
    stays is live), and, with Python's
    allocation tracing on (``PYTHONTRACEMALLOC=N``; it slows the worker), the Python heap and
    the ``top`` source lines whose live allocations grew most since the first report."""
    first: list[tracemalloc.Snapshot] = []
    log = logging.getLogger("reval.memory")

    @app.timer(interval=every)
    async def memory_report() -> None:
        rss, anon, files = _rss_mib(), _rss_mib("RssAnon"), _rss_mib("RssFile")
        trimmed = _trimmed_rss_mib()
        if not tracemalloc.is_tracing():
            log.info(
                "memory: RSS %.1f MiB (anonymous %.1f, files %.1f; %.1f after malloc_trim), "
                "%d Python blocks allocated",
                rss,
                anon,
                files,
                trimmed,
                sys.getallocatedblocks(),  # live objects: flat while RSS grows is fragmentation
            )
            return
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen *>")]
        )
        if not first:
            first.append(snapshot)
        stats = snapshot.compare_to(first[0], "lineno")[:top]
        traced, _ = tracemalloc.get_traced_memory()
        log.info(
            "memory: RSS %.1f MiB (anonymous %.1f, files %.1f; %.1f after malloc_trim), %.1f MiB "
            "traced; grown most since the first report: %s",
            rss,
            anon,
            files,
            trimmed,
            traced / 2**20,
            "; ".join(
                f"{s.traceback[0].filename}:{s.traceback[0].lineno} {s.size_diff / 1024:+.0f} KiB "
                f"({s.count_diff:+d} blocks)"
                for s in stats
            ),
        )


def _rss_mib(field: str = "VmRSS") -> float:
    """This process's resident memory, or the part ``field`` of ``/proc/self/status`` names
    (``RssAnon``, ``RssFile``) (Linux; NaN elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _trimmed_rss_mib() -> float:
    """The resident memory after glibc's ``malloc_trim(0)`` hands free heap pages back: what
    is left is live memory; what goes is the allocator's fragmentation (NaN without glibc)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return float("nan")
    return _rss_mib()
