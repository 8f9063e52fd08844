"""The per-request counters against prometheus_client's Counter: the same increments give the
same exposition, in the text format and in OpenMetrics (exemplars included)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter

from obs import conventions as c
from obs.exporters.counters import RequestCounter
from tests.support.expositions import pages

SERIES = st.sampled_from([("chat", "small"), ("chat", "big"), ("batch", "small")])
AMOUNT = st.integers(0, 10_000) | st.floats(0.0, 1e4) | st.just(1)
EXEMPLAR = st.none() | st.integers(0, 2**128 - 1).map(lambda t: {"trace_id": f"{t:032x}"})


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(SERIES, AMOUNT, EXEMPLAR), max_size=40))
def test_request_counter_exposes_what_prometheus_client_would(
    increments: list[tuple[tuple[str, str], float, dict[str, str] | None]],
) -> None:
    """Any increments, on any series, with or without exemplars: the same pages."""
    metric = c.PROMPT_TOKENS
    ours, reference = CollectorRegistry(), CollectorRegistry()
    fast = RequestCounter(metric, ours)
    plain = Counter(metric.name, metric.help, metric.labels, registry=reference)
    for series, amount, exemplar in increments:
        fast.labels(*series).inc(amount, exemplar)
        plain.labels(*series).inc(amount, exemplar)
    assert pages(ours) == pages(reference)


def test_request_counter_samples_read_as_prometheus_client_s() -> None:
    """A registry's sample values (what tests and the --workers merge read) are the same,
    a series made by ``labels`` alone included (it counts from 0)."""
    ours, reference = CollectorRegistry(), CollectorRegistry()
    m = c.SLO_MISSES
    fast = RequestCounter(m, ours)
    plain = Counter(m.name, m.help, m.labels, registry=reference)
    fast.labels("chat", "ttft", "queue", "other")
    plain.labels("chat", "ttft", "queue", "other")
    for _ in range(3):
        fast.labels("chat", "tpot", "decode", "other").inc()
        plain.labels("chat", "tpot", "decode", "other").inc()
    name = f"{m.name.removesuffix('_total')}_total"
    for labels, value in (
        ({"lane": "chat", "slo": "ttft", "phase": "queue", "cause": "other"}, 0.0),
        ({"lane": "chat", "slo": "tpot", "phase": "decode", "cause": "other"}, 3.0),
    ):
        assert ours.get_sample_value(name, labels) == value
        assert reference.get_sample_value(name, labels) == value
    assert pages(ours) == pages(reference)


def test_request_counter_refuses_what_prometheus_client_refuses() -> None:
    """A wrong label count, a negative amount and a name already registered raise ValueError."""
    registry = CollectorRegistry()
    fast = RequestCounter(c.REQUESTS, registry)
    with pytest.raises(ValueError, match="labels"):
        fast.labels("chat")
    with pytest.raises(ValueError, match="non-negative"):
        fast.labels(*("x" for _ in c.REQUESTS.labels)).inc(-1)
    with pytest.raises(ValueError, match="Duplicated"):
        RequestCounter(c.REQUESTS, registry)
