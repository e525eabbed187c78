"""The Prometheus rules and scrape config of reval-stream, rendered from
:mod:`stream.monitoring.alert_params`.

``deploy/prometheus/render.py`` is the command that writes them; the committed
``rules.yml`` and ``prometheus.yml`` beside it are the output with the defaults
(``tests/test_deploy.py`` fails when they drift from it).

Naming: recording rules are ``reval:<quantity>:<aggregation><window>``, e.g.
``reval:hit_ratio:mean1h`` = the mean #REval-hit-ratio of the events scored in
the last hour, per (recommender, k, r), computed from the workers' monotonic
``reval_hit_ratio_sum`` / ``reval_hit_ratio_count`` (so it is exact across any
number of scoring replicas and survives restarts).  The alerts are
:mod:`workers.adapters.prometheus.prometheus_alerts`.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import yaml

from stream.evaluation.chance import MIN_ROOM
from stream.evaluation.signals import SIGNALS
from stream.monitoring.alert_params import DEFAULTS, EVALUATION_INTERVAL, Params, seconds
from workers.adapters.prometheus.prometheus_alerts import JOBS, ROLES, Rule, alert_rules, fmt

__all__ = ["DEFAULT_PORTS", "recording_rules", "render_config", "render_rules", "render_signal_tests"]

DEFAULT_PORTS = {"embed": 9101, "index": 9102, "score": 9103}


def _by_offsets(metric: str, offsets: tuple[str, ...], by: str) -> str:
    """Mean of ``metric`` at each offset; a missing offset (young deployment) is skipped."""
    parts = [f'label_replace({metric} offset {o}, "baseline_offset", "{o}", "", "")' for o in offsets]
    joined = "\n  or\n  ".join(parts)
    return f"avg by ({by}) (\n  {joined}\n)"


def _offsets_ratio(numerator: str, denominator: str, floor: str, p: Params, by: str, op: str = ">") -> str:
    """A baseline of a ratio: the ratio of the mean sums of the quality window at each offset
    (not the mean of the ratios), null where the denominator is not ``op floor``."""
    mean_sums = (_by_offsets(x, p.baseline_offsets, by) for x in (numerator, denominator))
    return f"{next(mean_sums)}\n/\n({next(mean_sums)} {op} {floor})"


# --------------------------------------------------------------------------- recording rules


def _window_rules(w: str) -> list[Rule]:
    """The quality series recorded for one window."""
    # Each signal that declares a rule (stream.evaluation.signals): its mean over the window, per cell.
    means: list[Rule] = [
        {
            "record": f"reval:{signal.rule}:mean{w}",
            "expr": (
                f"sum by (recommender, k, r) (rate({signal.key}_sum[{w}]))\n"
                f"/\n(sum by (recommender, k, r) (rate({signal.key}_count[{w}])) > 0)"
            ),
        }
        for signal in SIGNALS
        if signal.rule is not None
    ]
    return [
        *means,
        # The chance-corrected score is the kappa of the sums (stream.evaluation.chance): the excess
        # of the observed over the expected and the room above the expected, as rates,
        # then their ratio (null where the expectation leaves no room).
        {
            "record": f"reval:corrected_excess:rate{w}",
            "expr": (
                f"sum by (recommender, k, r) (rate(reval_corrected_observed_total[{w}]))\n"
                f"- sum by (recommender, k, r) (rate(reval_corrected_expected_total[{w}]))"
            ),
        },
        {
            "record": f"reval:corrected_room:rate{w}",
            "expr": (
                f"sum by (recommender, k, r) (rate(reval_corrected_events_total[{w}]))\n"
                f"- sum by (recommender, k, r) (rate(reval_corrected_expected_total[{w}]))"
            ),
        },
        {
            "record": f"reval:hit_ratio_corrected:kappa{w}",
            "expr": (
                f"reval:corrected_excess:rate{w}\n/\n"
                f"(reval:corrected_room:rate{w} > {fmt(MIN_ROOM / seconds(w))})"
            ),
        },
        {
            "record": f"reval:exact_match:mean{w}",
            "expr": (
                f"sum by (recommender, metric, r) (rate(reval_exact_match_sum[{w}]))\n"
                f"/\n(sum by (recommender, metric, r) (rate(reval_exact_match_count[{w}])) > 0)"
            ),
        },
        {
            # #REval-hit-ratio at each k minus the exact hit ratio (= #REval at k=0).
            "record": f"reval:semantic_gap:mean{w}",
            "expr": (
                f"reval:hit_ratio:mean{w}\n"
                f"- on (recommender, r) group_left\n"
                f'reval:exact_match:mean{w}{{metric="hit_ratio"}}'
            ),
        },
        {
            "record": f"reval:scored_events:rate{w}",
            "expr": f'sum by (recommender) (rate(reval_events_total{{outcome="scored"}}[{w}]))',
        },
        {
            "record": f"reval:unknown_hashtag_share:ratio{w}",
            "expr": (
                f"sum by (recommender) (rate(reval_recommended_unknown_hashtags_total[{w}]))\n"
                f"/\n(sum by (recommender) (rate(reval_recommended_hashtags_total[{w}])) > 0)"
            ),
        },
    ]


def _baseline_rules(p: Params) -> list[Rule]:
    """The baselines of the quality window and the #REval alert's statistic."""
    qw = p.quality_window
    by = "recommender, k, r"
    floor = f"({p.min_events} / {fmt(seconds(qw))})"  # min_events a window, as a rate
    return [
        {
            "record": "reval:hit_ratio:baseline",
            "expr": _by_offsets(f"reval:hit_ratio:mean{qw}", p.baseline_offsets, by),
        },
        {
            # The baseline skill: the kappa of the mean sums of the window at each offset.
            "record": "reval:hit_ratio_corrected:baseline",
            "expr": _offsets_ratio(
                f"reval:corrected_excess:rate{qw}",
                f"reval:corrected_room:rate{qw}",
                fmt(MIN_ROOM / seconds(qw)),
                p,
                by,
            ),
        },
        # The #REval alert reads #REval's precision form (stream.evaluation.metrics.reval_precision_by_k):
        # its sum, the sum of its squares and its events over the window, as rates.
        *(
            {"record": f"reval:precision_{what}:rate{qw}", "expr": f"sum by ({by}) (rate({metric}[{qw}]))"}
            for what, metric in (
                ("sum", "reval_hit_ratio_precision_sum"),
                ("squares", "reval_hit_ratio_precision_squares_total"),
                ("events", "reval_hit_ratio_precision_count"),
            )
        ),
        {
            # Its baseline mean and variance: of the mean sums of the window at each offset, from
            # min_events events a window or none (stream.monitoring.backtest.skill_loss: a variance
            # from a handful of events is near 0, and the statistic divides by it).
            "record": "reval:precision:baseline",
            "expr": _offsets_ratio(
                f"reval:precision_sum:rate{qw}", f"reval:precision_events:rate{qw}", floor, p, by, ">="
            ),
        },
        {
            "record": "reval:precision_variance:baseline",
            "expr": _offsets_ratio(
                f"reval:precision_squares:rate{qw}", f"reval:precision_events:rate{qw}", floor, p, by, ">="
            )
            + "\n- reval:precision:baseline ^ 2",
        },
        {
            # The #REval alert's statistic (stream.monitoring.backtest.skill_loss): with P and n the sum
            # and events of the window, m0 > 0 and v0 the baseline mean and variance and delta =
            # skill_loss_fraction * m0: delta / v0 * ((m0 - delta / 2) n - P), the rates times
            # the window.
            "record": "reval:skill_loss:llr",
            "expr": _skill_loss(p),
        },
        {
            "record": "reval:exact_match:baseline",
            "expr": _by_offsets(f"reval:exact_match:mean{qw}", p.baseline_offsets, "recommender, metric, r"),
        },
    ]


