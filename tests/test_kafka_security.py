"""Security on a real broker: Apache Kafka with TLS and SASL/SCRAM on its client listener.

The workers, ``reval replay`` and ``reval admin`` connect with the ``REVAL_KAFKA_*`` settings
only; a wrong password stops a worker with one line naming the setting; the password appears in
no log, at any level, whatever happens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live import assert_means_equal, batch_means, counts_reach, plain_tweets, run_reval
from workers.dev.kafka_cluster import KafkaCluster, Security
from workers.dev.ports import find_free_port
from workers.dev.stack import Stack, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SECRET = "Kx9-scram-Pw-41d7"  # a password no library would print by chance


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    security = Security(users={"reval-worker": SECRET})
    with KafkaCluster(data_dir=tmp_path_factory.mktemp("kafka-sasl"), security=security) as cluster:
        yield cluster


def _env(cluster: KafkaCluster, password: str) -> dict[str, str]:
    assert cluster.security is not None and cluster.ca_file is not None
    return {
        "REVAL_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "REVAL_KAFKA_SASL_MECHANISM": cluster.security.mechanism,
        "REVAL_KAFKA_SASL_USERNAME": "reval-worker",
        "REVAL_KAFKA_SASL_PASSWORD": password,
        "REVAL_KAFKA_SSL_CAFILE": str(cluster.ca_file),
    }


def test_workers_replay_and_admin_over_sasl_ssl_never_log_the_password(
    secured: KafkaCluster, redis_url: str, tiny_bertweet: Path, tmp_path: Path
) -> None:
    stack = Stack(
        secured.bootstrap,
        redis_url,
        tiny_bertweet,
        tmp_path,
        client_options=secured.client_options(),
        extra_env=_env(secured, SECRET),
    )
    logs: list[str] = []
    try:
        worker = stack.start("embed", "index", "score", loglevel="debug")
        stack.wait_ready(worker, timeout=180)
        lines = plain_tweets(300)
        feed = tmp_path / "feed.jsonl"
        feed.write_text("\n".join(lines) + "\n")
        replay = run_reval("replay", str(feed), "--speed", "max", env=stack.env, timeout=180)
        assert replay.returncode == 0, replay.stderr
        logs += [replay.stdout, replay.stderr]
        expected = batch_means(lines, stack.model)
        wait_for("tweets applied over SASL_SSL", lambda: counts_reach(stack, expected), 180, 1.0)
        assert_means_equal(stack, expected)

        events = [
            (
                t.encode(),
                json.dumps(
                    {"tweet_id": t, "recommender": "r", "recommended": ["a"], "ground_truth": ["a"]}
                ).encode(),
            )
            for t in (f"e{i}" for i in range(40))
        ]
        stack.send("recommendations", events)
        wait_for(
            "events scored", lambda: len({r["tweet_id"] for r in stack.read_json("scores")}) == 40, 120, 1.0
        )

        # A wrong password: the worker stops with one line that names the setting.
        wrong = {**stack.env, "REVAL_KAFKA_SASL_PASSWORD": SECRET + "-wrong"}
        failed = run_reval(
            "worker",
            "embed",
            "--metrics-port",
            str(find_free_port()),
            "--loglevel",
            "debug",
            env=wrong,
            timeout=180,
            cwd=tmp_path,
        )
        assert failed.returncode == 1
        error_lines = [ln for ln in failed.stderr.splitlines() if ln.startswith("error:")]
        assert len(error_lines) == 1, failed.stderr[-3000:]
        assert "REVAL_KAFKA_SASL_PASSWORD" in error_lines[0]
        assert "authentication" in error_lines[0].lower()
        logs += [failed.stdout, failed.stderr]

        admin = run_reval("admin", "accept-topic", stack.topics["tweets"], env=stack.env, timeout=120)
        assert admin.returncode == 0, admin.stderr
        logs += [admin.stdout, admin.stderr]
        worker.stop()
        logs += [w.text() for w in stack.workers]
        assert "DEBUG" in logs[-1]  # the worker did log at debug level
    finally:
        stack.close()
    for text in logs:
        assert SECRET not in text
