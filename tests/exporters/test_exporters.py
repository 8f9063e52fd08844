"""The exporter fan-out: one failing exporter never stops the others, and is counted."""

from __future__ import annotations

import math

from obs.events import Event
from obs.exporters.base import Fanout
from obs.phases import Clock
from obs.record import Finished
from obs.tracecontext import new_ids


class Broken:
    name = "broken"

    def export(self, finished: Finished) -> None:
        raise OSError("disk on fire")

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        raise OSError("still on fire")

    def shutdown(self, timeout_s: float = 10.0) -> None:
        return None


class Keeper:
    name = "keeper"

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.shut = False

    def export(self, finished: Finished) -> None:
        self.seen.append(finished.event.request_id)

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        return True

    def shutdown(self, timeout_s: float = 10.0) -> None:
        self.shut = True


class Failures:
    def __init__(self) -> None:
        self.counted: list[str] = []

    def exporter_failed(self, exporter: str) -> None:
        self.counted.append(exporter)


def test_failing_exporter_is_counted_and_isolated() -> None:
    """An exporter that raises is counted per event; the next exporter still gets every event."""
    keeper, failures = Keeper(), Failures()
    fanout = Fanout([Broken(), keeper], failures=failures)
    for i in range(3):
        fanout.export(
            Finished(Event(request_id=f"r{i}"), Clock(received=0, end=1), 0, new_ids(None))
        )
    assert keeper.seen == ["r0", "r1", "r2"]
    assert failures.counted == ["broken"] * 3
    fanout.shutdown()
    assert keeper.shut


def test_itl_histogram_exposes_what_prometheus_client_would_for_the_same_gaps() -> None:
    """Batched ITL observations: bucket counts, sum and count equal a plain Histogram's."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from obs import conventions as c
    from obs.config import single_upstream
    from obs.exporters.prom import Metrics

    config = single_upstream("http://127.0.0.1:9", "tiny", False)
    registry = CollectorRegistry()
    metrics = Metrics(config, registry)
    buckets = c.merged_buckets(c.TOKEN_LATENCY_BUCKETS, config.slo_thresholds_s("tpot"))
    reference = CollectorRegistry()
    plain = Histogram(c.ITL.name, c.ITL.help, c.ITL.labels, registry=reference, buckets=buckets)
    # Gaps on, below and above bucket bounds, in ns, over two requests of one lane.
    bounds_ns = [round(b * 1e9) for b in buckets if b != float("inf")]
    gaps = [[1, *bounds_ns[:3], 5_000_000, 10**12], [b + 1 for b in bounds_ns], [7]]
    for i, itl in enumerate(gaps):
        ev = Event(request_id=f"r{i}", lane="default", pool="default", status="ok", e2e_ms=1.0)
        metrics.export(Finished(ev, Clock(received=0, end=1), 0, new_ids(None), itl_ns=itl))
        for gap in itl:
            plain.labels("default", "default").observe(gap / 1e9)

    def itl_lines(text: bytes) -> list[str]:
        lines = text.decode().splitlines()
        return sorted(x for x in lines if x.startswith(c.ITL.name) and "_created" not in x)

    got, want = itl_lines(generate_latest(registry)), itl_lines(generate_latest(reference))
    assert len(want) == len(bounds_ns) + 3
    sums = [(g, w) for g, w in zip(got, want, strict=True) if "_sum{" in w]
    assert [g for g in got if "_sum{" not in g] == [w for w in want if "_sum{" not in w]
    # The sum in ns divided once is exacter than 26 float additions of seconds.
    assert len(sums) == 1 and math.isclose(
        float(sums[0][0].split()[-1]), float(sums[0][1].split()[-1]), rel_tol=1e-12
    )


def test_each_request_s_itl_p95_is_one_observation_with_a_bucket_at_the_itl_threshold() -> None:
    """vllm_obs_itl_request_p95_seconds: one observation per request that has an itl_p95_ms
    (none for one without), in a histogram with a bound at the lanes' ITL SLO threshold."""
    from prometheus_client import CollectorRegistry

    from obs import conventions as c
    from obs.config import parse_config
    from obs.exporters.prom import Metrics

    config = parse_config(
        {
            "pools": [{"name": "gpu", "replicas": ["http://127.0.0.1:9"]}],
            "lanes": [{"name": "chat", "pool": "gpu", "slo": {"itl": {"threshold_ms": 42}}}],
            "default_lane": "chat",
        }
    )
    registry = CollectorRegistry()
    metrics = Metrics(config, registry)
    for i, p95 in enumerate((30.0, 42.0, 60.0, None)):
        ev = Event(request_id=f"r{i}", lane="chat", pool="gpu", status="ok", e2e_ms=1.0)
        ev.itl_p95_ms = p95
        metrics.export(Finished(ev, Clock(received=0, end=1), 0, new_ids(None)))
    labels = {"lane": "chat", "pool": "gpu"}
    bucket, _, count = c.ITL_REQUEST_P95.series
    assert registry.get_sample_value(count, labels) == 3
    assert registry.get_sample_value(bucket, {**labels, "le": "0.042"}) == 2
