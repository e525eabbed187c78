"""``reval thesaurus build | inspect | diff`` and ``reval synonyms`` (``thesaurus coherence``
is :mod:`workers.commands.audit_cli`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from stream.feeds.batch import ModelLoadError
from stream.intake.hashtags import normalise_hashtag
from stream.intake.records import ErrorLog
from stream.synonyms.hubness import DEFAULT_METHOD, check_method
from workers.adapters.files.annoy_thesaurus import DEFAULT_DEPTH
from workers.adapters.files.feeds import check_paths
from workers.commands.console import (
    OFFLINE_HINT,
    BatchSize,
    Feeds,
    JsonObject,
    JsonSummary,
    LanguageFilter,
    ThesaurusPath,
    command_group,
    err,
    fail,
    line_progress,
    load_or_fail,
    out,
    why_nothing,
)

thesaurus_app = command_group("Build and inspect hashtag thesauri.")


@thesaurus_app.command("build")
def thesaurus_build(
    feeds: Feeds,
    out_dir: Annotated[Path, typer.Option("--out", help="New (or empty) directory for the thesaurus")],
    model: Annotated[
        str,
        typer.Option(
            help="Hub id (the default is downloaded once: needs the network, or HF_HUB_OFFLINE=1 "
            "with it cached), a local model directory, or 'minilm' (packaged, works offline)"
        ),
    ] = "vinai/bertweet-base",
    min_count: Annotated[int, typer.Option(help="Leave out hashtags seen fewer times", min=1)] = 1,
    batch_size: BatchSize = 32,
    n_trees: Annotated[int, typer.Option(help="Annoy trees", min=1)] = 50,
    hubness: Annotated[
        str,
        typer.Option(help="Neighbour ranking: center+csls (default), raw (the paper's), center, csls, mp"),
    ] = DEFAULT_METHOD,
    depth: Annotated[
        int, typer.Option(help="Neighbours per hashtag in the table (deeper queries use the index)", min=1)
    ] = DEFAULT_DEPTH,
    language_filter: LanguageFilter = True,
    force: Annotated[bool, typer.Option("--force", help="Replace a thesaurus already in --out")] = False,
    as_json: JsonSummary = False,
) -> None:
    """Clean → embed → per-hashtag running means → thesaurus (neighbour table + Annoy index)."""
    from workers.adapters.files.thesaurus_files import ThesaurusOverwriteError, check_writable_thesaurus_dir

    try:  # everything that can be checked is checked before the model loads
        check_paths(feeds)
        check_method(hubness)
        check_writable_thesaurus_dir(out_dir, replace=force)
    except (OSError, ValueError, ThesaurusOverwriteError) as exc:
        raise fail(str(exc)) from None
    total = _count_tweets(feeds)
    thesaurus, report = _embed_and_build(
        feeds,
        total,
        model=model,
        batch_size=batch_size,
        min_count=min_count,
        n_trees=n_trees,
        hubness=hubness,
        depth=depth,
        language_filter=language_filter,
    )
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
    _print_build(summary, hubness)


def _count_tweets(feeds: list[Path]) -> int:
    """A quick pass before the model loads: the bar gets a total and an ETA, and a feed
    with no readable tweet fails now, not after the model has loaded."""
    from workers.adapters.files.feeds import read_tweets

    total, bad = 0, ErrorLog()
    for item in read_tweets(feeds):
        total += 1
        if item.error is not None:
            bad.add(item)
    if total == bad.total:
        raise fail(f"no tweet to read in {', '.join(map(str, feeds))}{why_nothing(bad)}", code=1)
    return total


def _embed_and_build(
    feeds: list[Path],
    total: int,
    *,
    model: str,
    batch_size: int,
    min_count: int,
    n_trees: int,
    hubness: str,
    depth: int,
    language_filter: bool,
) -> tuple[Any, Any]:
    """The encoder loaded, the feeds embedded under a progress bar, the thesaurus built:
    (the thesaurus, its build report)."""
    from stream.intake.cleaning import Cleaner
    from workers.adapters.encoding.encoder import Encoder  # torch: seconds to import, so only now
    from workers.commands.offline import NothingToBuildError, build_thesaurus

    try:
        encoder = Encoder(model, batch_size=batch_size)
    except ModelLoadError as exc:
        raise fail(f"--model: {exc}{OFFLINE_HINT}", code=1) from None
    err.print(f"encoder: {encoder.model_id} on {encoder.device} ({encoder.dtype}), dim {encoder.dim}")
    with line_progress() as progress:
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
    return thesaurus, report


def _print_build(summary: dict[str, Any], method: str) -> None:
    table = Table(title="thesaurus build", show_header=False)
    for key, value in summary.items():
        if key == "first_bad_lines":
            value = "\n".join(value) if value else "-"
        if key == "hubness":
            continue
        table.add_row(key, str(value))
    out.print(table)
    _print_hubness(summary["hubness"] or {}, method)


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
    from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus

    th = load_or_fail(str(directory))
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
        moved = ", ".join(map(_mover, drift["movers"][:10]))
        out.print(f"moved most since {drift.get('from_version')}: {escape(moved)}")
    recent = drift.get("recent") or {}
    if recent.get("movers"):  # recent use against earlier use, from the window means
        moved = ", ".join(map(_mover, recent["movers"][:10]))
        shifted = (
            f"; {recent['significant']} shifted beyond their spread (*)" if "significant" in recent else ""
        )
        out.print(f"recent use furthest from earlier use: {escape(moved)}{shifted}")
        for m in recent["movers"][:3]:  # the two senses, for a person to read
            if m.get("neighbours") or m.get("examples_recent"):
                out.print(
                    f"  #{escape(m['hashtag'])}: now near {escape(', '.join(m.get('neighbours', [])[:5]))}"
                    f"; before near {escape(', '.join(m.get('old_neighbours', [])[:5]) or '-')}"
                )
                for side in ("before", "recent"):
                    texts = " | ".join(_clip(t) for t in m.get(f"examples_{side}", [])) or "(none sampled)"
                    out.print(f"    {side}: {escape(texts)}")


def _mover(m: dict[str, Any]) -> str:
    """A mover as inspect lists it: the effect and its 95% lower end (the ranking), ``*`` when
    shifted; versions written before the spread-aware test carry only the cosine."""
    if m.get("effect") is None:
        return f"#{m['hashtag']} ({m['cosine']:.2f})"
    star = "*" if m["significant"] else ""
    low = f" ≥ {m['effect_low']:.2f}" if m.get("effect_low") is not None else ""
    return f"#{m['hashtag']} (effect {m['effect']:.2f}{low}{star})"


def _clip(text: str, width: int = 70) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


@thesaurus_app.command("diff")
def thesaurus_diff_cmd(
    old: Annotated[Path, typer.Argument(metavar="OLD", help="The earlier thesaurus (directory or store)")],
    new: Annotated[Path, typer.Argument(metavar="NEW", help="The later thesaurus (directory or store)")],
    top: Annotated[int, typer.Option(help="Movers to list", min=0)] = 20,
    min_support: Annotated[
        int,
        typer.Option(help="Only hashtags with at least this many tweets in OLD and since OLD", min=0),
    ] = 5,
    as_json: JsonObject = False,
) -> None:
    """Which hashtags' meaning moved between two versions: each hashtag's tweets since OLD
    tested against its tweets up to OLD and their spread (movers ranked by the lower end of the
    effect's 95% interval; versions without raw means: by the cosine of the two means), the
    overlap of its top-10 neighbours."""
    from workers.commands.drift import thesaurus_diff

    try:
        thesaurus_diff(old, new, as_json, top, min_support)
    except ValueError as exc:
        raise fail(str(exc)) from None


def synonyms(
    hashtags: Annotated[list[str], typer.Argument(metavar="HASHTAG", help="Hashtags, with or without #")],
    thesaurus: ThesaurusPath,
    k: Annotated[int, typer.Option("-k", help="Number of synonyms", min=0)] = 10,
    as_json: Annotated[bool, typer.Option("--json", help='Print {"hashtag": [...]}')] = False,
) -> None:
    """Nearest synonyms of hashtags, nearest first."""
    index = load_or_fail(thesaurus)
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
