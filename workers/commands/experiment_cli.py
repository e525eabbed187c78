"""The offline experiments: ``reval evaluate`` (the paper's experiment), ``reval backtest``
(drifts injected, alerts timed) and ``reval report`` (a backtest's HTML page)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from stream.evaluation.scoring import parse_ints
from stream.monitoring import alert_params
from workers.adapters.files.feeds import check_paths
from workers.commands.console import (
    BatchSize,
    Feeds,
    LanguageFilter,
    fail,
    out,
    with_progress,
)

if TYPE_CHECKING:  # evaluate imports gensim and torch: loaded by the command, not by `reval --help`
    from stream.evaluation.experiment import ExperimentConfig
    from workers.commands.backtest import Backtest
    from workers.commands.evaluate import Experiment


# Over 80 lines for its option list alone (Typer declares each option as a parameter).
def evaluate_cmd(
    feeds: Feeds,
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for the results")],
    split: Annotated[
        str, typer.Option(help="time (earliest 90% train), random, or both: time,random")
    ] = "time",
    seeds: Annotated[str, typer.Option(help="Seeds (random split, gensim, random draws), pooled")] = "1,2,3",
    cores: Annotated[
        str,
        typer.Option(help="p-core levels (paper 002), comma-separated: every cell again on each p-core"),
    ] = "1",
    recommenders: Annotated[
        str, typer.Option(help="Comma-separated: mowe, popular, least-popular, random, popular-users")
    ] = "mowe,popular,least-popular,random",
    embeddings: Annotated[
        str, typer.Option(help="Comma-separated: bertag, word2vec, fasttext")
    ] = "bertag,word2vec,fasttext",
    hubness: Annotated[
        str, typer.Option(help="Thesaurus rankings to compare: raw, center, csls, center+csls, mp")
    ] = "center+csls",
    mowe_threshold: Annotated[
        str,
        typer.Option(help="MOWE: cosine for a similar tweet, comma-separated to sweep (paper: 0.5)"),
    ] = "0.5",
    model: Annotated[
        str,
        typer.Option(
            help="BERTag encoder: hub id (the default needs the network once), a local model "
            "directory, or 'minilm' (packaged, works offline)"
        ),
    ] = "vinai/bertweet-base",
    rs: Annotated[str, typer.Option("-r", help="Top-r cut-offs, comma-separated")] = "1,5,10",
    ks: Annotated[
        str, typer.Option("-k", help="Numbers of synonyms, comma-separated")
    ] = "0,5,10,20,30,40,50,60,70",
    limit: Annotated[
        int | None, typer.Option(help="Use only the first N tweets left after pre-processing", min=1)
    ] = None,
    language_filter: LanguageFilter = True,
    batch_size: BatchSize = 32,
    dtype: Annotated[
        str, typer.Option(help="Encoder dtype: float32 (reference numbers) or auto (core's choice)")
    ] = "float32",
    fasttext_bucket: Annotated[
        int, typer.Option(help="FastText n-gram buckets (gensim's default 2,000,000)", min=1)
    ] = 2_000_000,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples for the 95% intervals", min=100)] = 1000,
    save_thesauri: Annotated[
        bool, typer.Option("--save-thesauri", help="Also save the first seed's thesauri under OUT/thesauri/")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Replace the results of an earlier run in --out")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print results.json's cells as JSON")] = False,
) -> None:
    """The paper's experiment (4.2) with baselines and confidence intervals: recommenders
    (MOWE, popular, the least-popular canary, the random null) scored on BERTag / Word2Vec /
    FastText thesauri, raw and chance-corrected #REval-hit-ratio per (r, k), 95% intervals."""

    from workers.commands import evaluate as ev
    from workers.commands import evaluate_outputs

    try:
        config = ev.ExperimentConfig(
            splits=_names(split),  # type: ignore[arg-type]
            seeds=_ints(seeds),
            cores=_ints(cores),
            recommenders=_names(recommenders),
            embeddings=_names(embeddings),
            hubness=_names(hubness),
            mowe_thresholds=tuple(float(x) for x in _names(mowe_threshold)),
            model=model,
            rs=_ints(rs),
            ks=_ints(ks),
            limit=limit,
            language_filter=language_filter,
            batch_size=batch_size,
            dtype=dtype,
            fasttext_bucket=fasttext_bucket,
            bootstrap=bootstrap,
        )
    except ValueError as exc:
        raise fail(str(exc)) from None
    try:  # the files, after the options; all before any model loads
        check_paths(feeds)
        evaluate_outputs.check_results_dir(out_dir, replace=force)
    except (OSError, ValueError) as exc:
        raise fail(str(exc)) from None
    experiment = with_progress(lambda track: ev.run_experiment(feeds, config, progress=track))
    evaluate_outputs.write_outputs(experiment, out_dir, save_thesauri=save_thesauri)
    if as_json:
        print(json.dumps(experiment.cells))
        return
    _print_experiment(experiment, config, out_dir)


