"""The bytes of the running means in Redis: log records, folded sums, watermarks, windows.

A folded sum is *block floating point*: int32 mantissas sharing one exponent per hashtag,
chosen on every fold so that the largest component uses 30-31 bits (an absolute error of at
most ``max|sum_i| * 2**-31``, ~100x less than float32's).  Its first :data:`HEAD_COMPONENTS`
mantissas go in field ``s``, the rest in ``m`` after a header (count, dim, exponent) and
before the folded watermarks, ``"topic:partition\\0"`` + the highest offset folded (float64).
A log record is its vector as float32 when that is exact, else float64.
:func:`decode_hashtag` turns what a read of one hashtag returns into its running mean (the
folded state plus the log above the watermarks).  The layout and the reasons for it:
``docs/redis-means.md``.

>>> import numpy as np
>>> from stream.synonyms.means import RunningMean
>>> s, m = encode_state(RunningMean(2, np.array([0.5, -1.25, 3.0])), {"t:0": 41})
>>> count, total, marks = decode_state(s, m, 3, "k")
>>> count, total.tolist(), marks
(2, [0.5, -1.25, 3.0], {'t:0': 41})
>>> parse_field("tweets:3:1200/19876")
('tweets:3', 1200, 19876)
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stream.synonyms.means import RunningMean, Vector

#: Sum components kept in field ``s``: 4·766 bytes + 6 of SDS header fit jemalloc's 3,072 class.
HEAD_COMPONENTS = 766
_HEADER = struct.Struct("<dIi")  # count, dim, shared exponent (of ``m`` and of a window)


class DimensionError(ValueError):
    """A vector's dimension differs from the one the store was fixed to."""


@dataclass(frozen=True)
class HashtagState:
    """One hashtag as read consistently: its mean, and what a fold of it would write."""

    mean: RunningMean
    generation: int
    fields: tuple[bytes, ...]  # every log field read (valid and stale): a fold drops them
    marks: dict[str, int]  # partition id -> highest offset in the mean
    windows: dict[int, RunningMean]  # window number -> the mean of its tweets
    logged_windows: frozenset[int]  # windows with records in the log: a fold rewrites them


def vectors_bytes(vectors: Sequence[Vector]) -> list[bytes]:
    """Each of a batch's vectors (all of one dimension) for the log: float32 when that is
    exact (an encoder's output), else float64 -- never a rounding before the float64 sum.
    Converted and compared as one matrix.

    >>> [len(b) for b in vectors_bytes([np.array([0.5, 1.0]), np.array([0.1, 2.0])])]
    [8, 16]
    """
    if not len(vectors):
        return []
    wide = np.asarray(np.stack(vectors), dtype="<f8")
    narrow = wide.astype("<f4")
    exact = (narrow == wide).all(axis=1)
    return [n.tobytes() if ok else w.tobytes() for n, w, ok in zip(narrow, wide, exact, strict=True)]


def parse_field(field: str) -> tuple[str, int, int | None]:
    """A log field ``"topic:partition:offset[/window]"`` as (``"topic:partition"``, offset,
    window or None)."""
    coords, slash, window = field.rpartition("/")
    if not slash or ":" in window:  # no window suffix (a topic may hold "/", never after ":")
        coords, window = field, ""
    pid, _, offset = coords.rpartition(":")
    return pid, int(offset), int(window) if window else None


def above_watermark(field: str, marks: dict[str, int]) -> bool:
    """Whether a log field's record lies above its partition's folded watermark."""
    pid, offset, _ = parse_field(field)
    return offset > marks.get(pid, -1)


def encode_window(mean: RunningMean) -> bytes:
    """A window's mean as one field: count, dim, exponent, then int32 mantissas."""
    exponent, mantissas = block(mean.total)
    return _HEADER.pack(float(mean.count), len(mean.total), exponent) + mantissas.tobytes()


def decode_window(value: bytes, dim: int, hashtag: str) -> RunningMean:
    count, stored_dim, exponent = _HEADER.unpack_from(value, 0)
    if stored_dim != dim:
        raise DimensionError(f"a window of {hashtag!r} holds {stored_dim}-d sums; the store is {dim}-d")
    mantissas = np.frombuffer(value, dtype="<i4", offset=_HEADER.size).astype(np.float64)
    return RunningMean(int(count), np.ldexp(mantissas, -exponent))


def vector_of(value: bytes, dim: int, hashtag: str) -> npt.NDArray[np.float64]:
    if len(value) == 4 * dim:
        return np.frombuffer(value, dtype="<f4").astype(np.float64)
    if len(value) == 8 * dim:
        return np.frombuffer(value, dtype="<f8")
    raise DimensionError(
        f"a log record of {hashtag!r} holds {len(value)} bytes: not a {dim}-d float32/float64 vector"
    )


