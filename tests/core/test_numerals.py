"""Whole numbers read from text: ASCII digits only (obs.numerals)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from obs.numerals import whole_number


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("0", 0),
        ("64", 64),
        ("007", 7),
        ("65535", 65535),
        ("12345678901234567890", 12345678901234567890),
    ],
)
def test_ascii_digits_are_read_as_their_number(text: str, number: int) -> None:
    """A string of ASCII digits is its number, leading zeros and all."""
    assert whole_number(text) == number


@pytest.mark.parametrize(
    "text", ["", "²", "٤", "1²", "\uff14", "-1", "+1", " 1", "1 ", "1_000", "1.0", "0x1f"]
)
def test_anything_else_is_not_a_number(text: str) -> None:
    """Other scripts' digits (which int() refuses or reads), signs, spaces, separators: None."""
    assert whole_number(text) is None


@given(st.text(max_size=12))
def test_any_text_is_read_without_raising_and_only_as_its_ascii_digits(text: str) -> None:
    """Whatever the text, no exception; a number exactly when every character is 0-9."""
    number = whole_number(text)
    if text and all("0" <= ch <= "9" for ch in text):
        assert number == int(text)
    else:
        assert number is None