# Over 80 lines for its option list alone (Typer declares each option as a parameter).
def backtest_cmd(
    feeds: Feeds,
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for detection.json/.md and series.json")],
    recommender: Annotated[
        str, typer.Option(help="The recommender under test: mowe, popular, popular-users, random")
    ] = "mowe",
    inject: Annotated[
        list[str] | None,
        typer.Option(
            help="A drift KIND:AMOUNT[@TIME], repeatable: random:F, swap:least-popular, synonyms:F, "
            "stale:DAYS, vocab:F; TIME is ISO 8601 (default: the middle of the scored period) "
            "[default: random:0.5 swap:least-popular synonyms:1 stale:60 vocab:0.5]"
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the drifts' random draws and of Word2Vec")] = 1,
    model: Annotated[
        str,
        typer.Option(help="Encoder of the thesaurus: hub id, local directory, or 'minilm' (offline)"),
    ] = "vinai/bertweet-base",
    warmup: Annotated[
        float, typer.Option(help="Share of the tweets (earliest) that only train, before scoring starts")
    ] = 0.3,
    refit_days: Annotated[
        float, typer.Option(help="Event-time days between refits of recommender and thesaurus")
    ] = 7.0,
    train_days: Annotated[
        float, typer.Option(help="The recommender learns from the labelled tweets of the last N days")
    ] = 30.0,
    time_scale: Annotated[
        str,
        typer.Option(
            help="Factor on every rule window and hold time, or 'auto' (the quality window holds "
            "twice the rules' min_events on average; 1 for a feed as dense as production)"
        ),
    ] = "auto",
    rules_profile: Annotated[
        str, typer.Option(help="Parameter profile of deploy/prometheus/render.py")
    ] = "default",
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a rule parameter NAME=VALUE (as render.py --set)"),
    ] = None,
    limit: Annotated[
        int | None, typer.Option(help="Use only the first N tweets left after pre-processing", min=10)
    ] = None,
    language_filter: LanguageFilter = True,
    force: Annotated[
        bool, typer.Option("--force", help="Replace the results of an earlier backtest in --out")
    ] = False,
    backfill: Annotated[
        Path | None,
        typer.Option(
            help="Also write the scores as Prometheus TSDB blocks at event time into this directory "
            "(promtool tsdb create-blocks-from openmetrics)"
        ),
    ] = None,
    backfill_interval: Annotated[
        str, typer.Option(help="Event time between two backfilled samples (Prometheus duration)")
    ] = "15m",
    html: Annotated[bool, typer.Option("--html", help="Also write OUT/report.html (reval report)")] = False,
    audit_votes: Annotated[
        Path | None,
        typer.Option(help="An audit's events (the votes topic as JSON lines): each refit's agreement"),
    ] = None,
    arl0: Annotated[
        float,
        typer.Option(
            "--arl0",
            help="The change detector's false-alarm budget: in-control average run length in events "
            "(its thresholds are calibrated to it; detection.json's diagnosis)",
            min=10,
        ),
    ] = 100_000.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print detection.json's signals as JSON")] = False,
) -> None:
    """Inject drifts into a replayed feed and measure, per alert signal of deploy/prometheus,
    the detection delay in event time and the false alarms per day on the undisturbed run."""
    from workers.commands import backtest as bk

    scale = _time_scale(time_scale)
    try:
        config = bk.BacktestConfig(
            recommender=recommender.strip().lower(),
            injections=tuple(inject) if inject else bk.DEFAULT_INJECTIONS,
            seed=seed,
            model=model,
            warmup=warmup,
            refit_days=refit_days,
            train_days=train_days,
            time_scale=scale,
            rules_profile=rules_profile,
            rules_set=tuple(set_ or ()),
            limit=limit,
            language_filter=language_filter,
            audit_votes=audit_votes,
            arl0=arl0,
        )
        if audit_votes is not None and not audit_votes.is_file():
            raise ValueError(f"--audit-votes {audit_votes}: no such file")
        bk.rules_for(bk.rule_params(config.rules_profile, list(config.rules_set)), 1.0)
        interval_s = alert_params.seconds(backfill_interval)
        _check_backtest_files(feeds, out_dir, force, backfill)
    except (OSError, ValueError) as exc:
        raise fail(str(exc)) from None
    result = with_progress(lambda track: bk.run_backtest(feeds, config, progress=track))
    if backfill is not None:
        try:
            result.summary["backfill"] = bk.backfill(result, backfill, interval_s=interval_s)
        except (OSError, RuntimeError, ValueError) as exc:
            raise fail(f"--backfill: {exc}", code=1) from None
    bk.write_outputs(result, out_dir)
    if html:
        from workers.commands.report import write_report

        write_report(out_dir)
    if as_json:
        print(json.dumps(result.rows))
        return
    _print_backtest(result, out_dir, backfill)


def report_cmd(
    run_dir: Annotated[Path, typer.Argument(metavar="DIR", help="A reval backtest --out directory")],
    out_file: Annotated[
        Path | None, typer.Option("--out", help="The HTML file [default: DIR/report.html]")
    ] = None,
) -> None:
    """One self-contained HTML page of a backtest: metrics over event time with the injected
    drifts and their detections, k-curves, the detection table, thesaurus health, slices.
    Opens from disk (no server, no network)."""
    from workers.commands.report import write_report

    try:
        path = write_report(run_dir, out_file)
    except (OSError, ValueError) as exc:
        raise fail(str(exc)) from None
    out.print(f"wrote {path}")


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip().lower() for x in text.split(",") if x.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in parse_ints(text) if x is not None)


