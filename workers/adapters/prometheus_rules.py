"""The Prometheus rules and scrape config of reval-stream, rendered from
:mod:`stream.alert_params`.

``deploy/prometheus/render.py`` is the command that writes them; the committed
``rules.yml`` and ``prometheus.yml`` beside it are the output with the defaults
(``tests/test_deploy.py`` fails when they drift from it).

Naming: recording rules are ``reval:<quantity>:<aggregation><window>``, e.g.
``reval:hit_ratio:mean1h`` = the mean #REval-hit-ratio of the events scored in
the last hour, per (recommender, k, r), computed from the workers' monotonic
``reval_hit_ratio_sum`` / ``reval_hit_ratio_count`` (so it is exact across any
number of scoring replicas and survives restarts).  Every alert is one function below
(``_quality_drop`` ... ``_coherence_fell``), in the order of :data:`ALERTS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import yaml

from stream.alert_params import DEFAULTS, EVALUATION_INTERVAL, Params, seconds
from stream.chance import MIN_ROOM

__all__ = [
    "ALERTS",
    "DEFAULT_PORTS",
    "JOBS",
    "ROLES",
    "alert_rules",
    "recording_rules",
    "render_config",
    "render_rules",
]

ROLES = ("embed", "index", "score")
JOBS = {role: f"reval-{role}" for role in ROLES}
DEFAULT_PORTS = {"embed": 9101, "index": 9102, "score": 9103}

Rule = dict[str, Any]


def _fmt(value: float) -> str:
    """A number as PromQL writes it (no trailing zeros).

    >>> _fmt(0.5), _fmt(1e-9 / 3600), _fmt(6.907755278982137)
    ('0.5', '2.77778e-13', '6.90776')
    """
    return f"{value:.6g}"


def pct(fraction: float) -> str:
    """A fraction as a percentage, for the alerts' descriptions.

    >>> pct(0.25)
    '25%'
    """
    return f"{fraction * 100:g}%"


def _by_offsets(metric: str, offsets: tuple[str, ...], by: str) -> str:
    """Mean of ``metric`` at each offset; a missing offset (young deployment) is skipped."""
    parts = [f'label_replace({metric} offset {o}, "baseline_offset", "{o}", "", "")' for o in offsets]
    joined = "\n  or\n  ".join(parts)
    return f"avg by ({by}) (\n  {joined}\n)"


# --------------------------------------------------------------------------- recording rules


def _window_rules(w: str) -> list[Rule]:
    """The quality series recorded for one window."""
    return [
        {
            "record": f"reval:hit_ratio:mean{w}",
            "expr": (
                f"sum by (recommender, k, r) (rate(reval_hit_ratio_sum[{w}]))\n"
                f"/\n(sum by (recommender, k, r) (rate(reval_hit_ratio_count[{w}])) > 0)"
            ),
        },
        # The chance-corrected score is the kappa of the sums (stream.chance): the excess
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
                f"(reval:corrected_room:rate{w} > {_fmt(MIN_ROOM / seconds(w))})"
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
    return [
        {
            "record": "reval:hit_ratio:baseline",
            "expr": _by_offsets(f"reval:hit_ratio:mean{qw}", p.baseline_offsets, by),
        },
        {
            # The baseline skill: the kappa of the mean sums of the window at each offset.
            "record": "reval:hit_ratio_corrected:baseline",
            "expr": (
                _by_offsets(f"reval:corrected_excess:rate{qw}", p.baseline_offsets, by)
                + "\n/\n("
                + _by_offsets(f"reval:corrected_room:rate{qw}", p.baseline_offsets, by)
                + f" > {_fmt(MIN_ROOM / seconds(qw))})"
            ),
        },
        {
            "record": f"reval:corrected_events:rate{qw}",
            "expr": f"sum by ({by}) (rate(reval_corrected_events_total[{qw}]))",
        },
        {
            # The #REval alert's statistic (stream.backtest.skill_loss): with D, R, n the excess,
            # room and events of the window and kappa0 > 0 the baseline skill, delta =
            # skill_loss_fraction * kappa0 and v = m (1 - m), m = 1 - (1 - kappa0) R / n:
            # delta R / (n v) * ((kappa0 - delta / 2) R - D), the rates times the window.
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
    kappa0 = "(reval:hit_ratio_corrected:baseline > 0)"  # no skill above chance: nothing to lose
    room, excess, events = (f"reval:corrected_{x}:rate{qw}" for x in ("room", "excess", "events"))
    share = f"((1 - reval:hit_ratio_corrected:baseline) * {room} / {events})"  # 1 - m
    f = p.skill_loss_fraction
    return (
        f"{_fmt(f)} * {kappa0} * {room}\n"
        f"/ ({events} * clamp((1 - {share}) * {share}, 1e-06, 0.25))\n"
        f"* ({_fmt(1 - f / 2)} * reval:hit_ratio_corrected:baseline * {room} - {excess})\n"
        f"* {_fmt(seconds(qw))}"
    )


# --------------------------------------------------------------------------- alerts


def _alert(p: Params, name: str, expr: str, hold: str, severity: str, summary: str, description: str) -> Rule:
    return {
        "alert": name,
        "expr": expr,
        "for": hold,
        "labels": {"severity": severity, "service": "reval-stream"},
        "annotations": {
            "summary": summary,
            "description": description,
            # the README heading's anchor (GitHub lower-cases headings)
            "runbook_url": f"{p.runbook}#{name.lower()}",
        },
    }


@dataclass(frozen=True)
class _Quality:
    """The selectors the quality alerts share: the alert's (k, r) and the event floor."""

    k: str
    sel: str
    exact_sel: str
    enough: str

    @classmethod
    def of(cls, p: Params) -> _Quality:
        k, r, qw = str(p.alert_k), p.alert_r, p.quality_window
        events = f"reval:scored_events:rate{qw} * {_fmt(seconds(qw))}"
        return cls(
            k=k,
            sel=f'{{k="{k}", r="{r}"}}',
            exact_sel=f'{{metric="hit_ratio", r="{r}"}}',
            enough=f"and on (recommender) {events} >= {p.min_events}",
        )


