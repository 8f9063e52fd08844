"""The span encoder's bytes against the reference protobuf: any request, the same spans."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans, Span, Status

from obs.conventions import OUTCOMES, PHASES
from obs.events import Event
from obs.exporters import otlp_spans
from obs.exporters.otlp_spans import _root_attributes, request_spans
from obs.phases import Clock
from obs.record import Finished, fill_timings
from obs.tracecontext import TraceIds

NS = st.integers(0, 10**12)
ID = st.none() | st.integers(1, 2**64 - 1)  # a parent span id, or none
TEXT = st.text(max_size=150)  # past 127 UTF-8 bytes, lengths take two varint bytes
SOME_INT = st.none() | st.integers(-(2**63), 2**63 - 1)
SOME_MS = st.none() | st.floats(allow_nan=False, allow_infinity=False)


@st.composite
def finished(draw: st.DrawFn) -> Finished:
    status = draw(st.sampled_from(OUTCOMES))
    ev = Event(
        request_id=draw(TEXT),
        model=draw(st.none() | st.sampled_from(["tiny", "Qwen/Qwen3-0.6B"]) | TEXT),
        lane=draw(st.sampled_from(["default", "chat"])),
        pool=draw(st.sampled_from(["default", "small"])),
        replica=draw(st.sampled_from([None, "http://127.0.0.1:8001", "https://h", "not a url"])),
        route=draw(st.sampled_from(["/v1/chat/completions", "/v1/completions"])),
        status=status,
        stream=draw(st.booleans()),
        http_status=draw(st.none() | st.sampled_from([200, 429, 502])),
        error_class=draw(st.none() | TEXT),
        error_phase=draw(st.none() | st.sampled_from(PHASES)),
        rejection_reason=draw(st.none() | st.sampled_from(["queue_full", "rate_limited"])),
        tenant=draw(st.none() | TEXT),
        prompt_tokens=draw(SOME_INT),
        completion_tokens=draw(SOME_INT),
        cached_tokens=draw(SOME_INT),
        max_tokens=draw(SOME_INT),
        stream_blocked_ms=draw(st.floats(allow_nan=False, allow_infinity=False)),
        finish_reason=draw(st.none() | st.sampled_from(["stop", "length"]) | TEXT),
    )
    received = draw(NS)
    clock = Clock(received, *(draw(st.just(0) | NS.map(lambda n: received + n)) for _ in range(5)))
    ids = TraceIds(
        draw(st.integers(1, 2**128 - 1)), draw(st.integers(1, 2**64 - 1)), draw(ID), True
    )
    f = Finished(ev, clock, draw(st.integers(1, 2**62)), ids)
    f.operation = draw(st.sampled_from(["chat", "text_completion"]))
    fill_timings(f)
    ev.ttft_ms, ev.tpot_ms = draw(SOME_MS), draw(SOME_MS)
    return f


def _any(v: Any) -> AnyValue:
    if isinstance(v, str):
        return AnyValue(string_value=v)
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    return AnyValue(array_value=ArrayValue(values=[_any(x) for x in v]))


def _expected(f: Finished, latest: bool, child_ids: list[bytes]) -> list[Span]:
    """The spans built with the reference classes (child span ids are drawn by the encoder)."""
    ev, ids = f.event, f.ids
    trace_id, root_id = ids.trace_id.to_bytes(16, "big"), ids.span_id.to_bytes(8, "big")
    failed = ev.status != "ok"
    root = Span(
        trace_id=trace_id,
        span_id=root_id,
        parent_span_id=(ids.parent_span_id or 0).to_bytes(8, "big") if ids.parent_span_id else b"",
        name=f"{f.operation} {ev.model}" if ev.model else f.operation,
        kind=Span.SPAN_KIND_SERVER,
        start_time_unix_nano=f.wall_start_ns,
        end_time_unix_nano=f.wall_ns(f.clock.end or f.clock.received),
        attributes=[KeyValue(key=k, value=_any(v)) for k, v in _root_attributes(f, latest).items()],
        flags=0x300 if ids.parent_span_id else 0x100,
    )
    if failed:
        root.status.CopyFrom(
            Status(message=ev.error_class or ev.status, code=Status.STATUS_CODE_ERROR)
        )
    out, t = [root], f.wall_start_ns
    for phase, dur, span_id in zip(PHASES, f.clock.phases_ns().values(), child_ids, strict=True):
        span = Span(
            trace_id=trace_id,
            span_id=span_id,
            parent_span_id=root_id,
            name=phase,
            kind=Span.SPAN_KIND_INTERNAL,
            start_time_unix_nano=t,
            end_time_unix_nano=t + dur,
            attributes=[KeyValue(key="vllm_obs.phase", value=AnyValue(string_value=phase))],
            flags=0x100,
        )
        if failed and ev.error_phase == phase:
            span.status.CopyFrom(
                Status(message=ev.error_class or "", code=Status.STATUS_CODE_ERROR)
            )
        out.append(span)
        t += dur
    return out


@settings(max_examples=300, deadline=None)
@given(finished(), st.booleans())
def test_request_spans_decode_as_the_reference_builds_them(f: Finished, latest: bool) -> None:
    """Any record's encoded spans parse to the spans opentelemetry-proto's classes build."""
    decoded = ScopeSpans()
    decoded.ParseFromString(request_spans(f, latest))
    child_ids = [s.span_id for s in decoded.spans[1:]]
    assert all(len(i) == 8 and any(i) for i in child_ids)
    assert list(decoded.spans) == _expected(f, latest, child_ids)


@given(finished())
def test_request_spans_encode_the_same_record_twice_alike(f: Finished) -> None:
    """The encoder's cached attribute bytes give a second encoding the first one's spans."""
    first, second = ScopeSpans(), ScopeSpans()
    first.ParseFromString(request_spans(f))
    second.ParseFromString(request_spans(f))
    for a, b in zip(first.spans, second.spans, strict=True):
        a.span_id = b.span_id  # the children's ids are drawn anew
    assert first == second


def _record(shared: int, own: int, parent: int | None) -> Finished:
    """One of three few-valued sets (ok, error, rejected) with one of three sets of the
    request's own values (none of them, small ones, large and negative ones)."""
    ev = Event(
        request_id=f"req-{shared}-{own}" * (own + 1),
        model=("tiny", "Qwen/Qwen3-0.6B", None)[shared],
        lane=("default", "chat", "chat")[shared],
        pool="default",
        replica=("http://127.0.0.1:8001", "https://h", None)[shared],
        route="/v1/chat/completions",
        status=("ok", "error", "rejected")[shared],
        stream=shared != 2,
        http_status=(200, 502, 429)[shared],
        error_class=(None, "upstream_5xx", None)[shared],
        error_phase=(None, "prefill", None)[shared],
        rejection_reason=(None, None, "queue_full")[shared],
        tenant=(None, "acme", "t" * 200)[shared],
        finish_reason=("stop", None, None)[shared],
    )
    ints = ((None,) * 4, (2, 128, 2, 0), (2**40, -5, 16384, 127))[own]
    ev.max_tokens, ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens = ints
    received = 10**9
    clock = Clock(received, received + 10**5, received + 2 * 10**7, 0, received + 3 * 10**7)
    f = Finished(ev, clock, 1_700_000_000 * 10**9, TraceIds(2**100 + own, 7 + shared, parent, True))
    fill_timings(f)
    ev.ttft_ms, ev.tpot_ms = ((None, None), (20.05, 5.0), (0.0, -1.5e300))[own]
    ev.stream_blocked_ms = (0.0, 3.25, 1e-9)[own]
    return f


