"""The incremental JSON checker agrees with ``json.loads``, however the text is split."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from obs.json_check import MAX_DEPTH, JsonCheck, ValueCount

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)  # fmt: skip


def _check(text: str, cuts: list[int] | None = None) -> bool:
    check = JsonCheck()
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts or [])})
    for a, b in itertools.pairwise(points):
        check.feed(text[a:b])
    return check.valid


def _loads(text: str) -> bool:
    def refuse(name: str) -> None:
        raise ValueError(name)

    try:
        json.loads(text, parse_constant=refuse)
    except ValueError:
        return False
    return True


@given(JSON_VALUES, st.sampled_from([None, 1, 2]), st.lists(st.integers(0, 10**6), max_size=8))
def test_every_json_value_is_valid_however_split(
    value: object, indent: int | None, cuts: list[int]
) -> None:
    """Any serialised value, compact or indented, split anywhere, is valid."""
    assert _check(json.dumps(value, indent=indent, ensure_ascii=False), cuts)


@settings(max_examples=400)
@given(st.text(alphabet='{}[]":,.-+0123456789eEtrufalsn \\\n\tx/u', max_size=24),
       st.lists(st.integers(0, 100), max_size=4))  # fmt: skip
def test_agrees_with_json_loads_on_arbitrary_text(text: str, cuts: list[int]) -> None:
    """On text made of JSON's own characters the verdict is json.loads' verdict."""
    assert _check(text, cuts) == _loads(text)


@given(JSON_VALUES, st.integers(1, 40))
def test_a_cut_off_answer_is_not_valid(value: object, drop: int) -> None:
    """An answer that stops early (max_tokens) is not JSON, unless what is left still is."""
    text = json.dumps(value)
    cut = text[: max(0, len(text) - drop)]
    assert _check(cut) == _loads(cut)


@pytest.mark.parametrize(
    "text",
    ['```json\n{"a": 1}\n```', "NaN", "Infinity", '{"a": 1} {"b": 2}', "01", '"\x01"', ""],
)
def test_what_json_mode_should_not_answer_is_invalid(text: str) -> None:
    """Markdown fences, non-standard constants, two values, a leading zero, raw control chars."""
    assert not _check(text)


def test_depth_is_bounded() -> None:
    """Nesting past MAX_DEPTH is refused at once; memory stays bounded by the cap."""
    check = JsonCheck()
    check.feed("[" * (MAX_DEPTH + 1))
    assert check.failed
    ok = JsonCheck()
    ok.feed("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    assert ok.valid


def test_once_failed_the_rest_is_not_read() -> None:
    """After the first error, feeding more does not make it valid."""
    check = JsonCheck()
    check.feed("}")
    check.feed("{}")
    assert check.failed and not check.valid
    assert check.chars == 3


# ---- ValueCount: values a body can hold, commas inside strings not counted --------------


def _reference_count(data: bytes) -> int:
    """Commas and object openers outside strings, one byte at a time (the slow, plain way)."""
    n, in_string, escaped = 0, False, False
    for b in data:
        ch = chr(b)
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in ",{":
            n += 1
    return n


@given(JSON_VALUES, st.lists(st.integers(min_value=0), max_size=6))
@settings(max_examples=300, deadline=None)
def test_value_count_matches_a_plain_scan_however_split(value, cuts) -> None:
    """ValueCount equals a byte-by-byte count of commas and `{` outside strings, at any split."""
    data = json.dumps(value, ensure_ascii=False).encode()
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    count = ValueCount()
    for a, b in itertools.pairwise(points):
        count.feed(data[a:b])
    assert count.values == _reference_count(data)


@pytest.mark.parametrize(
    "text",
    ['"a\\\\",{', '"a\\",{"', '"\\\\\\"",{', '["x,\\"y", {"k": ","}]', '"\\u0022,",{'],
)
def test_value_count_follows_escapes_across_every_split(text) -> None:
    """Escaped quotes and backslashes split at every byte count the same as unsplit."""
    data = text.encode()
    for cut in range(len(data) + 1):
        count = ValueCount()
        count.feed(data[:cut])
        count.feed(data[cut:])
        assert count.values == _reference_count(data), cut


def test_commas_inside_a_long_text_are_not_values() -> None:
    """A 500 KB prompt with 250,000 commas holds a handful of values, not 250,000."""
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "a," * 250_000}]})
    count = ValueCount()
    for at in range(0, len(body), 1 << 16):
        count.feed(body.encode()[at : at + (1 << 16)])
    assert count.values < 10


def _fed_s(data: bytes, piece: int) -> float:
    """The quickest of five counts of ``data`` fed in pieces of ``piece`` bytes, in seconds of
    this thread's CPU: a run preempted by other work (the heavy tier beside the fast one,
    ``scripts/check``) is not charged for the time it waited, which a wall clock would charge
    to the longer run only (0.171 s for 16 MiB against 0.0029 s for 2 MiB once)."""
    best = float("inf")
    for _ in range(5):
        count, t0 = ValueCount(), time.thread_time()
        for at in range(0, len(data), piece):
            count.feed(data[at : at + piece])
        best = min(best, time.thread_time() - t0)
    return best


HOSTILE: dict[str, Callable[[int], bytes]] = {
    "empty objects": lambda n: b"[" + b"{}," * (n // 3) + b"{}]",
    "one unterminated escaped string": lambda n: b'"' + b'\\"' * (n // 2),
}


@pytest.mark.parametrize("shape", HOSTILE)
def test_value_count_is_linear_on_hostile_bodies(shape: str) -> None:
    """Hostile bodies count in linear time: 8x the bytes, in one piece or 1 MiB pieces, < 32x.

    Quadratic work (a regular expression retried from every offset of an unterminated
    string, a rescan per piece) would take 64x; linear work measured 8x in pieces and up
    to 18x in one 16 MiB piece (caches). Compared with the same shape at an eighth of the
    size in the same run, not with a clock's bound (a 1.5 s bound failed once under a full
    suite's load).
    """
    make = HOSTILE[shape]
    small, large = make(2 << 20), make(16 << 20)
    for piece in (len(large), 1 << 20):
        assert _fed_s(large, piece) < 32 * _fed_s(small, piece)


def test_value_count_counts_a_long_array_of_objects() -> None:
    """1001 empty objects in an array count 2001 (each `{` and each comma): an upper bound."""
    assert ValueCount().feed(b"[" + b"{}," * 1000 + b"{}]") == 2001
