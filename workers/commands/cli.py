"""The ``reval`` command line.  Thin: argument handling and printing around the core."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from stream.batch import ModelLoadError
from stream.hashtags import normalise_hashtag
from stream.hubness import DEFAULT_METHOD, check_method
from stream.records import ErrorLog, RecordError, parse_recommendation
from stream.scoring import ALL, Summary, parse_ints, r_label, score_event
from workers.adapters.feeds import check_output_path, check_paths, read_file
from workers.adapters.store import DEFAULT_DEPTH, load_thesaurus, neighbour_cache
from workers.redaction import redact
from workers.settings import Settings

app = typer.Typer(  # the console script ``reval``
    help="#REval: semantic evaluation of hashtag recommenders on tweet feeds.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,  # click's plain help: no `<bool>` metavars, option names never cut at 80 columns
    add_completion=False,
)
thesaurus_app = typer.Typer(
    help="Build and inspect hashtag thesauri.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(thesaurus_app, name="thesaurus")
admin_app = typer.Typer(
    help="Operator commands for a running deployment.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(admin_app, name="admin")

OFFLINE_HINT = " (offline: a local model directory, or --model minilm, packaged)"
err = Console(stderr=True)
out = Console()


def fail(message: str, *, code: int = 2) -> typer.Exit:
    """One line on stderr naming what is wrong; exit 2 for a usage error, 1 for a runtime
    failure.  A library's message may quote a secret setting: it is masked (workers.redaction)."""
    err.print(f"[bold red]error:[/] {redact(message)}", soft_wrap=True, highlight=False)
    return typer.Exit(code=code)


def _progress() -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("lines"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[rate]}"),
        console=err,
        transient=False,
    )


