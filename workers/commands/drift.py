"""``reval thesaurus diff OLD NEW [--json]``: which hashtags' meaning moved between two
thesaurus versions (:mod:`stream.synonyms.drift`), as a table or one JSON object."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from stream.synonyms.drift import Quantiles, ThesaurusDrift, recorded_examples
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus, thesaurus_drift
from workers.adapters.files.store import load_thesaurus


def _open(path: Path) -> AnnoyThesaurus:
    try:
        loaded = load_thesaurus(path)
    except OSError as exc:
        # A missing or unreadable argument is a usage error like any other (exit 2).
        raise ValueError(str(exc)) from None
    if not isinstance(loaded, AnnoyThesaurus):
        raise ValueError(
            f"{path} is a JSON thesaurus: it has no vectors to compare (give a thesaurus directory)"
        )
    return loaded


def thesaurus_diff(old: Path, new: Path, as_json: bool, top: int, min_support: int) -> int:
    """Compare thesaurus ``old`` with ``new`` (each a thesaurus directory, or a store: its
    current version) and print the ``top`` movers among hashtags with at least
    ``min_support`` tweets in both, and the summary.  Returns 0; a bad argument or two
    versions that cannot be compared raise :class:`ValueError` (one line)."""
    if top < 0:
        raise ValueError(f"--top must be 0 or more, got {top}")
    if min_support < 0:
        raise ValueError(f"--min-support must be 0 or more, got {min_support}")
    before = _open(old)
    try:
        after = _open(new)
        try:
            drift = thesaurus_drift(before, after, min_support=min_support, top=top)
            # Example tweets of each side, where the index job recorded them for this pair.
            drift = recorded_examples(drift, after.metadata.drift, before.metadata.version)
        finally:
            after.close()
    finally:
        before.close()
    if as_json:
        print(json.dumps(drift.to_dict(), ensure_ascii=False))
    else:
        _print(drift, old, new, min_support)
    return 0


def _fmt(q: Quantiles | None) -> str:
    return "-" if q is None else f"{q.p50:.3f} / {q.p90:.3f} / {q.p99:.3f}"


def _print(drift: ThesaurusDrift, old: Path, new: Path, min_support: int) -> None:
    out = Console()  # stdout as it is at the call (tests capture it)
    tested = drift.ranked_by == "effect_low"
    if drift.movers:
        title = (
            f"hashtags whose tweets since OLD surely moved furthest beyond their spread: ranked by "
            f"the effect's lower 95% end (≥ {min_support} tweets before and since; * = shifted at 1% FDR)"
            if tested
            else f"hashtags whose meaning moved most (support ≥ {min_support} in both; cosine of the means)"
        )
        movers = Table(title=title)
        columns = ["hashtag", "effect [95%]"] if tested else ["hashtag"]
        for column in (*columns, "cosine", "jaccard", "support old/new", "old top-10", "new top-10"):
            movers.add_column(column, overflow="fold")
        for m in drift.movers:
            support = f"{'?' if m.support_old is None else m.support_old}/"
            support += "?" if m.support_new is None else str(m.support_new)
            effect = (
                [f"{m.effect:.2f}{'*' if m.significant else ''} [{m.effect_low:.2f}, {m.effect_high:.2f}]"]
                if tested and m.effect is not None and m.effect_low is not None and m.effect_high is not None
                else []
            )
            movers.add_row(
                escape(f"#{m.hashtag}"),
                *effect,
                f"{m.cosine:.3f}",
                f"{m.jaccard:.2f}",
                support,
                _neighbours(m.old_neighbours, m.new_neighbours),
                _neighbours(m.new_neighbours, m.old_neighbours),
            )
        out.print(movers)
        for m in [m for m in drift.movers if m.examples_before or m.examples_since][:3]:
            out.print(f"#{escape(m.hashtag)}, tweets up to OLD / since OLD:")
            for side, texts in (("before", m.examples_before), ("since", m.examples_since)):
                out.print(f"    {side}: {escape(' | '.join(texts) or '(none sampled)')}")
    else:
        out.print(f"no hashtag with support ≥ {min_support} in both versions moved")
    summary = Table(title=f"drift {old} → {new}", show_header=False)
    share = drift.share_top10_changed_over_half
    for key, value in (
        ("hashtags in both", str(drift.compared)),
        ("only in old", str(drift.only_old)),
        ("only in new", str(drift.only_new)),
        ("1 - cosine p50 / p90 / p99", _fmt(drift.shift_quantiles)),
        ("1 - Jaccard(top-10) p50 / p90 / p99", _fmt(drift.jaccard_quantiles)),
        ("top-10 changed by more than half", "-" if share is None else f"{share:.1%}"),
        (
            "shifted beyond their spread (1% FDR)",
            "-" if drift.significant is None else str(drift.significant),
        ),
    ):
        summary.add_row(key, value)
    out.print(summary)


def _neighbours(these: tuple[str, ...], others: tuple[str, ...]) -> str:
    # Bold: the neighbours the other version does not have, where the meaning moved.
    return " ".join(escape(f"#{h}") if h in others else f"[bold]{escape(f'#{h}')}[/]" for h in these)
