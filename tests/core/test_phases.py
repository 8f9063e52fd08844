"""Phase arithmetic: non-negative phases that always sum to the end-to-end time."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from obs.phases import NS_PER_MS, Clock, ms, percentile


def test_full_stream_phases() -> None:
    """Each phase is the gap between its two boundaries."""
    c = Clock(received=100, dispatched=110, first_up=150, first_sent=152, last_up=190, end=200)
    assert c.phases_ns() == {
        "queue": 10,
        "prefill": 40,
        "first_token": 2,
        "decode": 38,
        "stream": 10,
    }


def test_failure_before_first_token_is_charged_to_prefill() -> None:
    """An unreached boundary collapses forward: the time goes to the phase that was running."""
    c = Clock(received=0, dispatched=5, end=50)
    assert c.phases_ns() == {"queue": 5, "prefill": 45, "first_token": 0, "decode": 0, "stream": 0}
    assert c.current_phase() == "prefill"


def test_single_chunk_answer_has_no_negative_decode() -> None:
    """When the first output is also the last, decode is zero, not negative."""
    c = Clock(received=0, dispatched=1, first_up=10, first_sent=12, last_up=10, end=13)
    p = c.phases_ns()
    assert p["decode"] == 0 and p["stream"] == 1 and sum(p.values()) == 13


@given(st.lists(st.integers(min_value=0, max_value=10**12), min_size=6, max_size=6))
def test_phases_never_negative_and_sum_to_e2e(ts: list[int]) -> None:
    """Whatever the boundaries (missing or out of order), phases are >= 0 and sum to e2e."""
    received = ts[0]
    end = max(ts)
    c = Clock(received, ts[1], ts[2], ts[3], ts[4], end)
    p = c.phases_ns()
    assert all(v >= 0 for v in p.values())
    assert sum(p.values()) == end - received


def test_percentile_nearest_rank() -> None:
    """Nearest-rank percentiles over a sorted list."""
    vals = list(range(1, 101))
    assert percentile(vals, 0.5) == 50
    assert percentile(vals, 0.95) == 95
    assert percentile(vals, 1.0) == 100
    assert percentile([], 0.5) == 0


@given(
    st.lists(st.integers(min_value=1, max_value=10**6), min_size=5, max_size=5),
    st.integers(min_value=0, max_value=3),
)
def test_a_request_that_ends_early_charges_the_rest_to_its_current_phase(
    gaps: list[int], reached: int
) -> None:
    """Ended after ``reached`` boundaries: the phases before are the gaps, the time left is
    the current phase's, and no later phase gets any."""
    marks = [sum(gaps[: i + 1]) for i in range(4)]  # dispatched, first_up, first_sent, last_up
    kept = marks[:reached] + [0] * (4 - reached)
    end = sum(gaps)
    clock = Clock(0, kept[0], kept[1], kept[2], kept[3], end)
    phases = clock.phases_ns()
    order = list(phases)
    current = clock.current_phase()
    assert current == order[reached]
    assert [phases[p] for p in order[:reached]] == gaps[:reached]
    assert phases[current] == end - (marks[reached - 1] if reached else 0)
    assert all(phases[p] == 0 for p in order[reached + 1 :])
    assert percentile(sorted(phases.values()), 1.0) == max(phases.values())


@given(
    st.integers(-(10**10), 10**10)
    | st.integers(-(2**60), 2**60)
    | st.integers(-(10**12), 10**12).map(lambda k: k * 1000 + 500)  # ties
    | st.sampled_from([2**52 - 1, 2**52, 2**52 + 500, -(2**52), -400, 0, 62_500, -62_500])
)
def test_ms_rounds_as_round_does(ns: int) -> None:
    """``ms`` gives ``round(ns / NS_PER_MS, 3)`` for any int, to the sign of a zero (the JSON
    text): ties, negatives, huge values."""
    assert repr(ms(ns)) == repr(round(ns / NS_PER_MS, 3))
