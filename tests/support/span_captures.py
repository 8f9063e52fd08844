"""The engines' span captures in tests/data as the OTLP/HTTP protobuf export they send.

A capture is the JSON of one span (vLLM's) or a list of spans of one request
(SGLang's, TGI's); ``export`` moves them into a given trace under a given parent,
as the engine does with the ``traceparent`` the sidecar sent it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from obs.engines.sim.spans import set_any_value

DATA = Path(__file__).parents[1] / "data"


def load(name: str) -> list[dict[str, Any]]:
    """The spans of the capture ``tests/data/<name>`` (a single span becomes a list)."""
    data = json.loads((DATA / name).read_text())
    return data if isinstance(data, list) else [data]


def export(spans: list[dict[str, Any]], trace_id: str, parent: str) -> bytes:
    """One export of ``spans``: their trace is ``trace_id``, the caller's span is ``parent``.

    The spans whose parent is the first span's (the caller's span, in the capture)
    get ``parent``; the others keep their parents inside the engine.
    """
    caller = spans[0]["parent_span_id"]
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    for k, v in spans[0]["resource"].items():
        kv = rs.resource.attributes.add()
        kv.key = k
        set_any_value(kv.value, v)
    ss = rs.scope_spans.add()
    ss.scope.name = spans[0]["scope"]
    for s in spans:
        span = ss.spans.add()
        span.name, span.kind = s["name"], s["kind"]
        span.trace_id, span.span_id = bytes.fromhex(trace_id), bytes.fromhex(s["span_id"])
        own = s["parent_span_id"]
        span.parent_span_id = bytes.fromhex(parent if own == caller else own)
        span.start_time_unix_nano, span.end_time_unix_nano = s["start_ns"], s["end_ns"]
        for k, v in s["attributes"].items():
            kv = span.attributes.add()
            kv.key = k
            set_any_value(kv.value, v)
    return req.SerializeToString()
