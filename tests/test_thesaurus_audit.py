"""The audit on the live path, on real Redis and Apache Kafka: the coherence reservoir,
the index job's gauges and version metadata, the agreement with a vote log."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from stream.auditing.audit import Area, AuditState, Plan
from stream.auditing.coherence import bottom_k
from stream.intake.records import Coordinates
from tests.live import prefixed_redis
from workers.adapters.prometheus.exporter import Exporter
from workers.adapters.redis.redis_means import Contribution
from workers.adapters.redis.redis_reservoir import RedisReservoir
from workers.service.index import Indexer
from workers.service.stores import means_of
from workers.service.thesaurus_audit import VoteLog
from workers.settings import Settings

pytestmark = [pytest.mark.integration]
WORDS = {
    "flood": "water river rescue levee rain boats evacuate shelter sandbag overflow",
    "quake": "magnitude shaking aftershock rubble epicentre tremor collapse seismic tsunami fault",
    "bomb": "explosion marathon finish police suspect blast injured runners manhunt witness",
    "fire": "wildfire smoke blaze acres firefighters containment evacuation embers drought heat",
}
TOPICS = {topic: words.split(" ") for topic, words in WORDS.items()}


@pytest.fixture
def client(redis_url: str, redis_prefix: str) -> Iterator[redis.Redis]:
    with prefixed_redis(redis_url, redis_prefix) as c:
        yield c


def test_the_reservoir_is_the_bottom_k_whatever_the_order_redeliveries_and_writers(
    client: redis.Redis, redis_prefix: str
) -> None:
    # Each text twice, an hour apart: the sample keeps the hour it was first seen, whichever
    # copy arrives first.
    texts = [
        (("flood", "rain") if i % 3 else ("flood",), f"water level {i}", 3600.0 * (i + copy))
        for i in range(300)
        for copy in (0, 1)
    ]
    expected = bottom_k([(t, text) for tags, text, _ in texts for t in tags], 20)
    reservoir = RedisReservoir(client, redis_prefix, size=20)
    rng = np.random.default_rng(0)
    order = [texts[i] for i in rng.permutation(len(texts))]
    halves = [order[:200] + order[50:120], order[150:] + order[:30]]  # overlapping: redeliveries
    writers = [
        threading.Thread(target=lambda part=part: [reservoir.add([x]) for x in part]) for part in halves
    ]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    reservoir.add(order)  # a full replay of the stream changes nothing either
    assert reservoir.hashtags() == {"flood", "rain"}
    assert reservoir.samples(["flood", "rain"]) == expected
    assert client.zcard(reservoir.key("flood")) == 20
    first_hour = {f"water level {i}": 3600.0 * i for i in range(300)}
    dated = reservoir.dated_samples(["flood"])["flood"]
    assert [text for text, _ in dated] == expected["flood"]
    assert all(when == first_hour[text] for text, when in dated)
    assert reservoir.add([(("flood",), "", 0.0)]) == 0  # a text left empty is not sampled


def _feed(seed: int = 0) -> tuple[list[Contribution], list[tuple[tuple[str, ...], str, float]]]:
    """Hashtags of 4 topics: tweet vectors near their topic's centre, texts in its words."""
    rng = np.random.default_rng(seed)
    centres = {t: rng.normal(size=24) for t in TOPICS}
    contributions: list[Contribution] = []
    texts: list[tuple[tuple[str, ...], str, float]] = []
    offset = 0
    for topic, words in TOPICS.items():
        for j in range(12):
            tag = f"{topic}{j}"
            for _ in range(8):
                vector = centres[topic] + 0.5 * rng.normal(size=24)
                contributions.append(
                    Contribution(Coordinates("tweets", 0, offset), [tag], vector, time=60.0 * offset)
                )
                text = " ".join(rng.choice(words, 5)) + f" extra{rng.integers(1000)}"
                texts.append(((tag,), text, 60.0 * offset))
                offset += 1
    return contributions, texts


@pytest.mark.timeout(300)
def test_the_index_job_exports_coherence_and_agreement_per_version(
    tmp_path: Path, client: redis.Redis, redis_prefix: str, broker: str
) -> None:
    settings = Settings(
        index_dir=tmp_path / "store",
        redis_prefix=redis_prefix,
        model="test-model",
        index_n_trees=10,
        broker=broker,
        topic_votes=f"votes-{redis_prefix}",
        coherence_k=5,
        coherence_min_tweets=4,
        coherence_sample=40,
    )
    x = Exporter()
    indexer = Indexer(settings, x, client)

    def gauge(name: str, **labels: str) -> float:
        value = x.registry.get_sample_value(name, labels)
        assert value is not None, (name, labels)
        return value

    contributions, texts = _feed()
    means_of(client, settings).apply(contributions)
    RedisReservoir(client, redis_prefix, settings.coherence_reservoir).add(texts)
    assert indexer.run_once() == "v000001"
    lift = gauge("reval_thesaurus_coherence_lift", metric="tfidf", bound="estimate")
    low = gauge("reval_thesaurus_coherence_lift", metric="tfidf", bound="ci_low")
    # synonyms come from the same topic, and so do their words: far more coherent than chance
    assert low > 0 and lift > low
    assert gauge("reval_thesaurus_coherence", metric="tfidf", cluster="synonyms") > gauge(
        "reval_thesaurus_coherence", metric="tfidf", cluster="random"
    )
    assert math.isnan(gauge("reval_thesaurus_human_agreement", metric="tau_w", bound="estimate"))  # no votes
    meta = json.loads((tmp_path / "store" / "v000001" / "metadata.json").read_text())
    assert meta["audit"]["coherence"]["tfidf"]["lift"] == pytest.approx(lift)
    assert "agreement" not in meta["audit"]

    # People vote (an audit on this thesaurus's pairs): the next version reports agreement.
    hashtags = ("flood0", "flood1", "flood2", "quake0", "quake1", "bomb0", "fire0")
    plan = Plan("live", "v000001", (Area("flood0", hashtags),), 2, 0.1, 2, seed=0).check()
    log = VoteLog(settings)
    log.ensure()
    log.append({"type": "plan", "audit": "live", "plan": plan.to_dict()})
    state = AuditState(plan)
    same = {h: h.rstrip("0123456789") for h in hashtags}
    for n, (area, cid, left, right) in enumerate(state.pending()):
        a, b = (plan.areas[0].items[i] for i in (left, right))
        related = [same[a[0]] == same[a[1]], same[b[0]] == same[b[1]]]
        choice = "tie" if related[0] == related[1] else ("left" if related[0] else "right")
        vote = {
            "type": "vote",
            "audit": "live",
            "vote_id": f"vote-{n:05d}",
            "area": area,
            "comparison": cid,
            "choice": choice,
        }
        log.append(vote)
    log.close()
    more, _ = _feed(seed=1)
    means_of(client, settings).apply(
        [
            Contribution(Coordinates("tweets", 1, c.coordinates.offset), c.hashtags, c.vector, c.time)
            for c in more
        ]
    )
    assert indexer.run_once() == "v000002"
    tau = gauge("reval_thesaurus_human_agreement", metric="tau_w", bound="estimate")
    assert tau > 0.2  # people and thesaurus both put same-topic pairs first
    assert gauge("reval_audit_votes") == 21
    meta = json.loads((tmp_path / "store" / "v000002" / "metadata.json").read_text())
    assert meta["audit"]["agreement"]["audit"] == "live"
    assert meta["audit"]["agreement"]["tau_w"] == pytest.approx(tau)
