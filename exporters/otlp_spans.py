"""OTLP spans written straight from finished requests (protobuf wire format).

The sidecar's spans have one fixed shape: a SERVER root with the GenAI attributes and one
INTERNAL child per phase. The root's attributes follow the GenAI conventions at the version
``obs.conventions.genai`` pins; with ``latest``
(``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``) the names that version renamed
are no longer written under their old names. Field numbers are those of
``opentelemetry/proto/trace/v1/trace.proto`` (v1.x, stable).

Per request, only what is the request's own is encoded: its ids, times, token counts and
latencies. The root's few-valued attributes (lane, pool, route, model, outcome, ...) are
encoded once per distinct set of values, and the five phase spans fill one template.
``tests/exporters/test_otlp_proto.py`` decodes the output with ``opentelemetry-proto`` and
compares it with what the reference classes build.
"""

from __future__ import annotations

import struct
from operator import attrgetter
from typing import Final

from obs import conventions as c
from obs.conventions import OK, PHASES
from obs.exporters.otlp_proto import (
    DOUBLE,
    FIXED64,
    ONE_BYTE,
    AttrValue,
    field,
    key_value,
    length,
    server_address,
    varint,
)
from obs.record import Finished
from obs.tracecontext import new_span_ids

_KIND_INTERNAL = 1
_KIND_SERVER = 2
# Span.flags: the parent's is_remote is known (bit 8), and the parent is remote (bit 9).
_FLAGS_LOCAL_PARENT = struct.pack("<I", 0x100)
_FLAGS_REMOTE_PARENT = struct.pack("<I", 0x300)


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


def _span_attribute(key: str, v: AttrValue) -> bytes:
    """One attribute, framed as ``Span.attributes`` (field 9)."""
    return field(b"\x4a", key_value(key, v))


# The root's attributes whose values come from a small set (the config's lanes, pools and
# routes, a pool's models, the outcomes), by the run of ``_root_attributes``'s order they are
# in: the request's own attributes (its id, token counts and times) come between the runs.
_RUN: Final = {
    c.ATTR_OPERATION: 0,
    c.ATTR_SYSTEM: 0,
    c.ATTR_PROVIDER: 0,
    c.ATTR_LANE: 0,
    c.ATTR_POOL: 0,
    c.ATTR_STATUS: 1,
    c.ATTR_HTTP_ROUTE: 1,
    c.ATTR_HTTP_METHOD: 1,
    c.ATTR_REQUEST_MODEL: 1,
    c.ATTR_HTTP_STATUS: 2,
    c.ATTR_ERROR_TYPE: 2,
    c.ATTR_TENANT: 2,
    c.ATTR_REJECTION_REASON: 3,
    c.ATTR_SERVER_ADDRESS: 3,
    c.ATTR_SERVER_PORT: 3,
    c.ATTR_RESPONSE_MODEL: 3,
    c.ATTR_REQUEST_STREAM: 4,
    c.ATTR_FINISH_REASONS: 4,
}
# The encoded name, the five runs and the status (empty if ok), per distinct set of the values
# they are made of: at most ``_CACHED`` sets (then the cache starts again: a client's made-up
# model or tenant cannot grow it).
Shared = tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes]
_CACHED: Final = 4096
_SHARED: dict[tuple[object, ...], Shared] = {}


def _shared(f: Finished, latest: bool, error: str | None) -> Shared:
    """The root span's fields made only of few-valued attributes, encoded once per set."""
    ev = f.event
    key = (
        f.operation,
        latest,
        ev.lane,
        ev.pool,
        ev.status,
        ev.route,
        ev.model,
        ev.http_status,
        ev.error_class,
        ev.tenant,
        ev.rejection_reason,
        ev.replica,
        ev.stream,
        ev.finish_reason,
        error,
    )
    out = _SHARED.get(key)
    if out is None:
        runs: list[list[bytes]] = [[], [], [], [], []]
        for k, v in _root_attributes(f, latest).items():
            if (run := _RUN.get(k)) is not None:
                runs[run].append(_span_attribute(k, v))
        name = f"{f.operation} {ev.model}" if ev.model else f.operation
        a, b, c_, d, e = (b"".join(r) for r in runs)
        out = (field(b"\x2a", name.encode()), a, b, c_, d, e, _status(error) if error else b"")
        if len(_SHARED) >= _CACHED:
            _SHARED.clear()
        _SHARED[key] = out
    return out


