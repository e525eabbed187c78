from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream.intake.hashtags import _normalise_any, extract_hashtags, normalise_all, normalise_hashtag


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("#Covid19…Don't", "covid19"),
        ("#Covid19:", "covid19"),
        ("#COVID19!!", "covid19"),
        ("#coron…", None),
        ("#coron...", None),
        ("#東京", "東京"),
        ("#1", "1"),
        ("#keep_safe", "keep_safe"),
        ("#हिन्दी", "हिन्दी"),  # combining marks stay part of the word
        ("＃Full", "full"),
        ("#", None),
        ("", None),
        ("  #Spaced ", "spaced"),
    ],
)
def test_normalise(raw: str, expected: str | None) -> None:
    assert normalise_hashtag(raw) == expected


def test_extract_from_text() -> None:
    text = "RT @a: #Flood in #Brisbane: help! #flood #東京 &#39; x#no #QLD… more #coron… http://t.co/x"
    assert extract_hashtags(text) == ["flood", "brisbane", "東京", "qld"]


def test_truncated_at_end_with_trailing_link_is_dropped() -> None:
    assert extract_hashtags("Pray for the people of #Oklaho… http://t.co/abc") == []
    assert extract_hashtags("Pray for #Oklahoma... please") == ["oklahoma"]


def test_normalise_all_dedups_in_order() -> None:
    assert normalise_all(["B", "#a", "b", "#coron…"]) == ["b", "a"]


@given(st.text(max_size=60))
def test_normalised_hashtags_are_stable(text: str) -> None:
    for tag in extract_hashtags(text):
        assert tag and tag == tag.lower() and "#" not in tag
        assert normalise_hashtag(tag) == tag


@given(st.text(alphabet="aZ09_#＃ .…:!\u00e9e\u0301東\t", max_size=12) | st.text(max_size=12))
def test_the_ascii_shortcut_is_the_definition(raw: str) -> None:
    """normalise_hashtag's shortcut for ASCII word characters gives what the general path
    (NFC, the body's regex, the truncation check) gives, on any string."""
    assert normalise_hashtag(raw) == _normalise_any(raw)
