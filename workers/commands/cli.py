"""The ``reval`` command line: the command groups wired into one Typer app, and :func:`main`,
which turns every failure into one line on stderr and an exit code.

Each command lives with its group: :mod:`.thesaurus_cli` (thesaurus build, inspect, diff;
synonyms), :mod:`.score_cli` (score), :mod:`.ops_cli` (worker, admin, broker, tokenize, demo),
:mod:`.feeds_cli` (replay, recommend), :mod:`.experiment_cli` (evaluate, backtest, report),
:mod:`.audit_cli` (thesaurus coherence, audit); what they share is :mod:`.console`.
"""

from __future__ import annotations

import os
import sys

import typer

from workers.commands import experiment_cli, feeds_cli, ops_cli, score_cli, thesaurus_cli
from workers.commands.audit_cli import audit_app, thesaurus_coherence
from workers.commands.console import err
from workers.redaction import redact

app = typer.Typer(  # the console script ``reval``
    help="#REval: semantic evaluation of hashtag recommenders on tweet feeds.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,  # click's plain help: no `<bool>` metavars, option names never cut at 80 columns
    add_completion=False,
)

# Registered in the order `reval --help` lists them.
thesaurus_app = thesaurus_cli.thesaurus_app
thesaurus_app.command("coherence")(thesaurus_coherence)
app.add_typer(thesaurus_app, name="thesaurus")
admin_app = ops_cli.admin_app
app.add_typer(admin_app, name="admin")
app.command()(thesaurus_cli.synonyms)
app.command()(score_cli.score)
app.command()(ops_cli.worker)
app.command("tokenize")(ops_cli.tokenize_cmd)
app.command("broker")(ops_cli.local_broker)
app.command("replay")(feeds_cli.replay_feeds)
app.command("recommend")(feeds_cli.recommend_cmd)
app.command("evaluate")(experiment_cli.evaluate_cmd)
app.command("backtest")(experiment_cli.backtest_cmd)
app.command("report")(experiment_cli.report_cmd)
app.command()(ops_cli.demo)
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
