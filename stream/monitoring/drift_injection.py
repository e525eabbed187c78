"""Drifts injected into recommendation lists, for the backtest (:mod:`stream.monitoring.backtest`).

``reval backtest --inject KIND:AMOUNT[@TIME]`` changes the recommendations from TIME on in
one of the :data:`KINDS` of ways; :func:`parse_injection` reads the option, :func:`inject`
changes one list (``swap`` and ``stale`` replace whole lists: the caller takes them from
another model).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from stream.intake.records import RecordError, parse_time
from stream.options import parse_number

__all__ = ["KINDS", "Injection", "inject", "mutual_synonym", "parse_injection", "respell"]

#: Drift kinds: what each does to a recommendation list from the injection time on.
KINDS = {
    "random": "a fraction F of each list replaced by random known hashtags",
    "swap": "the recommender replaced by another (swap:least-popular: the canary)",
    "synonyms": "a fraction F of the recommended hashtags replaced by their nearest mutual thesaurus synonym",
    "stale": "recommendations from the model of D days before (stale:D)",
    "vocab": "a fraction F of the recommended hashtags respelled (unknown to the thesaurus)",
}

_INJECTION = re.compile(r"^(?P<kind>[a-z-]+):(?P<amount>[^@]+)(?:@(?P<at>.+))?$")


@dataclass(frozen=True)
class Injection:
    """One drift: ``kind`` from ``at`` on (None: the middle of the scored period).
    ``amount`` is the fraction F, the days D of ``stale`` or the recommender of ``swap``."""

    kind: str
    amount: str
    at: datetime | None = None

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.amount}"

    @property
    def fraction(self) -> float:
        return float(self.amount)


def parse_injection(text: str) -> Injection:
    """``KIND:AMOUNT[@TIME]`` → :class:`Injection`; TIME is ISO 8601 (UTC if no zone).

    >>> parse_injection("random:0.5@2013-01-01").at.isoformat()
    '2013-01-01T00:00:00+00:00'
    >>> parse_injection("stale:30").label
    'stale:30'
    >>> parse_injection("random:2")
    Traceback (most recent call last):
    ...
    ValueError: --inject random:2: the fraction must be in (0, 1]
    """
    match = _INJECTION.match(text.strip())
    if not match:
        raise ValueError(f"--inject {text!r}: expected KIND:AMOUNT[@TIME], e.g. random:0.5@2013-01-01")
    kind, amount, at_text = match["kind"], match["amount"].strip(), match["at"]
    if kind not in KINDS:
        raise ValueError(f"--inject {text}: unknown kind {kind!r}; one of {', '.join(KINDS)}")
    if kind in ("random", "synonyms", "vocab"):
        parse_number(amount, f"--inject {text}: the fraction must be in (0, 1]", at_most=1.0)
    elif kind == "stale":
        parse_number(amount, f"--inject {text}: stale needs a positive number of days")
    elif kind == "swap" and amount != "least-popular":
        raise ValueError(f"--inject {text}: swap supports least-popular")
    at = None
    if at_text:
        try:
            at = parse_time(at_text.strip())
        except RecordError:
            raise ValueError(f"--inject {text}: {at_text!r} is not an ISO 8601 time") from None
    return Injection(kind, amount, at)


def _positions(n: int, fraction: float, rng: np.random.Generator) -> list[int]:
    """``round(fraction * n)`` distinct positions of a list of ``n`` (at least one when n > 0)."""
    if n == 0:
        return []
    count = min(n, max(1, round(fraction * n)))
    return sorted(int(i) for i in rng.choice(n, size=count, replace=False))


def respell(hashtag: str, known: Callable[[str], bool]) -> str:
    """A new spelling of ``hashtag`` that ``known`` does not know (its last letter doubled,
    else a numbered suffix): the way fresh variants of a hashtag appear in a feed.

    >>> respell("flood", lambda h: h == "floodd")
    'flood_2'
    """
    candidate = hashtag + hashtag[-1:]
    suffix = 2
    while known(candidate):
        candidate = f"{hashtag}_{suffix}"
        suffix += 1
    return candidate


def mutual_synonym(hashtag: str, taken: set[str], neighbours: Callable[[str], Sequence[str]]) -> str | None:
    """The nearest neighbour ``s`` of ``hashtag`` (not in ``taken``) that has ``hashtag``
    among its own neighbours: #REval then credits ``s`` wherever it credited ``hashtag``
    as a ground truth (a hit needs the truth among the *recommended* hashtag's synonyms).

    >>> table = {"flood": ["fire", "floods"], "fire": ["smoke"], "floods": ["flood"]}
    >>> mutual_synonym("flood", set(), lambda h: table.get(h, []))
    'floods'
    """
    for candidate in neighbours(hashtag):
        if candidate not in taken and hashtag in neighbours(candidate):
            return candidate
    return None


def inject(
    kind: str,
    fraction: float,
    recs: Sequence[str],
    rng: np.random.Generator,
    *,
    vocabulary: Sequence[str] = (),
    synonym: Callable[[str, set[str]], str | None] = lambda h, taken: None,
    known: Callable[[str], bool] = lambda h: False,
) -> list[str]:
    """One list after a ``random``, ``synonyms`` or ``vocab`` drift (``swap`` and ``stale``
    replace whole lists: the caller takes them from another model).  ``synonym(h, taken)``
    is a synonym of ``h`` not in ``taken`` (None: ``h`` stays).

    >>> rng = np.random.default_rng(0)
    >>> inject("synonyms", 1.0, ["flood", "fire"], rng, synonym=lambda h, taken: {"flood": "floods"}.get(h))
    ['floods', 'fire']
    >>> inject("vocab", 1.0, ["flood"], rng)
    ['floodd']
    """
    out = list(recs)
    for i in _positions(len(out), fraction, rng):
        if kind == "random":
            taken = set(out)
            choices = [h for h in rng.choice(vocabulary, size=min(len(vocabulary), 8)) if h not in taken]
            if choices:
                out[i] = str(choices[0])
        elif kind == "synonyms":
            found = synonym(out[i], set(out))
            if found is not None:
                out[i] = found
        elif kind == "vocab":
            out[i] = respell(out[i], lambda h: known(h) or h in out)
        else:
            raise ValueError(f"{kind} drifts replace whole lists, not hashtags")
    return out
