"""An event's ``ts``, formatted a second at a time, is what ``datetime`` writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from obs.sidecar.relay.request import EventTime

_ONE = EventTime()  # shared across examples: its cached second must never leak into another


@given(st.integers(min_value=0, max_value=4_102_444_800 * 10**9))  # to 2100
def test_event_time_is_isoformat_in_milliseconds(wall_ns: int) -> None:
    """Any wall-clock time, ms boundaries and second changes included, reads as
    ``datetime.isoformat(timespec="milliseconds")`` of its microsecond."""
    expected = datetime.fromtimestamp(0, UTC) + timedelta(microseconds=wall_ns // 1000)
    assert _ONE(wall_ns) == expected.isoformat(timespec="milliseconds")


def test_event_time_in_one_second_keeps_its_prefix_and_moves_its_milliseconds() -> None:
    """Times within one second share the date and time; the milliseconds are truncated."""
    et = EventTime()
    base = 1_796_000_000 * 10**9
    assert et(base + 999_999_999) == "2026-11-30T00:53:20.999+00:00"
    assert et(base) == "2026-11-30T00:53:20.000+00:00"
    assert et(base + 10**9) == "2026-11-30T00:53:21.000+00:00"
