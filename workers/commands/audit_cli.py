"""The thesaurus audit's commands: ``reval thesaurus coherence`` and ``reval audit
serve | report | simulate`` (registered by :mod:`workers.commands.cli`; the heavy helpers are
imported where used, to keep ``reval --help`` quick)."""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from stream.auditing.ballots import Protocol
from workers.commands.console import (
    OFFLINE_HINT,
    Broker,
    Feeds,
    JsonObject,
    command_group,
    err,
    fail,
    load_or_fail,
    out,
    with_progress,
)

audit_app = command_group(
    "Audit a thesaurus against people: a voting page, the agreement report, campaign sizing."
)


def _annoy(path: Path) -> Any:
    """A thesaurus directory (or a store's current version) with its index."""
    from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus

    thesaurus = load_or_fail(str(path))
    if not isinstance(thesaurus, AnnoyThesaurus):
        raise fail(f"--thesaurus {path}: the audit needs a thesaurus directory, not a JSON file")
    return thesaurus


def _popular_first(index: Any) -> list[str]:
    """The thesaurus's hashtags, most used first (the seeds of the semantic areas)."""
    counts = index.table.counts
    return [index.hashtags[i] for i in np.argsort(-counts, kind="stable")]


def thesaurus_coherence(
    feeds: Feeds,
    thesaurus: Annotated[Path, typer.Option("--thesaurus", "-t", help="Thesaurus directory (or store)")],
    k: Annotated[int, typer.Option("-k", help="Synonyms per cluster")] = 10,
    min_tweets: Annotated[int, typer.Option(help="Score hashtags with at least this many tweets")] = 5,
    sample: Annotated[int, typer.Option(help="Hashtags scored (a seeded random sample)")] = 200,
    seed: Annotated[int, typer.Option(help="Seed of the sample, the random clusters, the bootstrap")] = 0,
    per_hashtag: Annotated[
        int, typer.Option(help="Tweets sampled per hashtag (as REVAL_COHERENCE_RESERVOIR)")
    ] = 20,
    model: Annotated[
        str | None, typer.Option(help="Encoder for BERTScore [default: the thesaurus's model]")
    ] = None,
    as_json: JsonObject = False,
) -> None:
    """Thematic coherence of the synonym sets (paper 003): each hashtag's tweets with its
    top-k synonyms', against k random hashtags of matched popularity; exhaustive TF-IDF
    cosine and BERTScore F1, the lift with its 95% bootstrap interval."""
    from stream.feeds.batch import ModelLoadError
    from workers.adapters.files.feeds import check_paths
    from workers.commands.coherence import CoherenceConfig, run_coherence

    try:
        config = CoherenceConfig(k, min_tweets, sample, seed, per_hashtag, model).check()
        check_paths(feeds)
    except (OSError, ValueError) as exc:
        raise fail(str(exc)) from None
    index = _annoy(thesaurus)
    chosen = model or index.metadata.model_id
    from workers.adapters.encoding.encoder import Encoder  # torch: only now

    try:
        encoder = Encoder(chosen, dtype="float32")  # the same numbers on every machine
    except ModelLoadError as exc:
        raise fail(f"--model: {exc}{OFFLINE_HINT}", code=1) from None
    result = with_progress(
        lambda track: run_coherence(feeds, index, encoder, config, track), errors=(ValueError,), code=1
    )
    if as_json:
        print(json.dumps(result, ensure_ascii=False))
        return
    _print_coherence(result)


