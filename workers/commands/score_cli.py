"""``reval score``: #REval-hit-ratio and exact-match metrics over a file of recommendation events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from stream.evaluation.scoring import ALL, parse_ints, r_label, score_batch
from stream.evaluation.signals import SIGNALS
from stream.evaluation.summary import Summary
from stream.intake.records import ErrorLog, Recommendation, RecordError, parse_recommendation
from workers.adapters.files.annoy_thesaurus import neighbour_cache
from workers.adapters.files.feeds import check_output_path, check_paths, read_file
from workers.commands.console import (
    JsonObject,
    ThesaurusPath,
    fail,
    load_or_fail,
    out,
    report_bad_lines,
    why_nothing,
)


def score(
    recs: Annotated[Path, typer.Argument(metavar="EVENTS", help="Recommendation events, JSON lines")],
    thesaurus: ThesaurusPath,
    ks: Annotated[str, typer.Option("-k", help="Comma-separated k values")] = "0,5,10",
    rs: Annotated[
        str, typer.Option("-r", help="Top-r cut-offs, comma-separated; 'all' = whole list")
    ] = "all",
    as_json: JsonObject = False,
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
    index = load_or_fail(thesaurus)
    try:
        cache = neighbour_cache(index, max(k_values))
    except ValueError as exc:
        raise fail(f"-k: {exc}") from None
    summary, errors = Summary(), ErrorLog()
    sink = events_out.open("w", encoding="utf-8") if events_out else None

    def score(events: list[Recommendation]) -> None:
        batch = score_batch([(e, e.ground_truth or ()) for e in events], cache, k_values, r_values)
        summary.update_batch(batch)
        if sink is not None:
            sink.writelines(json.dumps(record) + "\n" for record in batch.records())

    try:
        chunk: list[Recommendation] = []
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
            chunk.append(event)
            if len(chunk) >= CHUNK:
                score(chunk)
                chunk = []
        score(chunk)
    finally:
        if sink is not None:
            sink.close()
    report_bad_lines(errors)
    payload: dict[str, Any] = summary.get(r_values[0] if len(r_values) == 1 else ALL)
    if not payload["events"]:
        hint = f"; {WITH_TRUTH}" if errors.by_reason.get("no_ground_truth") else ""
        raise fail(f"no event of {recs} could be scored{why_nothing(errors)}{hint}", code=1)
    payload["thesaurus_version"] = cache.version
    payload["skipped_lines"] = errors.total
    if len(r_values) > 1 or r_values != [ALL]:
        payload["by_r"] = {r_label(r): summary.get(r) for r in r_values}
    if as_json:
        print(json.dumps(payload))
        return
    _print_scores(payload, k_values, r_values, summary)


#: Events scored together (:func:`stream.evaluation.scoring.score_batch`).
CHUNK = 1024

#: What to do about events without ground truth (``reval score`` needs it).
WITH_TRUTH = (
    "write the events with `reval recommend --with-truth` to carry each tweet's hashtags as ground_truth"
)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _print_scores(payload: dict[str, Any], ks: list[int], rs: list[int | None], summary: Summary) -> None:
    out.print(
        f"events {payload['events']}  unscorable {payload['unscorable']}  "
        f"thesaurus {payload['thesaurus_version']}"
    )
    first, *others = SIGNALS
    corrected = (
        "reval_hit_ratio_corrected",
        "chance-corrected #REval-hit-ratio (0 = random, 1 = best; 95% interval)",
    )
    for field, title in [(first.key, first.title), corrected, *((s.key, s.title) for s in others)]:
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
