"""The commands of a deployment: ``reval worker``, ``admin accept-topic``, ``broker``,
``tokenize`` and ``demo``."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path
from typing import Annotated, Any

import typer

from stream.feeds.batch import ModelLoadError
from workers.commands.console import (
    OFFLINE_HINT,
    Broker,
    RedisUrl,
    command_group,
    err,
    fail,
    out,
)
from workers.settings import Settings

admin_app = command_group("Operator commands for a running deployment.")


def worker(
    roles: Annotated[
        list[str], typer.Argument(metavar="ROLE", help="embed, index, score (several = one process)")
    ],
    broker: Broker = None,
    redis_url: RedisUrl = None,
    model: Annotated[str | None, typer.Option(help="Encoder model [REVAL_MODEL]")] = None,
    index_dir: Annotated[Path | None, typer.Option(help="Thesaurus store [REVAL_INDEX_DIR]")] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Prometheus port (embed 9101, index 9102, score 9103)")
    ] = None,
    loglevel: Annotated[str, typer.Option(help="Log level")] = "info",
    env_file: Annotated[
        str | None, typer.Option(help="Read REVAL_* settings from this file too [REVAL_ENV_FILE]")
    ] = None,
) -> None:
    """Run worker roles against a Kafka broker and Redis (settings: REVAL_* env, docs: Configuration)."""

    overrides = {
        "broker": broker,
        "redis_url": redis_url,
        "model": model,
        "index_dir": index_dir,
        "metrics_port": metrics_port,
    }
    from workers.adapters.kafka.kafka_client import BrokerAuthError, BrokerError
    from workers.commands.worker import MetricsPortError, run_worker

    try:
        run_worker(roles, {k: v for k, v in overrides.items() if v is not None}, loglevel, env_file)
    except ValueError as exc:  # settings and roles: usage
        raise fail(str(exc)) from None
    except BrokerAuthError as exc:
        raise fail(f"{exc.settings}: {exc}", code=1) from None
    except BrokerError as exc:
        raise fail(f"--broker / REVAL_BROKER: {exc}", code=1) from None
    except ModelLoadError as exc:
        raise fail(f"--model / REVAL_MODEL: {exc}{OFFLINE_HINT}", code=1) from None
    except MetricsPortError as exc:
        raise fail(f"--metrics-port / REVAL_METRICS_PORT: {exc}", code=1) from None


@admin_app.command("accept-topic")
def accept_topic(
    topic: Annotated[str, typer.Argument(metavar="TOPIC", help="The re-created source topic (e.g. tweets)")],
    broker: Broker = None,
    redis_url: RedisUrl = None,
) -> None:
    """Accept a re-created topic: its records are new data, read from its start.

    Starts a new generation of the consumer groups (every other topic goes on where it
    was), records the topic's new id; workers waiting on the topic stop, and read it from
    its start once restarted. If the new topic holds a replay of data already counted,
    use a new REVAL_REDIS_PREFIX instead.
    """
    import re

    from workers.adapters.kafka.kafka_client import TopicIdentity, copy_groups, list_groups
    from workers.adapters.redis.redis_client import connect
    from workers.service.incarnation import generation_key, group_generation, incarnation_key, next_group

    overrides = {k: v for k, v in {"broker": broker, "redis_url": redis_url}.items() if v is not None}
    try:
        settings = Settings.load(**overrides)
        bootstrap = settings.broker.split(",")[0]
        options = settings.kafka_client_options()
        identity = TopicIdentity(bootstrap, timeout=15, **options)
        current = identity.of(topic)
        identity.close()
        client = connect(settings.redis_url, cluster=settings.redis_cluster, timeout=settings.redis_timeout_s)
        generation = group_generation(client, settings.redis_prefix)
        suffix = re.compile(r"-g\d+$")
        groups = [
            g
            for g in list_groups(bootstrap, f"{settings.app_id}-", **options)
            if (g.endswith(f"-g{generation}") if generation else not suffix.search(g))
        ]
        renames = {g: next_group(g, generation) for g in groups}
        copied = copy_groups(bootstrap, renames, topic, **options)
        key = incarnation_key(settings.redis_prefix, topic)
        before = client.get(key)
        pipe = client.pipeline(transaction=False)  # one round trip: workers see both or neither
        pipe.set(key, current)
        pipe.set(generation_key(settings.redis_prefix), generation + 1)
        pipe.execute()
    except Exception as exc:  # broker or Redis unreachable, no such topic
        raise fail(f"cannot accept topic {topic!r}: {exc}", code=1) from None
    was = before.decode() if isinstance(before, bytes) else before
    out.print(f"consumer groups: generation {generation} -> {generation + 1} ({topic} read from its start)")
    for old, new in renames.items():
        out.print(f"  {old} -> {new}: {copied[new]} partition offsets kept")
    out.print(f"topic {topic}: incarnation {current} accepted (was {was or 'none'})")


def tokenize_cmd(
    model: Annotated[str, typer.Option(help="Model directory (or hub id, or 'minilm')")],
    slow: Annotated[
        bool,
        typer.Option("--slow", help="transformers' own tokenizer (the reference) instead of the fast one"),
    ] = False,
) -> None:
    """Texts on stdin, one per line -> one JSON array of token ids per line on stdout
    (with <s>/</s>, no padding, truncated at the model's maximum), as the encoder sees them."""
    # Before anything imports transformers: it then leaves torch unimported (its documented
    # USE_TORCH switch; seconds of imports a tokenizer does not need) and does not warn of it.
    os.environ.setdefault("USE_TORCH", "0")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from workers.commands.tokenize import tokenize_stream

    try:
        tokenize_stream(model, slow, sys.stdin, sys.stdout.write)
    except ValueError as exc:
        raise fail(f"--model: {exc}", code=1) from None


def local_broker(
    engine: Annotated[
        str, typer.Option(help="kafka: Apache Kafka (KRaft, Java 17+, jars from Maven); tansu: in memory")
    ] = "tansu",
    nodes: Annotated[int, typer.Option(help="Kafka nodes: 1, or 3 (three voters)")] = 1,
    port: Annotated[
        int | None,
        typer.Option(
            help="Client port of node 1 (node i: PORT+i-1), on 127.0.0.1 "
            "[default: 9092; with --data, the port the folder's cluster was made with]"
        ),
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(help="Kafka's data folder, kept across restarts (default: a temporary one)"),
    ] = None,
) -> None:
    """Run a local broker for development until Ctrl-C, SIGTERM or SIGHUP; prints
    `bootstrap: HOST:PORT[,...]` on stdout once it answers, and creates the topics."""
    import time

    from workers.adapters.kafka.kafka_client import BrokerError, create_topics
    from workers.dev.broker import ENGINES, local_broker
    from workers.dev.kafka_cluster import KafkaCluster, KafkaSetupError
    from workers.dev.processes import shielded, stop_on_signals

    if engine not in ENGINES:
        raise fail(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if port is None and not (data is not None and (data / "cluster.json").exists()):
        port = 9092
    try:
        broker = local_broker(engine, nodes=nodes, port=port, data_dir=data)
    except KafkaSetupError as exc:
        raise fail(str(exc), code=2 if exc.usage else 1) from None
    with contextlib.suppress(KeyboardInterrupt), stop_on_signals():
        try:
            broker.start()
            settings = Settings.load()
            create_topics(
                broker.bootstrap, settings.topics(), replication=nodes, configs=settings.topic_configs()
            )
            print(f"bootstrap: {broker.bootstrap}", flush=True)
            err.print(f"{engine} broker ({nodes} node{'s' * (nodes > 1)}); Ctrl-C or SIGTERM stops it")
            if isinstance(broker, KafkaCluster) and nodes > 1:
                _watch_nodes(broker)
            while broker.running:
                time.sleep(0.5)
            raise fail(f"the {engine} broker stopped on its own", code=1)
        except KafkaSetupError as exc:
            raise fail(str(exc), code=2 if exc.usage else 1) from None
        except BrokerError as exc:
            raise fail(str(exc).splitlines()[0] + _log_hint(str(exc)), code=1) from None
        finally:
            with shielded():  # a second signal must not leave a JVM or a temporary folder behind
                broker.stop()


def _watch_nodes(cluster: Any) -> None:
    """Keep a multi-node cluster serving while nodes die: say which node stopped and how to
    start it again (SIGUSR1 to this command: every stopped node, on its data); return when
    no node is left.  A user can so try a leader failover with ``kill -9`` of one JVM."""
    import os
    import signal
    import time

    restart = threading.Event()
    previous = signal.signal(signal.SIGUSR1, lambda *_: restart.set())
    down: set[int] = set()
    try:
        while True:
            alive = {i for i in cluster.node_ids if cluster.pid(i) is not None}
            if not alive:
                return
            for node in sorted(set(cluster.node_ids) - alive - down):
                err.print(
                    f"[yellow]kafka node {node} stopped[/]; nodes {', '.join(map(str, sorted(alive)))} keep "
                    f"serving; `kill -USR1 {os.getpid()}` starts it again on its data",
                    highlight=False,
                    soft_wrap=True,
                )
            down = set(cluster.node_ids) - alive
            if restart.is_set():
                restart.clear()
                for node in sorted(down):
                    cluster.start_node(node, wait=False)
                    err.print(
                        f"kafka node {node} starting again on its data (pid {cluster.pid(node)})",
                        highlight=False,
                        soft_wrap=True,
                    )
                down.clear()
                cluster.wait_ready()
            time.sleep(0.5)
    finally:
        signal.signal(signal.SIGUSR1, previous)


def _log_hint(message: str) -> str:
    """The log file a broker error names, if any (its first line must stay one line)."""
    for word in message.split():
        if word.endswith(".log:") or word.endswith(".log"):
            return f" (log: {word.rstrip(':')})"
    return ""


def demo(
    duration: Annotated[
        float | None,
        typer.Option(help="Stop this many seconds after the first scored event (default: Ctrl-C)"),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option(
            help="At most this many tweets a second once scoring starts (default: the embed worker's pace)"
        ),
    ] = None,
    model: Annotated[str, typer.Option(help="Encoder for the demo (BERTweet needs the hub)")] = "minilm",
    redis_url: Annotated[
        str | None,
        typer.Option(help="Use this Redis (under a key prefix of the demo's own) instead of a private one"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per refresh on stdout")] = False,
) -> None:
    """The live path on this machine: local broker, a private Redis, the three workers, the
    bundled sample feed (a warm-up, then paced) with four recommenders, and a live table of
    their scores.

    Nothing of yours is touched: the demo removes only the keys and files it created."""
    from workers.commands.demo import Demo, SampleFeed
    from workers.commands.demo_view import Output

    if duration is not None and duration <= 0:
        raise fail("--duration must be > 0")
    if rate is not None and rate <= 0:
        raise fail("--rate must be > 0")
    settings = Settings(index_interval_s=10.0)  # broker, Redis, key prefix and model: the demo's own
    try:
        with Output(json_lines=as_json) as output:
            Demo(settings, output, duration=duration, model=model, redis_url=redis_url).run(
                SampleFeed(rate=rate)
            )
    except KeyboardInterrupt:
        pass
    except (RuntimeError, TimeoutError, OSError) as exc:
        raise fail(f"demo: {exc}", code=1) from None
