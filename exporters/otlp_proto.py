"""OTLP trace payloads written straight from finished requests (protobuf wire format).

The sidecar's spans have one fixed shape: a SERVER root with the GenAI
attributes and one INTERNAL child per phase. Building SDK ``ReadableSpan``s
and letting the OTLP exporter turn them into protobuf objects cost ~200 us of
CPU per request, 11% of the sidecar's busy samples at 64 streams (py-spy),
and held the GIL against the event loop in the batch thread. Writing the
bytes directly costs a tenth of that (``python -m bench.exporter_cost``).

Only the messages and fields the sidecar emits are written; field numbers are
those of ``opentelemetry/proto/trace/v1/trace.proto`` (v1.x, stable). The root's attributes
follow the GenAI conventions at the version ``obs.conventions.genai`` pins; with ``latest``
(``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``) the names that version renamed
are no longer written under their old names.
``tests/exporters/test_otel_export.py`` decodes the output with ``opentelemetry-proto``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from urllib.parse import urlsplit

from obs import conventions as c
from obs.conventions import OK, PHASES
from obs.record import Finished
from obs.tracecontext import new_span_id

AttrValue = str | bool | int | float | Sequence[str]

SCOPE_NAME = "vllm_obs.sidecar"
SCOPE_VERSION = "0.1.0"

_KIND_INTERNAL = 1
_KIND_SERVER = 2
# Span.flags: the parent's is_remote is known (bit 8), and the parent is remote (bit 9).
_FLAGS_LOCAL_PARENT = struct.pack("<I", 0x100)
_FLAGS_REMOTE_PARENT = struct.pack("<I", 0x300)
_DOUBLE = struct.Struct("<d")
_FIXED64 = struct.Struct("<Q")


_BYTES = tuple(bytes((i,)) for i in range(0x80))  # the one-byte varints, made once


def _varint(n: int) -> bytes:
    if 0 <= n < 0x80:
        return _BYTES[n]
    if n < 0:
        n += 1 << 64  # int64 is written as its two's complement, ten bytes
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    n = len(payload)
    return tag + (_BYTES[n] if n < 0x80 else _varint(n)) + payload


def _any_value(v: AttrValue) -> bytes:
    """An ``AnyValue`` message."""
    if isinstance(v, str):
        return _field(b"\x0a", v.encode())
    if isinstance(v, bool):
        return b"\x10\x01" if v else b"\x10\x00"
    if isinstance(v, int):
        return b"\x18" + _varint(v)
    if isinstance(v, float):
        return b"\x21" + _DOUBLE.pack(v)
    array = b"".join(_field(b"\x0a", _any_value(x)) for x in v)  # ArrayValue.values
    return _field(b"\x2a", array)


_KEYS: dict[str, bytes] = {}


def _key_value(key: str, v: AttrValue) -> bytes:
    """A ``KeyValue`` as a repeated ``attributes`` entry (field 1 of Resource, 9 of Span)."""
    k = _KEYS.get(key)
    if k is None:
        k = _KEYS[key] = _field(b"\x0a", key.encode())
    return k + _field(b"\x12", _any_value(v))


def attributes(attrs: Mapping[str, AttrValue]) -> list[bytes]:
    """Each attribute as one encoded ``KeyValue``."""
    return [_key_value(k, v) for k, v in attrs.items()]


def _span(
    trace_id: bytes,
    span_id: int,
    parent_id: int,
    flags: bytes,
    name: bytes,
    kind: int,
    start_ns: int,
    end_ns: int,
    attrs: bytes,
    error: str | None,
) -> bytes:
    """One ``Span`` message, length-prefixed as ``ScopeSpans.spans`` (field 2)."""
    body = [
        b"\x0a\x10",
        trace_id,
        b"\x12\x08",
        span_id.to_bytes(8, "big"),
    ]
    if parent_id:
        body += (b"\x22\x08", parent_id.to_bytes(8, "big"))
    body += (
        name,
        b"\x30",
        bytes((kind,)),
        b"\x39",
        _FIXED64.pack(start_ns),
        b"\x41",
        _FIXED64.pack(end_ns),
        attrs,
    )
    if error is not None:  # Status{message (2), code (3): STATUS_CODE_ERROR = 2}
        body.append(_field(b"\x7a", _field(b"\x12", error.encode()) + b"\x18\x02"))
    body += (b"\x85\x01", flags)
    return _field(b"\x12", b"".join(body))


@lru_cache(maxsize=256)
def server_address(replica: str) -> tuple[str, int] | None:
    """``server.address`` and ``server.port`` of a replica's base URL (None if it has no host)."""
    try:
        parts = urlsplit(replica)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return (parts.hostname, port) if parts.hostname else None