def _print_experiment(experiment: Experiment, config: ExperimentConfig, out_dir: Path) -> None:
    """The data, then per metric a table of (r, k) by recommender, then the p-core flips."""
    d = experiment.data
    out.print(
        f"{d['train_tweets']:,} training / {d['test_tweets']:,} test tweets ({config.splits[0]} split, "
        f"seeds {', '.join(map(str, config.seeds))}); {experiment.timings['total']:.0f} s; "
        f"results in {out_dir}"
    )
    first = config.embeddings[0]
    for metric, title in (
        ("reval_hit_ratio", "#REval-hit-ratio"),
        ("reval_hit_ratio_corrected", "chance-corrected #REval-hit-ratio"),
    ):
        low, high = (
            ("ci_low", "ci_high")
            if metric == "reval_hit_ratio"
            else ("corrected_ci_low", "corrected_ci_high")
        )
        table = Table(title=f"{title}, {experiment.labels[first]}, {config.hubness[0]}: mean [95% CI]")
        table.add_column("r, k")
        for name in config.recommender_names:
            table.add_column(name, justify="right")
        for r in config.rs:
            for k in config.ks:
                cells = [
                    experiment.cell(variant=first, recommender=n, r=r, k=k) for n in config.recommender_names
                ]
                table.add_row(
                    f"{r}, {k}",
                    *(
                        "-" if c[metric] is None else f"{c[metric]:.3f} [{c[low]:.3f}, {c[high]:.3f}]"
                        for c in cells
                    ),
                )
        out.print(table)
    if len(config.cores) > 1:
        found = experiment.core_flips()
        clear = [f for f in found if any(pair["clear"] for pair in f["flips"])]
        out.print(
            f"p-cores {', '.join(map(str, config.cores))}: the ranking of recommenders flips in "
            f"{len(found)} cells against the {config.cores[0]}-core ({len(clear)} with a clear flip, "
            f"intervals apart); see {out_dir / 'cores.md'}"
        )


def _time_scale(text: str) -> float | None:
    try:
        return None if text.strip().lower() == "auto" else float(text)
    except ValueError:
        raise fail(f"--time-scale must be a positive number or 'auto', not {text!r}") from None


def _check_backtest_files(feeds: list[Path], out_dir: Path, force: bool, backfill: Path | None) -> None:
    from workers.commands import backtest as bk

    check_paths(feeds)
    bk.check_out(out_dir, replace=force)
    if backfill is not None and backfill.exists() and any(backfill.iterdir()):
        raise ValueError(f"--backfill {backfill} is not empty: blocks go into a new or empty directory")


def _print_backtest(result: Backtest, out_dir: Path, backfill: Path | None) -> None:
    from workers.commands import backtest as bk

    out.print(bk.markdown(result), markup=False)
    out.print(f"{result.timings['total']:.0f} s; results in {out_dir}")
    if backfill is not None:
        b = result.summary["backfill"]
        out.print(
            f"backfill: {b['samples']:,} samples of {b['series']} series from {b['from']} to {b['to']} "
            f"in {len(b['blocks'])} TSDB blocks under {backfill} (start Prometheus on it with "
            "--storage.tsdb.retention.time longer than the feed's age)"
        )
