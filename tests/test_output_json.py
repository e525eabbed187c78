"""The bytes of output records (``runtime.encode_json``, orjson): the same values as the
``json.dumps`` it replaced, strict JSON, and dead letters byte for byte as before."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.service.kafka_records import Record, dead_letter
from workers.service.runtime import encode_json


def old(value: Any) -> bytes:
    """What the runtime wrote before."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


# Valid Unicode (no lone surrogates: neither encoder can write them as UTF-8).
TEXT = st.text(st.characters(blacklist_categories=["Cs"]), max_size=20)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5),
    max_leaves=30,
)


@given(VALUES)
def test_values_parse_back_to_what_json_dumps_wrote(value: Any) -> None:
    data = encode_json(value)
    assert json.loads(data) == json.loads(old(value)) == value


@given(st.dictionaries(TEXT, st.none() | st.booleans() | st.integers(-(2**63), 2**63) | TEXT, max_size=8))
def test_without_floats_the_bytes_are_the_same(value: dict[str, Any]) -> None:
    assert encode_json(value) == old(value)


def test_floats_round_trip_though_some_are_spelt_differently() -> None:
    for x in (1e-05, 1e-07, 0.1, 1 / 3, 5e-324, 1e22, -0.0, 123456789.123):
        (back,) = json.loads(encode_json([x]))
        assert back == x and math.copysign(1, back) == math.copysign(1, x)
    assert encode_json(1e-05) == b"0.00001" and old(1e-05) == b"1e-05"


def test_non_finite_floats_are_null_not_the_invalid_tokens() -> None:
    assert encode_json({"a": math.nan, "b": math.inf, "c": -math.inf}) == b'{"a":null,"b":null,"c":null}'


def test_what_json_dumps_took_besides() -> None:
    assert encode_json({"x": np.float64(0.1)}) == b'{"x":0.1}'  # a float subclass
    assert encode_json({1: "a", None: 2}) == old({1: "a", None: 2}) == b'{"1":"a","null":2}'


def test_what_cannot_be_json_raises_type_error() -> None:
    for value in ({"x": object()}, {"x": np.float32(0.5)}, "\ud800", {(1, 2): 3}):
        with pytest.raises(TypeError):
            encode_json(value)


def test_dead_letters_are_byte_for_byte_as_before() -> None:
    odd = b'{"tweet_id": "\xff\xfe", "x": "\\u2028 \x00"}' + bytes(range(256))
    for key in (None, b"k", b"\xffbad utf-8 \xe2\x80\xa8", 'é😀\n\t"\\'.encode()):
        letter = dead_letter(
            Record("recommendations", 3, 42, 1, key, odd), "not_json", 'detail "é"\n\x1f', "score"
        )
        assert encode_json(letter) == old(letter)
