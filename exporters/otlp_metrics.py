"""The GenAI conventions' metrics over OTLP/HTTP: time to first token, time per output token,
request duration and token usage, as cumulative histograms with the conventions' buckets.

On by ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` or ``--otlp-metrics-endpoint`` (not by the
generic ``OTEL_EXPORTER_OTLP_ENDPOINT`` alone: the sidecar's Prometheus metrics already carry
the same figures). Like every event-writing exporter (``batching``): ``export`` turns the
finished request into a small tuple and appends it on the event loop; the exporter thread
adds them to the histograms and, every ``OTEL_METRIC_EXPORT_INTERVAL`` (60 s by default),
encodes every series (``opentelemetry-proto``, a few series per lane) and POSTs them
(``otlp_http``). Names, units, buckets and attributes: ``obs.conventions.genai`` (pinned
version); the Prometheus metrics keep their own names. Series are keyed by operation, model
(bounded as the Prometheus ``model`` label is), server address and port, error type, lane
and pool.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence

import structlog
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, Metric

from obs import conventions as c
from obs.config import Config
from obs.exporters.batching import BatchingExporter
from obs.exporters.jsonl import EventCounters
from obs.exporters.otlp_http import OtlpPost, OtlpSettings
from obs.exporters.otlp_proto import SCOPE_NAME, SCOPE_VERSION, AttrValue, server_address
from obs.record import Finished

log = structlog.get_logger("vllm_obs.otlp_metrics")

Attrs = tuple[tuple[str, AttrValue], ...]
# What a request's attributes derive from: operation, lane, pool, model, replica, status,
# error class.
Key = tuple[str, str, str, str | None, str | None, str, str | None]
# One request's observations: its key, then seconds (or None) per latency metric and its
# input and output tokens.
Item = tuple[Key, float, float | None, float | None, int | None, int | None]
MAX_KEYS = 4096
CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
WAKE_ITEMS = 512


class _Histogram:
    """One series' cumulative explicit-bucket histogram."""

    __slots__ = ("counts", "max", "min", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.min = float("inf")
        self.max = float("-inf")

    def add(self, bounds: Sequence[float], v: float) -> None:
        self.counts[bisect_left(bounds, v)] += 1
        self.sum += v
        self.min = min(self.min, v)
        self.max = max(self.max, v)


class GenAiMetricsExporter(BatchingExporter[Item]):
    """Aggregates finished requests into the GenAI histograms; exports them every interval."""

    name = "otlp_metrics"

    def __init__(
        self,
        settings: OtlpSettings,
        config: Config,
        *,
        resource: Mapping[str, AttrValue],
        counters: EventCounters | None = None,
    ) -> None:
        super().__init__(
            queue_size=settings.max_queue_spans * 8,
            flush_interval_s=settings.schedule_delay_s,
            wake_items=WAKE_ITEMS,
            batch_items=WAKE_ITEMS,
        )
        self.settings = settings
        self._resource = resource
        self._counters = counters
        self._model = c.BoundedLabel(tuple(p.model for p in config.pools if p.model))
        self._series: dict[tuple[str, Attrs], _Histogram] = {}
        self._attrs: dict[Key, Attrs] = {}
        self._start_ns = time.time_ns()
        self._next_export = time.monotonic() + settings.schedule_delay_s
        self._exported = threading.Event()
        self._export_now = False
        self._changed = False  # observations since the last export
        # cumulative: a failed export loses nothing, the next one carries the same counts
        self._post = OtlpPost(settings, self.name, lambda: self._stopping)
        self._start()

    # On the event loop: the request's raw fields, nothing computed.
    def _item(self, finished: Finished) -> Item:
        ev = finished.event
        return (
            (finished.operation, ev.lane, ev.pool, ev.model, ev.replica, ev.status, ev.error_class),
            ev.e2e_ms / 1000,
            ev.ttft_ms / 1000 if ev.status == c.OK and ev.ttft_ms is not None else None,
            ev.tpot_ms / 1000 if ev.status == c.OK and ev.tpot_ms is not None else None,
            ev.prompt_tokens,
            ev.completion_tokens,
        )

    def _attributes(self, key: Key) -> Attrs:
        """The data point attributes of a request (on the thread; cached per distinct key)."""
        attrs = self._attrs.get(key)
        if attrs is not None:
            return attrs
        operation, lane, pool, model, replica, status, error_class = key
        out: list[tuple[str, AttrValue]] = [
            (c.ATTR_OPERATION, operation),
            (c.ATTR_PROVIDER, c.PROVIDER),
            (c.ATTR_LANE, lane),
            (c.ATTR_POOL, pool),
        ]
        if model:
            out.append((c.ATTR_REQUEST_MODEL, self._model(model)))
            if status == c.OK:
                out.append((c.ATTR_RESPONSE_MODEL, self._model(model)))
        if replica and (address := server_address(replica)):
            out += ((c.ATTR_SERVER_ADDRESS, address[0]), (c.ATTR_SERVER_PORT, address[1]))
        if status != c.OK:
            out.append((c.ATTR_ERROR_TYPE, error_class or status))
        if len(self._attrs) >= MAX_KEYS:  # client-chosen models: keep the cache bounded
            self._attrs.clear()
        attrs = self._attrs[key] = tuple(out)
        return attrs

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Aggregate what is queued and export every series now."""
        deadline = time.monotonic() + timeout_s
        if not super().force_flush(timeout_s):
            return False
        self._exported.clear()
        self._export_now = True
        self._wake.set()
        return self._exported.wait(max(0.0, deadline - time.monotonic()))

    def shutdown(self, timeout_s: float = 10.0) -> None:
        super().shutdown(timeout_s)
        self._post.close()

    # The thread.
    def _write_batch(self, items: list[Item]) -> None:
        self._changed = True
        for key, duration, ttft, tpot, prompt, completion in items:
            attrs = self._attributes(key)
            self._observe(c.GENAI_REQUEST_DURATION, attrs, duration)
            if ttft is not None:
                self._observe(c.GENAI_TIME_TO_FIRST_TOKEN, attrs, ttft)
            if tpot is not None:
                self._observe(c.GENAI_TIME_PER_OUTPUT_TOKEN, attrs, tpot)
            # token usage has no error.type: the usage of a failed request still counts
            usage = tuple(a for a in attrs if a[0] != c.ATTR_ERROR_TYPE)
            for kind, n in ((c.TOKEN_INPUT, prompt), (c.TOKEN_OUTPUT, completion)):
                if n:
                    self._observe(c.GENAI_TOKEN_USAGE, (*usage, (c.ATTR_TOKEN_TYPE, kind)), n)

    def _observe(self, m: c.GenAiMetric, attrs: Attrs, v: float) -> None:
        h = self._series.get((m.name, attrs))
        if h is None:
            h = self._series[(m.name, attrs)] = _Histogram(m.buckets)
        h.add(m.buckets, v)

    def _before_batches(self) -> None:
        """Export what was aggregated up to the previous wake, when the interval is up."""
        if self._export_now or time.monotonic() >= self._next_export:
            self._export()

    def _on_stop(self) -> None:
        if self._changed:  # else the last export (often force_flush's, just before) holds all
            self._export()

    def _export(self) -> None:
        # Any export that starts after force_flush saw its requests aggregated holds them
        # (one thread aggregates and exports in turn): each one tells a waiting flush.
        self._export_now = self._changed = False
        self._next_export = time.monotonic() + self.settings.schedule_delay_s
        if self._series:
            self._post.send(self._encode(), 0)
        self._exported.set()

    def _encode(self) -> bytes:
        req = ExportMetricsServiceRequest()
        rm = req.resource_metrics.add()
        rm.resource.attributes.extend(_key_values(self._resource.items()))
        sm = rm.scope_metrics.add()
        sm.scope.name, sm.scope.version = SCOPE_NAME, SCOPE_VERSION
        sm.schema_url = f"https://opentelemetry.io/schemas/{c.GENAI_SEMCONV_VERSION}"
        now = time.time_ns()
        for m in c.GENAI_METRICS:
            points = [(a, h) for (name, a), h in self._series.items() if name == m.name]
            if not points:
                continue
            metric: Metric = sm.metrics.add()
            metric.name, metric.unit, metric.description = m.name, m.unit, m.description
            metric.histogram.aggregation_temporality = CUMULATIVE
            for attrs, h in points:
                p = metric.histogram.data_points.add()
                p.attributes.extend(_key_values(attrs))
                p.start_time_unix_nano, p.time_unix_nano = self._start_ns, now
                p.count, p.sum = sum(h.counts), h.sum
                p.min, p.max = h.min, h.max
                p.bucket_counts.extend(h.counts)
                p.explicit_bounds.extend(m.buckets)
        return req.SerializeToString()

    def _dropped(self, reason: str, n: int) -> None:
        if self._counters is not None:
            self._counters.event_dropped(self.name, reason, n)


def _key_values(attrs: Iterable[tuple[str, AttrValue]]) -> list[KeyValue]:
    out = []
    for k, v in attrs:
        value = AnyValue()
        if isinstance(v, str):
            value.string_value = v
        elif isinstance(v, bool):
            value.bool_value = v
        elif isinstance(v, int):
            value.int_value = v
        elif isinstance(v, float):
            value.double_value = v
        else:
            value.array_value.values.extend(AnyValue(string_value=x) for x in v)
        out.append(KeyValue(key=k, value=value))
    return out
