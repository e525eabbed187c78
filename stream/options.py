"""Option values read from text, with errors that say which option and why.

>>> parse_number("2.5", "--speed must be a positive number")
2.5
>>> parse_number("0", "--speed must be a positive number")
Traceback (most recent call last):
    ...
ValueError: --speed must be a positive number
"""

from __future__ import annotations

import math

__all__ = ["parse_number"]


def parse_number(text: str | float, error: str, *, at_most: float = math.inf) -> float:
    """``text`` as a number above 0 and at most ``at_most``; ``ValueError(error)`` for
    anything else (not a number, NaN, zero or negative, above ``at_most``).

    >>> parse_number("1", "a fraction in (0, 1]", at_most=1.0), parse_number("inf", "x")
    (1.0, inf)
    """
    try:
        value = float(text)
    except ValueError:
        raise ValueError(error) from None
    if not 0.0 < value <= at_most:
        raise ValueError(error)
    return value
