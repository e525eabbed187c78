"""The thesaurus audit on the live path: the vote log in Kafka, each new version's
coherence lift from the Redis reservoir and its agreement with the votes.

* :class:`VoteLog` -- the audit's events (:mod:`stream.auditing.audit`) in the ``votes`` topic, one
  partition so the log has one order; the web page appends, everyone else reads it whole.
* :func:`live_coherence` -- the TF-IDF coherence lift of a version's synonym sets over the
  tweets the embed workers sampled (:class:`~workers.adapters.redis.redis_reservoir.RedisReservoir`).
  TF-IDF only: the index job loads no model, and BERTScore needs one (``reval thesaurus
  coherence`` computes both).
* :class:`VersionAudit` -- what the index job runs for each new version: both of the
  above, the gauges, and the ``audit`` field of the version's metadata.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from stream.auditing.audit import AuditState, Plan, agreement, replay
from stream.auditing.coherence import (
    coherence_lift,
    eligible,
    pair_clusters,
    score_pairings,
    tags_of,
    tfidf_coherence,
)
from stream.feeds.replay import Outgoing
from workers.adapters.files.annoy_thesaurus import AnnoyThesaurus
from workers.adapters.kafka.kafka_client import BrokerError, KafkaSink, ensure_topic, read_topic
from workers.adapters.prometheus.exporter import Exporter
from workers.adapters.redis.redis_client import Client, with_retry
from workers.adapters.redis.redis_reservoir import RedisReservoir
from workers.settings import AuditSettings, VoteSettings

log = logging.getLogger("reval.workers")

#: Bootstrap resamples of the live gauges (the CLI's default is larger).
LIVE_RESAMPLES = 500


class VoteLog:
    """The audit's events in Kafka: appended one at a time and acknowledged by the broker
    (``acks=all``, idempotent producer) before :meth:`append` returns."""

    def __init__(self, settings: VoteSettings, *, timeout: float = 30.0) -> None:
        self.bootstrap = settings.broker
        self.topic = settings.topic_votes
        self.options = settings.kafka_client_options()
        self.timeout = timeout
        self._sink: KafkaSink | None = None

    def ensure(self) -> None:
        """Create the topic (one partition) unless it exists."""
        ensure_topic(self.bootstrap, self.topic, 1, timeout=self.timeout, **self.options)

    def events(self) -> list[dict[str, Any]]:
        """Every event so far, in log order (records that are not JSON objects skipped)."""
        out = []
        for _, offset, _, value in read_topic(
            self.bootstrap, self.topic, timeout=self.timeout, **self.options
        ):
            try:
                event = json.loads(value)
            except ValueError:
                log.warning("votes: record %d is not JSON, skipped", offset)
                continue
            if isinstance(event, dict):
                out.append(event)
        return out

    def append(self, event: Mapping[str, Any]) -> None:
        """Append one event and wait for the broker's acknowledgement; raises
        :class:`ProduceError` when it is not acknowledged."""
        if self._sink is None:
            self._sink = KafkaSink(
                self.bootstrap, self.topic, linger_ms=0, client_id="reval-audit", **self.options
            )
        value = json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()
        key = str(event.get("audit", "")).encode() or None
        self._sink(Outgoing(key, value, int(time.time() * 1000), f"vote {event.get('vote_id', '')}"))
        self._sink.flush(timeout=self.timeout)

    def close(self) -> None:
        if self._sink is not None:
            self._sink.close()
            self._sink = None


def model_scores(plan: Plan, thesaurus: AnnoyThesaurus) -> list[npt.NDArray[np.float64]]:
    """The thesaurus's similarity of every item of each area; a pair with a hashtag it
    does not know ranks below every known pair (a version that lost a hashtag ranks it
    last, as a person would not)."""
    out = []
    for area in plan.areas:
        sims = thesaurus.similarities(area.items)
        floor = float(np.nanmin(sims)) - 1.0 if np.isfinite(sims).any() else 0.0
        out.append(np.where(np.isfinite(sims), sims, floor))
    return out


def latest_audit(states: Mapping[str, AuditState], name: str | None = None) -> AuditState | None:
    """The audit called ``name``, else the last one planned in the log."""
    if name is not None:
        return states.get(name)
    return list(states.values())[-1] if states else None


def version_coherence(
    thesaurus: AnnoyThesaurus,
    counts: Mapping[str, int],
    fetch: Callable[[set[str]], Mapping[str, Sequence[str]]],
    *,
    k: int,
    sample: int,
    min_tweets: int,
    seed: int,
    resamples: int = LIVE_RESAMPLES,
) -> dict[str, Any] | None:
    """The TF-IDF coherence lift of ``thesaurus`` over sampled tweets: ``sample`` hashtags
    with at least ``min_tweets`` tweets, their top ``k`` synonyms against random hashtags
    of matched popularity.  ``counts``: tweets per hashtag that has a sample (its
    popularity); ``fetch(hashtags)``: their samples.  None when nothing qualifies."""
    rng = np.random.default_rng(seed)
    candidates = sorted(h for h, n in counts.items() if n >= min_tweets and h in thesaurus)
    if not candidates or not sample:
        return None
    chosen = rng.choice(candidates, min(sample, len(candidates)), replace=False)
    pairings = pair_clusters([str(h) for h in chosen], thesaurus.neighbours, counts, k, rng)
    samples = fetch(tags_of(pairings))
    enough = set(eligible(samples, min_tweets))
    pairings = [p for p in pairings if p.hashtag in enough]
    synonyms, random = score_pairings(pairings, samples, tfidf_coherence)
    lift = coherence_lift(synonyms, random, resamples=resamples, seed=seed)
    return None if lift is None else {**lift.to_dict(), "k": k}


def live_coherence(
    thesaurus: AnnoyThesaurus,
    counts: Mapping[str, int],
    reservoir: RedisReservoir,
    settings: AuditSettings,
    seed: int,
) -> dict[str, Any] | None:
    """:func:`version_coherence` over the embed workers' reservoir (``counts``: every
    hashtag's tweets, from the running means)."""
    pooled = with_retry("reservoir", reservoir.hashtags)
    return version_coherence(
        thesaurus,
        {h: n for h, n in counts.items() if h in pooled},
        lambda tags: with_retry("reservoir", lambda: reservoir.samples(tags)),
        k=settings.coherence_k,
        sample=settings.coherence_sample,
        min_tweets=settings.coherence_min_tweets,
        seed=seed,
    )


