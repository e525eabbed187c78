"""Render the Prometheus rules (and scrape config) of reval-stream from parameters.

The committed ``rules.yml`` and ``prometheus.yml`` beside this file are the output
with the defaults; ``tests/test_deploy.py`` fails when they drift from it.

    python deploy/prometheus/render.py                            # rewrite rules.yml (defaults)
    python deploy/prometheus/render.py --set alert_k=5 --set quality_drop_fraction=0.3 -o my-rules.yml
    python deploy/prometheus/render.py --profile test -o /tmp/rules.yml    # short windows (tests)
    python deploy/prometheus/render.py --config -o prometheus.yml           # the scrape config
    python deploy/prometheus/render.py --list                                # every parameter

Only the standard library and PyYAML (a dependency of ``transformers``) are needed.

Naming: recording rules are ``reval:<quantity>:<aggregation><window>``, e.g.
``reval:hit_ratio:mean1h`` = the mean #REval-hit-ratio of the events scored in
the last hour, per (recommender, k, r), computed from the workers' monotonic
``reval_hit_ratio_sum`` / ``reval_hit_ratio_count`` (so it is exact across any
number of scoring replicas and survives restarts).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROLES = ("embed", "index", "score")
JOBS = {role: f"reval-{role}" for role in ROLES}
DEFAULT_PORTS = {"embed": 9101, "index": 9102, "score": 9103}
RUNBOOK = "deploy/README.md"

#: Below this much room (events' worth of best - expected in a window) the chance-corrected
#: score is null: stream.chance.MIN_ROOM (tests/test_deploy.py checks they agree).
MIN_ROOM = 1e-9

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d|w|y)$")


def seconds(duration: str) -> float:
    """Seconds in a (single-unit) Prometheus duration.

    >>> seconds("90s"), seconds("1h"), seconds("7d")
    (90.0, 3600.0, 604800.0)
    """
    match = _DURATION.match(duration)
    if not match:
        raise ValueError(f"{duration!r} is not a Prometheus duration like 30s, 5m, 1h, 1d")
    return float(int(match.group(1)) * _UNITS[match.group(2)])


@dataclass(frozen=True)
class Params:
    """Every threshold, window and hold time of the rules (durations in Prometheus syntax)."""

    # Rolling means recorded for every (recommender, k, r): one series per window.
    windows: tuple[str, ...] = ("5m", "1h", "1d")
    # The quality alerts look at one k and one r (dashboards show all): where the
    # least-popular canary and the popular baseline separate most on the sample feed
    # among k >= 5 (deploy/README.md, "Which k the alerts watch").
    alert_k: int = 10
    alert_r: str = "10"
    # Quality drop (#REval): a sequential test on the chance-corrected sums over
    # `quality_window` (stream.backtest.skill_loss) -- did the recommender lose
    # `skill_loss_fraction` of its baseline skill above chance (the kappa of the same window
    # at each of `baseline_offsets` ago: daily seasonality)? Its log-likelihood ratio against
    # "kept its baseline skill" above log(1 / `false_alarm_probability`) (Wald's bound: a
    # recommender at its baseline gets there with at most that probability), for `quality_for`.
    quality_window: str = "1h"
    baseline_offsets: tuple[str, ...] = ("1d", "2d", "3d", "4d", "5d", "6d", "7d")
    skill_loss_fraction: float = 0.5
    false_alarm_probability: float = 0.01
    quality_for: str = "30m"
    # The fixed-fraction drop of a mean below its baseline that a monitor without the chance
    # correction would alert on: no deployed alert uses it; `reval backtest` compares the
    # #REval alert with it on the exact hit ratio (its `exact_drop`).
    quality_drop_fraction: float = 0.2
    # Ignore a recommender with fewer scored events than this in `quality_window`.
    min_events: int = 50
    # At chance: the chance-corrected #REval (0 = a popularity-weighted random recommender)
    # over `quality_window` at most `chance_margin`, for `chance_for`.
    chance_margin: float = 0.0
    chance_for: str = "1h"
    # Semantic gap widening: exact hit ratio falls by `gap_exact_drop_fraction` below its
    # baseline while #REval at alert_k stays within `gap_reval_tolerance` of its own.
    gap_exact_drop_fraction: float = 0.2
    gap_reval_tolerance: float = 0.05
    gap_for: str = "1h"
    # Unknown hashtags: share over `unknown_window` above `unknown_share_max` AND at least
    # `unknown_share_rise` above the share over `unknown_baseline_window` (i.e. rising).
    unknown_window: str = "1h"
    unknown_baseline_window: str = "1d"
    unknown_share_max: float = 0.2
    unknown_share_rise: float = 0.1
    unknown_for: str = "30m"
    # No recommendation events scored (at all, or for one recommender) over the window.
    no_scores_window: str = "15m"
    no_scores_for: str = "15m"
    # Consumer lag: above `lag_max_records` and still growing over `lag_growth_window`.
    lag_max_records: int = 10000
    lag_growth_window: str = "15m"
    lag_for: str = "15m"
    # Thesaurus index: no new version for `index_max_age` (or none ever built).
    index_max_age: str = "2h"
    index_for: str = "10m"
    # The scorer still uses an older thesaurus version than the index job published.
    scorer_behind_for: str = "10m"
    # Dead letters: rejected / consumed per topic over the window, with a floor on the rate.
    dead_letter_window: str = "15m"
    dead_letter_ratio_max: float = 0.05
    dead_letter_min_rate: float = 0.01
    dead_letter_for: str = "10m"
    # Embed throughput: rate over `embed_window` below `embed_collapse_fraction` of the rate
    # over the `embed_baseline_window` before it, when that baseline was at least
    # `embed_min_baseline_rate` tweets/s.
    embed_window: str = "15m"
    embed_baseline_window: str = "3h"
    embed_collapse_fraction: float = 0.25
    embed_min_baseline_rate: float = 0.1
    embed_for: str = "15m"
    # A scrape target down.
    worker_down_for: str = "5m"
    # A source topic re-created: workers wait for `reval admin accept-topic`.
    topic_reset_for: str = "1m"
    # Redis unavailable: the workers wait (back-pressure) instead of losing records.
    redis_unavailable_for: str = "2m"
    # Thesaurus coherence: the upper 95% bound of the current version's coherence lift (synonym
    # clusters against random ones, TF-IDF) falls below (1 - `coherence_drop_fraction`) x the
    # mean lift of the versions over `coherence_baseline_window`, `coherence_baseline_offset` ago.
    coherence_drop_fraction: float = 0.25
    coherence_baseline_window: str = "1d"
    coherence_baseline_offset: str = "1h"
    coherence_for: str = "15m"
    runbook: str = RUNBOOK

    def check(self) -> Params:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("windows", "baseline_offsets"):
                if not value:
                    raise ValueError(f"{f.name} must not be empty")
                for item in value:
                    seconds(item)
            elif f.name.endswith(("_window", "_for", "_offsets", "_offset", "_age")):
                seconds(value)
            elif (
                isinstance(value, float)
                and f.name.endswith(("_fraction", "_tolerance", "_max", "_rise"))
                and not 0 <= value <= 1
            ):
                raise ValueError(f"{f.name}={value} must be within [0, 1]")
        if not 0 < self.skill_loss_fraction <= 1:
            raise ValueError(f"skill_loss_fraction={self.skill_loss_fraction} must be within (0, 1]")
        if not 0 < self.false_alarm_probability < 1:
            raise ValueError(f"false_alarm_probability={self.false_alarm_probability} must be within (0, 1)")
        for name in ("quality_window", "unknown_window", "unknown_baseline_window"):
            if getattr(self, name) not in self.windows:
                raise ValueError(f"{name}={getattr(self, name)} must be one of windows={self.windows}")
        if len(set(self.windows)) != len(self.windows):
            raise ValueError("windows must be distinct")
        return self


DEFAULTS = Params()

# Short windows and hold times for the integration test against a real Prometheus
# (scrape and evaluation every second): a drift shows up within seconds.
TEST = replace(
    DEFAULTS,
    windows=("10s", "5m", "1h", "1d"),
    quality_window="10s",
    baseline_offsets=("30s", "40s", "50s"),
    quality_for="3s",
    chance_for="3s",
    min_events=20,
    gap_for="5s",
    unknown_window="10s",
    unknown_baseline_window="5m",
    unknown_for="5s",
    no_scores_window="30s",
    no_scores_for="10s",
    lag_growth_window="30s",
    lag_for="10s",
    index_max_age="5m",
    index_for="30s",
    scorer_behind_for="30s",
    dead_letter_window="30s",
    dead_letter_for="5s",
    embed_window="20s",
    embed_baseline_window="1m",
    embed_for="10s",
    worker_down_for="10s",
    topic_reset_for="5s",
    redis_unavailable_for="5s",
    coherence_baseline_window="1m",
    coherence_baseline_offset="20s",
    coherence_for="5s",
)

PROFILES = {"default": DEFAULTS, "test": TEST}


def _fmt(value: float) -> str:
    """A number as PromQL writes it (no trailing zeros)."""
    return f"{value:.6g}"


def _anchor(alert: str) -> str:
    """The README heading's anchor (GitHub lower-cases headings)."""
    return alert.lower()


