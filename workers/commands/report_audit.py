"""The report's thesaurus audit section: each refit's coherence lift (paper 003; synonym
clusters against random clusters of matched popularity) and agreement with people's votes
(paper 001's ρ_w, τ_w), from ``detection.json``'s ``thesaurus.refits[i].audit``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from workers.commands.report import _figure, _fmt, _get, _new, _note, _nums, _table, _time_axis, _when


def audit_section(d: dict[str, Any]) -> str:
    head = (
        '<section id="audit"><h2>(f) Thesaurus audit: coherence and agreement of each version</h2>'
        "<p><em>Coherence lift</em>: how much more coherent (exhaustive TF-IDF cosine, paper 003) a "
        "hashtag's tweets are together with its top-k synonyms' tweets than with the tweets of k "
        "random hashtags of matched popularity; 0 = the synonyms are no better than chance. "
        "<em>Agreement</em>: ρ_w and τ_w (paper 001, top ranks weigh most) between the version's "
        "ranking of the audited hashtag pairs and people's votes; 0 = unrelated.</p>"
    )
    refits = _get(d, "thesaurus", "refits")
    rows = [
        (t, r["audit"])
        for r in (refits if isinstance(refits, list) else [])
        if isinstance(r, dict) and isinstance(r.get("audit"), dict) and (t := _when(r.get("at"))) is not None
    ]
    if not rows:
        return head + _note("no audit in this run (a backtest of an older version)") + "</section>"
    return head + _plot(rows) + _rows_table(rows) + "</section>"


def _plot(rows: list[tuple[datetime, dict[str, Any]]]) -> str:
    times = [t for t, _ in rows]

    def col(*keys: str) -> list[float]:
        return _nums([_get(a, *keys) for _, a in rows])

    voted = any(a.get("agreement") for _, a in rows)
    fig, axes = _new(2 if voted else 1, 1, figsize=(9, 5.5 if voted else 3), sharex=True, squeeze=False)
    ax = axes[0][0]
    ax.fill_between(
        times, col("coherence", "tfidf", "lift_ci_low"), col("coherence", "tfidf", "lift_ci_high"), alpha=0.25
    )
    ax.plot(
        times, col("coherence", "tfidf", "lift"), "o-", ms=2.5, lw=1, label="coherence lift (TF-IDF), 95% CI"
    )
    ax.axhline(0.0, color="#555555", lw=0.8, ls="--", label="chance (random hashtags)")
    ax.set_ylabel("lift\n(synonyms − random)", fontsize=8)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    if voted:
        ax = axes[1][0]
        for key in ("tau_w", "rho_w"):
            ax.fill_between(
                times, col("agreement", f"{key}_ci_low"), col("agreement", f"{key}_ci_high"), alpha=0.2
            )
            ax.plot(times, col("agreement", key), "o-", ms=2.5, lw=1, label=f"{key}, 95% CI")
        ax.axhline(0.0, color="#555555", lw=0.8, ls="--", label="no agreement")
        ax.set_ylabel("agreement with votes\n(−1 .. 1)", fontsize=8)
        ax.legend(fontsize=7, loc="best")
        ax.grid(alpha=0.3)
    _time_axis(axes[-1][0])
    axes[-1][0].set_xlabel("refit time (event time, UTC)")
    fig.suptitle(
        "Each refit's thesaurus: coherence of its synonym sets" + (", agreement with people" if voted else "")
    )
    caption = (
        "Coherence over the tweets seen up to each refit (each hashtag's bottom-k sample, as the live "
        "reservoir keeps it). "
        + ("" if voted else "No audit votes were given (reval backtest --audit-votes).")
    )
    return _figure("audit", fig, caption)


def _ci(block: Any, key: str) -> str:
    value = _get(block, key)
    if value is None:
        return "—"
    low, high = _get(block, f"{key}_ci_low"), _get(block, f"{key}_ci_high")
    return f"{_fmt(value, '.4f')} [{_fmt(low, '.4f')}, {_fmt(high, '.4f')}]"


def _rows_table(rows: list[tuple[datetime, dict[str, Any]]]) -> str:
    body = []
    for t, a in rows:
        c = _get(a, "coherence", "tfidf")
        body.append(
            [
                t.date().isoformat(),
                _fmt(_get(c, "hashtags"), ".0f"),
                _fmt(_get(c, "synonyms"), ".4f"),
                _fmt(_get(c, "random"), ".4f"),
                _ci(c, "lift"),
                _ci(_get(a, "agreement"), "tau_w"),
                _ci(_get(a, "agreement"), "rho_w"),
            ]
        )
    header = ["refit", "hashtags", "synonyms", "random", "lift [95% CI]", "τ_w [95% CI]", "ρ_w [95% CI]"]
    return _table(header, body, [False, True, True, True, True, True, True])
