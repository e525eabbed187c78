"""The docs site's generated pages: MkDocs hooks (``mkdocs.yml``: ``hooks``) that add, at build
time, the pages whose source of truth is not in ``docs/``.

* ``configuration.md`` from :class:`workers.settings.Settings` (every ``REVAL_*`` setting);
* ``cli.md`` from the Typer app (every ``reval`` command's ``--help``);
* ``index.md`` (the home page) from ``README.md``, ``benchmarks.md`` from ``BENCHMARKS.md`` and
  ``deploy.md`` from ``deploy/README.md``, their
  relative links re-pointed at the site (a link to a file outside ``docs/`` becomes the
  file's path in code: the site publishes pages, not the source tree).

Nothing generated is committed, so a page cannot drift from its source; ``tests/test_docs.py``
builds the site with ``--strict`` (a broken link or a page outside the nav fails it).
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

import typer
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

from workers.settings import settings_table

ROOT = Path(__file__).resolve().parents[2]

# Repository files published as site pages (repository path -> page).
INCLUDED = {"BENCHMARKS.md": "benchmarks.md", "deploy/README.md": "deploy.md", "README.md": "index.md"}

_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def site_link(target: str, source: str, page: str) -> str | None:
    """Where a relative link ``target`` written in repository file ``source`` points from site
    page ``page``; ``None`` when it points outside the site (a source file).

    >>> site_link("docs/experiment.md#x", "README.md", "benchmarks.md")
    'experiment.md#x'
    >>> site_link("../BENCHMARKS.md", "deploy/README.md", "deploy.md")
    'benchmarks.md'
    >>> site_link("bench/bench_redis.py", "BENCHMARKS.md", "benchmarks.md") is None
    True
    """
    path, _, anchor = target.partition("#")
    suffix = f"#{anchor}" if anchor else ""
    if not path:
        return target
    repo_path = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
    if (ROOT / repo_path).is_dir():  # a folder is source, not a page
        return None
    if repo_path in INCLUDED:
        site_path = INCLUDED[repo_path]
    elif repo_path.startswith("docs/"):
        site_path = repo_path[len("docs/") :]
    else:
        return None
    return posixpath.relpath(site_path, posixpath.dirname(page) or ".") + suffix


def rewrite_links(markdown: str, source: str, page: str) -> str:
    """``markdown`` from repository file ``source`` with every relative link re-pointed for
    site page ``page`` (absolute URLs and in-page anchors unchanged)."""

    def one(match: re.Match[str]) -> str:
        bang, text, target = match.groups()
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            return match.group(0)
        where = site_link(target, source, page)
        if where is not None:
            return f"{bang}[{text}]({where})"
        shown = target.split("#")[0]
        return f"`{shown}`" if text.strip("`") == shown else f"{text} (`{shown}`)"

    return _LINK.sub(one, markdown)


def configuration_page() -> str:
    return (
        "# Configuration\n\n"
        "Every worker and command reads its settings from `REVAL_*` environment variables (or an\n"
        "`.env` file); command-line options override them. This page is generated from\n"
        "`workers/settings.py` when the site is built, so it always lists what the code reads.\n"
        "In Kubernetes, the chart's `settings` (every role) and `roles.<role>.settings` take the\n"
        "same names ([Deploying](deploy.md)).\n\n" + settings_table() + "\n"
    )


def cli_page() -> str:
    """Every command's ``--help``, as ``reval`` prints it, one section per command."""
    from workers.commands.cli import app

    root = typer.main.get_command(app)
    sections = [
        "# Command-line reference\n\n"
        "Generated from the `reval` command's own help when the site is built.\n"
        "A tour of what to run when is in [Using it](commands.md).\n"
    ]

    # Typer may build its commands on its own copy of click: read them by what they do
    # (make_context, get_help, list_commands), not by their class.
    def walk(command: Any, path: list[str], parent: Any) -> None:
        ctx = command.make_context(path[-1], [], parent=parent, resilient_parsing=True)
        level = "#" * min(len(path) + 1, 4)
        sections.append(f"{level} `{' '.join(path)}`\n\n```text\n{command.get_help(ctx)}\n```\n")
        if hasattr(command, "list_commands"):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    walk(sub, [*path, name], ctx)

    walk(root, ["reval"], None)
    return "\n".join(sections)


def included_page(source: str) -> str:
    return rewrite_links((ROOT / source).read_text(), source, INCLUDED[source])


def generated_pages() -> dict[str, str]:
    """Site page -> its Markdown, for every page the build generates."""
    pages = {"configuration.md": configuration_page(), "cli.md": cli_page()}
    for source, page in INCLUDED.items():
        pages[page] = included_page(source)
    return pages


def on_files(files: Files, config: MkDocsConfig, **_: Any) -> Files:
    """MkDocs hook: add the generated pages to the build."""
    for page, text in generated_pages().items():
        files.append(File.generated(config, page, content=text))
    return files