def _root_attributes(f: Finished, latest: bool) -> dict[str, AttrValue]:
    ev = f.event
    attrs: dict[str, AttrValue] = {c.ATTR_OPERATION: f.operation}
    if not latest:
        attrs[c.ATTR_SYSTEM] = c.PROVIDER
    attrs |= {
        c.ATTR_PROVIDER: c.PROVIDER,
        c.ATTR_LANE: ev.lane,
        c.ATTR_POOL: ev.pool,
        c.ATTR_REQUEST_ID: ev.request_id,
        c.ATTR_STATUS: ev.status,
        c.ATTR_HTTP_ROUTE: ev.route,
        c.ATTR_HTTP_METHOD: "POST",
    }
    optional: dict[str, AttrValue | None] = {
        c.ATTR_REQUEST_MODEL: ev.model,
        c.ATTR_REQUEST_MAX_TOKENS: ev.max_tokens,
        c.ATTR_INPUT_TOKENS: ev.prompt_tokens,
        c.ATTR_OUTPUT_TOKENS: ev.completion_tokens,
        c.ATTR_CACHED_INPUT_TOKENS: ev.cached_tokens,
        c.ATTR_HTTP_STATUS: ev.http_status,
        c.ATTR_ERROR_TYPE: ev.error_class,
        c.ATTR_TENANT: ev.tenant,
        c.ATTR_TTFT_MS: ev.ttft_ms,
        c.ATTR_TPOT_MS: ev.tpot_ms,
        c.ATTR_STREAM_BLOCKED_MS: ev.stream_blocked_ms,
        c.ATTR_REJECTION_REASON: ev.rejection_reason,
    }
    for k, v in optional.items():
        if v is not None:
            attrs[k] = v
    if ev.replica and (address := server_address(ev.replica)):
        attrs[c.ATTR_SERVER_ADDRESS], attrs[c.ATTR_SERVER_PORT] = address
    if ev.model and ev.status == OK:  # vLLM answers under the served model name asked for
        attrs[c.ATTR_RESPONSE_MODEL] = ev.model
    if ev.stream and ev.ttft_ms is not None:
        attrs[c.ATTR_TIME_TO_FIRST_CHUNK] = ev.ttft_ms / 1000
    attrs[c.ATTR_REQUEST_STREAM] = ev.stream
    if ev.finish_reason:
        attrs[c.ATTR_FINISH_REASONS] = [ev.finish_reason]
    return attrs


_PHASE_NAMES = {p: _field(b"\x2a", p.encode()) for p in PHASES}
_PHASE_ATTR_FIELDS = {p: _field(b"\x4a", _key_value(c.ATTR_PHASE, p)) for p in PHASES}