def _operations_rules(p: Params) -> list[Rule]:
    return [
        {
            # max over duplicates: a replica that lost a partition in a rebalance may keep
            # reporting its last value for it.
            "record": "reval:consumer_lag:sum",
            "expr": "sum by (job, topic) (max by (job, topic, partition) (reval_consumer_lag))",
        },
        {
            "record": f"reval:tweets_embedded:rate{p.embed_window}",
            "expr": f'sum(rate(reval_tweets_embedded_total{{job="{JOBS["embed"]}"}}[{p.embed_window}]))',
        },
        {
            "record": f"reval:dead_letter_ratio:ratio{p.dead_letter_window}",
            "expr": (
                f"sum by (topic) (rate(reval_records_rejected_total[{p.dead_letter_window}]))\n"
                f"/ sum by (topic) (rate(reval_records_consumed_total[{p.dead_letter_window}]))"
            ),
        },
    ]


def recording_rules(p: Params) -> list[Rule]:
    quality = [rule for w in p.windows for rule in _window_rules(w)] + _baseline_rules(p)
    return [
        {"name": "reval-quality-recording", "rules": quality},
        {"name": "reval-operations-recording", "rules": _operations_rules(p)},
    ]


def _skill_loss(p: Params) -> str:
    qw = p.quality_window
    m0 = "(reval:precision:baseline > 0)"  # a baseline of 0: nothing to lose
    f = p.skill_loss_fraction
    return (
        f"{fmt(f)} * {m0}\n"
        f"/ clamp(reval:precision_variance:baseline, 1e-06, 0.25)\n"
        f"* ({fmt(1 - f / 2)} * reval:precision:baseline * reval:precision_events:rate{qw}"
        f" - reval:precision_sum:rate{qw})\n"
        f"* {fmt(seconds(qw))}"
    )