@thesaurus_app.command("build")
def thesaurus_build(
    feeds: Annotated[
        list[Path], typer.Argument(metavar="FEED", help="Tweet files: .jsonl, .jsonl.gz or .csv")
    ],
    out_dir: Annotated[Path, typer.Option("--out", help="New (or empty) directory for the thesaurus")],
    model: Annotated[
        str,
        typer.Option(
            help="Hub id (the default is downloaded once: needs the network, or HF_HUB_OFFLINE=1 "
            "with it cached), a local model directory, or 'minilm' (packaged, works offline)"
        ),
    ] = "vinai/bertweet-base",
    min_count: Annotated[int, typer.Option(help="Leave out hashtags seen fewer times", min=1)] = 1,
    batch_size: Annotated[int, typer.Option(help="Encoder batch size", min=1)] = 32,
    n_trees: Annotated[int, typer.Option(help="Annoy trees", min=1)] = 50,
    hubness: Annotated[
        str,
        typer.Option(help="Neighbour ranking: center+csls (default), raw (the paper's), center, csls, mp"),
    ] = DEFAULT_METHOD,
    depth: Annotated[
        int, typer.Option(help="Neighbours per hashtag in the table (deeper queries use the index)", min=1)
    ] = DEFAULT_DEPTH,
    language_filter: Annotated[bool, typer.Option(help="Drop non-English tweets (paper 3.1.1)")] = True,
    force: Annotated[bool, typer.Option("--force", help="Replace a thesaurus already in --out")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON")] = False,
) -> None:
    """Clean → embed → per-hashtag running means → thesaurus (neighbour table + Annoy index)."""
    from stream.cleaning import Cleaner
    from workers.adapters.feeds import read_tweets
    from workers.adapters.store import ThesaurusOverwriteError, check_writable_thesaurus_dir

    try:  # everything that can be checked is checked before the model loads
        check_paths(feeds)
        check_method(hubness)
        check_writable_thesaurus_dir(out_dir, replace=force)
    except (OSError, ValueError, ThesaurusOverwriteError) as exc:
        raise fail(str(exc)) from None
    # A quick pass before the model loads: the bar gets a total and an ETA, and a feed
    # with no readable tweet fails now, not after the model has loaded.
    total, bad = 0, ErrorLog()
    for item in read_tweets(feeds):
        total += 1
        if item.error is not None:
            bad.add(item)
    if total == bad.total:
        raise fail(f"no tweet to read in {', '.join(map(str, feeds))}{_why_nothing(bad)}", code=1)
    from workers.adapters.encoder import Encoder  # torch: seconds to import, so only now
    from workers.commands.offline import NothingToBuildError, build_thesaurus

    try:
        encoder = Encoder(model, batch_size=batch_size)
    except ModelLoadError as exc:
        raise fail(f"--model: {exc}{OFFLINE_HINT}", code=1) from None
    err.print(f"encoder: {encoder.model_id} on {encoder.device} ({encoder.dtype}), dim {encoder.dim}")
    with _progress() as progress:
        task = progress.add_task("embedding", total=total, rate="")
        done = [0]

        def tick(n: int) -> None:
            done[0] += n
            if done[0] % 200 == 0:
                elapsed = progress.tasks[task].elapsed or 0.0
                rate = f"{done[0] / elapsed:,.0f} lines/s" if elapsed else ""
                progress.update(task, completed=done[0], rate=rate)

        try:
            thesaurus, _, report = build_thesaurus(
                feeds,
                encoder,
                min_count=min_count,
                n_trees=n_trees,
                method=hubness,
                depth=depth,
                cleaner=Cleaner(language_filter=language_filter),
                on_progress=tick,
            )
        except NothingToBuildError as exc:
            progress.stop()
            raise fail(str(exc), code=1) from None
        progress.update(task, completed=done[0])
    try:
        thesaurus.save(out_dir, replace=force)
    except (OSError, ThesaurusOverwriteError) as exc:
        raise fail(f"cannot write {out_dir}: {exc}") from None
    summary = {
        **report.as_dict(),
        "out": str(out_dir),
        "version": thesaurus.version,
        "hubness_method": hubness,
        "hubness": thesaurus.metadata.hubness,
    }
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    table = Table(title="thesaurus build", show_header=False)
    for key, value in summary.items():
        if key == "first_bad_lines":
            value = "\n".join(value) if value else "-"  # type: ignore[arg-type]
        if key == "hubness":
            continue
        table.add_row(key, str(value))
    out.print(table)
    _print_hubness(thesaurus.metadata.hubness or {}, hubness)


def _print_hubness(report: dict[str, Any], method: str) -> None:
    if not report:
        out.print("no hubness report (a thesaurus built by an older version)")
        return
    out.print(
        f"hubness ({method}): N_{report['k']} skewness {report['skewness']:.2f}, largest "
        f"{report['max']} ({100 * report['max_share']:.1f}% of {report['hashtags']:,} hashtags); "
        f"{100 * report['share_with_hub']:.1f}% of the lists hold one of these hubs:"
    )
    out.print("  " + ", ".join(f"#{h} ({n})" for h, n in report["hubs"]))


@thesaurus_app.command("inspect")
def thesaurus_inspect(
    directory: Annotated[
        Path, typer.Argument(metavar="DIR", help="A thesaurus directory (or a store: its current version)")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print the metadata as JSON")] = False,
) -> None:
    """What a thesaurus was built from, and its hubness (the hashtags near everything)."""
    from workers.adapters.store import AnnoyThesaurus

    th = _load(str(directory))
    if not isinstance(th, AnnoyThesaurus):
        raise fail(f"{directory} is not a thesaurus directory")
    meta = th.metadata.to_dict()
    if as_json:
        print(json.dumps(meta, indent=2, ensure_ascii=False))
        return
    table = Table(title=f"thesaurus {directory}", show_header=False)
    for key in (
        "version",
        "model_id",
        "count",
        "dimension",
        "hubness_method",
        "depth",
        "min_count",
        "max_distance",
        "n_trees",
        "built_at",
    ):
        table.add_row(key, str(meta[key]))
    out.print(table)
    _print_hubness(meta.get("hubness") or {}, th.metadata.hubness_method)
    drift = meta.get("drift") or {}
    if drift.get("movers"):  # written by the index job: what moved since the version before
        moved = ", ".join(f"#{m['hashtag']} ({m['cosine']:.2f})" for m in drift["movers"][:10])
        out.print(f"moved most since {drift.get('from_version')}: {escape(moved)}")
    recent = drift.get("recent") or {}
    if recent.get("movers"):  # recent use against earlier use, from the window means
        moved = ", ".join(f"#{m['hashtag']} ({m['cosine']:.2f})" for m in recent["movers"][:10])
        out.print(f"recent use furthest from earlier use: {escape(moved)}")


@thesaurus_app.command("diff")
def thesaurus_diff_cmd(
    old: Annotated[Path, typer.Argument(metavar="OLD", help="The earlier thesaurus (directory or store)")],
    new: Annotated[Path, typer.Argument(metavar="NEW", help="The later thesaurus (directory or store)")],
    top: Annotated[int, typer.Option(help="Movers to list", min=0)] = 20,
    min_support: Annotated[
        int, typer.Option(help="Only hashtags with at least this many tweets in both", min=0)
    ] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
) -> None:
    """Which hashtags' meaning moved between two versions: the cosine between each
    hashtag's mean then and now, the overlap of its top-10 neighbours, the movers."""
    from workers.commands.drift import thesaurus_diff

    try:
        thesaurus_diff(old, new, as_json, top, min_support)
    except ValueError as exc:
        raise fail(str(exc)) from None


def _load(thesaurus: str) -> Any:
    try:
        return load_thesaurus(thesaurus)
    except (OSError, ValueError) as exc:
        raise fail(str(exc)) from None


@app.command()
def synonyms(
    hashtags: Annotated[list[str], typer.Argument(metavar="HASHTAG", help="Hashtags, with or without #")],
    thesaurus: Annotated[str, typer.Option("--thesaurus", "-t", help="Thesaurus dir or .json")],
    k: Annotated[int, typer.Option("-k", help="Number of synonyms", min=0)] = 10,
    as_json: Annotated[bool, typer.Option("--json", help='Print {"hashtag": [...]}')] = False,
) -> None:
    """Nearest synonyms of hashtags, nearest first."""
    index = _load(thesaurus)
    result: dict[str, list[str]] = {}
    for raw in hashtags:
        tag = normalise_hashtag(raw)
        if tag is None:
            raise fail(f"{raw!r} is not a hashtag")
        result[tag] = index.neighbours(tag, k)
    if as_json:
        print(json.dumps(result, ensure_ascii=False))
        return
    for tag, found in result.items():
        known = "" if tag in index else "  (not in the thesaurus)"
        out.print(f"[bold]#{tag}[/]{known}: " + ", ".join(f"#{s}" for s in found))


@app.command()
def score(
    recs: Annotated[Path, typer.Argument(metavar="EVENTS", help="Recommendation events, JSON lines")],
    thesaurus: Annotated[str, typer.Option("--thesaurus", "-t", help="Thesaurus dir or .json")],
    ks: Annotated[str, typer.Option("-k", help="Comma-separated k values")] = "0,5,10",
    rs: Annotated[
        str, typer.Option("-r", help="Top-r cut-offs, comma-separated; 'all' = whole list")
    ] = "all",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
    events_out: Annotated[
        Path | None, typer.Option("--events", help="Also write one JSON result per event here")
    ] = None,
) -> None:
    """Average #REval-hit-ratio per k and exact-match metrics over events with ground truth."""
    try:
        k_values = [int(k) for k in parse_ints(ks) if k is not None]
    except ValueError as exc:
        raise fail(f"-k: {exc}") from None
    try:
        r_values = list(parse_ints(rs, allow_all=True))
    except ValueError as exc:
        raise fail(f"-r: {exc}") from None
    try:  # everything that can be checked is checked before the thesaurus loads
        check_paths([recs])
        if events_out is not None:
            check_output_path(events_out)
    except (OSError, ValueError) as exc:
        raise fail(str(exc)) from None
    index = _load(thesaurus)
    try:
        cache = neighbour_cache(index, max(k_values))
    except ValueError as exc:
        raise fail(f"-k: {exc}") from None
    summary, errors = Summary(), ErrorLog()
    sink = events_out.open("w", encoding="utf-8") if events_out else None
    try:
        for item in read_file(recs, parse_recommendation):
            if item.error is not None:
                errors.add(item)
                continue
            assert item.value is not None
            event = item.value
            if event.ground_truth is None:
                missing = RecordError("no_ground_truth", f"no ground_truth in the event ({WITH_TRUTH})")
                errors.note(f"{recs}:{item.line}", missing)
                continue
            result = score_event(event, event.ground_truth, cache, k_values, r_values)
            summary.update(result)
            if sink is not None:
                sink.write(json.dumps(result.to_json()) + "\n")
    finally:
        if sink is not None:
            sink.close()
    _report_bad_lines(errors)
    payload: dict[str, Any] = summary.get(r_values[0] if len(r_values) == 1 else ALL)
    if not payload["events"]:
        hint = f"; {WITH_TRUTH}" if errors.by_reason.get("no_ground_truth") else ""
        raise fail(f"no event of {recs} could be scored{_why_nothing(errors)}{hint}", code=1)
    payload["thesaurus_version"] = cache.version
    payload["skipped_lines"] = errors.total
    if len(r_values) > 1 or r_values != [ALL]:
        payload["by_r"] = {r_label(r): summary.get(r) for r in r_values}
    if as_json:
        print(json.dumps(payload))
        return
    _print_scores(payload, k_values, r_values, summary)


#: What to do about events without ground truth (``reval score`` needs it).
WITH_TRUTH = (
    "write the events with `reval recommend --with-truth` to carry each tweet's hashtags as ground_truth"
)


def _report_bad_lines(errors: ErrorLog) -> None:
    if errors.total:
        err.print(f"[yellow]skipped {errors.total} bad lines[/] {errors.by_reason}", soft_wrap=True)
        for line in errors.first:
            err.print(f"  {line}", soft_wrap=True, highlight=False)


def _why_nothing(errors: ErrorLog, otherwise: str = "it holds no records") -> str:
    """The reason a run produced nothing, for its one error line."""
    if not errors.total:
        return f" ({otherwise})"
    reasons = ", ".join(
        f"{n} {reason}" for reason, n in sorted(errors.by_reason.items(), key=lambda x: -x[1])
    )
    return f": all {errors.total} records were bad ({reasons})"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _print_scores(payload: dict[str, Any], ks: list[int], rs: list[int | None], summary: Summary) -> None:
    out.print(
        f"events {payload['events']}  unscorable {payload['unscorable']}  "
        f"thesaurus {payload['thesaurus_version']}"
    )
    for field, title in (
        ("reval_hit_ratio", "average #REval-hit-ratio"),
        (
            "reval_hit_ratio_corrected",
            "chance-corrected #REval-hit-ratio (0 = random, 1 = best; 95% interval)",
        ),
        ("reval_hit_ratio_ranked", "rank-aware #REval-hit-ratio"),
    ):
        table = Table(title=title)
        table.add_column("r")
        for k in ks:
            table.add_column(f"k={k}", justify="right")
        for r in rs:
            by_k = summary.get(r)["by_k"]
            table.add_row(r_label(r), *(_cell(by_k.get(str(k), {}), field) for k in ks))
        out.print(table)
    exact = Table(title="exact match")
    exact.add_column("r")
    names = ["hit_rate", "precision", "recall", "f1", "hit_ratio"]
    for name in names:
        exact.add_column(name, justify="right")
    for r in rs:
        values = summary.get(r)["exact"]
        exact.add_row(r_label(r), *(_fmt(values.get(name)) for name in names))
    out.print(exact)


def _cell(values: dict[str, Any], field: str) -> str:
    """A table cell: the value, and for the corrected score its interval below it."""
    text = _fmt(values.get(field))
    if field == "reval_hit_ratio_corrected" and values.get("corrected_ci_low") is not None:
        text += f"\n[{values['corrected_ci_low']:.3f}, {values['corrected_ci_high']:.3f}]"
    return text


@app.command()
def worker(
    roles: Annotated[
        list[str], typer.Argument(metavar="ROLE", help="embed, index, score (several = one process)")
    ],
    broker: Annotated[str | None, typer.Option(help="Kafka bootstrap host:port [REVAL_BROKER]")] = None,
    redis_url: Annotated[str | None, typer.Option(help="[REVAL_REDIS_URL]")] = None,
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
    """Run worker roles against a Kafka broker and Redis (settings: REVAL_* env, see README)."""

    overrides = {
        "broker": broker,
        "redis_url": redis_url,
        "model": model,
        "index_dir": index_dir,
        "metrics_port": metrics_port,
    }
    from workers.adapters.kafka_client import BrokerAuthError, BrokerError
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
    broker: Annotated[str | None, typer.Option(help="Kafka bootstrap host:port [REVAL_BROKER]")] = None,
    redis_url: Annotated[str | None, typer.Option(help="[REVAL_REDIS_URL]")] = None,
) -> None:
    """Accept a re-created topic: its records are new data, read from its start.

    Starts a new generation of the consumer groups (every other topic goes on where it
    was), records the topic's new id; workers waiting on the topic stop, and read it from
    its start once restarted. If the new topic holds a replay of data already counted,
    use a new REVAL_REDIS_PREFIX instead.
    """
    import re

    from workers.adapters.kafka_client import TopicIdentity, copy_groups, list_groups
    from workers.adapters.redis_client import connect
    from workers.service.incarnation import generation_key, group_generation, incarnation_key, next_group

    overrides = {k: v for k, v in {"broker": broker, "redis_url": redis_url}.items() if v is not None}
    try:
        settings = Settings.load(**overrides)
        bootstrap = settings.broker.split(",")[0]
        options = settings.kafka_client_options()
        identity = TopicIdentity(bootstrap, timeout=15, **options)
        current = identity.of(topic)
        identity.close()
        client = connect(settings.redis_url, cluster=settings.redis_cluster)
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


@app.command("tokenize")
def tokenize_cmd(
    model: Annotated[str, typer.Option(help="Model directory (or hub id, or 'minilm')")],
    slow: Annotated[
        bool,
        typer.Option("--slow", help="transformers' own tokenizer (the reference) instead of the fast one"),
    ] = False,
) -> None:
    """Texts on stdin, one per line -> one JSON array of token ids per line on stdout
    (with <s>/</s>, no padding, truncated at the model's maximum), as the encoder sees them."""
    from workers.commands.tokenize import tokenize_stream

    try:
        tokenize_stream(model, slow, sys.stdin, sys.stdout.write)
    except ValueError as exc:
        raise fail(f"--model: {exc}", code=1) from None


@app.command("broker")
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

    from workers.adapters.kafka_client import BrokerError, create_topics
    from workers.dev.broker import ENGINES, local_broker
    from workers.dev.kafka_cluster import KafkaSetupError
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
            create_topics(broker.bootstrap, Settings.load().topics(), replication=nodes)
            print(f"bootstrap: {broker.bootstrap}", flush=True)
            err.print(f"{engine} broker ({nodes} node{'s' * (nodes > 1)}); Ctrl-C or SIGTERM stops it")
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


def _log_hint(message: str) -> str:
    """The log file a broker error names, if any (its first line must stay one line)."""
    for word in message.split():
        if word.endswith(".log:") or word.endswith(".log"):
            return f" (log: {word.rstrip(':')})"
    return ""


@app.command("replay")
def replay_feeds(
    feeds: Annotated[
        list[Path],
        typer.Argument(
            metavar="FEED",
            help="Feed files (.jsonl, .jsonl.gz, .json, .csv; tweets in API v1.1/v2 JSON or "
            "minimal form, or recommendation events); several are merged in event-time order",
        ),
    ],
    topic: Annotated[
        str | None,
        typer.Option(help="Topic (default by kind: REVAL_TOPIC_TWEETS / REVAL_TOPIC_RECOMMENDATIONS)"),
    ] = None,
    broker: Annotated[str | None, typer.Option(help="Kafka bootstrap host:port [REVAL_BROKER]")] = None,
    speed: Annotated[
        str, typer.Option(help="Pace by event time: 1 = real time, 10 = ten times faster, max = no pauses")
    ] = "max",
    start: Annotated[str | None, typer.Option(help="Only events at or after this ISO time")] = None,
    end: Annotated[str | None, typer.Option(help="Only events before this ISO time")] = None,
    limit: Annotated[int | None, typer.Option(help="Stop after N records produced", min=1)] = None,
    from_line: Annotated[
        int,
        typer.Option(
            help="Resume at this 1-based line; with several files it applies to the FIRST file only",
            min=1,
        ),
    ] = 1,
    strict: Annotated[bool, typer.Option(help="Stop at the first bad line (exit code 2)")] = False,
    kind: Annotated[
        str | None,
        typer.Option(
            help="tweets or recommendations (default: detected from the first good record, "
            "else from the topic name)"
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON")] = False,
) -> None:
    """Replay archived feeds into Kafka (original line bytes, key = tweet id, timestamp = event time)."""
    from rich.progress import TimeElapsedColumn as Elapsed

    from stream import replay as rp
    from workers.adapters.feeds import detect_file_kind, read_feeds
    from workers.adapters.kafka_client import KafkaSink, ensure_topic

    if kind is not None and kind not in tuple(rp.Kind):
        raise fail(f"--kind must be one of {', '.join(rp.Kind)}, not {kind!r}")
    try:
        pace = rp.parse_speed(speed)
        lower = rp.parse_bound(start) if start else None
        upper = rp.parse_bound(end) if end else None
        chosen = rp.Kind(kind) if kind else None
        settings = Settings.load()
        if chosen is None:
            hinted = (
                rp.kind_from_topic(
                    topic,
                    tweets_topic=settings.topic_tweets,
                    recommendations_topic=settings.topic_recommendations,
                )
                if topic
                else None
            )
            chosen = detect_file_kind(feeds, from_line=from_line) or hinted or rp.Kind.tweets
            if hinted is not None and hinted != chosen:
                err.print(f"[yellow]warning:[/] topic {topic!r} looks like {hinted}, the feed holds {chosen}")
    except (ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    topic = topic or (settings.topic_tweets if chosen is rp.Kind.tweets else settings.topic_recommendations)
    bootstrap = broker or settings.broker
    try:
        options = settings.kafka_client_options()
        if ensure_topic(bootstrap, topic, settings.partitions, timeout=15, **options):
            err.print(f"created topic {topic!r} with {settings.partitions} partitions")
        sink = KafkaSink(bootstrap, topic, **options)
    except Exception as exc:
        raise fail(f"cannot use broker {bootstrap}: {exc}") from None

    progress = Progress(
        SpinnerColumn(),
        TextColumn(
            "{task.fields[produced]} produced · {task.fields[rate]} rec/s · "
            "event time {task.fields[position]} · {task.fields[lines]} lines"
        ),
        Elapsed(),
        console=err,
        transient=False,
    )
    task = progress.add_task(
        "replay", total=None, topic=topic, produced="0", rate="-", position="-", lines="0"
    )
    state: list[rp.ReplaySummary] = []

    def report(summary: rp.ReplaySummary) -> None:
        state[:] = [summary]
        position = f"{summary.position:%Y-%m-%dT%H:%M:%SZ}" if summary.position else "-"
        progress.update(
            task,
            produced=f"{summary.produced:,}",
            rate=f"{summary.rate:,.0f}",
            position=position,
            lines=f"{summary.lines_read:,}",
        )

    code, message = 0, None
    try:
        with progress:
            rp.replay(
                read_feeds(feeds, chosen, from_line=from_line),
                sink,
                kind=chosen,
                speed=pace,
                start=lower,
                end=upper,
                limit=limit,
                strict=strict,
                flush=sink.flush,
                on_progress=report,
            )
    except rp.ReplayError as exc:
        code, message = exc.exit_code, str(exc)
    except ValueError as exc:
        code, message = 2, str(exc)
    except KeyboardInterrupt:
        code, message = 130, "interrupted"
    finally:
        sink.close()
    if state:
        summary = state[0]
        if as_json:
            print(json.dumps({**summary.as_dict(), "topic": topic, "broker": bootstrap}))
        else:
            table = Table(title=f"replay → {topic} ({bootstrap})", show_header=False)
            for label, value in rp.summary_rows(summary):
                table.add_row(label, value)
            out.print(table)
    if message is not None:
        err.print(f"[bold red]error:[/] {message}", soft_wrap=True, highlight=False)
        raise typer.Exit(code=code)


@app.command("recommend")
def recommend_cmd(
    method: Annotated[
        str, typer.Option("--method", "-m", help="mowe | popular | popular-users | least-popular | random")
    ],
    train: Annotated[list[Path], typer.Option("--train", metavar="FILE", help="Training feed (repeatable)")],
    feed: Annotated[
        list[Path], typer.Option("--feed", metavar="FILE", help="Feed to recommend for (repeatable)")
    ],
    r: Annotated[int, typer.Option("-r", min=1, help="Hashtags per tweet (at most)")] = 10,
    out_path: Annotated[Path | None, typer.Option("--out", help="Write the events here (JSON lines)")] = None,
    topic: Annotated[
        str | None, typer.Option("--topic", help="Produce the events to this Kafka topic")
    ] = None,
    broker: Annotated[str | None, typer.Option(help="Kafka bootstrap host:port [REVAL_BROKER]")] = None,
    with_truth: Annotated[
        bool, typer.Option("--with-truth", help="Put each tweet's hashtags in ground_truth")
    ] = False,
    recommender_name: Annotated[
        str | None, typer.Option("--recommender-name", help="The events' recommender field")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of mowe's Word2Vec and of random's draws")] = 0,
    threshold: Annotated[
        float,
        typer.Option(help="mowe: cosine for a similar training tweet (paper: 0.5)"),
    ] = 0.5,
    language_filter: Annotated[
        bool, typer.Option(help="Drop non-English training tweets (paper 3.1.1)")
    ] = True,
    all_tweets: Annotated[
        bool, typer.Option("--all-tweets", help="Also recommend for tweets without hashtags")
    ] = False,
) -> None:
    """Recommend hashtags with a baseline recommender; emit `reval score` / scoring-worker events.

    The recommender never sees the hashtags of the tweets it recommends for.
    """
    import warnings

    from stream import recommenders as rec
    from workers.adapters.feeds import read_tweets
    from workers.adapters.word_vectors import trainer
    from workers.commands.offline import EventSink

    if method not in rec.METHODS:
        raise fail(f"unknown method {method!r}; choose from {', '.join(rec.METHODS)}")
    if out_path is None and topic is None:
        raise fail("give --out FILE, --topic TOPIC, or both")
    try:  # everything that can be checked is checked before training
        check_paths(train)
        check_paths(feed)
        if out_path is not None:
            check_output_path(out_path)
        recommender = rec.make_recommender(
            method, name=recommender_name, threshold=threshold, trainer=trainer(seed=seed), seed=seed
        )
    except (OSError, ValueError) as exc:
        raise fail(str(exc)) from None
    train_errors = ErrorLog()
    with err.status(f"training {method} on {', '.join(map(str, train))}"):
        tweets = rec.labelled_tweets(read_tweets(train), language_filter=language_filter, errors=train_errors)
        if not tweets:
            why = _why_nothing(train_errors, "none kept after pre-processing")
            raise fail(f"no hashtagged training tweet in --train{why}", code=1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            recommender.fit(tweets)
    for warning in caught:
        err.print(f"[yellow]warning:[/] {warning.message}")
    train_ids = {t.id for t in tweets}
    if topic is not None and broker is None:
        broker = Settings.load().broker

    errors, skipped, overlap, empty = ErrorLog(), 0, 0, 0
    try:
        options = Settings.load().kafka_client_options() if topic is not None else {}
        sink = EventSink(out_path, topic=topic, broker=broker, **options)
    except Exception as exc:  # kafka-python raises its own NoBrokersAvailable etc.
        raise fail(f"cannot open the output: {exc}", code=1) from None
    with sink:
        batch: list[Any] = []

        def flush() -> None:
            nonlocal empty
            for tweet, recs in zip(batch, recommender.recommend_many(batch, r), strict=True):
                empty += not recs
                sink.write(rec.recommendation_event(tweet, recs, recommender.name, with_truth=with_truth))
            batch.clear()

        for item in read_tweets(feed):
            if item.error is not None:
                errors.add(item)
                continue
            assert item.value is not None
            if not item.value.hashtags and not all_tweets:
                skipped += 1
                continue
            overlap += item.value.id in train_ids
            batch.append(item.value)
            if len(batch) >= 2048:
                flush()
        flush()
    where = " and ".join(
        x for x in (str(out_path) if out_path else "", f"topic {topic} ({broker})" if topic else "") if x
    )
    err.print(
        f"{recommender.name}: {sink.count} events to {where}; {empty} with no recommendation; "
        f"skipped {skipped} tweets without hashtags, {errors.total + train_errors.total} bad lines"
    )
    if overlap:
        err.print(f"[yellow]warning:[/] {overlap} tweets of --feed are also training tweets")
    if not sink.count:
        why = _why_nothing(errors, f"{skipped} tweets without hashtags; --all-tweets takes those too")
        raise fail(f"no event written: no tweet of --feed to recommend for{why}", code=1)


def _progress_bars() -> tuple[Progress, Any]:
    """Progress bars on stderr for a long command, and the ``progress(description, total)``
    factory (:data:`stream.experiment.ProgressFactory`) that opens one bar each."""
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=False,
    )

    def track(description: str, total: int | None) -> Any:
        task = progress.add_task(description, total=total)
        return lambda n: progress.advance(task, n)

    return progress, track


@app.command("evaluate")
def evaluate_cmd(
    feeds: Annotated[
        list[Path], typer.Argument(metavar="FEED", help="Tweet files: .jsonl, .jsonl.gz or .csv")
    ],
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for the results")],
    split: Annotated[
        str, typer.Option(help="time (earliest 90% train), random, or both: time,random")
    ] = "time",
    seeds: Annotated[str, typer.Option(help="Seeds (random split, gensim, random draws), pooled")] = "1,2,3",
    cores: Annotated[
        str,
        typer.Option(help="p-core levels (paper 002), comma-separated: every cell again on each p-core"),
    ] = "1",
    recommenders: Annotated[
        str, typer.Option(help="Comma-separated: mowe, popular, least-popular, random, popular-users")
    ] = "mowe,popular,least-popular,random",
    embeddings: Annotated[
        str, typer.Option(help="Comma-separated: bertag, word2vec, fasttext")
    ] = "bertag,word2vec,fasttext",
    hubness: Annotated[
        str, typer.Option(help="Thesaurus rankings to compare: raw, center, csls, center+csls, mp")
    ] = "center+csls",
    mowe_threshold: Annotated[
        str,
        typer.Option(help="MOWE: cosine for a similar tweet, comma-separated to sweep (paper: 0.5)"),
    ] = "0.5",
    model: Annotated[
        str,
        typer.Option(
            help="BERTag encoder: hub id (the default needs the network once), a local model "
            "directory, or 'minilm' (packaged, works offline)"
        ),
    ] = "vinai/bertweet-base",
    rs: Annotated[str, typer.Option("-r", help="Top-r cut-offs, comma-separated")] = "1,5,10",
    ks: Annotated[
        str, typer.Option("-k", help="Numbers of synonyms, comma-separated")
    ] = "0,5,10,20,30,40,50,60,70",
    limit: Annotated[
        int | None, typer.Option(help="Use only the first N tweets left after pre-processing", min=1)
    ] = None,
    language_filter: Annotated[bool, typer.Option(help="Drop non-English tweets (paper 3.1.1)")] = True,
    batch_size: Annotated[int, typer.Option(help="Encoder batch size", min=1)] = 32,
    dtype: Annotated[
        str, typer.Option(help="Encoder dtype: float32 (reference numbers) or auto (core's choice)")
    ] = "float32",
    fasttext_bucket: Annotated[
        int, typer.Option(help="FastText n-gram buckets (gensim's default 2,000,000)", min=1)
    ] = 2_000_000,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples for the 95% intervals", min=100)] = 1000,
    save_thesauri: Annotated[
        bool, typer.Option("--save-thesauri", help="Also save the first seed's thesauri under OUT/thesauri/")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Replace the results of an earlier run in --out")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print results.json's cells as JSON")] = False,
) -> None:
    """The paper's experiment (4.2) with baselines and confidence intervals: recommenders
    (MOWE, popular, the least-popular canary, the random null) scored on BERTag / Word2Vec /
    FastText thesauri, raw and chance-corrected #REval-hit-ratio per (r, k), 95% intervals."""

    from workers.commands import evaluate as ev

    def names(text: str) -> tuple[str, ...]:
        return tuple(x.strip().lower() for x in text.split(",") if x.strip())

    try:
        config = ev.ExperimentConfig(
            splits=names(split),  # type: ignore[arg-type]
            seeds=tuple(int(x) for x in parse_ints(seeds) if x is not None),
            cores=tuple(int(x) for x in parse_ints(cores) if x is not None),
            recommenders=names(recommenders),
            embeddings=names(embeddings),
            hubness=names(hubness),
            mowe_thresholds=tuple(float(x) for x in names(mowe_threshold)),
            model=model,
            rs=tuple(int(x) for x in parse_ints(rs) if x is not None),
            ks=tuple(int(x) for x in parse_ints(ks) if x is not None),
            limit=limit,
            language_filter=language_filter,
            batch_size=batch_size,
            dtype=dtype,
            fasttext_bucket=fasttext_bucket,
            bootstrap=bootstrap,
        )
    except ValueError as exc:
        raise fail(str(exc)) from None
    try:  # the files, after the options; all before any model loads
        check_paths(feeds)
        ev.check_results_dir(out_dir, replace=force)
    except (OSError, ValueError) as exc:
        raise fail(str(exc)) from None
    progress, track = _progress_bars()
    try:
        with progress:
            experiment = ev.run_experiment(feeds, config, progress=track)
    except (OSError, ValueError) as exc:
        raise fail(str(exc)) from None
    ev.write_outputs(experiment, out_dir, save_thesauri=save_thesauri)
    if as_json:
        print(json.dumps(experiment.cells))
        return
    d = experiment.data
    out.print(
        f"{d['train_tweets']:,} training / {d['test_tweets']:,} test tweets ({config.splits[0]} split, "
        f"seeds {', '.join(map(str, config.seeds))}); {experiment.timings['total']:.0f} s; "
        f"results in {out_dir}"
    )
    first = config.embeddings[0]
    for metric, title in (
        ("reval_hit_ratio", "#REval-hit-ratio"),
        ("reval_hit_ratio_corrected", "chance-corrected #REval-hit-ratio"),
    ):
        low, high = (
            ("ci_low", "ci_high")
            if metric == "reval_hit_ratio"
            else ("corrected_ci_low", "corrected_ci_high")
        )
        table = Table(title=f"{title}, {experiment.labels[first]}, {config.hubness[0]}: mean [95% CI]")
        table.add_column("r, k")
        for name in config.recommender_names:
            table.add_column(name, justify="right")
        for r in config.rs:
            for k in config.ks:
                cells = [
                    experiment.cell(variant=first, recommender=n, r=r, k=k) for n in config.recommender_names
                ]
                table.add_row(
                    f"{r}, {k}",
                    *(
                        "-" if c[metric] is None else f"{c[metric]:.3f} [{c[low]:.3f}, {c[high]:.3f}]"
                        for c in cells
                    ),
                )
        out.print(table)
    if len(config.cores) > 1:
        found = experiment.core_flips()
        clear = [f for f in found if any(pair["clear"] for pair in f["flips"])]
        out.print(
            f"p-cores {', '.join(map(str, config.cores))}: the ranking of recommenders flips in "
            f"{len(found)} cells against the {config.cores[0]}-core ({len(clear)} with a clear flip, "
            f"intervals apart); see {out_dir / 'cores.md'}"
        )


@app.command("backtest")
def backtest_cmd(
    feeds: Annotated[
        list[Path], typer.Argument(metavar="FEED", help="Tweet files: .jsonl, .jsonl.gz or .csv")
    ],
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for detection.json/.md and series.json")],
    recommender: Annotated[
        str, typer.Option(help="The recommender under test: mowe, popular, popular-users, random")
    ] = "mowe",
    inject: Annotated[
        list[str] | None,
        typer.Option(
            help="A drift KIND:AMOUNT[@TIME], repeatable: random:F, swap:least-popular, synonyms:F, "
            "stale:DAYS, vocab:F; TIME is ISO 8601 (default: the middle of the scored period) "
            "[default: random:0.5 swap:least-popular synonyms:1 stale:60 vocab:0.5]"
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the drifts' random draws and of Word2Vec")] = 1,
    model: Annotated[
        str,
        typer.Option(help="Encoder of the thesaurus: hub id, local directory, or 'minilm' (offline)"),
    ] = "vinai/bertweet-base",
    warmup: Annotated[
        float, typer.Option(help="Share of the tweets (earliest) that only train, before scoring starts")
    ] = 0.3,
    refit_days: Annotated[
        float, typer.Option(help="Event-time days between refits of recommender and thesaurus")
    ] = 7.0,
    train_days: Annotated[
        float, typer.Option(help="The recommender learns from the labelled tweets of the last N days")
    ] = 30.0,
    time_scale: Annotated[
        str,
        typer.Option(
            help="Factor on every rule window and hold time, or 'auto' (the quality window holds "
            "twice the rules' min_events on average; 1 for a feed as dense as production)"
        ),
    ] = "auto",
    rules_profile: Annotated[
        str, typer.Option(help="Parameter profile of deploy/prometheus/render.py")
    ] = "default",
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a rule parameter NAME=VALUE (as render.py --set)"),
    ] = None,
    limit: Annotated[
        int | None, typer.Option(help="Use only the first N tweets left after pre-processing", min=10)
    ] = None,
    language_filter: Annotated[bool, typer.Option(help="Drop non-English tweets (paper 3.1.1)")] = True,
    force: Annotated[
        bool, typer.Option("--force", help="Replace the results of an earlier backtest in --out")
    ] = False,
    backfill: Annotated[
        Path | None,
        typer.Option(
            help="Also write the scores as Prometheus TSDB blocks at event time into this directory "
            "(promtool tsdb create-blocks-from openmetrics)"
        ),
    ] = None,
    backfill_interval: Annotated[
        str, typer.Option(help="Event time between two backfilled samples (Prometheus duration)")
    ] = "15m",
    html: Annotated[bool, typer.Option("--html", help="Also write OUT/report.html (reval report)")] = False,
    audit_votes: Annotated[
        Path | None,
        typer.Option(help="An audit's events (the votes topic as JSON lines): each refit's agreement"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print detection.json's signals as JSON")] = False,
) -> None:
    """Inject drifts into a replayed feed and measure, per alert signal of deploy/prometheus,
    the detection delay in event time and the false alarms per day on the undisturbed run."""
    from workers.commands import backtest as bk

    try:
        scale = None if time_scale.strip().lower() == "auto" else float(time_scale)
    except ValueError:
        raise fail(f"--time-scale must be a positive number or 'auto', not {time_scale!r}") from None
    try:
        config = bk.BacktestConfig(
            recommender=recommender.strip().lower(),
            injections=tuple(inject) if inject else bk.DEFAULT_INJECTIONS,
            seed=seed,
            model=model,
            warmup=warmup,
            refit_days=refit_days,
            train_days=train_days,
            time_scale=scale,
            rules_profile=rules_profile,
            rules_set=tuple(set_ or ()),
            limit=limit,
            language_filter=language_filter,
            audit_votes=audit_votes,
        )
        if audit_votes is not None and not audit_votes.is_file():
            raise ValueError(f"--audit-votes {audit_votes}: no such file")
        bk.rules_for(bk.rule_params(config.rules_profile, list(config.rules_set)), 1.0)
        interval_s = bk.load_render().seconds(backfill_interval)
        check_paths(feeds)
        bk.check_out(out_dir, replace=force)
        if backfill is not None and backfill.exists() and any(backfill.iterdir()):
            raise ValueError(f"--backfill {backfill} is not empty: blocks go into a new or empty directory")
    except (OSError, ValueError) as exc:
        raise fail(str(exc)) from None
    progress, track = _progress_bars()
    try:
        with progress:
            result = bk.run_backtest(feeds, config, progress=track)
    except (OSError, ValueError) as exc:
        raise fail(str(exc)) from None
    if backfill is not None:
        try:
            result.summary["backfill"] = bk.backfill(result, backfill, interval_s=interval_s)
        except (OSError, RuntimeError, ValueError) as exc:
            raise fail(f"--backfill: {exc}", code=1) from None
    bk.write_outputs(result, out_dir)
    if html:
        from workers.commands.report import write_report

        write_report(out_dir)
    if as_json:
        print(json.dumps(result.rows))
        return
    out.print(bk.markdown(result), markup=False)
    out.print(f"{result.timings['total']:.0f} s; results in {out_dir}")
    if backfill is not None:
        b = result.summary["backfill"]
        out.print(
            f"backfill: {b['samples']:,} samples of {b['series']} series from {b['from']} to {b['to']} "
            f"in {len(b['blocks'])} TSDB blocks under {backfill} (start Prometheus on it with "
            "--storage.tsdb.retention.time longer than the feed's age)"
        )


@app.command("report")
def report_cmd(
    run_dir: Annotated[Path, typer.Argument(metavar="DIR", help="A reval backtest --out directory")],
    out_file: Annotated[
        Path | None, typer.Option("--out", help="The HTML file [default: DIR/report.html]")
    ] = None,
) -> None:
    """One self-contained HTML page of a backtest: metrics over event time with the injected
    drifts and their detections, k-curves, the detection table, thesaurus health, slices.
    Opens from disk (no server, no network)."""
    from workers.commands.report import write_report

    try:
        path = write_report(run_dir, out_file)
    except (OSError, ValueError) as exc:
        raise fail(str(exc)) from None
    out.print(f"wrote {path}")


@app.command()
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
    from workers.commands.demo import Demo, Output, SampleFeed

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


# The thesaurus audit (workers/commands/audit_cli.py): coherence of the synonym sets, votes.
from workers.commands.audit_cli import audit_app, thesaurus_coherence  # noqa: E402

thesaurus_app.command("coherence")(thesaurus_coherence)
app.add_typer(audit_app, name="audit")


def _os_error(exc: OSError) -> str:
    """``[Errno 2] No such file...: 'x'`` → ``x: No such file or directory``."""
    where = exc.filename if exc.filename is not None else ""
    what = exc.strerror or str(exc)
    return f"{where}: {what}" if where else what


def main(argv: list[str] | None = None) -> int:
    """The console script: every failure ends as one line on stderr and an exit code --
    2 for a usage error (found before any work), 1 for a runtime failure, 0 only when
    the work was done. ``REVAL_DEBUG=1`` re-raises with the traceback."""
    debug = os.environ.get("REVAL_DEBUG", "") not in ("", "0")
    try:
        code = app(args=argv, prog_name="reval", standalone_mode=False)
    except typer.TyperException as exc:  # click's usage errors (typer vendors click)
        message = exc.format_message()
        show = getattr(exc, "show", None)
        if exc.exit_code == 2 and message.lstrip().startswith("Usage:") and show is not None:
            show()  # a bare group (`reval thesaurus`): its help, as click prints it
            return 2
        ctx = getattr(exc, "ctx", None)
        where = f"{ctx.command_path}: " if ctx is not None else ""
        err.print(f"[bold red]error:[/] {where}{message}", highlight=False, soft_wrap=True)
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        err.print("interrupted")
        return 130
    except OSError as exc:
        if debug:
            raise
        err.print(f"[bold red]error:[/] {redact(_os_error(exc))}", highlight=False, soft_wrap=True)
        return 1
    except Exception as exc:  # a bug: still one line, the traceback on request
        if debug:
            raise
        err.print(
            f"[bold red]error:[/] unexpected {type(exc).__name__}: {redact(str(exc))} "
            "(REVAL_DEBUG=1 shows the traceback; please report it)",
            highlight=False,
            soft_wrap=True,
        )
        return 1
    return code if isinstance(code, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
