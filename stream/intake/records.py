"""Tweet records: one parser for Twitter API v1.1, API v2 and the minimal feed format.

Every record the system reads -- a Kafka message, a line of an archive, a CSV
row -- goes through :func:`parse_tweet`.  A record that cannot be used raises
:class:`RecordError` whose ``reason`` is a short, stable code (used as the
dead-letter reason and as a metric label) and whose message says what was
wrong and where.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, TypeVar

from stream.intake.hashtags import extract_hashtags, normalise_all

MAX_RECORD_BYTES = 512 * 1024
MAX_TEXT_CHARS = 25_000  # API v2 note tweets go up to 25,000 characters
MAX_HASHTAGS = 100


class RecordError(ValueError):
    """A record that cannot be used; ``reason`` is a stable machine-readable code.

    Codes: ``not_json``, ``invalid_utf8``, ``not_object``, ``missing_field``,
    ``bad_type``, ``bad_time``, ``oversize``, ``too_many_hashtags``, ``bad_value``.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.detail = message


@dataclass(frozen=True, slots=True)
class Coordinates:
    """Where a record came from: its topic, partition and offset -- the one spelling of a
    record's source, with every textual form the workers store written here once.

    The forms with a topic *incarnation* (the topic re-created under the same name starts
    its offsets again) are Redis keys and claims of running deployments: their text stays.

    >>> c = Coordinates("tweets", 3, 42)
    >>> str(c), c.as_dict()  # logs, letter keys; a dead letter's "source"
    ('tweets:3:42', {'topic': 'tweets', 'partition': 3, 'offset': 42})
    >>> c.scoped("k2"), c.event_id("k2"), c.claim("k2")  # embed claims; join ids and claims
    ('tweets@k2:3:42', 'k2:3:42', 'k2|tweets|3|42')
    >>> Coordinates.from_claim(c.claim("k2"))
    ('k2', Coordinates(topic='tweets', partition=3, offset=42))
    """

    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.topic}:{self.partition}:{self.offset}"

    def as_dict(self) -> dict[str, str | int]:
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset}

    def scoped(self, incarnation: str) -> str:
        """``topic@incarnation:partition:offset``: who claims a tweet's content (embed role)."""
        return f"{self.topic}@{incarnation}:{self.partition}:{self.offset}"

    def event_id(self, incarnation: str) -> str:
        """``incarnation:partition:offset``: an event's id in the join (its topic is known)."""
        return f"{incarnation}:{self.partition}:{self.offset}"

    def claim(self, incarnation: str) -> str:
        """``incarnation|topic|partition|offset``: the record that holds a join claim."""
        return f"{incarnation}|{self.topic}|{self.partition}|{self.offset}"

    @classmethod
    def from_claim(cls, text: str) -> tuple[str, Coordinates]:
        """The incarnation and coordinates of :meth:`claim`'s text."""
        incarnation, topic, partition, offset = text.split("|")
        return incarnation, cls(topic, int(partition), int(offset))


@dataclass(frozen=True)
class Tweet:
    """A parsed tweet.  ``hashtags`` are normalised; ``retweet_of`` is the original's id
    when the API says so (the minimal format only has the ``RT @user:`` text convention,
    see :attr:`is_retweet`)."""

    id: str
    text: str
    created_at: datetime | None = None
    hashtags: tuple[str, ...] = ()
    lang: str | None = None
    user_id: str | None = None
    retweet_of: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_retweet(self) -> bool:
        return self.retweet_of is not None or self.text.startswith("RT @")


