"""The plan's pure searches: the fewest replicas, and lane limits by Little's law."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from obs.plan.search import Limits, Search, fewest, little_limits, widen


@settings(deadline=None)  # a loaded CI machine is slow, not wrong
@given(st.integers(min_value=1, max_value=3000))
def test_fewest_finds_the_threshold_of_a_monotone_pool(threshold: int) -> None:
    """With attainment monotone in replicas, the search returns exactly the first size that
    passes, asking O(log n) sizes (doubling, then bisecting)."""
    search = Search(lambda n: n >= threshold, most=4096)
    assert search.fewest() == threshold
    assert len(search.tried) <= 2 * math.ceil(math.log2(threshold + 1)) + 2
    assert all(passed == (n >= threshold) for n, passed in search.tried.items())
    if threshold > 1:
        assert search.tried[threshold - 1] is False  # the size below was replayed and failed


def test_fewest_is_none_when_no_size_up_to_the_limit_passes() -> None:
    """A pool that no size up to ``most`` serves has no plan (None), not a wrong one."""
    assert fewest(lambda n: False, most=64) is None
    assert fewest(lambda n: n >= 64, most=64) == 64


@settings(deadline=None)  # a loaded CI machine is slow, not wrong
@given(
    st.floats(min_value=0, max_value=500, allow_nan=False),
    st.floats(min_value=0, max_value=60, allow_nan=False),
)
def test_little_limits_hold_the_mean_in_flight_and_its_poisson_tail(
    rate: float, service_s: float
) -> None:
    """max_concurrency covers L = rate x service plus 3 standard deviations of Poisson(L)
    concurrency; the queue holds L more; both at least 1; L is reported."""
    lim = little_limits(rate, service_s)
    load = rate * service_s
    assert lim.max_concurrency >= max(1, math.ceil(load))
    assert lim.max_concurrency >= load + 3 * math.sqrt(load) - 1e-9
    assert lim.max_queue >= max(1, math.ceil(load) - 0)
    assert lim.in_flight == pytest.approx(load, abs=1e-3)


def _poisson_sf(mean: float, k: int) -> float:
    """P(X > k) for X ~ Poisson(mean), summed directly."""
    term, cdf = math.exp(-mean), 0.0
    for i in range(k + 1):
        cdf += term
        term *= mean / (i + 1)
    return max(0.0, 1.0 - cdf)


@pytest.mark.parametrize("load", [0.5, 2.0, 10.0, 40.0, 150.0])
def test_the_concurrency_limit_refuses_only_in_the_poisson_tail(load: float) -> None:
    """While the pool keeps up, a lane's requests in flight are Poisson(L): the limit is
    exceeded less than 1% of the time (the limit sheds only past saturation)."""
    lim = little_limits(load, 1.0)
    assert _poisson_sf(load, lim.max_concurrency) < 0.01


@settings(deadline=None)  # a loaded CI machine is slow, not wrong
@given(
    st.floats(min_value=0.1, max_value=100), st.floats(min_value=0.1, max_value=100),
    st.floats(min_value=0.01, max_value=30),
)  # fmt: skip
def test_limits_grow_with_rate_and_service_time(r1: float, r2: float, s: float) -> None:
    """More traffic or longer service never lowers a lane's limits."""
    lo, hi = sorted((r1, r2))
    a, b = little_limits(lo, s), little_limits(hi, s)
    assert (a.max_concurrency, a.max_queue) <= (b.max_concurrency, b.max_queue)
    c, d = little_limits(s, lo), little_limits(s, hi)
    assert c.max_concurrency <= d.max_concurrency and c.max_queue <= d.max_queue


@settings(deadline=None)  # a loaded CI machine is slow, not wrong
@given(st.integers(min_value=1, max_value=10_000), st.integers(min_value=1, max_value=10_000))
def test_widen_always_raises_both_limits(conc: int, queue: int) -> None:
    """A lane found refusing at the plan gets strictly larger limits (the loop ends)."""
    w = widen(Limits(conc, queue, 1.0))
    assert w.max_concurrency > conc and w.max_queue > queue


def test_negative_inputs_are_refused() -> None:
    """A negative rate or service time is an error, not a limit."""
    with pytest.raises(ValueError):
        little_limits(-1.0, 1.0)
