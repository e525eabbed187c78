"""Soak: the three workers on Apache Kafka under a long steady load; is their memory flat?

What it runs: one Apache Kafka node (``workers.dev.broker.local_broker``), the Redis at
``--redis-url``, and ``reval worker embed``, ``index`` and ``score`` as three processes
(exactly-once scores) with a tiny BERTweet-architecture model (memory, not the encoder's
speed, is the question).  A producer sends, every second, ``--rate`` recommendation events
(a ``--malformed`` share of them broken JSON) and ``--tweets-rate`` tweets, copies of real
sample-feed tweets with fresh ids and the time of sending:

* phase ``fixed`` (the first half): the tweets cycle through ``--fixed-lines`` sample lines,
  so after warm-up no new hashtag appears and the thesaurus keeps its size;
* phase ``growing`` (the second half): every fifth tweet brings a new hashtag, so the
  thesaurus grows all along.

Every ``--every`` seconds it samples each worker's RSS and Redis's ``used_memory``.  Per
phase, after a warm-up (the first ``--warmup`` share of it), the least-squares slope of RSS
against time, in MiB and in % per 10 minutes.  At the end: the scores topic read by a
``read_committed`` consumer -- every good event exactly once -- and one dead letter per
broken record.

    make soak                                  # 30 minutes, the issue's load
    python -m bench.soak --minutes 6 --out /tmp/soak   # a short look
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import redis
from kafka import KafkaConsumer, TopicPartition

from stream.synonyms.thesaurus import ThesaurusMetadata
from workers.adapters.files.feeds import sample_feed
from workers.adapters.files.thesaurus_files import METADATA_FILE
from workers.adapters.redis.redis_thesaurus import RedisThesauri
from workers.dev.broker import local_broker
from workers.dev.stack import Stack, Worker, wait_for
from workers.dev.tiny_models import build_tiny_bertweet

ROLES = ("embed", "index", "score")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def sample_lines(n: int) -> list[dict[str, Any]]:
    """The first ``n`` hashtagged English sample tweets, as objects."""
    out = []
    with gzip.open(sample_feed(), "rt", encoding="utf-8") as src:
        for line in src:
            obj = json.loads(line)
            if "#" in obj.get("text", "") and not obj["text"].startswith("RT @"):
                out.append(obj)
                if len(out) == n:
                    break
    return out


def memray_wrapper(out: Path, role: str) -> list[str]:
    """The command a worker runs under to record every allocation, native ones included
    (the C extensions' mallocs that ``tracemalloc`` does not see), into ``out``."""
    capture = (out / f"memray-{role}.bin").resolve()
    capture.unlink(missing_ok=True)
    return [sys.executable, "-m", "memray", "run", "--native", "--aggregate", "--quiet", "-o", str(capture)]


class Load:
    """The producer: a steady rate of events and tweets, until :meth:`stop`."""

    def __init__(self, stack: Stack, args: argparse.Namespace, lines: list[dict[str, Any]]) -> None:
        self.stack, self.args, self.lines = stack, args, lines
        self.phase = "fixed"
        self.sent_events: list[str] = []
        self.malformed = 0
        self.tweets = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-load", daemon=True)
        self.tags = sorted({t.lower() for obj in lines for t in _hashtags(obj["text"])})[:50]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        args, n_event, n_tweet = self.args, 0, 0
        lines = itertools.cycle(self.lines)
        bad_every = round(1 / args.malformed) if args.malformed > 0 else 0
        tick = time.monotonic()
        while not self._stop.is_set():
            now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
            tweets = []
            for _ in range(args.tweets_rate):
                obj = dict(next(lines))
                obj["id"] = obj["id_str"] = f"soak-t{n_tweet}"
                obj["created_at"] = now
                if self.phase == "growing" and n_tweet % 5 == 0:
                    obj["text"] = f"{obj['text']} #soakgrow{n_tweet // 5}"
                tweets.append((obj["id"].encode(), json.dumps(obj).encode()))
                n_tweet += 1
            events = []
            for _ in range(args.rate):
                tid = f"soak-e{n_event}"
                n_event += 1
                if bad_every and n_event % bad_every == 0:
                    events.append((tid.encode(), b'{"tweet_id": "' + tid.encode() + b'", broken'))
                    self.malformed += 1
                    continue
                event = {
                    "tweet_id": tid,
                    "recommender": "soak",
                    "recommended": self.tags[n_event % 40 : n_event % 40 + 10],
                    "ground_truth": [self.tags[(n_event * 7) % len(self.tags)]],
                    "ts": now,
                }
                events.append((tid.encode(), json.dumps(event).encode()))
                self.sent_events.append(tid)
            self.stack.send("tweets", tweets)
            self.stack.send("recommendations", events)
            self.tweets += len(tweets)
            tick += 1.0
            self._stop.wait(max(tick - time.monotonic(), 0))


def _hashtags(text: str) -> list[str]:
    return [w[1:].strip(".,:;!?") for w in text.split() if w.startswith("#") and len(w) > 1]


def slope(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(MiB per 10 minutes, % of the mean per 10 minutes) of a least-squares line."""
    t = np.array([p[0] for p in points])
    y = np.array([p[1] for p in points])
    per_s = float(np.polyfit(t, y, 1)[0]) if len(points) >= 3 else float("nan")
    return per_s * 600, 100 * per_s * 600 / float(y.mean())


def read_committed(stack: Stack, topic: str, partitions: int) -> list[Any]:
    consumer = KafkaConsumer(
        bootstrap_servers=stack.bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
        consumer_timeout_ms=5000,
    )
    parts = [TopicPartition(stack.topics[topic], p) for p in range(partitions)]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    records = list(consumer)
    consumer.close()
    return records


def thesaurus_size(client: redis.Redis, prefix: str) -> int:
    """Hashtags in the current thesaurus version (0 before the first)."""
    thesauri = RedisThesauri(client, prefix)
    version = thesauri.current_version()
    if version is None:
        return 0
    raw = client.hget(thesauri.key(version), METADATA_FILE)
    return 0 if raw is None else ThesaurusMetadata.from_json(bytes(raw).decode()).count  # type: ignore[arg-type]


def redis_families(client: redis.Redis, prefix: str) -> dict[str, dict[str, int]]:
    """Redis memory by key family (the key's first segment after the prefix: ``h`` the
    all-time means, ``w`` the windows, ``thesaurus`` the versions kept, ...): keys and bytes
    (``MEMORY USAGE ... SAMPLES 0``: every element counted)."""
    out: dict[str, dict[str, int]] = {}
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        name = bytes(key).decode()[len(prefix) + 1 :]
        family = name.split(":", 1)[0]
        size = client.memory_usage(key, samples=0) or 0
        row = out.setdefault(family, {"keys": 0, "bytes": 0})
        row["keys"] += 1
        row["bytes"] += int(size)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["bytes"]))


def families_table(families: dict[str, dict[str, int]], hashtags: int, events: int) -> str:
    """The key families as a table, each also per hashtag of the thesaurus and per event sent."""
    rows = [
        f"Redis at the end, by key family ({hashtags:,} hashtags in the thesaurus, {events:,} events sent):",
        "",
        "| family | keys | MiB | bytes per hashtag | bytes per event |",
        "|---|---:|---:|---:|---:|",
    ]
    for family, row in families.items():
        per_tag = row["bytes"] / hashtags if hashtags else float("nan")
        per_event = row["bytes"] / events if events else float("nan")
        rows.append(
            f"| `{family}` | {row['keys']:,} | {row['bytes'] / 2**20:.1f} "
            f"| {per_tag:,.0f} | {per_event:,.1f} |"
        )
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=30.0, help="the whole run (two phases)")
    p.add_argument("--rate", type=int, default=150, help="recommendation events per second")
    p.add_argument("--tweets-rate", type=int, default=20, help="tweets per second")
    p.add_argument("--malformed", type=float, default=0.005, help="share of broken events")
    p.add_argument("--fixed-lines", type=int, default=600, help="sample tweets the fixed phase cycles")
    p.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    p.add_argument("--warmup", type=float, default=0.3, help="share of each phase not fitted")
    p.add_argument("--redis-url", default=os.environ.get("REVAL_REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--out", type=Path, help="write soak.json and soak.md here")
    p.add_argument(
        "--trace-memory",
        type=int,
        default=0,
        help="PYTHONTRACEMALLOC frames for the workers (0: off): their logs say where memory grew",
    )
    p.add_argument("--memory-report-s", type=float, default=0.0, help="REVAL_MEMORY_REPORT_S of the workers")
    p.add_argument(
        "--memray",
        choices=ROLES,
        action="append",
        default=[],
        help="run this role under memray's native allocation tracker (pip install memray): "
        "memray-ROLE.bin in --out, read it with `memray stats` or `memray flamegraph --leaks`",
    )
    args = p.parse_args()
    if args.memray and not args.out:
        p.error("--memray needs --out (where its capture file goes)")
    traced = {"PYTHONTRACEMALLOC": str(args.trace_memory)} if args.trace_memory else {}
    if args.memory_report_s or args.trace_memory:
        traced["REVAL_MEMORY_REPORT_S"] = str(args.memory_report_s or 120.0)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = build_tiny_bertweet(work / "model")
        broker = local_broker("kafka", log_path=work / "broker.log")
        broker.start()
        stack = Stack(
            broker.bootstrap,
            args.redis_url,
            model,
            work / "stack",
            partitions=4,
            extra_env={
                "REVAL_PROCESSING_GUARANTEE": "exactly_once",
                "REVAL_INDEX_INTERVAL_S": "30",
                **traced,
            },
        )
        try:
            if args.memray:
                args.out.mkdir(parents=True, exist_ok=True)
            workers: dict[str, Worker] = {
                role: stack.start(role, wrapper=memray_wrapper(args.out, role) if role in args.memray else ())
                for role in ROLES
            }
            stack.wait_ready(*workers.values(), timeout=300)
            client = redis.Redis.from_url(args.redis_url)
            load = Load(stack, args, sample_lines(args.fixed_lines))
            samples: list[dict[str, Any]] = []
            t0 = time.monotonic()
            total = args.minutes * 60
            load.start()
            while (elapsed := time.monotonic() - t0) < total:
                load.phase = "fixed" if elapsed < total / 2 else "growing"
                samples.append(
                    {
                        "t": elapsed,
                        "phase": load.phase,
                        "redis_mib": int(client.info("memory")["used_memory"]) / 2**20,
                        "hashtags": thesaurus_size(client, stack.prefix),
                        **{role: rss_mib(w.proc.pid) for role, w in workers.items()},
                    }
                )
                print(
                    json.dumps(
                        {k: round(v, 1) if isinstance(v, float) else v for k, v in samples[-1].items()}
                    )
                )
                time.sleep(args.every)
            load.stop()

            def scored() -> float:
                return sum(
                    value
                    for (name, labels), value in workers["score"].metrics().items()
                    if name == "reval_events_total"
                    and dict(labels).get("outcome") in ("scored", "unscorable")
                )

            wait_for("the score worker caught up", lambda: scored() >= len(load.sent_events), 600, 1.0)
            records = read_committed(stack, "scores", 4)
            ids = Counter(json.loads(r.value)["tweet_id"] for r in records)
            dead = stack.read("dead_letter")
            result = check_and_fit(samples, args, load, ids, dead)
            families = redis_families(client, stack.prefix)
            result["redis_families"] = families
            table = families_table(families, samples[-1]["hashtags"], len(load.sent_events))
            result["markdown"] += "\n\n" + table
            growth = {
                role: [line for line in w.text().splitlines() if "reval.memory" in line or "memory: " in line]
                for role, w in workers.items()
            }
        finally:
            stack.close()
            broker.stop()
    print(result["markdown"])
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "soak.json").write_text(json.dumps({**result, "samples": samples}, indent=1))
        (args.out / "soak.md").write_text(result["markdown"])
        if traced:
            (args.out / "memory.txt").write_text(
                "\n".join(f"{role}: {line}" for role, lines in growth.items() for line in lines) + "\n"
            )


def check_and_fit(
    samples: list[dict[str, Any]], args: argparse.Namespace, load: Load, ids: Counter[str], dead: list[Any]
) -> dict[str, Any]:
    sent = set(load.sent_events)
    missing = len(sent - set(ids))
    doubled = sum(1 for tid in sent if ids.get(tid, 0) > 1)
    rows = [
        "| phase | worker | RSS at start of fit (MiB) | at end | slope MiB / 10 min | % / 10 min "
        "| hashtags / 10 min | bytes per new hashtag |",
        "|---|---|---|---|---|---|---|---|",
    ]
    fits: dict[str, dict[str, list[float]]] = {}
    for phase in ("fixed", "growing"):
        points = [s for s in samples if s["phase"] == phase]
        fitted = points[int(len(points) * args.warmup) :]
        for what in (*ROLES, "redis_mib"):
            series = [(s["t"], s[what]) for s in fitted]
            if len(series) < 3:
                continue
            mib, pct = slope(series)
            fits.setdefault(phase, {})[what] = [mib, pct]
            # Bytes per hashtag the thesaurus gained over the same stretch (the growing phase).
            tags, _ = slope([(s["t"], s["hashtags"]) for s in fitted])
            # Only for the workers that hold the thesaurus: Redis's slope is the event keys'.
            per_tag = f"{mib * 2**20 / tags:,.0f}" if tags > 100 and what in ("index", "score") else "-"
            rows.append(
                f"| {phase} | {what} | {series[0][1]:.0f} | {series[-1][1]:.0f} | {mib:+.1f} | {pct:+.1f} "
                f"| {tags:+,.0f} | {per_tag} |"
            )
    markdown = "\n".join(
        [
            f"{args.minutes:g} min, {args.rate} events/s + {args.tweets_rate} tweets/s, "
            f"{args.malformed:.1%} malformed, exactly-once; {len(sent):,} good events, "
            f"{load.tweets:,} tweets: {missing} missing, {doubled} doubled for a read_committed "
            f"reader; dead letters {len(dead)} for {load.malformed} broken records.",
            "",
            *rows,
        ]
    )
    return {
        "missing": missing,
        "doubled": doubled,
        "dead_letters": len(dead),
        "malformed": load.malformed,
        "fits": fits,
        "markdown": markdown,
    }


if __name__ == "__main__":
    main()