def _decode(raw: bytes | str | Mapping[str, Any], max_bytes: int) -> Mapping[str, Any]:
    if isinstance(raw, Mapping):
        return raw
    if isinstance(raw, bytes | bytearray | memoryview):
        if len(raw) > max_bytes:
            raise RecordError("oversize", f"record is {len(raw):,} bytes (limit {max_bytes:,})")
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordError("invalid_utf8", f"record is not valid UTF-8 ({exc})") from None
    elif len(raw) > max_bytes:
        raise RecordError("oversize", f"record is {len(raw):,} characters (limit {max_bytes:,})")
    try:
        obj = json.loads(raw)
    except RecursionError:
        raise RecordError("not_json", "not JSON we accept: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and integers beyond Python's digit limit
        raise RecordError("not_json", f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise RecordError("not_object", f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _str_field(
    obj: Mapping[str, Any], *names: str, required: bool = False, numbers: bool = False
) -> str | None:
    """The first present field of ``names`` as a string; ids (``numbers``) may be integers."""
    allowed = (str, int) if numbers else (str,)
    for name in names:
        value = obj.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, allowed):
            raise RecordError("bad_type", f"field {name!r} must be a string, got {_kind(value)}")
        return str(value)
    if required:
        raise RecordError("missing_field", f"missing field {' / '.join(map(repr, names))}")
    return None


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def parse_time(value: Any) -> datetime:
    """Parse a tweet time: ISO 8601 (API v2, minimal feed), v1.1's ``Wed Oct 10 20:19:24
    +0000 2018``, or epoch seconds/milliseconds.  Always returns an aware UTC datetime.

    >>> parse_time("Wed Oct 10 20:19:24 +0000 2018").isoformat()
    '2018-10-10T20:19:24+00:00'
    >>> parse_time("2012-05-18T11:04:31.662Z").isoformat()
    '2012-05-18T11:04:31.662000+00:00'
    """
    if isinstance(value, bool):
        raise RecordError("bad_time", f"unparseable created_at {value!r}")
    if isinstance(value, int | float):
        seconds = value / 1000 if value > 1e11 else value  # epoch ms vs s
        try:
            return datetime.fromtimestamp(seconds, tz=UTC)
        except (OverflowError, OSError, ValueError):
            raise RecordError("bad_time", f"created_at {value!r} is out of range") from None
    if not isinstance(value, str):
        raise RecordError("bad_time", f"created_at must be a string or number, got {_kind(value)}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        try:
            parsed = datetime.strptime(value, "%a %b %d %H:%M:%S %z %Y")
        except ValueError:
            raise RecordError("bad_time", f"unparseable created_at {value!r}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def _entity_hashtags(entities: Any) -> list[str]:
    """Hashtags from ``entities.hashtags``: ``{"text": ..}`` in v1.1, ``{"tag": ..}`` in v2."""
    if entities is None:
        return []
    if not isinstance(entities, Mapping):
        raise RecordError("bad_type", f"'entities' must be an object, got {_kind(entities)}")
    tags = entities.get("hashtags") or []
    if not isinstance(tags, list):
        raise RecordError("bad_type", f"'entities.hashtags' must be a list, got {_kind(tags)}")
    out = []
    for i, tag in enumerate(tags):
        value = (tag.get("tag") or tag.get("text")) if isinstance(tag, Mapping) else None
        if not isinstance(value, str):
            raise RecordError("bad_type", f"entities.hashtags[{i}] has no string 'tag' or 'text'")
        out.append(value)
    return out


def _v1_text(obj: Mapping[str, Any]) -> str | None:
    extended = obj.get("extended_tweet")
    if isinstance(extended, Mapping) and isinstance(extended.get("full_text"), str):
        return str(extended["full_text"])
    return _str_field(obj, "full_text", "text")


def parse_tweet(
    raw: bytes | str | Mapping[str, Any],
    *,
    max_bytes: int = MAX_RECORD_BYTES,
    max_text: int = MAX_TEXT_CHARS,
    max_hashtags: int = MAX_HASHTAGS,
) -> Tweet:
    """Parse one tweet in any supported format, or raise :class:`RecordError`.

    >>> t = parse_tweet('{"id": "1", "created_at": "2013-01-01T00:00:00Z", "text": "Go #Help"}')
    >>> t.id, t.hashtags
    ('1', ('help',))
    >>> parse_tweet('{"text": "no id"}')
    Traceback (most recent call last):
    ...
    stream.intake.records.RecordError: missing_field: missing field 'id_str' / 'id'
    """
    obj = _decode(raw, max_bytes)
    if isinstance(obj.get("data"), Mapping):  # API v2 response wrapper
        obj = obj["data"]

    tweet_id = _str_field(obj, "id_str", "id", required=True, numbers=True)
    assert tweet_id is not None
    if not tweet_id.strip():
        raise RecordError("bad_value", "field 'id' is empty")

    retweet_of: str | None = None
    source = obj
    original = obj.get("retweeted_status")
    if original is not None:  # v1.1: the retweet's own text is clipped; use the original's
        if not isinstance(original, Mapping):
            raise RecordError("bad_type", "'retweeted_status' must be an object")
        retweet_of = _str_field(original, "id_str", "id", numbers=True)
        source = original
    refs = obj.get("referenced_tweets")
    if refs is not None:  # API v2
        if not isinstance(refs, list):
            raise RecordError("bad_type", "'referenced_tweets' must be a list")
        for ref in refs:
            if isinstance(ref, Mapping) and ref.get("type") == "retweeted":
                retweet_of = _str_field(ref, "id", numbers=True)

    note = obj.get("note_tweet")
    if isinstance(note, Mapping) and isinstance(note.get("text"), str):
        text: str | None = str(note["text"])
    else:
        text = _v1_text(source) or _v1_text(obj)
    if text is None:
        raise RecordError("missing_field", "missing field 'text' / 'full_text'")
    if len(text) > max_text:
        raise RecordError("oversize", f"text is {len(text):,} characters (limit {max_text:,})")

    created = obj.get("created_at")
    created_at = parse_time(created) if created is not None else None

    lang = _str_field(obj, "lang")
    user = obj.get("user")
    user_id = _str_field(user, "id_str", "id", numbers=True) if isinstance(user, Mapping) else None
    user_id = user_id or _str_field(obj, "author_id", "user_id", numbers=True)

    extended = source.get("extended_tweet")
    entities = extended.get("entities") if isinstance(extended, Mapping) else None
    entity_tags = _entity_hashtags(entities or source.get("entities"))
    if len(entity_tags) > max_hashtags:
        raise RecordError("too_many_hashtags", f"{len(entity_tags):,} hashtags (limit {max_hashtags})")
    hashtags = normalise_all([*entity_tags, *extract_hashtags(text)])
    if len(hashtags) > max_hashtags:
        raise RecordError("too_many_hashtags", f"{len(hashtags):,} hashtags (limit {max_hashtags})")

    return Tweet(
        id=tweet_id,
        text=text,
        created_at=created_at,
        hashtags=tuple(hashtags),
        lang=lang.lower() if lang else None,
        user_id=user_id,
        retweet_of=retweet_of,
        extra=obj,
    )


@dataclass(frozen=True)
class Recommendation:
    """One recommendation event: what ``recommender`` suggested for tweet ``tweet_id``.

    ``recommended`` is ranked, normalised and without duplicates.  ``ground_truth``
    is ``None`` when the event carries none (the scorer then joins it with the tweet
    of the same id); an empty list is a real, empty ground truth (unscorable).
    """

    tweet_id: str
    recommended: tuple[str, ...]
    ground_truth: tuple[str, ...] | None = None
    recommender: str = "default"
    ts: datetime | None = None


_ONLY_STR = frozenset([str])  # what JSON decodes a string to: str itself, never a subclass


def _hashtag_list(obj: Mapping[str, Any], name: str, max_hashtags: int) -> tuple[str, ...] | None:
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not _ONLY_STR.issuperset(map(type, value)):
        raise RecordError("bad_type", f"field {name!r} must be a list of strings")
    if len(value) > max_hashtags:
        raise RecordError("too_many_hashtags", f"{name!r} has {len(value):,} items (limit {max_hashtags})")
    return tuple(normalise_all(value))


def parse_recommendation(
    raw: bytes | str | Mapping[str, Any],
    *,
    max_bytes: int = MAX_RECORD_BYTES,
    max_hashtags: int = MAX_HASHTAGS,
) -> Recommendation:
    """Parse ``{"tweet_id", "recommender"?, "recommended", "ground_truth"?, "ts"?}``.

    Unknown fields are ignored, so producers can add their own.

    >>> event = parse_recommendation('{"tweet_id": 7, "recommended": ["#Flood", "flood", "help"]}')
    >>> event.tweet_id, event.recommended, event.ground_truth, event.recommender
    ('7', ('flood', 'help'), None, 'default')
    """
    obj = _decode(raw, max_bytes)
    tweet_id = _str_field(obj, "tweet_id", required=True, numbers=True)
    assert tweet_id is not None
    recommended = _hashtag_list(obj, "recommended", max_hashtags)
    if recommended is None:
        raise RecordError("missing_field", "missing field 'recommended'")
    recommender = _str_field(obj, "recommender") or "default"
    ts = obj.get("ts")
    return Recommendation(
        tweet_id=tweet_id,
        recommended=recommended,
        ground_truth=_hashtag_list(obj, "ground_truth", max_hashtags),
        recommender=recommender,
        ts=parse_time(ts) if ts is not None else None,
    )


T = TypeVar("T")


@dataclass(frozen=True)
class Parsed(Generic[T]):
    """One line of a feed file after parsing: ``value`` or ``error`` (never both).

    ``path`` and ``line`` say where it came from; ``raw`` is what was read (a JSON
    line as text, a CSV row as a dict), so replays can send the original bytes.
    """

    path: Path
    line: int
    value: T | None = None
    error: RecordError | None = None
    raw: str | dict[str, Any] | None = None


@dataclass
class ErrorLog:
    """Counts bad lines by reason and keeps the first few locations for the summary.

    >>> log = ErrorLog(keep=1)
    >>> log.add(Parsed(Path("feed.jsonl"), 3, error=RecordError("not_json", "not JSON")))
    >>> log.add(Parsed(Path("feed.jsonl"), 9, error=RecordError("not_json", "not JSON")))
    >>> log.total, log.by_reason, log.first
    (2, {'not_json': 2}, ['feed.jsonl:3: not_json: not JSON'])
    """

    keep: int = 10

    def __post_init__(self) -> None:
        self.by_reason: dict[str, int] = {}
        self.first: list[str] = []

    def add(self, item: Parsed[Any]) -> None:
        assert item.error is not None
        self.note(f"{item.path}:{item.line}", item.error)

    def note(self, where: str, error: RecordError) -> None:
        """Count one bad record found at ``where``."""
        self.by_reason[error.reason] = self.by_reason.get(error.reason, 0) + 1
        if len(self.first) < self.keep:
            self.first.append(f"{where}: {error}")

    @property
    def total(self) -> int:
        return sum(self.by_reason.values())