def test_records_that_share_few_valued_attributes_keep_their_own_values() -> None:
    """Records encoded after one another with the same and with other few-valued attributes
    (ok, error, rejected; latest or not) decode to their own spans, none to another's."""
    records = [
        _record(shared, own, parent)
        for own in range(3)
        for shared in range(3)
        for parent in (None, 2**63 + shared)
    ]
    for _ in range(2):  # the second time every set is encoded already
        for f in records:
            for latest in (False, True):
                decoded = ScopeSpans()
                decoded.ParseFromString(request_spans(f, latest))
                child_ids = [s.span_id for s in decoded.spans[1:]]
                assert list(decoded.spans) == _expected(f, latest, child_ids)
                assert len(set(child_ids)) == len(PHASES)


def test_shared_attribute_sets_are_kept_to_a_bound() -> None:
    """Past ``_CACHED`` distinct sets (a client's made-up tenants) the cache starts again,
    and a record encoded after that still decodes to its spans."""
    f = _record(0, 1, None)
    for i in range(otlp_spans._CACHED + 10):
        f.event.tenant = f"tenant-{i}"
        request_spans(f)
        assert len(otlp_spans._SHARED) <= otlp_spans._CACHED
    decoded = ScopeSpans()
    decoded.ParseFromString(request_spans(f))
    assert list(decoded.spans) == _expected(f, False, [s.span_id for s in decoded.spans[1:]])
