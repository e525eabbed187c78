"""The monitoring path against a real Prometheus (Debian's binary) scraping the real
workers: recording rules get values, the quality-drop alert goes pending then firing for
a recommender that degrades mid-run while the steady one stays quiet, Alertmanager
receives it, and every query of the Grafana dashboard returns data.

Prometheus scrapes and evaluates every second with the rules rendered from the ``test``
profile of ``stream/monitoring/alert_params.py`` (10 s quality window, baseline = the same
window 30/40/50 s earlier, 3 s hold), so the whole run takes a few minutes.
"""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stream.intake.records import parse_tweet
from stream.monitoring.alert_params import TEST
from tests.live import run_reval
from tests.test_deploy import DEPLOY, dashboard, panel_queries, require_binary
from workers.adapters.files.feeds import sample_feed
from workers.adapters.files.store import ThesaurusStore
from workers.adapters.prometheus.prometheus_rules import render_config, render_rules
from workers.dev.ports import find_free_port
from workers.dev.processes import terminate
from workers.dev.stack import Stack, Worker, tweet_lines, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

K, R = str(TEST.alert_k), TEST.alert_r
QW = TEST.quality_window
ALERT = "RevalRecommenderQualityDrop"


class Server:
    """A Prometheus-family server process on a free local port, logging to a file."""

    name = "server"

    def __init__(self, args: list[str], log: Path) -> None:
        self.port = find_free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc = subprocess.Popen(
            [*args, f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(f"{self.name} ready", self.ready, 60)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as response:
            return json.load(response)

    def stop(self) -> None:
        terminate(self.proc)


class Prometheus(Server):
    """Prometheus with its own storage and the given config."""

    name = "prometheus"

    def __init__(
        self, binary: str, workdir: Path, config: str, *, data: Path | None = None, retention: str = "1h"
    ) -> None:
        (workdir / "prometheus.yml").write_text(config)
        super().__init__(
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={data or workdir / 'data'}",
                f"--storage.tsdb.retention.time={retention}",
            ],
            workdir / "prometheus.log",
        )

    def api(self, path: str, **params: str) -> Any:
        body = self.get(f"/api/v1/{path}", **params)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        return data["result"]

    def value(self, expr: str) -> dict[str, float]:
        """recommender (or '') -> value of an instant query."""
        return {s["metric"].get("recommender", ""): float(s["value"][1]) for s in self.query(expr)}

    def alerts(self, name: str) -> dict[str, str]:
        """recommender -> state (pending/firing) of the alert ``name``."""
        return {
            a["labels"].get("recommender", ""): a["state"]
            for a in self.api("alerts")["alerts"]
            if a["labels"]["alertname"] == name
        }


class Alertmanager(Server):
    """Alertmanager with the committed deploy/alertmanager/alertmanager.yml."""

    name = "alertmanager"

    def __init__(self, binary: str, workdir: Path) -> None:
        super().__init__(
            [
                binary,
                f"--config.file={DEPLOY / 'alertmanager' / 'alertmanager.yml'}",
                f"--storage.path={workdir / 'am-data'}",
                "--cluster.listen-address=",
            ],
            workdir / "alertmanager.log",
        )

    def received(self) -> list[dict[str, Any]]:
        return self.get("/api/v2/alerts")


class Traffic(threading.Thread):
    """Recommendation events for two recommenders, ~15 events/s each.

    ``steady`` recommends the tweet's own hashtags (one of them swapped for a random
    hashtag a quarter of the time) plus two popular ones; ``flaky`` does the same
    until :attr:`degraded` is set, then recommends three random hashtags.
    """

    def __init__(self, stack: Stack, tweets: list[tuple[str, list[str]]], vocabulary: list[str]) -> None:
        super().__init__(daemon=True)
        self.stack, self.tweets, self.vocabulary = stack, tweets, vocabulary
        counts: dict[str, int] = {}
        for _, tags in tweets:
            for tag in tags:
                counts[tag] = counts.get(tag, 0) + 1
        self.popular = sorted(counts, key=counts.__getitem__, reverse=True)[:2]
        self.degraded = threading.Event()
        self.halt = threading.Event()
        self.sent = 0
        self.error: BaseException | None = None

    def good(self, rng: random.Random, tags: list[str]) -> list[str]:
        own = list(tags)
        if rng.random() < 0.25:
            own[rng.randrange(len(own))] = rng.choice(self.vocabulary)
        return own + [p for p in self.popular if p not in own]

    def run(self) -> None:
        rng = random.Random(20240611)
        try:
            while not self.halt.is_set():
                batch = []
                for _ in range(3):
                    tweet_id, tags = rng.choice(self.tweets)
                    flaky = rng.sample(self.vocabulary, 3) if self.degraded.is_set() else self.good(rng, tags)
                    for name, recommended in (("steady", self.good(rng, tags)), ("flaky", flaky)):
                        event = {
                            "tweet_id": tweet_id,
                            "recommender": name,
                            "recommended": recommended,
                            "ground_truth": tags,
                        }
                        batch.append((tweet_id.encode(), json.dumps(event).encode()))
                self.stack.send("recommendations", batch)
                self.sent += len(batch)
                time.sleep(0.2)
        except BaseException as exc:  # surfaced by the test
            self.error = exc


@pytest.fixture
def stack(broker: str, redis_url: str, tiny_bertweet: Path, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(broker, redis_url, tiny_bertweet, tmp_path, extra_env={"REVAL_INDEX_INTERVAL_S": "2"})
    yield s
    s.close()


def substitute(expr: str, variables: dict[str, str]) -> str:
    """Grafana's interpolation of the dashboard variables (multi-value recommender as a regex)."""
    for name, value in sorted(variables.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


@dataclass
class Monitoring:
    """The three workers, scraped every second by a real Prometheus that sends its alerts to
    a real Alertmanager."""

    embed: Worker
    index: Worker
    score: Worker
    prometheus: Prometheus
    alertmanager: Alertmanager


@pytest.fixture
def monitoring(stack: Stack, tmp_path: Path) -> Iterator[Monitoring]:
    prometheus_bin = require_binary("prometheus")
    alertmanager_bin = require_binary("prometheus-alertmanager")
    embed, index, score = stack.start("embed"), stack.start("index"), stack.start("score")
    rules = tmp_path / "rules.yml"
    rules.write_text(render_rules(TEST))
    alertmanager = Alertmanager(alertmanager_bin, tmp_path)
    try:
        targets = {
            "embed": [f"127.0.0.1:{embed.port}"],
            "index": [f"127.0.0.1:{index.port}"],
            "score": [f"127.0.0.1:{score.port}"],
        }
        config = render_config(
            targets,
            rule_files=(str(rules),),
            scrape_interval="1s",
            evaluation_interval="1s",
            alertmanagers=(f"127.0.0.1:{alertmanager.port}",),
        )
        prometheus = Prometheus(prometheus_bin, tmp_path, config)
        try:
            yield Monitoring(embed, index, score, prometheus, alertmanager)
        finally:
            prometheus.stop()
    finally:
        alertmanager.stop()


def replay_sample(stack: Stack, m: Monitoring) -> list[tuple[str, list[str]]]:
    """The sample feed through the product's own replay command (key = id, event-time
    timestamps) and some bad records (for the dead-letter panels); once a thesaurus is built
    and loaded, the tweets (id, hashtags) all of whose hashtags it knows."""
    replayed = run_reval(
        "replay", str(sample_feed()), "--limit", "1500", "--json", env=stack.env, timeout=180
    )
    assert replayed.returncode == 0, replayed.stderr[-3000:]
    stack.send("tweets", [(b"bad1", b"{not json"), (b"bad2", b'{"text": "no id #x"}')])
    stack.send("recommendations", [(b"bad3", b"[1, 2, 3]")])

    store = ThesaurusStore(stack.index_dir)
    wait_for("a thesaurus version", store.current_version, 120)
    wait_for("the scorer to load it", lambda: m.score.metric("reval_scoring_thesaurus_version") >= 1, 60)
    wait_for(
        "all tweets embedded",
        lambda: m.embed.metric("reval_records_consumed_total", topic=stack.topics["tweets"]) >= 1502,
        120,
    )
    version = store.current_version()
    time.sleep(3)  # the index catches up with the last embedded tweets
    current = store.current_version() or version
    assert current is not None
    thesaurus = store.load(current)
    tweets = [
        (t.id, list(t.hashtags))
        for t in map(parse_tweet, tweet_lines(sample_feed(), 1500))
        if t.hashtags and all(h in thesaurus for h in t.hashtags)
    ]
    assert len(tweets) > 100
    return tweets


class SteadyWatch:
    """Called at every look: the undisturbed recommender never alerts, the traffic thread
    has not failed; flaky's alert states are kept in order (:attr:`flaky_states`)."""

    def __init__(self, prometheus: Prometheus, traffic: Traffic) -> None:
        self.prometheus, self.traffic = prometheus, traffic
        self.flaky_states: list[str] = []

    def __call__(self) -> None:
        states = self.prometheus.alerts(ALERT)
        if "steady" in states:  # what the alert read, for the failure message
            read = {
                name: self.prometheus.value(f'{name}{{recommender="steady", k="{K}", r="{R}"}}')
                for name in (
                    "reval:skill_loss:llr",
                    "reval:precision:baseline",
                    "reval:precision_variance:baseline",
                )
            }
            raise AssertionError(f"{ALERT} for the undisturbed recommender: {states}; {read}")
        if "flaky" in states:
            self.flaky_states.append(states["flaky"])
        assert self.traffic.error is None, self.traffic.error


def assert_recording_rules_have_values(prometheus: Prometheus) -> None:
    """Every window's recording rules (k=0 is the exact hit ratio); the corrected score from
    the workers' corrected sums: flaky lost its skill above chance, steady did not; the #REval
    alert's statistic from their precision-form sums: flaky far past the bound, steady not."""
    for window in TEST.windows:
        for expr in (
            f"reval:hit_ratio:mean{window}",
            f"reval:exact_match:mean{window}",
            f"reval:semantic_gap:mean{window}",
            f"reval:scored_events:rate{window}",
            f"reval:unknown_hashtag_share:ratio{window}",
            f"reval:corrected_excess:rate{window}",
            f"reval:corrected_room:rate{window}",
            f"reval:hit_ratio_corrected:kappa{window}",
        ):
            assert {"steady", "flaky"} <= set(prometheus.value(expr)), expr
    kappa = prometheus.value(f'reval:hit_ratio_corrected:kappa{QW}{{k="{K}", r="{R}"}}')
    skill = prometheus.value(f'reval:hit_ratio_corrected:baseline{{k="{K}", r="{R}"}}')
    assert kappa["flaky"] < 0.5 * skill["flaky"] and kappa["steady"] > 0.5 * skill["steady"], (
        kappa,
        skill,
    )
    shares = prometheus.value(f'reval:precision_sum:rate{QW}{{k="{K}", r="{R}"}}')
    events = prometheus.value(f'reval:precision_events:rate{QW}{{k="{K}", r="{R}"}}')
    base = prometheus.value(f'reval:precision:baseline{{k="{K}", r="{R}"}}')
    assert shares["flaky"] / events["flaky"] < 0.5 * base["flaky"], (shares, events, base)
    assert shares["steady"] / events["steady"] > 0.5 * base["steady"], (shares, events, base)
    llr = prometheus.value(f'reval:skill_loss:llr{{k="{K}", r="{R}"}}')
    bound = math.log(1 / TEST.false_alarm_probability)
    assert llr["flaky"] > bound > llr["steady"], llr
    gap0 = prometheus.value(f'reval:semantic_gap:mean5m{{k="0", r="{R}"}}')
    assert all(abs(v) < 1e-9 for v in gap0.values()), gap0
    assert prometheus.value(f'reval:semantic_gap:mean5m{{k="{K}", r="{R}"}}')["flaky"] >= 0
    for expr in (
        "reval:consumer_lag:sum",
        f"reval:tweets_embedded:rate{TEST.embed_window}",
        f"reval:dead_letter_ratio:ratio{TEST.dead_letter_window}",
        "reval:exact_match:baseline",
    ):
        assert prometheus.query(expr), f"{expr}: no data"


def assert_dashboard_has_data(prometheus: Prometheus) -> None:
    """Every query of every dashboard panel returns data, variables substituted the way
    Grafana does; the variables' own queries (label_values) are answered too."""
    board = dashboard()
    variables: dict[str, str] = {}
    for var in board["templating"]["list"]:
        match = re.fullmatch(r"label_values\((\w+), (\w+)\)", var.get("definition", ""))
        if match:
            values = prometheus.api(f"label/{match[2]}/values", **{"match[]": match[1]})
            assert values, var["name"]
            variables[var["name"]] = values
    assert {"steady", "flaky"} <= set(variables["recommender"])
    assert K in variables["k"] and R in variables["r"]
    substitutions = {
        "recommender": "(steady|flaky)",
        "k": K,
        "r": R,
        "window": "5m",
        "__rate_interval": "15s",
        "datasource": "prometheus",
    }
    empty = []
    for title, expr in panel_queries(board):
        query = substitute(expr, substitutions)
        if not prometheus.query(query):
            empty.append(f"{title}: {query}")
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)


# One real Prometheus (minutes to set up) checked phase by phase, in order:
def test_rules_alerts_and_dashboard_against_real_prometheus(stack: Stack, monitoring: Monitoring) -> None:
    started = time.monotonic()
    prometheus = monitoring.prometheus
    stack.wait_ready(monitoring.embed, monitoring.index, monitoring.score, timeout=180)
    tweets = replay_sample(stack, monitoring)
    vocabulary = sorted({tag for _, tags in tweets for tag in tags})
    traffic = Traffic(stack, tweets, vocabulary)
    traffic.start()
    try:
        quiet_for_steady = SteadyWatch(prometheus, traffic)
        flaky_states = quiet_for_steady.flaky_states

        # Phase 1: both recommenders good, until the baseline (30-50 s back) exists.
        baseline = f'reval:hit_ratio:baseline{{k="{K}", r="{R}"}}'

        def baseline_ready() -> bool:
            quiet_for_steady()
            return set(prometheus.value(baseline)) >= {"steady", "flaky"}

        wait_for("the quality baseline", baseline_ready, 120, 1.0)
        good_until = time.monotonic() + 25  # every baseline offset covers good traffic
        while time.monotonic() < good_until:
            quiet_for_steady()
            time.sleep(1)
        assert not flaky_states, f"{ALERT} for flaky before it degraded: {flaky_states}"
        before = prometheus.value(f'reval:hit_ratio:mean{QW}{{k="{K}", r="{R}"}}')
        assert before["steady"] > 0.7 and before["flaky"] > 0.7, before

        # Phase 2: flaky switches to random hashtags; its alert must go pending, then firing.
        traffic.degraded.set()
        switched = time.monotonic()

        def flaky_firing() -> bool:
            quiet_for_steady()
            return bool(flaky_states) and flaky_states[-1] == "firing"

        wait_for(f"{ALERT} firing for flaky", flaky_firing, 45, 0.5)
        fired_after = time.monotonic() - switched
        assert "pending" in flaky_states, f"never seen pending before firing: {flaky_states}"
        after = prometheus.value(f'reval:hit_ratio:mean{QW}{{k="{K}", r="{R}"}}')
        assert after["flaky"] < 0.8 * prometheus.value(baseline)["flaky"] and after["steady"] > 0.7, after

        assert_recording_rules_have_values(prometheus)
        quiet_for_steady()

        # Alertmanager got it from Prometheus.
        def received() -> bool:
            return any(
                a["labels"].get("alertname") == ALERT and a["labels"].get("recommender") == "flaky"
                for a in monitoring.alertmanager.received()
            )

        wait_for("the alert at Alertmanager", received, 30, 0.5)
        assert_dashboard_has_data(prometheus)
        quiet_for_steady()
        print(
            f"\nalert fired {fired_after:.1f}s after the switch; events sent: {traffic.sent}; "
            f"test took {time.monotonic() - started:.0f}s"
        )
    finally:
        traffic.halt.set()
        traffic.join(10)