def _quality_drop(p: Params) -> Rule:
    q, qw = _Quality.of(p), p.quality_window
    return _alert(
        p,
        "RevalRecommenderQualityDrop",
        (f"reval:skill_loss:llr{q.sel}\n> {_fmt(math.log(1 / p.false_alarm_probability))}\n{q.enough}"),
        p.quality_for,
        "warning",
        "Recommender {{ $labels.recommender }}: #REval-hit-ratio@k={{ $labels.k }} dropped",
        (
            "Over the last "
            + qw
            + ", the chance-corrected #REval-hit-ratio (k={{ $labels.k }}, r={{ $labels.r }}) of "
            "recommender {{ $labels.recommender }} is more likely to have lost "
            + pct(p.skill_loss_fraction)
            + " of its skill above chance than to hold its baseline (the same window "
            + ", ".join(p.baseline_offsets)
            + ' ago): log-likelihood ratio {{ $value | printf "%.1f" }}, above log(1/'
            + _fmt(p.false_alarm_probability)
            + ")."
        ),
    )


def _at_chance(p: Params) -> Rule:
    q, qw = _Quality.of(p), p.quality_window
    return _alert(
        p,
        "RevalRecommenderAtChance",
        (f"reval:hit_ratio_corrected:kappa{qw}{q.sel}\n<= {_fmt(p.chance_margin)}\n{q.enough}"),
        p.chance_for,
        "warning",
        "Recommender {{ $labels.recommender }} is no better than chance",
        (
            "The chance-corrected #REval-hit-ratio (k={{ $labels.k }}, r={{ $labels.r }}) of recommender "
            "{{ $labels.recommender }} over the last " + qw + ' is {{ $value | printf "%.3f" }}: '
            "its recommendations hit no more often than a popularity-weighted random draw of the "
            "same size would."
        ),
    )