def request_spans(f: Finished, latest: bool = False) -> bytes:
    """The request's root span and one span per phase, each a ``ScopeSpans.spans`` entry.

    Child span ids are drawn here. Whether the trace is sampled is the caller's check.
    ``latest``: the latest GenAI conventions only (no ``gen_ai.system``).
    """
    ids = f.ids
    ev, clock = f.event, f.clock
    trace_id = ids.trace_id.to_bytes(16, "big")
    start = f.wall_start_ns
    end = f.wall_ns(clock.end or clock.received)
    failed = ev.status != OK
    error = (ev.error_class or ev.status) if failed else None
    name = f"{f.operation} {ev.model}" if ev.model else f.operation
    root_attrs = b"".join(_field(b"\x4a", kv) for kv in attributes(_root_attributes(f, latest)))
    out = [
        _span(
            trace_id,
            ids.span_id,
            ids.parent_span_id or 0,
            _FLAGS_REMOTE_PARENT if ids.parent_span_id else _FLAGS_LOCAL_PARENT,
            _field(b"\x2a", name.encode()),
            _KIND_SERVER,
            start,
            end,
            root_attrs,
            error,
        )
    ]
    t = start
    for phase, dur_ns in zip(PHASES, clock.phases_ns().values(), strict=True):
        out.append(
            _span(
                trace_id,
                new_span_id(),
                ids.span_id,
                _FLAGS_LOCAL_PARENT,
                _PHASE_NAMES[phase],
                _KIND_INTERNAL,
                t,
                t + dur_ns,
                _PHASE_ATTR_FIELDS[phase],
                (ev.error_class or "") if failed and ev.error_phase == phase else None,
            )
        )
        t += dur_ns
    return b"".join(out)


def export_request(resource: Mapping[str, AttrValue], spans: Iterable[bytes]) -> bytes:
    """An ``ExportTraceServiceRequest``: one resource, the sidecar's scope, these spans.

    ``spans`` are ``request_spans`` outputs (already framed as repeated fields).
    """
    res = _field(b"\x0a", b"".join(_field(b"\x0a", kv) for kv in attributes(resource)))
    scope = _field(
        b"\x0a", _field(b"\x0a", SCOPE_NAME.encode()) + _field(b"\x12", SCOPE_VERSION.encode())
    )
    scope_spans = _field(b"\x12", scope + b"".join(spans))
    return _field(b"\x0a", res + scope_spans)


# --- Log records (opentelemetry/proto/logs/v1/logs.proto) -------------------------------------

EVENT_NAME = "vllm_obs.request"
# SeverityNumber: INFO for a served request, WARN for one refused or cut short, ERROR for one
# that failed in the pool or the relay.
_SEVERITY = {OK: (9, b"INFO"), c.ERROR: (17, b"ERROR")}
_WARN = (13, b"WARN")
_EVENT_NAME_FIELD = _field(b"\x62", EVENT_NAME.encode())  # LogRecord.event_name (12)


def log_record(f: Finished) -> bytes:
    """The request's event as one ``LogRecord``, framed as ``ScopeLogs.log_records`` (2).

    Every event field that has a value is an attribute under the field's own name (the JSONL
    event's keys, so a pipeline reads both alike); the record's trace context is the request's
    trace and the sidecar's root span.
    """
    ev, ids = f.event, f.ids
    severity, text = _SEVERITY.get(ev.status, _WARN)
    attrs = {k: v for k, v in ev.to_dict().items() if v is not None}
    body = [
        b"\x09",  # time_unix_nano (1): when the request was received
        _FIXED64.pack(f.wall_start_ns),
        b"\x59",  # observed_time_unix_nano (11): when it ended
        _FIXED64.pack(f.wall_ns(f.clock.end or f.clock.received)),
        b"\x10",
        _varint(severity),
        _field(b"\x1a", text),
        *(_field(b"\x32", kv) for kv in attributes(attrs)),
        b"\x45",  # flags (8, fixed32): the W3C trace flags
        struct.pack("<I", 1 if ids.sampled else 0),
        _field(b"\x4a", ids.trace_id.to_bytes(16, "big")),
        _field(b"\x52", ids.span_id.to_bytes(8, "big")),
        _EVENT_NAME_FIELD,
    ]
    return _field(b"\x12", b"".join(body))


def export_logs_request(resource: Mapping[str, AttrValue], records: Iterable[bytes]) -> bytes:
    """An ``ExportLogsServiceRequest``: one resource, the sidecar's scope, these records."""
    res = _field(b"\x0a", b"".join(_field(b"\x0a", kv) for kv in attributes(resource)))
    scope = _field(
        b"\x0a", _field(b"\x0a", SCOPE_NAME.encode()) + _field(b"\x12", SCOPE_VERSION.encode())
    )
    return _field(b"\x0a", res + _field(b"\x12", scope + b"".join(records)))
