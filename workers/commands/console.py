"""What every ``reval`` command shares: the two consoles, the one-line error and its exit
code, the progress bars, the thesaurus opened or a usage error."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from stream.intake.records import ErrorLog
from workers.adapters.files.store import load_thesaurus
from workers.redaction import redact

#: The options several commands take, spelled once.
Feeds = Annotated[list[Path], typer.Argument(metavar="FEED", help="Tweet files: .jsonl, .jsonl.gz or .csv")]
LanguageFilter = Annotated[bool, typer.Option(help="Drop non-English tweets (paper 3.1.1)")]
Broker = Annotated[str | None, typer.Option(help="Kafka bootstrap host:port [REVAL_BROKER]")]
RedisUrl = Annotated[str | None, typer.Option(help="[REVAL_REDIS_URL]")]
ThesaurusPath = Annotated[str, typer.Option("--thesaurus", "-t", help="Thesaurus dir or .json")]
BatchSize = Annotated[int, typer.Option(help="Encoder batch size", min=1)]
#: ``--json`` of the commands whose JSON is one object, and of those that print a summary.
JsonObject = Annotated[bool, typer.Option("--json", help="Print one JSON object")]
JsonSummary = Annotated[bool, typer.Option("--json", help="Print the summary as JSON")]

OFFLINE_HINT = " (offline: a local model directory, or --model minilm, packaged)"
err = Console(stderr=True)
out = Console()


def command_group(help: str) -> typer.Typer:
    """A sub-command group of ``reval`` (``reval thesaurus``, ``reval admin`` ...): its help
    when called bare, and click's plain help like the top level (see ``workers.commands.cli``)."""
    return typer.Typer(help=help, no_args_is_help=True, rich_markup_mode=None)


def fail(message: str, *, code: int = 2) -> typer.Exit:
    """One line on stderr naming what is wrong; exit 2 for a usage error, 1 for a runtime
    failure.  A library's message may quote a secret setting: it is masked (workers.redaction)."""
    err.print(f"[bold red]error:[/] {redact(message)}", soft_wrap=True, highlight=False)
    return typer.Exit(code=code)


def line_progress() -> Progress:
    """A bar over the lines of a feed, with its rate (``task.fields[rate]``) on stderr."""
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


def load_or_fail(thesaurus: str) -> Any:
    """The thesaurus at ``thesaurus`` (:func:`workers.adapters.files.store.load_thesaurus`), or exit 2."""
    try:
        return load_thesaurus(thesaurus)
    except (OSError, ValueError) as exc:
        raise fail(str(exc)) from None


def report_bad_lines(errors: ErrorLog) -> None:
    if errors.total:
        err.print(f"[yellow]skipped {errors.total} bad lines[/] {errors.by_reason}", soft_wrap=True)
        for line in errors.first:
            err.print(f"  {line}", soft_wrap=True, highlight=False)


def why_nothing(errors: ErrorLog, otherwise: str = "it holds no records") -> str:
    """The reason a run produced nothing, for its one error line."""
    if not errors.total:
        return f" ({otherwise})"
    reasons = ", ".join(
        f"{n} {reason}" for reason, n in sorted(errors.by_reason.items(), key=lambda x: -x[1])
    )
    return f": all {errors.total} records were bad ({reasons})"


def progress_bars() -> tuple[Progress, Any]:
    """Progress bars on stderr for a long command, and the ``progress(description, total)``
    factory (:data:`stream.evaluation.experiment.ProgressFactory`) that opens one bar each."""
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


T = TypeVar("T")


def with_progress(
    run: Callable[[Any], T], *, errors: tuple[type[Exception], ...] = (OSError, ValueError), code: int = 2
) -> T:
    """``run(track)`` behind :func:`progress_bars`; one of ``errors`` is one line (:func:`fail`
    with ``code``) after the bars are closed."""
    progress, track = progress_bars()
    try:
        with progress:
            return run(track)
    except errors as exc:
        raise fail(str(exc), code=code) from None
