"""The ``reval`` command line.  Thin: argument handling and printing around the core."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from stream.feeds import ErrorLog, read_file
from stream.hashtags import normalise_hashtag
from stream.records import parse_recommendation
from stream.scoring import ALL, NeighbourCache, Summary, parse_ints, r_label, score_event
from stream.thesaurus import load_thesaurus

app = typer.Typer(
    help="#REval: semantic evaluation of hashtag recommenders on tweet feeds.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
thesaurus_app = typer.Typer(help="Build and inspect hashtag thesauri.", no_args_is_help=True)
app.add_typer(thesaurus_app, name="thesaurus")

err = Console(stderr=True)
out = Console()


def fail(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code=2)


def _progress() -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        MofNCompleteColumn(),
        TextColumn("lines"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[rate]}"),
        console=err,
        transient=False,
    )


@thesaurus_app.command("build")
def thesaurus_build(
    feeds: Annotated[list[Path], typer.Argument(help="Tweet files: .jsonl, .jsonl.gz or .csv")],
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write the thesaurus to")],
    model: Annotated[
        str, typer.Option(help="Hub id or local path; 'minilm' = the packaged MiniLM")
    ] = "vinai/bertweet-base",
    min_count: Annotated[int, typer.Option(help="Leave out hashtags seen fewer times")] = 1,
    batch_size: Annotated[int, typer.Option(help="Encoder batch size")] = 32,
    n_trees: Annotated[int, typer.Option(help="Annoy trees")] = 50,
    language_filter: Annotated[
        bool, typer.Option(help="Drop non-English tweets (paper 3.1.1)")
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON")] = False,
) -> None:
    """Clean → embed → per-hashtag running means → Annoy thesaurus."""
    from stream.batch import build_thesaurus
    from stream.cleaning import Cleaner
    from stream.encoder import Encoder

    for feed in feeds:
        if not feed.exists():
            raise fail(f"feed file not found: {feed}")
    try:
        encoder = Encoder(model, batch_size=batch_size)
    except OSError as exc:
        raise fail(f"cannot load model {model!r}: {exc}") from None
    err.print(
        f"encoder: {encoder.model_id} on {encoder.device} ({encoder.dtype}), dim {encoder.dim}"
    )
    with _progress() as progress:
        task = progress.add_task("embedding", total=None, rate="")
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
                cleaner=Cleaner(language_filter=language_filter),
                on_progress=tick,
            )
        except ValueError as exc:
            raise fail(str(exc)) from None
        progress.update(task, completed=done[0])
    thesaurus.save(out_dir)
    summary = {**report.as_dict(), "out": str(out_dir), "version": thesaurus.version}
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    table = Table(title="thesaurus build", show_header=False)
    for key, value in summary.items():
        if key == "first_bad_lines":
            value = "\n".join(value) if value else "-"  # type: ignore[arg-type]
        table.add_row(key, str(value))
    out.print(table)


def _load(thesaurus: str) -> Any:
    try:
        return load_thesaurus(thesaurus)
    except (OSError, ValueError) as exc:
        raise fail(str(exc)) from None


@app.command()
def synonyms(
    hashtags: Annotated[list[str], typer.Argument(help="Hashtags, with or without #")],
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
    recs: Annotated[Path, typer.Argument(help="Recommendation events, JSON lines")],
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
        r_values = list(parse_ints(rs, allow_all=True))
    except ValueError as exc:
        raise fail(str(exc)) from None
    if not recs.exists():
        raise fail(f"recommendations file not found: {recs}")
    index = _load(thesaurus)
    cache = NeighbourCache(index, max_k=max(k_values))
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
                errors.by_reason["no_ground_truth"] = errors.by_reason.get("no_ground_truth", 0) + 1
                if len(errors.first) < errors.keep:
                    errors.first.append(f"{recs}:{item.line}: no ground_truth in the event")
                continue
            result = score_event(event, event.ground_truth, cache, k_values, r_values)
            summary.update(result)
            if sink is not None:
                sink.write(json.dumps(result.to_json()) + "\n")
    finally:
        if sink is not None:
            sink.close()
    if errors.total:
        err.print(f"[yellow]skipped {errors.total} bad lines[/] {errors.by_reason}")
        for line in errors.first:
            err.print(f"  {line}")
    payload: dict[str, Any] = summary.get(r_values[0] if len(r_values) == 1 else ALL)
    payload["thesaurus_version"] = cache.version
    payload["skipped_lines"] = errors.total
    if len(r_values) > 1 or r_values != [ALL]:
        payload["by_r"] = {r_label(r): summary.get(r) for r in r_values}
    if as_json:
        print(json.dumps(payload))
        return
    _print_scores(payload, k_values, r_values, summary)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _print_scores(
    payload: dict[str, Any], ks: list[int], rs: list[int | None], summary: Summary
) -> None:
    out.print(
        f"events {payload['events']}  unscorable {payload['unscorable']}  "
        f"thesaurus {payload['thesaurus_version']}"
    )
    table = Table(title="average #REval-hit-ratio")
    table.add_column("r")
    for k in ks:
        table.add_column(f"k={k}", justify="right")
    for r in rs:
        by_k = summary.get(r)["by_k"]
        table.add_row(r_label(r), *(_fmt(by_k.get(str(k), {}).get("reval_hit_ratio")) for k in ks))
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


@app.command()
def worker(
    roles: Annotated[list[str], typer.Argument(help="embed, index, score (several = one process)")],
    broker: Annotated[str | None, typer.Option(help="Kafka bootstrap host:port [REVAL_BROKER]")] = None,
    redis_url: Annotated[str | None, typer.Option(help="[REVAL_REDIS_URL]")] = None,
    model: Annotated[str | None, typer.Option(help="Encoder model [REVAL_MODEL]")] = None,
    index_dir: Annotated[Path | None, typer.Option(help="Thesaurus store [REVAL_INDEX_DIR]")] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Prometheus port (embed 9101, index 9102, score 9103)")
    ] = None,
    loglevel: Annotated[str, typer.Option(help="Log level")] = "info",
) -> None:
    """Run worker roles against a Kafka broker and Redis (settings: REVAL_* env, see README)."""
    from workers.run import run_worker

    overrides = {
        "broker": broker,
        "redis_url": redis_url,
        "model": model,
        "index_dir": index_dir,
        "metrics_port": metrics_port,
    }
    try:
        run_worker(roles, {k: v for k, v in overrides.items() if v is not None}, loglevel)
    except ValueError as exc:
        raise fail(str(exc)) from None


@app.command("broker")
def local_broker(
    port: Annotated[int, typer.Option(help="Port to listen on (127.0.0.1)")] = 9092,
) -> None:
    """Run a local Kafka-protocol broker (Tansu, in memory) for development, until Ctrl-C."""
    import time

    from workers.broker import LocalBroker
    from workers.settings import Settings

    with LocalBroker(port) as running:
        from workers.broker import create_topics

        create_topics(running.bootstrap, Settings().topics())
        err.print(f"broker at {running.bootstrap} (Ctrl-C stops it); topics created")
        try:
            while running.running:
                time.sleep(1)
        except KeyboardInterrupt:
            pass


def main() -> None:  # pragma: no cover - entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