def _print_coherence(result: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(
        title=f"coherence of synonym sets (k={result['k']}) against random sets of matched popularity"
    )
    for column in ("metric", "synonyms", "random", "lift", "95% CI", "hashtags"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for name, m in result["metrics"].items():
        if m is None:
            table.add_row(name, "-", "-", "-", "-", "0")
            continue
        ci = f"[{m['lift_ci_low']:.4f}, {m['lift_ci_high']:.4f}]"
        table.add_row(
            name, f"{m['synonyms']:.4f}", f"{m['random']:.4f}", f"{m['lift']:+.4f}", ci, str(m["hashtags"])
        )
    out.print(table)
    out.print("least coherent synonym sets (BERTScore):", highlight=False)
    for row in result["hashtags"][:10]:
        value = row["bertscore"]["synonyms"]
        shown = "-" if value is None else f"{value:.3f}"
        out.print(
            f"  #{row['hashtag']} ({shown}): " + ", ".join(f"#{s}" for s in row["synonyms"]), highlight=False
        )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _examples(feeds: list[Path], hashtags: set[str]) -> dict[str, list[str]]:
    """Up to two tweets per hashtag, as written (a seeded-free bottom-k: always the same)."""
    from stream.auditing.coherence import bottom_k
    from workers.adapters.files.feeds import read_tweets

    pairs = []
    for item in read_tweets(feeds):
        if item.value is None:
            continue
        text = " ".join(item.value.text.split())
        for tag in set(item.value.hashtags) & hashtags:
            pairs.append((tag, text[:280]))
    return bottom_k(pairs, 2)


@audit_app.command("serve")
def serve_cmd(
    thesaurus: Annotated[
        Path, typer.Option("--thesaurus", "-t", help="The thesaurus to audit (directory or store)")
    ],
    port: Annotated[int, typer.Option(help="Port (0: any free one)", min=0, max=65535)] = 8321,
    host: Annotated[
        str, typer.Option(help="Address to listen on (beyond loopback: --token required)")
    ] = "127.0.0.1",
    audit: Annotated[
        str | None,
        typer.Option(help="Audit name (votes continue an audit of that name) [default: audit-VERSION]"),
    ] = None,
    feed: Annotated[list[Path] | None, typer.Option(help="Tweets to show as examples (repeatable)")] = None,
    areas: Annotated[int, typer.Option(help="Semantic areas (one campaign each)", min=1)] = 3,
    area_size: Annotated[int, typer.Option(help="Hashtags per area (items: all their pairs)", min=7)] = 10,
    ballots: Annotated[int, typer.Option(help="Ballots n_b (001: 2..10)")] = 3,
    alpha: Annotated[float, typer.Option(help="Share alpha of items kept for the next ballot")] = 0.3,
    m: Annotated[int, typer.Option("-m", help="Comparisons per item per ballot (M)")] = 4,
    seed: Annotated[int, typer.Option(help="Seed of the areas and of the comparisons")] = 0,
    token: Annotated[
        str | None, typer.Option(help="Require this token (or REVAL_AUDIT_TOKEN); open /?token=... once")
    ] = None,
    broker: Broker = None,
) -> None:
    """Serve the voting page: two pairs of hashtags at a time, the more related one picked
    by mouse or keyboard; votes go to the Kafka topic `votes` (001's adaptive ballots)."""
    from stream.auditing.audit import Plan, make_areas
    from workers.adapters.kafka.kafka_client import BrokerError
    from workers.service.audit_server import AuditServer, open_audit, serve
    from workers.service.thesaurus_audit import VoteLog
    from workers.settings import Settings

    token = token or os.environ.get("REVAL_AUDIT_TOKEN") or None
    if not _loopback(host) and not token:
        raise fail(f"--host {host} is reachable from other machines: set --token (or REVAL_AUDIT_TOKEN)")
    try:
        settings = Settings.load(**({"broker": broker} if broker else {}))
        if feed:
            from workers.adapters.files.feeds import check_paths

            check_paths(feed)
    except (OSError, ValueError) as exc:
        raise fail(str(exc)) from None
    index = _annoy(thesaurus)
    found = make_areas(_popular_first(index), index.neighbours, areas, area_size, np.random.default_rng(seed))
    if len(found) < areas:
        raise fail(f"--areas {areas}: the thesaurus has room for {len(found)} areas of {area_size} hashtags")
    name = audit or f"audit-{index.version}"
    try:
        plan = Plan(name, index.version, tuple(found), ballots, alpha, m, seed).check()
    except ValueError as exc:
        raise fail(str(exc)) from None
    log = VoteLog(settings)
    try:
        state = open_audit(log, plan)
    except BrokerError as exc:
        raise fail(f"--broker / REVAL_BROKER: {exc}", code=1) from None
    if state.plan != plan:
        err.print(
            f"audit {name} continues with the plan it was started with (seed {state.plan.seed}, "
            f"{len(state.plan.areas)} areas)",
            highlight=False,
        )
    hashtags = {h for a in state.plan.areas for h in a.hashtags}
    examples = _examples(list(feed), hashtags) if feed else {}
    server = AuditServer(state, log, examples, token)

    def ready(url: str) -> None:
        print(f"audit {name}: {url} ({state.votes} of {state.plan.comparisons} votes so far)", flush=True)

    serve(server, host, port, ready)


def _agreement_of(thesaurus: Any, state: Any, resamples: int, seed: int) -> dict[str, Any]:
    from stream.auditing.audit import agreement
    from stream.auditing.rankcorr import bootstrap_interval, tau_w
    from workers.service.thesaurus_audit import model_scores

    model = model_scores(state.plan, thesaurus)
    per_area, overall = agreement(state, model, resamples=resamples, seed=seed)
    rng = np.random.default_rng(seed)
    chance = []  # the baseline: τ_w of the people's ranking against shuffled thesaurus scores
    for _ in range(200):
        values = []
        for campaign, scores in zip(state.campaigns, model, strict=True):
            human = campaign.scores(provisional=True)
            known = np.isfinite(human)
            if known.sum() >= 2:
                values.append(tau_w(rng.permutation(scores[known]), human[known]))
        chance.append(float(np.nanmean(values)) if values else float("nan"))
    low, high = bootstrap_interval(chance)
    return {
        "thesaurus_version": thesaurus.version,
        "overall": overall.to_dict(),
        "areas": [{"seed": a.seed, **g.to_dict()} for a, g in zip(state.plan.areas, per_area, strict=True)],
        "chance": {"tau_w": float(np.nanmean(chance)), "tau_w_low": low, "tau_w_high": high},
    }


@audit_app.command("report")
def report_cmd(
    thesaurus: Annotated[
        Path, typer.Option("--thesaurus", "-t", help="A thesaurus directory, or a store: every version in it")
    ],
    audit: Annotated[str | None, typer.Option(help="Audit name [default: the last one planned]")] = None,
    resamples: Annotated[int, typer.Option(help="Bootstrap resamples of the votes", min=100)] = 1000,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap")] = 0,
    broker: Broker = None,
    as_json: JsonObject = False,
) -> None:
    """rho_w and tau_w between the thesaurus's ranking of the audited pairs and the
    people's, per semantic area and overall, with 95% bootstrap intervals and chance."""
    from stream.auditing.audit import replay
    from workers.adapters.files.store import ThesaurusStore
    from workers.adapters.files.thesaurus_files import is_our_thesaurus
    from workers.adapters.kafka.kafka_client import BrokerError
    from workers.service.thesaurus_audit import VoteLog, latest_audit
    from workers.settings import Settings

    if not thesaurus.exists():
        raise fail(f"--thesaurus {thesaurus} does not exist")
    store = ThesaurusStore(thesaurus)
    versions = [] if is_our_thesaurus(thesaurus) else store.versions()
    try:
        settings = Settings.load(**({"broker": broker} if broker else {}))
        events = VoteLog(settings).events()
    except ValueError as exc:
        raise fail(str(exc)) from None
    except BrokerError as exc:
        raise fail(f"--broker / REVAL_BROKER: {exc}", code=1) from None
    states = replay(events)
    state = latest_audit(states, audit)
    if state is None:
        known = ", ".join(states) or "none"
        raise fail(
            f"no audit {audit or ''} in topic {settings.topic_votes} (audits: {known})".replace("  ", " "),
            code=1,
        )
    rows = []
    for version in versions or [""]:
        index = store.load(version) if version else _annoy(thesaurus)
        rows.append({"version": version or index.version, **_agreement_of(index, state, resamples, seed)})
    payload = {
        "audit": state.plan.audit,
        "votes": state.votes,
        "planned": state.plan.comparisons,
        "versions": rows,
    }
    if as_json:
        print(json.dumps(payload))
        return
    _print_report(payload)


def _print_report(payload: dict[str, Any]) -> None:
    from rich.table import Table

    def cell(d: dict[str, Any], key: str) -> str:
        if d.get(key) is None:
            return "-"
        low, high = d.get(f"{key}_ci_low"), d.get(f"{key}_ci_high")
        ci = "" if low is None or high is None else f" [{low:.3f}, {high:.3f}]"
        return f"{d[key]:.3f}{ci}"

    out.print(f"audit {payload['audit']}: {payload['votes']} of {payload['planned']} votes", highlight=False)
    for row in payload["versions"]:
        table = Table(
            title=f"thesaurus {row['version']} against the votes (chance tau_w {row['chance']['tau_w']:.3f})"
        )
        for column in ("area", "rho_w [95% CI]", "tau_w [95% CI]", "items", "votes", "ballot"):
            table.add_column(column)
        for area in row["areas"]:
            table.add_row(
                f"#{area['seed']}",
                cell(area, "rho_w"),
                cell(area, "tau_w"),
                str(area["items"]),
                str(area["votes"]),
                str(area["ballot"]) + (" (provisional)" if area["provisional"] else ""),
            )
        o = row["overall"]
        table.add_row("overall", cell(o, "rho_w"), cell(o, "tau_w"), str(o["items"]), str(o["votes"]), "")
        out.print(table)


def _truth(thesaurus: Path, truth: str, items: int, seed: int) -> Any:
    """The items' underlying similarities z: the thesaurus's cosines of the pairs of one
    area (the smallest with ``items`` pairs), or one of 001's synthetic distributions."""
    from stream.auditing.audit import make_areas
    from stream.auditing.voters import exponential_similarity, power_similarity

    index = _annoy(thesaurus)
    if truth != "thesaurus":
        return (exponential_similarity if truth == "exponential" else power_similarity)(items)
    size = int(np.ceil((1 + np.sqrt(1 + 8 * items)) / 2))
    rng = np.random.default_rng(seed)
    found = make_areas(_popular_first(index), index.neighbours, 1, size, rng, depth=max(50, 3 * size))
    if not found:
        raise fail(f"--items {items}: the thesaurus has no area of {size} hashtags")
    return index.similarities(found[0].items[:items], ranking=False)


@audit_app.command("simulate")
def simulate_cmd(
    thesaurus: Annotated[
        Path, typer.Option("--thesaurus", "-t", help="Its cosines are the true similarities")
    ],
    items: Annotated[int, typer.Option(help="Items (pairs of hashtags of one area)", min=20)] = 990,
    voters: Annotated[int, typer.Option(help="Simulated voters", min=1)] = 100,
    budget: Annotated[
        int | None, typer.Option(help="Comparisons [default: 001's M = 20 with the ballots and alpha]", min=1)
    ] = None,
    ballots: Annotated[int, typer.Option(help="Ballots n_b")] = 7,
    alpha: Annotated[float, typer.Option(help="Share of items kept per ballot")] = 0.5,
    runs: Annotated[
        int, typer.Option(help="Campaigns simulated (seeds S, S+1, ...); means are printed", min=1)
    ] = 10,
    truth: Annotated[
        str, typer.Option(help="thesaurus (its cosines), or 001's exponential / power similarities")
    ] = "thesaurus",
    seed: Annotated[int, typer.Option(help="First seed")] = 0,
    as_json: JsonObject = False,
) -> None:
    """001's stochastic transitivity model with a known true ranking: the adaptive
    protocol against uniform pairs at the same number of votes (tau_w, rho_w to the truth)."""
    from stream.auditing.voters import simulate

    if truth not in ("thesaurus", "exponential", "power"):
        raise fail(f"--truth must be thesaurus, exponential or power, not {truth!r}")
    try:
        protocol = (
            Protocol.for_budget(items, budget, ballots, alpha)
            if budget
            else Protocol(items, ballots, alpha, 20)
        ).check()
    except ValueError as exc:
        raise fail(str(exc)) from None
    z = _truth(thesaurus, truth, items, seed)
    results = [simulate(z, protocol, voters, seed + r) for r in range(runs)]
    payload = {
        "budget": results[0].budget,
        "adaptive": {key: float(np.mean([r.adaptive[key] for r in results])) for key in ("tau_w", "rho_w")},
        "uniform": {key: float(np.mean([r.uniform[key] for r in results])) for key in ("tau_w", "rho_w")},
    }
    if as_json:
        print(json.dumps(payload))
        return
    sd = {
        name: {
            key: float(np.std([getattr(r, name)[key] for r in results], ddof=1)) if runs > 1 else 0.0
            for key in ("tau_w", "rho_w")
        }
        for name in ("adaptive", "uniform")
    }
    out.print(
        f"{items} items, {voters} voters, {payload['budget']} comparisons (n_b={ballots}, alpha={alpha:g}, "
        f"M={protocol.m}, M_top={protocol.m_top}, M_unif={protocol.m_uniform:.1f}); mean ± sd of {runs} runs",
        highlight=False,
    )
    for name in ("adaptive", "uniform"):
        values = payload[name]
        assert isinstance(values, dict)
        out.print(
            f"  {name:8s} tau_w {values['tau_w']:.3f} ± {sd[name]['tau_w']:.3f}   "
            f"rho_w {values['rho_w']:.3f} ± {sd[name]['rho_w']:.3f}",
            highlight=False,
        )