def _semantic_gap(p: Params) -> Rule:
    q, qw = _Quality.of(p), p.quality_window
    return _alert(
        p,
        "RevalSemanticGapWidening",
        (
            f"reval:exact_match:mean{qw}{q.exact_sel}\n"
            f"< {_fmt(1 - p.gap_exact_drop_fraction)} * reval:exact_match:baseline{q.exact_sel}\n"
            f"and on (recommender, r)\n"
            f"reval:hit_ratio:mean{qw}{q.sel}\n"
            f">= {_fmt(1 - p.gap_reval_tolerance)} * reval:hit_ratio:baseline{q.sel}\n"
            f"{q.enough}"
        ),
        p.gap_for,
        "info",
        "Recommender {{ $labels.recommender }}: exact match falls while #REval holds",
        (
            "The exact hit ratio (r={{ $labels.r }}) of recommender {{ $labels.recommender }} "
            "is more than "
            + pct(p.gap_exact_drop_fraction)
            + f" below its baseline while its #REval-hit-ratio at k={q.k} stays within "
            + pct(p.gap_reval_tolerance)
            + " of its own: the recommender (or the feed) moved to synonyms of the ground truth."
        ),
    )


def _unknown_hashtags(p: Params) -> Rule:
    return _alert(
        p,
        "RevalUnknownHashtagsRising",
        (
            f"reval:unknown_hashtag_share:ratio{p.unknown_window} > {_fmt(p.unknown_share_max)}\n"
            f"and\nreval:unknown_hashtag_share:ratio{p.unknown_window}\n"
            f"> reval:unknown_hashtag_share:ratio{p.unknown_baseline_window}"
            f" + {_fmt(p.unknown_share_rise)}"
        ),
        p.unknown_for,
        "warning",
        "Recommender {{ $labels.recommender }}: many recommended hashtags unknown to the thesaurus",
        (
            "Over the last "
            + p.unknown_window
            + " more than "
            + pct(p.unknown_share_max)
            + " of the hashtags recommended by {{ $labels.recommender }} are not in the thesaurus, "
            + pct(p.unknown_share_rise)
            + " more than over the last "
            + p.unknown_baseline_window
            + ". Unknown hashtags only match themselves (Syn(h) = {h})."
        ),
    )


def _no_scores(p: Params) -> Rule:
    score = JOBS["score"]
    return _alert(
        p,
        "RevalNoScores",
        (
            f'sum by (recommender) (rate(reval_events_total{{job="{score}"}}[{p.no_scores_window}]))'
            " == 0\n"
            f'or\nabsent(reval_events_total{{job="{score}"}})'
        ),
        p.no_scores_for,
        "critical",
        "No recommendation events scored{{ with $labels.recommender }} for {{ . }}{{ end }}",
        (
            "The scoring workers scored no recommendation event"
            "{{ with $labels.recommender }} of recommender {{ . }}{{ end }} in the last "
            + p.no_scores_window
            + "."
        ),
    )


def _consumer_lag(p: Params) -> Rule:
    return _alert(
        p,
        "RevalConsumerLagGrowing",
        (
            f"reval:consumer_lag:sum > {p.lag_max_records}\n"
            f"and\nderiv(reval:consumer_lag:sum[{p.lag_growth_window}]) > 0"
        ),
        p.lag_for,
        "warning",
        "{{ $labels.job }} is falling behind on {{ $labels.topic }}",
        (
            "Consumer group of {{ $labels.job }} is more than "
            + str(p.lag_max_records)
            + " records behind on topic {{ $labels.topic }} and the lag grew over the last "
            + p.lag_growth_window
            + "."
        ),
    )