def _key(key: str) -> bytes:
    return field(b"\x0a", key.encode())


def _int_prefixes(key: str) -> tuple[bytes, ...]:
    """By the varint's length (1 to 10): an int attribute's bytes before its varint."""
    k = _key(key)
    return tuple(
        b"\x4a" + length(len(k) + 3 + n) + k + b"\x12" + ONE_BYTE[1 + n] + b"\x18"
        for n in range(11)
    )


def _double_prefix(key: str) -> bytes:
    """A double attribute's bytes before its 8 bytes."""
    k = _key(key)
    return b"\x4a" + length(len(k) + 11) + k + b"\x12\x09\x21"


# The request's own attributes after its id, by run (the token counts, then the latencies):
# (key, the event's field, the encoded key and tags before the value).
_REQUEST_ID_KEY = _key(c.ATTR_REQUEST_ID) + b"\x12"
_INTS = tuple(
    (k, _int_prefixes(k))
    for k in (
        c.ATTR_REQUEST_MAX_TOKENS,
        c.ATTR_INPUT_TOKENS,
        c.ATTR_OUTPUT_TOKENS,
        c.ATTR_CACHED_INPUT_TOKENS,
    )
)
_INT_VALUES = attrgetter("max_tokens", "prompt_tokens", "completion_tokens", "cached_tokens")
_DOUBLES = tuple(
    (k, _double_prefix(k)) for k in (c.ATTR_TTFT_MS, c.ATTR_TPOT_MS, c.ATTR_STREAM_BLOCKED_MS)
)
_DOUBLE_VALUES = attrgetter("ttft_ms", "tpot_ms", "stream_blocked_ms")
_TIME_TO_FIRST_CHUNK = _double_prefix(c.ATTR_TIME_TO_FIRST_CHUNK)


def _root_span(
    f: Finished, trace_id: bytes, span_id: bytes, end: int, error: str | None, latest: bool
) -> bytes:
    """The request's SERVER span, length-prefixed as ``ScopeSpans.spans`` (field 2).

    Its attributes are ``_root_attributes``'s, in their order: the few-valued runs from
    ``_shared``, the request's own written here (an int or a float as the event holds them;
    another kind as ``_span_attribute`` writes it).
    """
    ev, parent = f.event, f.ids.parent_span_id
    name, run0, run1, run2, run3, run4, status = _shared(f, latest, error)
    body = [b"\x0a\x10", trace_id, b"\x12\x08", span_id]
    if parent:
        body += (b"\x22\x08", parent.to_bytes(8, "big"))
    body += (name, _TIMES.pack(0x30, _KIND_SERVER, 0x39, f.wall_start_ns, 0x41, end), run0)
    rid = ev.request_id
    if rid.__class__ is str:
        raw = rid.encode()
        value = b"\x0a" + length(len(raw)) + raw
        kv = _REQUEST_ID_KEY + length(len(value)) + value
        body += (b"\x4a", length(len(kv)), kv, run1)
    else:
        body += (_span_attribute(c.ATTR_REQUEST_ID, rid), run1)
    for (key, prefixes), v in zip(_INTS, _INT_VALUES(ev), strict=True):
        if v.__class__ is int:
            raw = varint(v)
            body += (prefixes[len(raw)], raw)
        elif v is not None:
            body.append(_span_attribute(key, v))
    body.append(run2)
    for (key, prefix), v in zip(_DOUBLES, _DOUBLE_VALUES(ev), strict=True):
        if v.__class__ is float:
            body += (prefix, DOUBLE.pack(v))
        elif v is not None:
            body.append(_span_attribute(key, v))
    body.append(run3)
    if ev.stream and ev.ttft_ms is not None:
        body += (_TIME_TO_FIRST_CHUNK, DOUBLE.pack(ev.ttft_ms / 1000))
    body += (run4, status, b"\x85\x01", _FLAGS_REMOTE_PARENT if parent else _FLAGS_LOCAL_PARENT)
    return field(b"\x12", b"".join(body))


def _status(error: str) -> bytes:
    """``Span.status`` (field 15): ``message`` (2) and ``code`` (3) STATUS_CODE_ERROR (2)."""
    return field(b"\x7a", field(b"\x12", error.encode()) + b"\x18\x02")


