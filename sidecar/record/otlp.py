"""OTLP/HTTP payloads: decoding the spans the sidecar receives, and (for tests and users'
receivers) the metrics and log records it sends (protobuf)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start_ns: int
    end_ns: int
    scope: str
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)


def _any_value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def parse_export(body: bytes) -> Any:
    """One OTLP/HTTP protobuf ``ExportTraceServiceRequest`` (raises on anything else)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    return req


def decode_traces(body: bytes) -> list[ReceivedSpan]:
    """Spans of one OTLP/HTTP protobuf ``ExportTraceServiceRequest``."""
    return spans_of(parse_export(body))


def keep_traces(req: Any, ours: Callable[[str, str], bool]) -> int:
    """Remove from ``req`` every span but those the sidecar's own spans parent; spans kept.

    ``ours(trace_id, parent_span_id)`` (hex) says whether a span's parent is a span the
    sidecar made (the engine's request span, under the sidecar's relay span); that span's
    descendants in the same export are kept too (an engine's nested spans). A client that
    chose its trace id with ``traceparent`` never learns the sidecar's span id.
    """
    at: list[tuple[int, int, int]] = []  # (resource, scope, span) position of each span
    children: dict[tuple[bytes, bytes], list[int]] = {}  # (trace, parent) -> spans
    todo: list[int] = []
    for i, rs in enumerate(req.resource_spans):
        for j, ss in enumerate(rs.scope_spans):
            for k, span in enumerate(ss.spans):
                n = len(at)
                at.append((i, j, k))
                if ours(span.trace_id.hex(), span.parent_span_id.hex()):
                    todo.append(n)
                else:
                    children.setdefault((span.trace_id, span.parent_span_id), []).append(n)
    keep: set[tuple[int, int, int]] = set()
    while todo:
        n = todo.pop()
        i, j, k = at[n]
        if at[n] in keep:
            continue
        keep.add(at[n])
        span = req.resource_spans[i].scope_spans[j].spans[k]
        todo.extend(children.pop((span.trace_id, span.span_id), []))
    for i, rs in enumerate(req.resource_spans):
        for j, ss in enumerate(rs.scope_spans):
            spans = [s for k, s in enumerate(ss.spans) if (i, j, k) in keep]
            if len(spans) != len(ss.spans):
                del ss.spans[:]
                ss.spans.extend(spans)
    return len(keep)


def spans_of(req: Any) -> list[ReceivedSpan]:
    """The spans of a parsed export, their attributes as Python values."""
    out = []
    for rs in req.resource_spans:
        resource = {kv.key: _any_value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    ReceivedSpan(
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        kind=s.kind,
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        scope=ss.scope.name,
                        attributes={kv.key: _any_value(kv.value) for kv in s.attributes},
                        resource=resource,
                    )
                )
    return out


@dataclass
class ReceivedPoint:
    """One histogram data point of an OTLP metrics export."""

    metric: str
    unit: str
    attributes: dict[str, Any]
    count: int
    sum: float
    bucket_counts: list[int]
    explicit_bounds: list[float]
    temporality: int
    resource: dict[str, Any] = field(default_factory=dict)


def decode_metrics(body: bytes) -> list[ReceivedPoint]:
    """The histogram points of one ``ExportMetricsServiceRequest`` (other kinds are skipped)."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    req = ExportMetricsServiceRequest()
    req.ParseFromString(body)
    out = []
    for rm in req.resource_metrics:
        resource = {kv.key: _any_value(kv.value) for kv in rm.resource.attributes}
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.histogram.data_points:
                    out.append(
                        ReceivedPoint(
                            metric=m.name,
                            unit=m.unit,
                            attributes={kv.key: _any_value(kv.value) for kv in p.attributes},
                            count=p.count,
                            sum=p.sum,
                            bucket_counts=list(p.bucket_counts),
                            explicit_bounds=list(p.explicit_bounds),
                            temporality=m.histogram.aggregation_temporality,
                            resource=resource,
                        )
                    )
    return out


@dataclass
class ReceivedLog:
    """One log record of an OTLP logs export."""

    event_name: str
    time_ns: int
    observed_ns: int
    severity_number: int
    severity_text: str
    trace_id: str
    span_id: str
    flags: int
    body: Any
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)
    scope: str = ""


def decode_logs(body: bytes) -> list[ReceivedLog]:
    """The log records of one ``ExportLogsServiceRequest``."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    req = ExportLogsServiceRequest()
    req.ParseFromString(body)
    out = []
    for rl in req.resource_logs:
        resource = {kv.key: _any_value(kv.value) for kv in rl.resource.attributes}
        for sl in rl.scope_logs:
            for r in sl.log_records:
                out.append(
                    ReceivedLog(
                        event_name=r.event_name,
                        time_ns=r.time_unix_nano,
                        observed_ns=r.observed_time_unix_nano,
                        severity_number=r.severity_number,
                        severity_text=r.severity_text,
                        trace_id=r.trace_id.hex(),
                        span_id=r.span_id.hex(),
                        flags=r.flags,
                        body=_any_value(r.body) if r.HasField("body") else None,
                        attributes={kv.key: _any_value(kv.value) for kv in r.attributes},
                        resource=resource,
                        scope=sl.scope.name,
                    )
                )
    return out
