"""The per-request histograms against prometheus_client's Histogram: the same observations
give the same exposition, in the text format and in OpenMetrics (exemplars included)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from obs import conventions as c
from obs.exporters.histograms import RequestHistogram
from tests.support.expositions import pages

BUCKETS = c.merged_buckets(c.LATENCY_BUCKETS, [0.5, 1.5])
SERIES = st.sampled_from([("chat", "small"), ("chat", "big"), ("batch", "small")])
AMOUNT = st.sampled_from(BUCKETS) | st.floats(-1.0, 1e4) | st.just(float("nan"))
EXEMPLAR = st.none() | st.integers(0, 2**128 - 1).map(lambda t: {"trace_id": f"{t:032x}"})


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(SERIES, AMOUNT, EXEMPLAR), max_size=40))
def test_request_histogram_exposes_what_prometheus_client_would(
    observations: list[tuple[tuple[str, str], float, dict[str, str] | None]],
) -> None:
    """Any observations, on any series, with or without exemplars: the same pages."""
    metric = c.TTFT
    ours, reference = CollectorRegistry(), CollectorRegistry()
    fast = RequestHistogram(metric, ours, BUCKETS)
    plain = Histogram(metric.name, metric.help, metric.labels, registry=reference, buckets=BUCKETS)
    for series, amount, exemplar in observations:
        fast.labels(*series).observe(amount, exemplar)
        plain.labels(*series).observe(amount, exemplar)
    assert pages(ours) == pages(reference)


def test_request_histogram_samples_read_as_prometheus_client_s() -> None:
    """A registry's sample values (what tests and the --workers merge read) are the same."""
    ours, reference = CollectorRegistry(), CollectorRegistry()
    m = c.REQUEST_DURATION
    fast = RequestHistogram(m, ours, BUCKETS)
    plain = Histogram(m.name, m.help, m.labels, registry=reference, buckets=BUCKETS)
    for v in (0.0, 0.5, 0.7, 99.0):
        fast.labels("chat", "small").observe(v)
        plain.labels("chat", "small").observe(v)
    for name, labels in (
        (f"{m.name}_count", {"lane": "chat", "pool": "small"}),
        (f"{m.name}_sum", {"lane": "chat", "pool": "small"}),
        (f"{m.name}_bucket", {"lane": "chat", "pool": "small", "le": "0.5"}),
        (f"{m.name}_bucket", {"lane": "chat", "pool": "small", "le": "+Inf"}),
    ):
        assert ours.get_sample_value(name, labels) == reference.get_sample_value(name, labels)
    assert ours.get_sample_value(f"{m.name}_count", {"lane": "chat", "pool": "small"}) == 4


def test_request_histogram_refuses_what_prometheus_client_refuses() -> None:
    """Unsorted buckets, a wrong label count and a name already registered raise ValueError."""
    registry = CollectorRegistry()
    with pytest.raises(ValueError, match="sorted"):
        RequestHistogram(c.TTFT, registry, (1.0, 0.5))
    fast = RequestHistogram(c.TTFT, registry, BUCKETS)
    with pytest.raises(ValueError, match="labels"):
        fast.labels("chat")
    with pytest.raises(ValueError, match="Duplicated"):
        RequestHistogram(c.TTFT, registry, BUCKETS)
