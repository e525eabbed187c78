"""Count the Redis round trips and commands per batch of each role's step (issue 36 §4).

Why: a batch's Redis work is latency (round trips, each a network RTT and, where a replication
barrier follows, a WAIT) and server CPU (commands); both should be counted, not read off the
code.  This runs the score role's step (``Scorer.admit_events`` + ``apply_events``, the
workload of ``bench/profile_score_step.py``) and the embed role's (``Embedder.admit`` +
``apply`` on the sample feed's tweets, the tiny test model) in this process against a Redis of
its own, and counts per batch:

* round trips: requests the client sent (one per command outside a pipeline, one per
  pipeline execute), by a :class:`redis.Connection` subclass that counts its
  ``send_packed_command`` calls;
* commands: the server's ``INFO commandstats`` calls before and after, by command (so give
  it a Redis nothing else uses).

    python -m bench.round_trips --redis-url redis://127.0.0.1:6390/0 --batches 8
"""

from __future__ import annotations

import argparse
import gzip
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import redis

from bench.bench_score_worker import FixedIncarnations
from bench.bench_scoring import as_records, clustered_vectors, make_events
from bench.results import bench_command, cpu_model, publish
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus
from workers.adapters.files.feeds import sample_feed
from workers.adapters.files.store import ThesaurusStore
from workers.adapters.prometheus.exporter import Exporter
from workers.adapters.redis.redis_client import clear_prefix
from workers.dev.tiny_models import build_tiny_bertweet
from workers.service.embed import Embedder, load_encoder
from workers.service.kafka_records import Record
from workers.service.score import Scorer
from workers.settings import Settings


class CountingConnection(redis.Connection):
    """A connection that counts the requests it sends (one per round trip)."""

    sent = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sent += 1
        super().send_packed_command(command, check_health)


def commandstats(client: redis.Redis) -> Counter[str]:
    return Counter({name: int(v["calls"]) for name, v in client.info("commandstats").items()})


def count(client: redis.Redis, batches: list[Any], run: Callable[[Any], None]) -> tuple[float, Counter[str]]:
    """Round trips and commands per batch of ``run`` over ``batches``."""
    run(batches[0])  # warm: the scripts loaded, the dimension fixed, the thesaurus read
    before, sent = commandstats(client), CountingConnection.sent
    for batch in batches[1:]:
        run(batch)
    n = len(batches) - 1
    after = commandstats(client)
    return (CountingConnection.sent - sent) / n, Counter({k: (after[k] - before[k]) / n for k in after})


def feed_records(n: int, size: int) -> list[list[Record]]:
    """``n`` batches of ``size`` sample-feed tweets, as the embed role's consumer hands them."""
    lines = []
    with gzip.open(sample_feed(), "rb") as fh:
        for line in fh:
            lines.append(line.strip())
            if len(lines) == n * size:
                break
    records = [Record("tweets", 0, i, 1_700_000_000_000 + i, None, v) for i, v in enumerate(lines)]
    return [records[i : i + size] for i in range(0, len(records), size)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--redis-url", default="redis://127.0.0.1:6390/0", help="a Redis nothing else uses")
    p.add_argument("--batches", type=int, default=8, help="batches per role (the first one warms)")
    p.add_argument("--score-batch", type=int, default=256)
    p.add_argument("--embed-batch", type=int, default=512)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    pool = redis.ConnectionPool.from_url(args.redis_url, connection_class=CountingConnection)
    client = redis.Redis(connection_pool=pool)
    rows: list[tuple[str, int, float, Counter[str]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        settings = Settings(
            index_dir=work / "index",
            thesaurus_source="dir",
            redis_url=args.redis_url,
            redis_prefix=f"rt-{uuid.uuid4().hex[:8]}",
            model=str(build_tiny_bertweet(work / "model")),
            device="cpu",
            embed_batch_size=args.embed_batch,
        )
        # The score step: the clustered workload of bench/profile_score_step.py.
        rng = np.random.default_rng(0)
        names = [f"tag{i}" for i in range(2000)]
        vectors, labels = clustered_vectors(len(names), 64, 40, rng)
        ThesaurusStore(settings.index_dir).publish(AnnoyThesaurus.build(names, vectors, n_trees=10))
        scorer = Scorer(settings, Exporter(), client, FixedIncarnations())  # type: ignore[arg-type]
        events = make_events(names, labels, args.score_batch * args.batches, rng)
        events = [replace(ev, tweet_id=f"rt-{i}") for i, ev in enumerate(events)]
        records = as_records(events)
        score_batches = [records[i : i + args.score_batch] for i in range(0, len(records), args.score_batch)]

        def score(batch: list[Record]) -> None:
            items, _ = scorer.admit_events(batch)
            for after in scorer.apply_events(items).after:
                after()

        rows.append(("score", args.score_batch, *count(client, score_batches, score)))
        # The embed step: sample-feed tweets, the tiny model.
        embedder = Embedder(
            settings,
            Exporter(),
            client,
            load_encoder(settings),
            FixedIncarnations(),  # type: ignore[arg-type]
        )

        def embed(batch: list[Record]) -> None:
            items, _ = embedder.admit(batch)
            for after in embedder.apply(items).after:
                after()

        tweets = feed_records(args.batches, args.embed_batch)
        rows.append(("embed", args.embed_batch, *count(client, tweets, embed)))
        clear_prefix(args.redis_url, settings.redis_prefix)
    lines = [
        "### Redis round trips and commands per batch (bench/round_trips.py)",
        "",
        f"Command: `{bench_command('round_trips')}`. Machine: {cpu_model()}; a Redis of its own, "
        "standalone (no replication barrier). Per batch, averaged over the batches after the first.",
        "",
        "| role | batch | round trips | commands | by command |",
        "|---|---:|---:|---:|---|",
    ]
    for role, size, trips, commands in rows:
        named = commands.most_common()
        by = ", ".join(f"{k.removeprefix('cmdstat_')} {v:,.0f}" for k, v in named if v >= 0.5)
        lines.append(f"| {role} | {size} | {trips:.1f} | {sum(commands.values()):,.0f} | {by} |")
    publish(lines, args.out)


if __name__ == "__main__":
    main()