def version_agreement(
    state: AuditState | None, thesaurus: AnnoyThesaurus, resamples: int = LIVE_RESAMPLES
) -> dict[str, Any] | None:
    """ρ_w, τ_w (overall, with intervals) of ``thesaurus`` against an audit's votes; None
    without votes."""
    if state is None or not state.votes:
        return None
    _, overall = agreement(state, model_scores(state.plan, thesaurus), resamples=resamples)
    return {"audit": state.plan.audit, **overall.to_dict()}


class VersionAudit:
    """Coherence and agreement of each new version, for the index job."""

    def __init__(self, settings: AuditSettings, exporter: Exporter, client: Client) -> None:
        self.settings = settings
        self.x = exporter
        self.reservoir = RedisReservoir(client, settings.redis_prefix, settings.coherence_reservoir)
        self.votes = VoteLog(settings, timeout=5.0)
        self.x.set_coherence("tfidf", None)
        self.x.set_agreement(None)

    def run(self, thesaurus: AnnoyThesaurus, counts: Mapping[str, int], seed: int) -> dict[str, Any]:
        """Measure, export and return the version's ``audit`` annotation.  Never fails the
        build: what cannot be measured is left out (and its gauges are NaN)."""
        out: dict[str, Any] = {}
        try:
            coherence = live_coherence(thesaurus, counts, self.reservoir, self.settings, seed)
        except ValueError as exc:  # a thesaurus without neighbours for the sample, say
            log.warning("index: no coherence for this version (%s)", exc)
            coherence = None
        self.x.set_coherence("tfidf", coherence)
        if coherence is not None:
            out["coherence"] = {"tfidf": coherence}
            log.info(
                "index: coherence lift (tfidf) %.4f [%.4f, %.4f] over %d hashtags",
                coherence["lift"],
                coherence["lift_ci_low"],
                coherence["lift_ci_high"],
                coherence["hashtags"],
            )
        found = self._agreement(thesaurus)
        self.x.set_agreement(found)
        if found is not None:
            out["agreement"] = found
        return out

    def _agreement(self, thesaurus: AnnoyThesaurus) -> dict[str, Any] | None:
        try:
            events = self.votes.events()
        except BrokerError:  # no votes topic (no audit yet), or the broker is away
            return None
        return version_agreement(latest_audit(replay(events)), thesaurus)
