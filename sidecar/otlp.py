"""OTLP/HTTP trace payloads: decoding the spans the sidecar receives (protobuf)."""

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


def keep_traces(req: Any, keep: Callable[[str], bool]) -> int:
    """Remove from ``req`` every span whose trace id (hex) ``keep`` refuses; spans kept."""
    kept = 0
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            spans = [s for s in ss.spans if keep(s.trace_id.hex())]
            if len(spans) != len(ss.spans):
                del ss.spans[:]
                ss.spans.extend(spans)
            kept += len(spans)
    return kept


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
