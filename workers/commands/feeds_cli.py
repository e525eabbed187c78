"""Feeds in and events out: ``reval replay`` (archived feeds into Kafka) and ``reval recommend``
(a baseline recommender's events)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import (
    Progress,
    SpinnerColumn,
    TextColumn,
)
from rich.table import Table

from stream.feeds.retention import Timestamps, replay_refusal
from stream.intake.records import ErrorLog
from workers.adapters.files.feeds import check_output_path, check_paths
from workers.commands.console import (
    Broker,
    JsonSummary,
    err,
    fail,
    out,
    why_nothing,
)
from workers.settings import Settings


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
    broker: Broker = None,
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
    timestamps: Annotated[
        str,
        typer.Option(
            help="Kafka timestamps: event (the record's event time; refused, exit 2 and nothing sent, "
            "where the topic's retention would delete it) or now (the time of sending; the event "
            "time stays in each record)"
        ),
    ] = "event",
    as_json: JsonSummary = False,
) -> None:
    """Replay archived feeds into Kafka (original line bytes, key = tweet id, timestamp = event time)."""

    from stream.feeds import replay as rp
    from workers.adapters.files.feeds import read_feeds

    if kind is not None and kind not in tuple(rp.Kind):
        raise fail(f"--kind must be one of {', '.join(rp.Kind)}, not {kind!r}")
    if timestamps not in tuple(Timestamps):
        raise fail(f"--timestamps must be one of {', '.join(Timestamps)}, not {timestamps!r}")
    try:
        pace = rp.parse_speed(speed)
        lower = rp.parse_bound(start) if start else None
        upper = rp.parse_bound(end) if end else None
        settings = Settings.load()
        chosen = _feed_kind(feeds, kind, topic, settings, from_line)
    except (ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    topic = topic or (settings.topic_tweets if chosen is rp.Kind.tweets else settings.topic_recommendations)
    bootstrap = broker or settings.broker
    sink = _open_sink(settings, bootstrap, topic)
    refuse = _retention_check(settings, bootstrap, topic, feeds, Timestamps(timestamps))
    progress, report, state = _replay_progress(topic)

    def run() -> None:
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
                timestamps=timestamps,
                refuse=refuse,
            )

    code, message = _outcome(run, sink.close)
    if state:
        _print_replay(state[0], topic, bootstrap, as_json)
    if message is not None:
        err.print(f"[bold red]error:[/] {message}", soft_wrap=True, highlight=False)
        raise typer.Exit(code=code)


def _open_sink(settings: Settings, bootstrap: str, topic: str) -> Any:
    """A producer to ``topic``, the topic created where it is missing."""
    from workers.adapters.kafka.kafka_client import KafkaSink, ensure_topic

    try:
        options = settings.kafka_client_options()
        if ensure_topic(
            bootstrap, topic, settings.partitions, timeout=15, configs=settings.topic_configs(), **options
        ):
            err.print(f"created topic {topic!r} with {settings.partitions} partitions")
        return KafkaSink(bootstrap, topic, **options)
    except Exception as exc:
        raise fail(f"cannot use broker {bootstrap}: {exc}") from None


def _retention_check(
    settings: Settings, bootstrap: str, topic: str, feeds: list[Path], timestamps: Timestamps
) -> Callable[[int], str | None] | None:
    """What :func:`stream.feeds.replay.replay` asks before sending: would ``topic`` keep a record
    stamped so?  None (nothing asked) where the broker does not describe topic settings."""
    from workers.adapters.files.feeds import feed_bytes
    from workers.adapters.kafka.kafka_client import BrokerError, topic_retention

    try:
        retention = topic_retention(bootstrap, [topic], timeout=15, **settings.kafka_client_options())[topic]
    except BrokerError as exc:
        err.print(f"[yellow]warning:[/] retention of {topic!r} not checked: {exc}", highlight=False)
        return None
    if retention is None:
        return None
    size = feed_bytes(feeds) if retention.retention_bytes >= 0 else None

    def refuse(first_ms: int) -> str | None:
        return replay_refusal(
            retention,
            oldest_ms=first_ms,
            now_ms=int(time.time() * 1000),
            size_bytes=size,
            timestamps=timestamps,
        )

    return refuse


def _outcome(run: Callable[[], None], close: Callable[[], None]) -> tuple[int, str | None]:
    """Run the replay, then close its sink: (exit code, error message or None)."""
    from stream.feeds import replay as rp

    try:
        run()
    except rp.ReplayError as exc:
        return exc.exit_code, str(exc)
    except ValueError as exc:
        return 2, str(exc)
    except KeyboardInterrupt:
        return 130, "interrupted"
    finally:
        close()
    return 0, None


def _feed_kind(
    feeds: list[Path], kind: str | None, topic: str | None, settings: Settings, from_line: int
) -> Any:
    """--kind, else the kind of the first good record, else the topic's name's, else tweets
    (a warning where the topic's name and the feed disagree)."""
    from stream.feeds import replay as rp
    from workers.adapters.files.feeds import detect_file_kind

    if kind:
        return rp.Kind(kind)
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
    return chosen


def _replay_progress(topic: str) -> tuple[Progress, Any, list[Any]]:
    """The replay's status line, the ``on_progress`` callback that updates it, and the list
    that callback keeps the last summary in."""
    from rich.progress import TimeElapsedColumn as Elapsed

    from stream.feeds import replay as rp

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

    return progress, report, state


def _print_replay(summary: Any, topic: str, bootstrap: str, as_json: bool) -> None:
    from stream.feeds import replay as rp

    if as_json:
        print(json.dumps({**summary.as_dict(), "topic": topic, "broker": bootstrap}))
    else:
        table = Table(title=f"replay → {topic} ({bootstrap})", show_header=False)
        for label, value in rp.summary_rows(summary):
            table.add_row(label, value)
        out.print(table)


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
    broker: Broker = None,
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

    from stream.evaluation import recommenders as rec
    from workers.adapters.encoding.word_vectors import trainer
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
    train_ids, train_errors = _train(recommender, method, train, language_filter)
    if topic is not None and broker is None:
        broker = Settings.load().broker

    try:
        options = Settings.load().kafka_client_options() if topic is not None else {}
        sink = EventSink(out_path, topic=topic, broker=broker, **options)
    except Exception as exc:  # kafka-python raises its own NoBrokersAvailable etc.
        raise fail(f"cannot open the output: {exc}", code=1) from None
    with sink:
        errors, skipped, overlap, empty = _recommend_feed(
            recommender, feed, sink, r, train_ids, with_truth=with_truth, all_tweets=all_tweets
        )
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
        why = why_nothing(errors, f"{skipped} tweets without hashtags; --all-tweets takes those too")
        raise fail(f"no event written: no tweet of --feed to recommend for{why}", code=1)


def _train(
    recommender: Any, method: str, train: list[Path], language_filter: bool
) -> tuple[set[str], ErrorLog]:
    """The recommender fitted on the labelled tweets of --train: (their ids, the bad lines)."""
    import warnings

    from stream.evaluation import recommenders as rec
    from workers.adapters.files.feeds import read_tweets

    train_errors = ErrorLog()
    with err.status(f"training {method} on {', '.join(map(str, train))}"):
        tweets = rec.labelled_tweets(read_tweets(train), language_filter=language_filter, errors=train_errors)
        if not tweets:
            why = why_nothing(train_errors, "none kept after pre-processing")
            raise fail(f"no hashtagged training tweet in --train{why}", code=1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            recommender.fit(tweets)
    for warning in caught:
        err.print(f"[yellow]warning:[/] {warning.message}")
    return {t.id for t in tweets}, train_errors


def _recommend_feed(
    recommender: Any,
    feed: list[Path],
    sink: Any,
    r: int,
    train_ids: set[str],
    *,
    with_truth: bool,
    all_tweets: bool,
) -> tuple[ErrorLog, int, int, int]:
    """One event per tweet of --feed, in batches: (bad lines, tweets skipped for having no
    hashtag, tweets that are also training tweets, events with no recommendation)."""
    from stream.evaluation import recommenders as rec
    from workers.adapters.files.feeds import read_tweets

    errors, skipped, overlap, empty = ErrorLog(), 0, 0, 0
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
    return errors, skipped, overlap, empty
