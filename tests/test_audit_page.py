"""`reval audit serve` on real parts: the page in headless Chromium (Selenium + Debian's
chromedriver), votes in Apache Kafka (the session's KRaft node), the server a real process
killed with SIGKILL; bad input over HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stream.auditing.audit import replay
from tests.test_report import chromium
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus
from workers.adapters.kafka.kafka_client import read_topic
from workers.dev.ports import find_free_port

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def thesaurus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """80 hashtags around 4 topics, popularity falling with the index."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 16))
    names = [f"topic{t}tag{i}" for t in range(4) for i in range(20)]
    vectors = np.vstack([centres[t] + 0.6 * rng.normal(size=16) for t in range(4) for _ in range(20)])
    counts = [200 - 2 * i for i in range(80)]
    th = AnnoyThesaurus.build(names, vectors, counts=counts, model_id="test", depth=40, n_trees=5)
    return th.save(tmp_path_factory.mktemp("audit") / "th")


class Server:
    """``reval audit serve`` in its own process on a fixed port (so a restart keeps the URL)."""

    def __init__(
        self, thesaurus: Path, broker: str, audit: str, port: int, token: str | None = None, m: int = 2
    ) -> None:
        self.args = [
            sys.executable, "-m", "workers.commands.cli", "audit", "serve",
            "--thesaurus", str(thesaurus), "--broker", broker, "--audit", audit, "--port", str(port),
            "--areas", "2", "--area-size", "7", "--ballots", "2", "--alpha", "0.1", "-m", str(m),
        ]  # fmt: skip
        if token:
            self.args += ["--token", token]
        self.url = f"http://127.0.0.1:{port}/"
        self.proc: subprocess.Popen[str] | None = None
        self.line = ""

    def start(self) -> Server:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen(
            self.args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        found: list[str] = []
        reader = threading.Thread(target=lambda: found.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout=90)
        if not found or not found[0]:
            self.proc.kill()
            raise AssertionError(f"the server did not start: {self.proc.stderr.read()}")  # type: ignore[union-attr]
        self.line = found[0]
        assert self.url in self.line, self.line
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextmanager
def running(
    thesaurus: Path, broker: str, audit: str, token: str | None = None, m: int = 2
) -> Iterator[Server]:
    server = Server(thesaurus, broker, audit, find_free_port(), token, m).start()
    try:
        yield server
    finally:
        server.stop()


def request(
    url: str, body: bytes | None = None, headers: dict[str, str] | None = None, method: str | None = None
) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        data = exc.read()
        try:
            return exc.code, json.loads(data)
        except ValueError:
            return exc.code, {"raw": data.decode(errors="replace")}


def post_vote(
    server: Server, vote: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    return request(
        server.url + "api/vote",
        json.dumps(vote).encode(),
        {"Content-Type": "application/json", **(headers or {})},
    )


def logged(broker: str, audit: str) -> list[dict[str, Any]]:
    """The audit's vote events in the topic, in log order."""
    events = [json.loads(v) for _, _, _, v in read_topic(broker, "votes", timeout=30)]
    return [e for e in events if e.get("audit") == audit and e.get("type") == "vote"]


def votes_on_page(browser: Any) -> int:
    return int(browser.find_element("id", "count").get_attribute("data-votes") or -1)


def wait_for(predicate: Any, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.timeout(420)
def test_twenty_votes_by_keyboard_and_mouse_survive_reload_and_kill_9(thesaurus: Path, broker: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    audit = f"page-{uuid.uuid4().hex[:8]}"
    server = Server(thesaurus, broker, audit, find_free_port()).start()
    try:
        with chromium() as browser:
            browser.get(server.url)
            wait_for(lambda: votes_on_page(browser) == 0, what="the first comparison")
            assert "more related" in browser.find_element("id", "guideline").text
            total = int(browser.execute_script("return document.getElementById('bar').max"))
            assert total == 2 * (21 + 2)  # two areas of 7 hashtags: 21 pairs, then 2, M = 2
            keys = [Keys.ARROW_LEFT, Keys.ARROW_RIGHT, Keys.ARROW_DOWN]
            for n in range(20):
                shown = browser.find_element("tag name", "body").get_attribute("data-comparison")
                if n % 2 == 0:  # keyboard
                    ActionChains(browser).send_keys(keys[n % 3]).perform()
                else:  # mouse
                    browser.find_element("id", ("left", "right", "tie")[n % 3]).click()
                wait_for(lambda n=n: votes_on_page(browser) == n + 1, what=f"vote {n + 1}")
                wait_for(
                    lambda shown=shown: (
                        browser.find_element("tag name", "body").get_attribute("data-comparison") != shown
                    ),
                    what="the next comparison",
                )
            before = browser.find_element("tag name", "body").get_attribute("data-comparison")
            left_text = browser.find_element("id", "left").text

            browser.refresh()  # the state lives on the server (and in Kafka), not in the page
            wait_for(lambda: votes_on_page(browser) == 20, what="the count after a reload")
            assert browser.find_element("tag name", "body").get_attribute("data-comparison") == before
            assert browser.find_element("id", "left").text == left_text

            server.kill()  # SIGKILL: no shutdown code runs
            browser.find_element("id", "left").click()  # vote 21, sent while nothing listens
            wait_for(
                lambda: "does not answer" in browser.find_element("id", "message").text,
                what="the retry notice",
            )
            server.start()  # the same port: the page's retries reach the new process
            wait_for(lambda: votes_on_page(browser) == 21, timeout=60, what="vote 21 after the restart")
            severe = [
                e
                for e in browser.get_log("browser")
                if e["level"] == "SEVERE" and "api/vote" not in e["message"]
            ]
            assert not severe, severe
    finally:
        server.stop()
    events = logged(broker, audit)
    assert len(events) == 21 and len({e["vote_id"] for e in events}) == 21  # none lost, none twice
    assert {e["choice"] for e in events} == {"left", "right", "tie"}
    state = replay(json.loads(v) for _, _, _, v in read_topic(broker, "votes"))[audit]
    assert state.votes == 21 and not state.skipped


@pytest.mark.timeout(300)
def test_bad_input_gets_a_clear_error_and_records_nothing(thesaurus: Path, broker: str) -> None:
    audit = f"bad-{uuid.uuid4().hex[:8]}"
    with running(thesaurus, broker, audit) as server:
        status, nxt = request(server.url + "api/next?voter=tester")
        assert status == 200 and nxt["comparison"]
        vote = {
            "vote_id": uuid.uuid4().hex,
            "area": nxt["area"],
            "comparison": nxt["comparison"],
            "choice": "left",
        }
        assert post_vote(server, vote)[0] == 200

        cases = [
            ({**vote, "vote_id": uuid.uuid4().hex, "comparison": "1.999"}, 404, "unknown_comparison"),
            ({**vote, "vote_id": uuid.uuid4().hex, "area": 7}, 404, "unknown_comparison"),
            (vote, 409, "replayed"),
            ({**vote, "vote_id": uuid.uuid4().hex}, 409, "already_voted"),
            ({**vote, "vote_id": uuid.uuid4().hex, "comparison": "1.3", "choice": "maybe"}, 400, "bad_vote"),
        ]
        for body, code, reason in cases:
            status, answer = post_vote(server, body)
            assert (status, answer.get("error")) == (code, reason), (body, answer)
            assert answer["detail"]
        headers = {"Content-Type": "application/json"}
        assert request(server.url + "api/vote", b"{not json", headers) == (
            400,
            {"error": "bad_json", "detail": "the body is not valid JSON"},
        )
        assert request(server.url + "api/vote", b"[1, 2]", headers)[1]["error"] == "bad_json"
        assert (
            request(server.url + "api/vote", json.dumps(vote).encode(), {"Content-Type": "text/plain"})[0]
            == 415
        )
        huge = json.dumps({**vote, "pad": "x" * 5_000_000}).encode()
        status, answer = request(server.url + "api/vote", huge, headers)
        assert status == 413 and answer["error"] == "too_large"
        # still serving, and only the one good vote is in the log
        assert request(server.url + "api/state")[1]["votes"] == 1
    assert [e["vote_id"] for e in logged(broker, audit)] == [vote["vote_id"]]


@pytest.mark.timeout(300)
def test_a_token_guards_every_request(thesaurus: Path, broker: str) -> None:
    audit = f"token-{uuid.uuid4().hex[:8]}"
    with running(thesaurus, broker, audit, token="s3cret-token") as server:
        for url in (server.url, server.url + "app.js", server.url + "api/next", server.url + "api/state"):
            status, answer = request(url)
            assert (status, answer.get("error")) == (401, "token"), url
        status, nxt = request(server.url + "api/next", headers={"X-Audit-Token": "s3cret-token"})
        assert status == 200
        vote = {
            "vote_id": uuid.uuid4().hex,
            "area": nxt["area"],
            "comparison": nxt["comparison"],
            "choice": "tie",
        }
        assert post_vote(server, vote)[0] == 401  # no token: refused
        assert post_vote(server, vote, {"X-Audit-Token": "wrong"})[0] == 401
        assert post_vote(server, vote, {"X-Audit-Token": "s3cret-token"})[0] == 200
        # the page: /?token=... sets an HttpOnly cookie and drops the token from the address
        with chromium() as browser:
            browser.get(server.url + "?token=s3cret-token")
            wait_for(lambda: votes_on_page(browser) == 1, what="the page with the token cookie")
            assert "token" not in browser.current_url
            browser.find_element("id", "right").click()
            wait_for(lambda: votes_on_page(browser) == 2, what="a vote from the page")
    assert len(logged(broker, audit)) == 2


def test_a_non_loopback_address_needs_a_token(thesaurus: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "workers.commands.cli", "audit", "serve", "--thesaurus", str(thesaurus),
         "--host", "0.0.0.0", "--broker", "127.0.0.1:9"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "REVAL_AUDIT_TOKEN": ""},
    )  # fmt: skip
    assert done.returncode == 2
    assert "--host 0.0.0.0 is reachable from other machines: set --token" in done.stderr


@pytest.mark.timeout(400)
def test_report_ranks_the_pairs_against_the_votes(thesaurus: Path, broker: str) -> None:
    """Votes that follow the thesaurus's own ranking agree with it; the report says so per area,
    overall and against chance, from the log alone (the server is gone by then)."""
    from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus

    audit = f"report-{uuid.uuid4().hex[:8]}"
    index = AnnoyThesaurus.load(thesaurus)
    with running(thesaurus, broker, audit, m=8) as server:
        for n in range(500):
            _, nxt = request(server.url + "api/next?voter=bot")
            if nxt.get("comparison") is None:
                break
            left, right = (tuple(nxt[side]["hashtags"]) for side in ("left", "right"))
            sims = index.similarities([left, right])
            choice = "left" if sims[0] > sims[1] else "right"
            vote = {
                "vote_id": f"bot-{n:06d}",
                "area": nxt["area"],
                "comparison": nxt["comparison"],
                "choice": choice,
            }
            assert post_vote(server, vote)[0] == 200
    done = subprocess.run(
        [sys.executable, "-m", "workers.commands.cli", "audit", "report", "--thesaurus", str(thesaurus),
         "--audit", audit, "--broker", broker, "--resamples", "200", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["audit"] == audit and report["votes"] == 2 * (84 + 8) == report["planned"]
    (version,) = report["versions"]
    assert len(version["areas"]) == 2
    overall = version["overall"]
    assert overall["tau_w"] > 0.6 and overall["rho_w"] > 0.8
    assert overall["tau_w_ci_low"] <= overall["tau_w"] <= overall["tau_w_ci_high"]
    assert abs(version["chance"]["tau_w"]) < 0.3 < overall["tau_w"]
    missing = subprocess.run(
        [sys.executable, "-m", "workers.commands.cli", "audit", "report", "--thesaurus", str(thesaurus),
         "--audit", "no-such-audit", "--broker", broker],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert missing.returncode == 1 and "no audit no-such-audit" in missing.stderr
