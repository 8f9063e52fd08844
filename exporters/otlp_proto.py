"""OTLP payloads written straight from finished requests (protobuf wire format).

The wire format's pieces (varints, length-delimited fields, ``AnyValue``, ``KeyValue``), the
export requests that carry spans and log records, and the log records themselves; the spans
are ``otlp_spans``'. Building SDK objects and letting the OTLP exporters turn them into
protobuf objects cost ~200 us of CPU per request, and held the GIL against the event loop in
the batch thread. Writing the bytes directly costs a tenth of that
(``python -m bench.exporter_cost``).

Only the messages and fields the sidecar emits are written; field numbers are those of
``opentelemetry/proto/{trace,logs}/v1/*.proto`` (v1.x, stable).
``tests/exporters/test_otel_export.py`` decodes the output with ``opentelemetry-proto``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from urllib.parse import urlsplit

from obs import conventions as c
from obs.conventions import OK
from obs.record import Finished

AttrValue = str | bool | int | float | Sequence[str]

SCOPE_NAME = "vllm_obs.sidecar"
SCOPE_VERSION = "0.1.0"

DOUBLE = struct.Struct("<d")
FIXED64 = struct.Struct("<Q")


ONE_BYTE = tuple(bytes((i,)) for i in range(0x80))  # the one-byte varints, made once


def varint(n: int) -> bytes:
    """A varint (a negative int64 as its two's complement)."""
    if 0 <= n < 0x80:
        return ONE_BYTE[n]
    if 0 < n < 0x4000:  # two bytes: token counts, most lengths
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    if n < 0:
        n += 1 << 64  # int64 is written as its two's complement, ten bytes
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def length(n: int) -> bytes:
    """A length (a non-negative varint)."""
    return ONE_BYTE[n] if n < 0x80 else varint(n)


def field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    n = len(payload)
    return tag + (ONE_BYTE[n] if n < 0x80 else varint(n)) + payload


def _any_value(v: AttrValue) -> bytes:
    """An ``AnyValue`` message."""
    if isinstance(v, str):
        return field(b"\x0a", v.encode())
    if isinstance(v, bool):
        return b"\x10\x01" if v else b"\x10\x00"
    if isinstance(v, int):
        return b"\x18" + varint(v)
    if isinstance(v, float):
        return b"\x21" + DOUBLE.pack(v)
    array = b"".join(field(b"\x0a", _any_value(x)) for x in v)  # ArrayValue.values
    return field(b"\x2a", array)


_KEYS: dict[str, bytes] = {}


def key_value(key: str, v: AttrValue) -> bytes:
    """A ``KeyValue`` as a repeated ``attributes`` entry (field 1 of Resource, 9 of Span)."""
    k = _KEYS.get(key)
    if k is None:
        k = _KEYS[key] = field(b"\x0a", key.encode())
    return k + field(b"\x12", _any_value(v))


def attributes(attrs: Mapping[str, AttrValue]) -> list[bytes]:
    """Each attribute as one encoded ``KeyValue``."""
    return [key_value(k, v) for k, v in attrs.items()]


@lru_cache(maxsize=256)
def server_address(replica: str) -> tuple[str, int] | None:
    """``server.address`` and ``server.port`` of a replica's base URL (None if it has no host)."""
    try:
        parts = urlsplit(replica)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return (parts.hostname, port) if parts.hostname else None


def export_request(resource: Mapping[str, AttrValue], spans: Iterable[bytes]) -> bytes:
    """An ``ExportTraceServiceRequest``: one resource, the sidecar's scope, these spans.

    ``spans`` are ``request_spans`` outputs (already framed as repeated fields).
    """
    res = field(b"\x0a", b"".join(field(b"\x0a", kv) for kv in attributes(resource)))
    scope = field(
        b"\x0a", field(b"\x0a", SCOPE_NAME.encode()) + field(b"\x12", SCOPE_VERSION.encode())
    )
    scope_spans = field(b"\x12", scope + b"".join(spans))
    return field(b"\x0a", res + scope_spans)


# --- Log records (opentelemetry/proto/logs/v1/logs.proto) -------------------------------------

EVENT_NAME = "vllm_obs.request"
# SeverityNumber: INFO for a served request, WARN for one refused or cut short, ERROR for one
# that failed in the pool or the relay.
_SEVERITY = {OK: (9, b"INFO"), c.ERROR: (17, b"ERROR")}
_WARN = (13, b"WARN")
_EVENT_NAME_FIELD = field(b"\x62", EVENT_NAME.encode())  # LogRecord.event_name (12)


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
        FIXED64.pack(f.wall_start_ns),
        b"\x59",  # observed_time_unix_nano (11): when it ended
        FIXED64.pack(f.wall_ns(f.clock.end or f.clock.received)),
        b"\x10",
        varint(severity),
        field(b"\x1a", text),
        *(field(b"\x32", kv) for kv in attributes(attrs)),
        b"\x45",  # flags (8, fixed32): the W3C trace flags
        struct.pack("<I", 1 if ids.sampled else 0),
        field(b"\x4a", ids.trace_id.to_bytes(16, "big")),
        field(b"\x52", ids.span_id.to_bytes(8, "big")),
        _EVENT_NAME_FIELD,
    ]
    return field(b"\x12", b"".join(body))


def export_logs_request(resource: Mapping[str, AttrValue], records: Iterable[bytes]) -> bytes:
    """An ``ExportLogsServiceRequest``: one resource, the sidecar's scope, these records."""
    res = field(b"\x0a", b"".join(field(b"\x0a", kv) for kv in attributes(resource)))
    scope = field(
        b"\x0a", field(b"\x0a", SCOPE_NAME.encode()) + field(b"\x12", SCOPE_VERSION.encode())
    )
    return field(b"\x0a", res + field(b"\x12", scope + b"".join(records)))