def pct(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def _by_offsets(metric: str, offsets: tuple[str, ...], by: str) -> str:
    """Mean of ``metric`` at each offset; a missing offset (young deployment) is skipped."""
    parts = [f'label_replace({metric} offset {o}, "baseline_offset", "{o}", "", "")' for o in offsets]
    joined = "\n  or\n  ".join(parts)
    return f"avg by ({by}) (\n  {joined}\n)"


def recording_rules(p: Params) -> list[dict[str, Any]]:
    quality: list[dict[str, Any]] = []
    for w in p.windows:
        quality += [
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
    qw = p.quality_window
    by = "recommender, k, r"
    quality += [
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
    operations = [
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
    return [
        {"name": "reval-quality-recording", "rules": quality},
        {"name": "reval-operations-recording", "rules": operations},
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


def alert_rules(p: Params) -> list[dict[str, Any]]:
    k, r, qw = str(p.alert_k), p.alert_r, p.quality_window
    sel = f'{{k="{k}", r="{r}"}}'
    exact_sel = f'{{metric="hit_ratio", r="{r}"}}'
    enough = f"and on (recommender) reval:scored_events:rate{qw} * {_fmt(seconds(qw))} >= {p.min_events}"
    score = JOBS["score"]
    index = JOBS["index"]
    embed = JOBS["embed"]

    def alert(name: str, expr: str, hold: str, severity: str, summary: str, description: str) -> dict:
        return {
            "alert": name,
            "expr": expr,
            "for": hold,
            "labels": {"severity": severity, "service": "reval-stream"},
            "annotations": {
                "summary": summary,
                "description": description,
                "runbook_url": f"{p.runbook}#{_anchor(name)}",
            },
        }

    rules = [
        alert(
            "RevalRecommenderQualityDrop",
            (f"reval:skill_loss:llr{sel}\n> {_fmt(math.log(1 / p.false_alarm_probability))}\n{enough}"),
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
        ),
        alert(
            "RevalRecommenderAtChance",
            (f"reval:hit_ratio_corrected:kappa{qw}{sel}\n<= {_fmt(p.chance_margin)}\n{enough}"),
            p.chance_for,
            "warning",
            "Recommender {{ $labels.recommender }} is no better than chance",
            (
                "The chance-corrected #REval-hit-ratio (k={{ $labels.k }}, r={{ $labels.r }}) of recommender "
                "{{ $labels.recommender }} over the last " + qw + ' is {{ $value | printf "%.3f" }}: '
                "its recommendations hit no more often than a popularity-weighted random draw of the "
                "same size would."
            ),
        ),
        alert(
            "RevalSemanticGapWidening",
            (
                f"reval:exact_match:mean{qw}{exact_sel}\n"
                f"< {_fmt(1 - p.gap_exact_drop_fraction)} * reval:exact_match:baseline{exact_sel}\n"
                f"and on (recommender, r)\n"
                f"reval:hit_ratio:mean{qw}{sel}\n"
                f">= {_fmt(1 - p.gap_reval_tolerance)} * reval:hit_ratio:baseline{sel}\n"
                f"{enough}"
            ),
            p.gap_for,
            "info",
            "Recommender {{ $labels.recommender }}: exact match falls while #REval holds",
            (
                "The exact hit ratio (r={{ $labels.r }}) of recommender {{ $labels.recommender }} "
                "is more than "
                + pct(p.gap_exact_drop_fraction)
                + f" below its baseline while its #REval-hit-ratio at k={k} stays within "
                + pct(p.gap_reval_tolerance)
                + " of its own: the recommender (or the feed) moved to synonyms of the ground truth."
            ),
        ),
        alert(
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
        ),
        alert(
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
        ),
        alert(
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
        ),
        alert(
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
        ),
        alert(
            "RevalScorerThesaurusBehind",
            (
                f'max(reval_index_version{{job="{index}"}})\n'
                f'> min(reval_scoring_thesaurus_version{{job="{score}"}})'
            ),
            p.scorer_behind_for,
            "warning",
            "A scoring worker does not load the newest thesaurus version",
            (
                "The index job published a newer thesaurus version than at least one scoring worker "
                "uses, for more than " + p.scorer_behind_for + "."
            ),
        ),
        alert(
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
                "More than "
                + pct(p.dead_letter_ratio_max)
                + " of the records consumed from {{ $labels.topic }} "
                "were rejected over the last " + p.dead_letter_window + "."
            ),
        ),
        alert(
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
        ),
        alert(
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
        ),
        alert(
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
        ),
        alert(
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
        ),
        alert(
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
        ),
        _coherence_alert(p, alert),
    ]
    return [{"name": "reval-alerts", "rules": rules}]


def _coherence_alert(p: Params, alert: Any) -> dict[str, Any]:
    lift = f'reval_thesaurus_coherence_lift{{job="{JOBS["index"]}", metric="tfidf"'
    baseline = (
        f'avg_over_time({lift}, bound="estimate"}}[{p.coherence_baseline_window}] '
        f"offset {p.coherence_baseline_offset})"
    )
    return alert(
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
    evaluation_interval: str = "15s",
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


def parse_set(params: Params, items: list[str]) -> Params:
    """``params`` with ``NAME=VALUE`` overrides (``--set``); ValueError names a bad one."""
    known = {f.name: f for f in fields(Params)}
    changes: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or name not in known:
            raise ValueError(f"--set {item!r}: expected NAME=VALUE with NAME one of {', '.join(known)}")
        current = getattr(params, name)
        if isinstance(current, tuple):
            changes[name] = tuple(x.strip() for x in text.split(",") if x.strip())
        elif isinstance(current, bool):
            changes[name] = text.lower() in ("1", "true", "yes")
        elif isinstance(current, int):
            changes[name] = int(text)
        elif isinstance(current, float):
            changes[name] = float(text)
        else:
            changes[name] = text
    return replace(params, **changes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", choices=sorted(PROFILES), default="default")
    parser.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="override a parameter"
    )
    parser.add_argument("--config", action="store_true", help="render the scrape config instead of the rules")
    parser.add_argument("--list", action="store_true", help="print the parameters and exit")
    parser.add_argument(
        "-o", "--out", type=Path, help="output file ('-' = stdout) [default: rules.yml / prometheus.yml here]"
    )
    args = parser.parse_args(argv)
    try:
        params = parse_set(PROFILES[args.profile], args.set)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for name, value in asdict(params).items():
            print(f"{name} = {value!r}")
        return 0
    try:
        text = render_config() if args.config else render_rules(params)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = args.out or HERE / ("prometheus.yml" if args.config else "rules.yml")
    if str(out) == "-":
        sys.stdout.write(text)
    else:
        out.write_text(text)
        print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