# --------------------------------------------------------------------------- files


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)


def _dump(data: Any, header: str) -> str:
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)
    return header + body


def render_rules(params: Params = DEFAULTS) -> str:
    """``rules.yml`` for ``params`` (checked); its header names the non-default ones."""
    params.check()
    changed = {k: v for k, v in asdict(params).items() if v != getattr(DEFAULTS, k)}
    note = "defaults" if not changed else ", ".join(f"{k}={v}" for k, v in changed.items())
    header = (
        "# Generated by deploy/prometheus/render.py -- edit the parameters there, not this file.\n"
        f"# Parameters: {note}\n"
    )
    return _dump({"groups": recording_rules(params) + alert_rules(params)}, header)


def render_signal_tests(params: Params = DEFAULTS) -> str:
    """``tests/signals_test.yml``: a ``promtool test rules`` value test of every signal's mean
    rule (:data:`stream.evaluation.signals.SIGNALS`), one window each -- made from the declarations, so a
    new signal's rule is tested without a hand-written case.  Two scoring replicas, b restarting
    at minute 10: 64 events a minute with mean 0.25 on a and 64 with mean 0.75 on b, so 0.5."""
    cell = 'recommender="mowe",k="10",r="5"'
    labels = f'job="reval-score",{cell}'
    tests = []
    for signal in SIGNALS:
        if signal.rule is None:
            continue
        series = []
        for instance, per_minute, restart in (("a", 16, False), ("b", 48, True)):
            for part, step in (("sum", per_minute), ("count", 64)):
                values = f"0+{step}x9 {step}+{step}x10" if restart else f"0+{step}x20"
                series.append(
                    {"series": f'{signal.key}_{part}{{{labels},instance="{instance}"}}', "values": values}
                )
        checks = [
            {
                "expr": f'reval:{signal.rule}:mean{w}{{k="10"}}',
                "eval_time": "20m",
                "exp_samples": [
                    {
                        "labels": f'reval:{signal.rule}:mean{w}{{recommender="mowe",k="10",r="5"}}',
                        "value": 0.5,
                    }
                ],
            }
            for w in params.windows
        ]
        tests.append(
            {
                "name": f"{signal.key}: its mean is sum-rate over count-rate, across replicas and restarts",
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": checks,
            }
        )
    header = (
        "# Generated by deploy/prometheus/render.py --signal-tests from stream/evaluation/signals.py:"
        " do not edit.\n"
        "# `promtool test rules signals_test.yml` checks each signal's recording rule for its value.\n"
    )
    return _dump(
        {"rule_files": ["../rules.yml"], "evaluation_interval": EVALUATION_INTERVAL, "tests": tests}, header
    )


def render_config(
    targets: dict[str, list[str]] | None = None,
    *,
    rule_files: tuple[str, ...] = ("rules.yml",),
    scrape_interval: str = "15s",
    evaluation_interval: str = EVALUATION_INTERVAL,
    alertmanagers: tuple[str, ...] = ("alertmanager:9093",),
) -> str:
    """The scrape config.

    By default every worker role is found by DNS under its docker-compose service name
    (``embed``, ``index``, ``score``): Docker's DNS answers with one A record per
    replica, so ``docker compose up --scale embed=3`` is scraped without a change.
    ``targets`` (role -> ["host:port", ...]) gives static targets instead.
    """
    jobs: list[dict[str, Any]] = []
    for role in ROLES:
        job: dict[str, Any] = {"job_name": JOBS[role]}
        if targets is None:
            job["dns_sd_configs"] = [
                {"names": [role], "type": "A", "port": DEFAULT_PORTS[role], "refresh_interval": "30s"}
            ]
            job["relabel_configs"] = [{"target_label": "role", "replacement": role}]
        elif role in targets:
            job["static_configs"] = [{"targets": targets[role], "labels": {"role": role}}]
        else:
            continue
        jobs.append(job)
    jobs.append({"job_name": "prometheus", "static_configs": [{"targets": ["localhost:9090"]}]})
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": scrape_interval,
            "evaluation_interval": evaluation_interval,
            "external_labels": {"system": "reval-stream"},
        },
        "rule_files": list(rule_files),
    }
    if alertmanagers:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": list(alertmanagers)}]}]}
    config["scrape_configs"] = jobs
    return _dump(config, "# Generated by deploy/prometheus/render.py --config (render_config).\n")
