"""The docs site and the README: ``mkdocs build --strict`` as ``make docs`` runs it (a broken
link, a missing anchor or a page outside the nav fails), the generated pages equal to what the
code defines (every setting, every command), no orphan page, and a README that fits a screen
and links only to what exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html import unescape
from pathlib import Path

import typer
import yaml

from workers.commands.cli import app
from workers.dev.docs_site import rewrite_links, site_link
from workers.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def build_site(out: Path) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def text_of(html: str) -> str:
    return unescape(re.sub(r"<[^>]+>", "", html))


def test_the_site_builds_strictly_with_every_setting_and_command(tmp_path: Path) -> None:
    out = build_site(tmp_path / "site")
    configuration = text_of((out / "configuration.html").read_text())
    for name, field in Settings.model_fields.items():
        assert f"REVAL_{name.upper()}" in configuration, name
        assert (field.description or "")[:30] in configuration, name
    cli = text_of((out / "cli.html").read_text())
    root = typer.main.get_command(app)
    assert isinstance(root, typer.core.TyperGroup)
    for name in root.list_commands(None):  # type: ignore[arg-type]
        assert f"reval {name}" in cli, name
    assert "reval thesaurus build" in cli and "reval admin accept-topic" in cli
    # the home page is the README; the deploy page is deploy/README.md, links re-pointed
    assert "Where to read on" in text_of((out / "index.html").read_text())
    assert "Kubernetes (Helm)" in text_of((out / "deploy.html").read_text())
    # no orphan: every page the nav leaves out is linked from a page (pages mkdocs built: an
    # HTML file docs/ only holds -- the backtest's report.html after `make docs` -- is an asset)
    built = (p for p in out.rglob("*.html") if 'name="generator" content="mkdocs-' in p.read_text())
    pages = {p.relative_to(out).as_posix() for p in built} - {"404.html", "search.html"}
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!", ""))["nav"]
    in_nav = {v.replace(".md", ".html") for v in _leaves(nav)}
    hrefs: set[str] = set()
    for page in pages:
        base = os.path.dirname(page)
        for href in re.findall(r'href="([^"#:]+)(?:#[^"]*)?"', (out / page).read_text()):
            hrefs.add(os.path.normpath(os.path.join(base, href)))
    orphans = sorted(p for p in pages - in_nav if p not in hrefs)
    assert not orphans, f"pages neither in the nav nor linked: {orphans}"


def _leaves(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [leaf for value in node.values() for leaf in _leaves(value)]
    if isinstance(node, list):
        return [leaf for item in node for leaf in _leaves(item)]
    return []


def test_links_from_repository_files_are_re_pointed_at_the_site() -> None:
    assert site_link("docs/backtest.md#x", "README.md", "index.md") == "backtest.md#x"
    assert site_link("../BENCHMARKS.md", "deploy/README.md", "deploy.md") == "benchmarks.md"
    assert site_link("README.md", "BENCHMARKS.md", "benchmarks.md") == "index.md"
    text = (
        "[bench](bench/bench_redis.py), [`tests/x.py`](tests/x.py), [web](https://x.org/a.md), [here](#top)"
    )
    assert rewrite_links(text, "BENCHMARKS.md", "benchmarks.md") == (
        "bench (`bench/bench_redis.py`), `tests/x.py`, [web](https://x.org/a.md), [here](#top)"
    )


def test_the_readme_is_one_screen_and_links_only_to_what_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 160, "the README is the front page: keep the reference in docs/"
    assert readme.count("make demo") >= 1 and "make test" in readme
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if not re.match(r"^[a-z]+:", target):
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