def _thesaurus_stale(p: Params) -> Rule:
    index = JOBS["index"]
    return _alert(
        p,
        "RevalThesaurusStale",
        (
            f'min(reval_index_age_seconds{{job="{index}"}}) > {_fmt(seconds(p.index_max_age))}\n'
            f'or\nmax(reval_index_version{{job="{index}"}}) == 0'
        ),
        p.index_for,
        "warning",
        "The thesaurus index is stale",
        (
            "No new thesaurus version was published for more than "
            + p.index_max_age
            + " (or none was ever built): new hashtags get no synonyms."
        ),
    )


def _scorer_behind(p: Params) -> Rule:
    return _alert(
        p,
        "RevalScorerThesaurusBehind",
        (
            f'max(reval_index_version{{job="{JOBS["index"]}"}})\n'
            f'> min(reval_scoring_thesaurus_version{{job="{JOBS["score"]}"}})'
        ),
        p.scorer_behind_for,
        "warning",
        "A scoring worker does not load the newest thesaurus version",
        (
            "The index job published a newer thesaurus version than at least one scoring worker "
            "uses, for more than " + p.scorer_behind_for + "."
        ),
    )


def _dead_letters(p: Params) -> Rule:
    return _alert(
        p,
        "RevalDeadLetterRateHigh",
        (
            f"reval:dead_letter_ratio:ratio{p.dead_letter_window} > {_fmt(p.dead_letter_ratio_max)}\n"
            f"and on (topic)\n"
            f"sum by (topic) (rate(reval_records_rejected_total[{p.dead_letter_window}])) "
            f"> {_fmt(p.dead_letter_min_rate)}"
        ),
        p.dead_letter_for,
        "warning",
        "Many records of {{ $labels.topic }} go to the dead-letter topic",
        (
            "More than " + pct(p.dead_letter_ratio_max) + " of the records consumed from {{ $labels.topic }} "
            "were rejected over the last " + p.dead_letter_window + "."
        ),
    )


def _embed_collapsed(p: Params) -> Rule:
    embed = JOBS["embed"]
    return _alert(
        p,
        "RevalEmbedThroughputCollapsed",
        (
            f"reval:tweets_embedded:rate{p.embed_window}\n"
            f'< {_fmt(p.embed_collapse_fraction)} * sum(rate(reval_tweets_embedded_total{{job="{embed}"}}'
            f"[{p.embed_baseline_window}] offset {p.embed_window}))\n"
            f'and\nsum(rate(reval_tweets_embedded_total{{job="{embed}"}}'
            f"[{p.embed_baseline_window}] offset {p.embed_window})) > {_fmt(p.embed_min_baseline_rate)}"
        ),
        p.embed_for,
        "warning",
        "Embedding throughput collapsed",
        (
            "The embed workers embedded fewer than "
            + pct(p.embed_collapse_fraction)
            + " as many tweets per second over the last "
            + p.embed_window
            + " as over the "
            + p.embed_baseline_window
            + " before."
        ),
    )


def _worker_down(p: Params) -> Rule:
    return _alert(
        p,
        "RevalWorkerDown",
        # absent(): with DNS discovery a stopped service has no target at all
        'up{job=~"reval-.*"} == 0' + "".join(f'\nor\nabsent(up{{job="{JOBS[role]}"}})' for role in ROLES),
        p.worker_down_for,
        "critical",
        "{{ $labels.job }}{{ with $labels.instance }} at {{ . }}{{ end }} is down",
        (
            "Prometheus cannot scrape {{ $labels.job }}{{ with $labels.instance }} at {{ . }}{{ end }}"
            " (or finds no target for it)."
        ),
    )


