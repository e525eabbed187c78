"""The alerting rules of reval-stream (the ``reval-alerts`` group of ``rules.yml``), one
function per alert, in the order of :data:`ALERTS`, from :mod:`stream.monitoring.alert_params`.

The runbook of each is a section of ``deploy/README.md`` named after it; the recording
rules they read (``reval:...``) are :mod:`workers.adapters.prometheus.prometheus_rules`'s.  The
descriptions are f-strings that read as prose: the Prometheus template parts they carry (the
firing series' labels and value) are the constants and helpers below.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stream.monitoring.alert_params import DEFAULTS, Params, seconds

__all__ = ["ALERTS", "JOBS", "ROLES", "Rule", "alert_rules", "fmt", "pct", "printed_value", "with_label"]

ROLES = ("embed", "index", "score")
JOBS = {role: f"reval-{role}" for role in ROLES}

Rule = dict[str, Any]

#: Prometheus (Go) template references to the firing series' labels, rendered literally.
RECOMMENDER = "{{ $labels.recommender }}"
K = "{{ $labels.k }}"
R = "{{ $labels.r }}"
JOB = "{{ $labels.job }}"
TOPIC = "{{ $labels.topic }}"


def with_label(label: str, text: str) -> str:
    """``text`` and the label's value where the firing series has the label; nothing where not.

    >>> with_label("instance", " at ")
    '{{ with $labels.instance }} at {{ . }}{{ end }}'
    """
    return "{{ with $labels." + label + " }}" + text + "{{ . }}{{ end }}"


AT_INSTANCE = with_label("instance", " at ")


def printed_value(printf: str) -> str:
    """The firing series' value as a Prometheus template prints it.

    >>> printed_value("%.1f")
    '{{ $value | printf "%.1f" }}'
    """
    return '{{ $value | printf "' + printf + '" }}'


def fmt(value: float) -> str:
    """A number as PromQL writes it (no trailing zeros).

    >>> fmt(0.5), fmt(1e-9 / 3600), fmt(6.907755278982137)
    ('0.5', '2.77778e-13', '6.90776')
    """
    return f"{value:.6g}"


def pct(fraction: float) -> str:
    """A fraction as a percentage, for the alerts' descriptions.

    >>> pct(0.25)
    '25%'
    """
    return f"{fraction * 100:g}%"


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
        events = f"reval:scored_events:rate{qw} * {fmt(seconds(qw))}"
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
        f"reval:skill_loss:llr{q.sel}\n> {fmt(math.log(1 / p.false_alarm_probability))}\n{q.enough}",
        p.skill_loss_for,
        "warning",
        f"Recommender {RECOMMENDER}: #REval-hit-ratio@k={K} dropped",
        f"Over the last {qw}, the precision form of #REval (k={K}, r={R}: the share of the recommended "
        f"hashtags with a ground truth among their k synonyms) of recommender {RECOMMENDER} is more "
        f"likely to have lost {pct(p.skill_loss_fraction)} of its baseline than to hold it (the same "
        f"window {', '.join(p.baseline_offsets)} ago): log-likelihood ratio {printed_value('%.1f')}, "
        f"above log(1/{fmt(p.false_alarm_probability)}).",
    )


def _at_chance(p: Params) -> Rule:
    q, qw = _Quality.of(p), p.quality_window
    return _alert(
        p,
        "RevalRecommenderAtChance",
        f"reval:hit_ratio_corrected:kappa{qw}{q.sel}\n<= {fmt(p.chance_margin)}\n{q.enough}",
        p.chance_for,
        "warning",
        f"Recommender {RECOMMENDER} is no better than chance",
        f"The chance-corrected #REval-hit-ratio (k={K}, r={R}) of recommender {RECOMMENDER} over the last "
        f"{qw} is {printed_value('%.3f')}: its recommendations hit no more often than a "
        "popularity-weighted random draw of the same size would.",
    )


def _semantic_gap(p: Params) -> Rule:
    q, qw = _Quality.of(p), p.quality_window
    return _alert(
        p,
        "RevalSemanticGapWidening",
        f"reval:exact_match:mean{qw}{q.exact_sel}\n"
        f"< {fmt(1 - p.gap_exact_drop_fraction)} * reval:exact_match:baseline{q.exact_sel}\n"
        f"and on (recommender, r)\n"
        f"reval:hit_ratio:mean{qw}{q.sel}\n"
        f">= {fmt(1 - p.gap_reval_tolerance)} * reval:hit_ratio:baseline{q.sel}\n"
        f"{q.enough}",
        p.gap_for,
        "info",
        f"Recommender {RECOMMENDER}: exact match falls while #REval holds",
        f"The exact hit ratio (r={R}) of recommender {RECOMMENDER} is more than "
        f"{pct(p.gap_exact_drop_fraction)} below its baseline while its #REval-hit-ratio at k={q.k} stays "
        f"within {pct(p.gap_reval_tolerance)} of its own: the recommender (or the feed) moved to synonyms "
        "of the ground truth.",
    )


def _unknown_hashtags(p: Params) -> Rule:
    share = "reval:unknown_hashtag_share:ratio"
    return _alert(
        p,
        "RevalUnknownHashtagsRising",
        f"{share}{p.unknown_window} > {fmt(p.unknown_share_max)}\nand\n{share}{p.unknown_window}\n"
        f"> {share}{p.unknown_baseline_window} + {fmt(p.unknown_share_rise)}",
        p.unknown_for,
        "warning",
        f"Recommender {RECOMMENDER}: many recommended hashtags unknown to the thesaurus",
        f"Over the last {p.unknown_window} more than {pct(p.unknown_share_max)} of the hashtags recommended "
        f"by {RECOMMENDER} are not in the thesaurus, {pct(p.unknown_share_rise)} more than over the last "
        f"{p.unknown_baseline_window}. Unknown hashtags only match themselves (Syn(h) = {{h}}).",
    )


def _no_scores(p: Params) -> Rule:
    events = f'reval_events_total{{job="{JOBS["score"]}"}}'
    return _alert(
        p,
        "RevalNoScores",
        f"sum by (recommender) (rate({events}[{p.no_scores_window}])) == 0\nor\nabsent({events})",
        p.no_scores_for,
        "critical",
        f"No recommendation events scored{with_label('recommender', ' for ')}",
        f"The scoring workers scored no recommendation event{with_label('recommender', ' of recommender ')} "
        f"in the last {p.no_scores_window}.",
    )


def _consumer_lag(p: Params) -> Rule:
    lag = "reval:consumer_lag:sum"
    return _alert(
        p,
        "RevalConsumerLagGrowing",
        f"{lag} > {p.lag_max_records}\nand\nderiv({lag}[{p.lag_growth_window}]) > 0",
        p.lag_for,
        "warning",
        f"{JOB} is falling behind on {TOPIC}",
        f"Consumer group of {JOB} is more than {p.lag_max_records} records behind on topic {TOPIC} and "
        f"the lag grew over the last {p.lag_growth_window}.",
    )


def _thesaurus_stale(p: Params) -> Rule:
    index = JOBS["index"]
    return _alert(
        p,
        "RevalThesaurusStale",
        f'min(reval_index_age_seconds{{job="{index}"}}) > {fmt(seconds(p.index_max_age))}\n'
        f'or\nmax(reval_index_version{{job="{index}"}}) == 0',
        p.index_for,
        "warning",
        "The thesaurus index is stale",
        f"No new thesaurus version was published for more than {p.index_max_age} (or none was ever "
        "built): new hashtags get no synonyms.",
    )


def _scorer_behind(p: Params) -> Rule:
    return _alert(
        p,
        "RevalScorerThesaurusBehind",
        f'max(reval_index_version{{job="{JOBS["index"]}"}})\n'
        f'> min(reval_scoring_thesaurus_version{{job="{JOBS["score"]}"}})',
        p.scorer_behind_for,
        "warning",
        "A scoring worker does not load the newest thesaurus version",
        "The index job published a newer thesaurus version than at least one scoring worker uses, for "
        f"more than {p.scorer_behind_for}.",
    )


def _dead_letters(p: Params) -> Rule:
    window = p.dead_letter_window
    return _alert(
        p,
        "RevalDeadLetterRateHigh",
        f"reval:dead_letter_ratio:ratio{window} > {fmt(p.dead_letter_ratio_max)}\nand on (topic)\n"
        f"sum by (topic) (rate(reval_records_rejected_total[{window}])) > {fmt(p.dead_letter_min_rate)}",
        p.dead_letter_for,
        "warning",
        f"Many records of {TOPIC} go to the dead-letter topic",
        f"More than {pct(p.dead_letter_ratio_max)} of the records consumed from {TOPIC} were rejected "
        f"over the last {window}.",
    )


def _embed_collapsed(p: Params) -> Rule:
    baseline = (
        f'sum(rate(reval_tweets_embedded_total{{job="{JOBS["embed"]}"}}'
        f"[{p.embed_baseline_window}] offset {p.embed_window}))"
    )
    return _alert(
        p,
        "RevalEmbedThroughputCollapsed",
        f"reval:tweets_embedded:rate{p.embed_window}\n< {fmt(p.embed_collapse_fraction)} * {baseline}\n"
        f"and\n{baseline} > {fmt(p.embed_min_baseline_rate)}",
        p.embed_for,
        "warning",
        "Embedding throughput collapsed",
        f"The embed workers embedded fewer than {pct(p.embed_collapse_fraction)} as many tweets per second "
        f"over the last {p.embed_window} as over the {p.embed_baseline_window} before.",
    )


def _worker_down(p: Params) -> Rule:
    return _alert(
        p,
        "RevalWorkerDown",
        # absent(): with DNS discovery a stopped service has no target at all
        'up{job=~"reval-.*"} == 0' + "".join(f'\nor\nabsent(up{{job="{JOBS[role]}"}})' for role in ROLES),
        p.worker_down_for,
        "critical",
        f"{JOB}{AT_INSTANCE} is down",
        f"Prometheus cannot scrape {JOB}{AT_INSTANCE} (or finds no target for it).",
    )


def _topic_reset(p: Params) -> Rule:
    return _alert(
        p,
        "RevalTopicReset",
        "max by (topic) (reval_topic_reset_detected) == 1",
        p.topic_reset_for,
        "critical",
        f"Topic {TOPIC} was re-created: its workers wait for accept-topic",
        f"The broker reports a new id for {TOPIC} (deleted and created again: its offsets restarted at "
        f"0). Nothing of it is applied until an operator runs `reval admin accept-topic {TOPIC}`.",
    )


def _redis_unavailable(p: Params) -> Rule:
    return _alert(
        p,
        "RevalRedisUnavailable",
        "max by (job, instance) (reval_redis_unavailable) == 1",
        p.redis_unavailable_for,
        "critical",
        f"{JOB} waits for Redis",
        f"{JOB}{AT_INSTANCE} cannot write to Redis (connection, OOM, READONLY, LOADING...) and holds its "
        "batch unacknowledged: nothing is lost, nothing advances.",
    )


def _redis_lost_writes(p: Params) -> Rule:
    return _alert(
        p,
        "RevalRedisLostWrites",
        "max by (job, instance) (increase(reval_redis_rollbacks_total[15m])) > 0",
        "0m",
        "critical",
        f"{JOB} found writes it had acknowledged missing from Redis",
        f"{JOB}{AT_INSTANCE} found a Redis master gone back in time (a failover to a replica without its "
        "latest writes, or a restart from older data): running means, claims or the join may miss "
        "records whose offsets were committed. Replay the input from before the fault.",
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
        f'{lift}, bound="ci_high"}}\n< ignoring (bound) {fmt(1 - p.coherence_drop_fraction)} * {baseline}',
        p.coherence_for,
        "warning",
        "The thesaurus's synonym sets became less coherent",
        "The coherence lift of the current thesaurus version (its synonym sets' tweets against random "
        "hashtags of matched popularity, TF-IDF) is, with 95% confidence, more than "
        f"{pct(p.coherence_drop_fraction)} below its mean over the {p.coherence_baseline_window} before "
        f"the last {p.coherence_baseline_offset}: new versions group hashtags that are less about one thing.",
    )


def _detector(
    alternative: str, name: str, severity: str, summary: str, meaning: str
) -> Callable[[Params], Rule]:
    """The alert of one of the change detector's alternatives (stream.monitoring.cusum.ALTERNATIVES)."""

    def rule(p: Params) -> Rule:
        series = "reval_detector_last_alarm_timestamp_seconds"
        last = f'{series}{{job="{JOBS["score"]}", alternative="{alternative}"}}'
        window = fmt(seconds(p.detector_alarm_window))
        return _alert(
            p,
            name,
            f"time() - max by (recommender) ({last}) < {window}",
            "0m",
            severity,
            f"{summary} ({RECOMMENDER})",
            f"The change detector of recommender {RECOMMENDER} (CUSUM charts of its exact, synonym-only "
            f"and missed recommendations, calibrated to REVAL_DETECTOR_ARL0 in-control events per false "
            f"alarm) alarmed {printed_value('%.0f')} s ago: {meaning}",
        )

    return rule


_quality_lost = _detector(
    "quality_lost",
    "RevalRecommenderQualityLost",
    "critical",
    "A recommender lost quality",
    "its recommendations moved to misses -- towards chance, or away from the hashtags people use.",
)
_wording_changed = _detector(
    "wording_changed",
    "RevalRecommenderWordingChanged",
    "info",
    "A recommender changed its wording",
    "its exact hits turned into synonym-only hits while its synonym-aware hits held -- it says the "
    "same with other hashtags; exact-match metrics fall, the meaning does not.",
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
    _quality_lost,
    _wording_changed,
)

#: The alerts' names, in the order of the rules file.
ALERTS = tuple(alert(DEFAULTS)["alert"] for alert in _ALERTS)


def alert_rules(p: Params) -> list[Rule]:
    return [{"name": "reval-alerts", "rules": [alert(p) for alert in _ALERTS]}]
