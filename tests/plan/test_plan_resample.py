"""Arrivals at --growth: drawn again per interval (Poisson), not the recording compressed."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from obs.plan.resample import arrivals, busiest, lane_arrivals, poisson
from obs.plan.traffic import LaneTraffic, Shape

SHAPES = [Shape(100 + i, 20 + i, 64, i % 2 == 0) for i in range(10)]


def _lane(name: str, counts: list[int]) -> LaneTraffic:
    return LaneTraffic(name, "main", counts, list(SHAPES), served=sum(counts))


def test_poisson_draws_have_the_mean_and_variance_asked() -> None:
    """Small means (Knuth) and large ones (normal approximation) draw with mean ~ variance ~ m."""
    for mean in (0.5, 4.0, 25.0, 400.0):
        rng = random.Random(mean)
        draws = [poisson(rng, mean) for _ in range(4000)]
        m = sum(draws) / len(draws)
        var = sum((d - m) ** 2 for d in draws) / len(draws)
        assert abs(m - mean) < 5 * math.sqrt(mean / len(draws))
        assert 0.8 * mean < var < 1.2 * mean
        assert min(draws) >= 0


def test_growth_scales_each_intervals_arrivals() -> None:
    """Over many intervals, a lane's grown arrivals per interval average its recorded count
    x growth (within 5 standard errors), and quiet intervals stay quiet."""
    counts = [5, 0, 20, 1, 0, 12] * 50
    got = lane_arrivals(_lane("chat", counts), 10.0, 8.0, random.Random(1))
    per = [0] * len(counts)
    for t, _ in got:
        per[int(t // 10.0)] += 1
    expected = sum(counts) * 8.0
    assert abs(len(got) - expected) < 5 * math.sqrt(expected)
    assert all(per[i] == 0 for i, c in enumerate(counts) if c == 0)


@settings(max_examples=50, deadline=None)  # a loaded CI machine is slow, not wrong
@given(st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=40), st.integers())
def test_arrivals_stay_in_their_interval_and_are_sorted(counts: list[int], seed: int) -> None:
    """Every arrival falls inside an interval that had traffic; they come in time order, each
    with a shape of its own lane's sample."""
    lt = _lane("rag", counts)
    got = arrivals([lt], 5.0, 3.0, seed)
    assert [a.t for a in got] == sorted(a.t for a in got)
    for a in got:
        i = int(a.t // 5.0)
        assert 0 <= i < len(counts) and counts[i] > 0
        assert a.shape in SHAPES and a.lane == "rag"
    assert [a.index for a in got] == list(range(len(got)))


def test_arrivals_are_redrawn_not_the_recording_compressed() -> None:
    """Same seed, same arrivals; another seed, other instants; at growth 1 the count still
    varies around the recorded one (a draw, not a copy)."""
    lanes = [_lane("chat", [10] * 30)]
    a, b, c = (
        arrivals(lanes, 10.0, 1.0, 7),
        arrivals(lanes, 10.0, 1.0, 7),
        arrivals(lanes, 10.0, 1.0, 8),
    )
    assert [x.t for x in a] == [x.t for x in b]
    assert [x.t for x in a] != [x.t for x in c]
    assert {len(arrivals(lanes, 10.0, 1.0, s)) for s in range(8)} != {300}


def test_a_lane_added_does_not_move_anothers_arrivals() -> None:
    """Each lane draws from its own stream: the chat lane's arrivals are the same with or
    without the batch lane beside it."""
    chat = _lane("chat", [3, 4, 5])
    alone = [(a.t, a.shape) for a in arrivals([chat], 10.0, 2.0, 3)]
    both = arrivals([chat, _lane("batch", [9, 9, 9])], 10.0, 2.0, 3)
    assert [(a.t, a.shape) for a in both if a.lane == "chat"] == alone


def test_a_lane_without_shapes_sends_nothing() -> None:
    """Offered but never served (every request refused): no shape to replay, no arrival."""
    assert lane_arrivals(LaneTraffic("x", "p", [50, 50]), 10.0, 2.0, random.Random(0)) == []


@settings(deadline=None)  # a loaded CI machine is slow, not wrong
@given(
    st.lists(st.floats(min_value=0, max_value=1000), min_size=1, max_size=60), st.floats(1, 5000)
)
def test_busiest_span_is_the_heaviest_window_that_fits(totals: list[float], cap: float) -> None:
    """The whole window when it fits; else a run of intervals sized to the cap whose sum is
    the largest of any run of that length."""
    first, end = busiest(totals, cap)
    assert 0 <= first < end <= len(totals)
    if sum(totals) <= cap:
        assert (first, end) == (0, len(totals))
        return
    k = end - first
    best = max(sum(totals[i : i + k]) for i in range(len(totals) - k + 1))
    assert sum(totals[first:end]) >= best - 1e-6