# Span: kind (6, varint), start and end (7 and 8, fixed64).
_TIMES = struct.Struct("<BBBQBQ")
# A phase span after its ids: name (5), kind, start, end, its one attribute, and (before the
# flags) its status if it failed. Without a status its length is fixed: its prefix too.
_PHASE_NAMES = {p: field(b"\x2a", p.encode()) for p in PHASES}
_PHASE_ATTR_FIELDS = {p: _span_attribute(c.ATTR_PHASE, p) for p in PHASES}
_IDS_LEN = 2 + 16 + 2 + 8 + 2 + 8  # trace id, span id, parent span id (each tagged)
_PHASE_PREFIX = {
    p: b"\x12"
    + varint(_IDS_LEN + len(_PHASE_NAMES[p]) + _TIMES.size + len(_PHASE_ATTR_FIELDS[p]) + 6)
    for p in PHASES
}
_FLAGS_FIELD = b"\x85\x01" + _FLAGS_LOCAL_PARENT


# Kind INTERNAL, and the tags of start and end (fixed64, written between).
_INTERNAL_TIMES = bytes((0x30, _KIND_INTERNAL, 0x39))


def _phase_template(p: str) -> bytes:
    """Phase ``p``'s span without a status as a ``bytes % args`` template: its trace id, span
    id, parent span id, start and end (fixed64 bytes)."""
    constants = (
        _PHASE_PREFIX[p] + b"\x0a\x10",
        b"\x12\x08",
        b"\x22\x08",
        _PHASE_NAMES[p] + _INTERNAL_TIMES,
        b"\x41",
        _PHASE_ATTR_FIELDS[p] + _FLAGS_FIELD,
    )
    return b"%b".join(x.replace(b"%", b"%%") for x in constants)


_PHASE_TEMPLATES = {p: _phase_template(p) for p in PHASES}
_PHASES_TEMPLATE = b"".join(_PHASE_TEMPLATES.values())  # all five, in PHASES order


def _failed_phase_span(
    phase: str, trace_id: bytes, span_id: bytes, parent: bytes, start: bytes, end: bytes, error: str
) -> bytes:
    """The span of the phase a request failed in (with a status), as ``ScopeSpans.spans``."""
    ids = b"\x0a\x10" + trace_id + b"\x12\x08" + span_id + b"\x22\x08" + parent
    times = _INTERNAL_TIMES + start + b"\x41" + end
    rest = _PHASE_NAMES[phase] + times + _PHASE_ATTR_FIELDS[phase]
    return field(b"\x12", ids + rest + _status(error) + _FLAGS_FIELD)


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
    root = _root_span(
        f, trace_id, span_id, end, (ev.error_class or ev.status) if failed else None, latest
    )
    # The phases' boundaries on the wall clock, and their spans' ids, drawn at once.
    q, p, ft, d, s = f.phases()  # PHASES order
    t1 = start + q
    t2 = t1 + p
    t3 = t2 + ft
    t4 = t3 + d
    w = FIXED64.pack
    w0, w1, w2, w3, w4, w5 = w(start), w(t1), w(t2), w(t3), w(t4), w(t4 + s)
    x = new_span_ids(5)
    c0, c1, c2, c3, c4 = x[:8], x[8:16], x[16:24], x[24:32], x[32:]
    if not failed or ev.error_phase not in _PHASE_TEMPLATES:
        return root + _PHASES_TEMPLATE % (
            *(trace_id, c0, span_id, w0, w1),
            *(trace_id, c1, span_id, w1, w2),
            *(trace_id, c2, span_id, w2, w3),
            *(trace_id, c3, span_id, w3, w4),
            *(trace_id, c4, span_id, w4, w5),
        )
    out = [root]
    bounds = (w0, w1, w2, w3, w4, w5)
    for i, (phase, cid) in enumerate(zip(PHASES, (c0, c1, c2, c3, c4), strict=True)):
        a, b = bounds[i], bounds[i + 1]
        if phase == ev.error_phase:
            error = ev.error_class or ""
            out.append(_failed_phase_span(phase, trace_id, cid, span_id, a, b, error))
        else:
            out.append(_PHASE_TEMPLATES[phase] % (trace_id, cid, span_id, a, b))
    return b"".join(out)