def _topic_reset(p: Params) -> Rule:
    return _alert(
        p,
        "RevalTopicReset",
        "max by (topic) (reval_topic_reset_detected) == 1",
        p.topic_reset_for,
        "critical",
        "Topic {{ $labels.topic }} was re-created: its workers wait for accept-topic",
        (
            "The broker reports a new id for {{ $labels.topic }} (deleted and created again: its "
            "offsets restarted at 0). Nothing of it is applied until an operator runs "
            "`reval admin accept-topic {{ $labels.topic }}`."
        ),
    )


def _redis_unavailable(p: Params) -> Rule:
    return _alert(
        p,
        "RevalRedisUnavailable",
        "max by (job, instance) (reval_redis_unavailable) == 1",
        p.redis_unavailable_for,
        "critical",
        "{{ $labels.job }} waits for Redis",
        (
            "{{ $labels.job }}{{ with $labels.instance }} at {{ . }}{{ end }} cannot write to Redis "
            "(connection, OOM, READONLY, LOADING...) and holds its batch unacknowledged: "
            "nothing is lost, nothing advances."
        ),
    )


def _redis_lost_writes(p: Params) -> Rule:
    return _alert(
        p,
        "RevalRedisLostWrites",
        "max by (job, instance) (increase(reval_redis_rollbacks_total[15m])) > 0",
        "0m",
        "critical",
        "{{ $labels.job }} found writes it had acknowledged missing from Redis",
        (
            "{{ $labels.job }}{{ with $labels.instance }} at {{ . }}{{ end }} found a Redis master gone "
            "back in time (a failover to a replica without its latest writes, or a restart from older "
            "data): running means, claims or the join may miss records whose offsets were committed. "
            "Replay the input from before the fault."
        ),
    )


def _coherence_fell(p: Params) -> Rule:
    lift = f'reval_thesaurus_coherence_lift{{job="{JOBS["index"]}", metric="tfidf"'
    baseline = (
        f'avg_over_time({lift}, bound="estimate"}}[{p.coherence_baseline_window}] '
        f"offset {p.coherence_baseline_offset})"
    )
    return _alert(
        p,
        "RevalThesaurusCoherenceFell",
        f'{lift}, bound="ci_high"}}\n< ignoring (bound) {_fmt(1 - p.coherence_drop_fraction)} * {baseline}',
        p.coherence_for,
        "warning",
        "The thesaurus's synonym sets became less coherent",
        (
            "The coherence lift of the current thesaurus version (its synonym sets' tweets against "
            "random hashtags of matched popularity, TF-IDF) is, with 95% confidence, more than "
            + pct(p.coherence_drop_fraction)
            + " below its mean over the "
            + p.coherence_baseline_window
            + " before the last "
            + p.coherence_baseline_offset
            + ": new versions group hashtags that are less about one thing."
        ),
    )


_ALERTS: tuple[Callable[[Params], Rule], ...] = (
    _quality_drop,
    _at_chance,
    _semantic_gap,
    _unknown_hashtags,
    _no_scores,
    _consumer_lag,
    _thesaurus_stale,
    _scorer_behind,
    _dead_letters,
    _embed_collapsed,
    _worker_down,
    _topic_reset,
    _redis_unavailable,
    _redis_lost_writes,
    _coherence_fell,
)

ALERTS = (
    "RevalRecommenderQualityDrop",
    "RevalRecommenderAtChance",
    "RevalSemanticGapWidening",
    "RevalUnknownHashtagsRising",
    "RevalNoScores",
    "RevalConsumerLagGrowing",
    "RevalThesaurusStale",
    "RevalScorerThesaurusBehind",
    "RevalDeadLetterRateHigh",
    "RevalEmbedThroughputCollapsed",
    "RevalWorkerDown",
    "RevalTopicReset",
    "RevalRedisUnavailable",
    "RevalRedisLostWrites",
    "RevalThesaurusCoherenceFell",
)


def alert_rules(p: Params) -> list[Rule]:
    return [{"name": "reval-alerts", "rules": [alert(p) for alert in _ALERTS]}]


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
