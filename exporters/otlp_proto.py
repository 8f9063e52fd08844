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
from typing import cast
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


def _length(n: int) -> bytes:
    """A length (a non-negative varint)."""
    return _BYTES[n] if n < 0x80 else _varint(n)


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


# The root's attributes whose values come from a small set (the config's lanes, pools and
# routes, a pool's models, the outcomes): each (key, value) is encoded once, for at most
# ``_CACHED_VALUES`` pairs (a client's made-up model or tenant then costs its encoding each time).
_FEW_VALUES = frozenset(
    {
        c.ATTR_OPERATION,
        c.ATTR_SYSTEM,
        c.ATTR_PROVIDER,
        c.ATTR_LANE,
        c.ATTR_POOL,
        c.ATTR_STATUS,
        c.ATTR_HTTP_ROUTE,
        c.ATTR_HTTP_METHOD,
        c.ATTR_REQUEST_MODEL,
        c.ATTR_HTTP_STATUS,
        c.ATTR_ERROR_TYPE,
        c.ATTR_TENANT,
        c.ATTR_REJECTION_REASON,
        c.ATTR_SERVER_ADDRESS,
        c.ATTR_SERVER_PORT,
        c.ATTR_RESPONSE_MODEL,
        c.ATTR_REQUEST_STREAM,
        c.ATTR_FINISH_REASONS,
    }
)
_CACHED_VALUES = 4096
_ENCODED: dict[tuple[str, type, object], bytes] = {}


def _span_attribute(key: str, v: AttrValue) -> bytes:
    """One attribute, framed as ``Span.attributes`` (field 9)."""
    cls = v.__class__
    if key in _FEW_VALUES:
        cache_key = (key, cls, tuple(cast(list[str], v)) if cls is list else v)
        out = _ENCODED.get(cache_key)
        if out is None:
            out = _field(b"\x4a", _key_value(key, v))
            if len(_ENCODED) < _CACHED_VALUES:
                _ENCODED[cache_key] = out
        return out
    if cls is str:
        raw = v.encode()  # type: ignore[union-attr]
        value = b"\x0a" + _length(len(raw)) + raw
    elif cls is int:
        value = b"\x18" + _varint(v)  # type: ignore[arg-type]
    elif cls is float:
        value = b"\x21" + _DOUBLE.pack(v)
    else:
        value = _any_value(v)
    k = _KEYS.get(key)
    if k is None:
        k = _KEYS[key] = _field(b"\x0a", key.encode())
    kv = k + b"\x12" + _length(len(value)) + value
    return b"\x4a" + _length(len(kv)) + kv


def _root_span(
    f: Finished, trace_id: bytes, span_id: bytes, end: int, error: str | None, latest: bool
) -> bytes:
    """The request's SERVER span, length-prefixed as ``ScopeSpans.spans`` (field 2)."""
    ev, parent = f.event, f.ids.parent_span_id
    name = f"{f.operation} {ev.model}" if ev.model else f.operation
    body = [b"\x0a\x10", trace_id, b"\x12\x08", span_id]
    if parent:
        body += (b"\x22\x08", parent.to_bytes(8, "big"))
    body += (
        _field(b"\x2a", name.encode()),
        _TIMES.pack(0x30, _KIND_SERVER, 0x39, f.wall_start_ns, 0x41, end),
        *[_span_attribute(k, v) for k, v in _root_attributes(f, latest).items()],
    )
    if error is not None:
        body.append(_status(error))
    body += (b"\x85\x01", _FLAGS_REMOTE_PARENT if parent else _FLAGS_LOCAL_PARENT)
    return _field(b"\x12", b"".join(body))


def _status(error: str) -> bytes:
    """``Span.status`` (field 15): ``message`` (2) and ``code`` (3) STATUS_CODE_ERROR (2)."""
    return _field(b"\x7a", _field(b"\x12", error.encode()) + b"\x18\x02")


# Span: kind (6, varint), start and end (7 and 8, fixed64).
_TIMES = struct.Struct("<BBBQBQ")
# A phase span after its ids: name (5), kind, start, end, its one attribute, and (before the
# flags) its status if it failed. Without a status its length is fixed: its prefix too.
_PHASE_NAMES = {p: _field(b"\x2a", p.encode()) for p in PHASES}
_PHASE_ATTR_FIELDS = {p: _span_attribute(c.ATTR_PHASE, p) for p in PHASES}
_IDS_LEN = 2 + 16 + 2 + 8 + 2 + 8  # trace id, span id, parent span id (each tagged)
_PHASE_PREFIX = {
    p: b"\x12"
    + _varint(_IDS_LEN + len(_PHASE_NAMES[p]) + _TIMES.size + len(_PHASE_ATTR_FIELDS[p]) + 6)
    for p in PHASES
}
_FLAGS_FIELD = b"\x85\x01" + _FLAGS_LOCAL_PARENT


def _phase_span(
    phase: str, trace_id: bytes, parent: bytes, start: int, end: int, error: str | None
) -> bytes:
    """One phase's INTERNAL span, length-prefixed as ``ScopeSpans.spans`` (field 2)."""
    ids = b"\x0a\x10" + trace_id + b"\x12\x08" + new_span_id().to_bytes(8, "big") + parent
    times = _TIMES.pack(0x30, _KIND_INTERNAL, 0x39, start, 0x41, end)
    rest = _PHASE_NAMES[phase] + times + _PHASE_ATTR_FIELDS[phase]
    if error is None:
        return _PHASE_PREFIX[phase] + ids + rest + _FLAGS_FIELD
    return _field(b"\x12", ids + rest + _status(error) + _FLAGS_FIELD)


def request_spans(f: Finished, latest: bool = False) -> bytes:
    """The request's root span and one span per phase, each a ``ScopeSpans.spans`` entry.

    Child span ids are drawn here. Whether the trace is sampled is the caller's check.
    ``latest``: the latest GenAI conventions only (no ``gen_ai.system``).
    """
    ids, ev, clock = f.ids, f.event, f.clock
    trace_id = ids.trace_id.to_bytes(16, "big")
    span_id = ids.span_id.to_bytes(8, "big")
    start = f.wall_start_ns
    end = f.wall_ns(clock.end or clock.received)
    failed = ev.status != OK
    out = [
        _root_span(
            f, trace_id, span_id, end, (ev.error_class or ev.status) if failed else None, latest
        )
    ]
    parent = b"\x22\x08" + span_id
    failed_in = ev.error_phase if failed else None
    t = start
    for phase, dur_ns in zip(PHASES, clock.phases_ns().values(), strict=True):
        error = (ev.error_class or "") if phase == failed_in else None
        out.append(_phase_span(phase, trace_id, parent, t, t + dur_ns, error))
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