def block(total: npt.NDArray[np.float64]) -> tuple[int, npt.NDArray[np.int32]]:
    """A sum as block floating point: the shared exponent and the int32 mantissas.

    The exponent puts the largest |component| in [2**30, 2**31) (capped so that ``2**e``
    stays a normal double); each component rounds half to even onto the grid ``2**-e``.
    """
    mx = float(np.abs(total).max())
    exponent = 0
    if mx > 0:
        exponent = min(31 - math.frexp(mx)[1], 1000)
        if np.rint(math.ldexp(mx, exponent)) >= 2**31:
            exponent -= 1
    return exponent, np.rint(np.ldexp(total, exponent)).astype("<i4")


def encode_state(mean: RunningMean, marks: dict[str, int]) -> tuple[bytes, bytes]:
    """The ``s`` and ``m`` fields of a folded mean (:func:`block`), with its watermarks."""
    total = mean.total
    exponent, mantissas = block(total)
    head = min(len(total), HEAD_COMPONENTS)
    m = [_HEADER.pack(float(mean.count), len(total), exponent), mantissas[head:].tobytes()]
    m += [pid.encode() + b"\0" + struct.pack("<d", offset) for pid, offset in sorted(marks.items())]
    return mantissas[:head].tobytes(), b"".join(m)


def decode_marks(m: bytes) -> dict[str, int]:
    """The folded watermarks in ``m``: ``"topic:partition" -> highest offset folded``."""
    _, dim, _ = _HEADER.unpack_from(m, 0)
    pos = _HEADER.size + 4 * (dim - min(dim, HEAD_COMPONENTS))
    marks: dict[str, int] = {}
    while pos < len(m):
        end = m.index(b"\0", pos)
        (offset,) = struct.unpack_from("<d", m, end + 1)
        marks[m[pos:end].decode()] = int(offset)
        pos = end + 9
    return marks


def decode_state(
    s: bytes | None, m: bytes, dim: int, key: str
) -> tuple[int, npt.NDArray[np.float64], dict[str, int]]:
    """A folded state's count, sum and watermarks from its ``s`` and ``m`` fields."""
    count, stored_dim, exponent = _HEADER.unpack_from(m, 0)
    if stored_dim != dim:
        raise DimensionError(f"{key} holds {stored_dim}-d sums; the store is {dim}-d")
    head = min(dim, HEAD_COMPONENTS)
    mantissas = np.zeros(dim, dtype=np.float64)
    if s is not None:
        mantissas[:head] = np.frombuffer(s, dtype="<i4")
    mantissas[head:] = np.frombuffer(m, dtype="<i4", count=dim - head, offset=_HEADER.size)
    return int(count), np.ldexp(mantissas, -exponent), decode_marks(m)


def decode_hashtag(
    tag: str,
    key: str,
    dim: int,
    s: bytes | None,
    m: bytes | None,
    g: int,
    log: dict[bytes, bytes],
    stored_windows: dict[bytes, bytes],
) -> HashtagState:
    """One hashtag as read: its folded state (``s``, ``m``; None: never folded) plus the
    records of its log above their partition's watermark, in a fixed order (reads are
    reproducible); ``key`` names the folded state in errors."""
    count = 0
    marks: dict[str, int] = {}
    total = np.zeros(dim, dtype=np.float64)
    if m is not None:
        count, total, marks = decode_state(s, m, dim, key)
    windows = {int(w): decode_window(v, dim, tag) for w, v in stored_windows.items()}
    records = []
    for name, value in log.items():
        pid, offset, window = parse_field(name.decode())
        if offset > marks.get(pid, -1):  # at or below: a redelivered copy of a folded record
            records.append((pid, offset, window, value))
    records.sort(key=lambda r: (r[0], r[1]))
    new_marks = dict(marks)
    logged = set()
    for pid, offset, window, value in records:
        vector = vector_of(value, dim, tag)
        total += vector
        new_marks[pid] = max(offset, new_marks.get(pid, -1))
        if window is not None:
            windows.setdefault(window, RunningMean.empty(dim)).update(vector)
            logged.add(window)
    mean = RunningMean(count + len(records), total)
    return HashtagState(mean, g, tuple(log), new_marks, windows, frozenset(logged))


def stored_dim(m: bytes) -> int:
    """The dimension a folded state's ``m`` field was written for."""
    return int(_HEADER.unpack_from(m, 0)[1])


__all__ = [
    "HEAD_COMPONENTS",
    "DimensionError",
    "HashtagState",
    "above_watermark",
    "block",
    "decode_hashtag",
    "decode_marks",
    "decode_state",
    "decode_window",
    "encode_state",
    "encode_window",
    "parse_field",
    "stored_dim",
    "vector_of",
    "vectors_bytes",
]
