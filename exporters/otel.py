"""OpenTelemetry spans: one SERVER span per request and one child per phase.

Spans are built when the request has ended, from the recorded boundaries,
with the ids the relay fixed before dispatch (so the ``traceparent`` it sent
upstream makes vLLM's ``llm_request`` span a child of our root span). They
go to an injected ``SpanProcessor``: a ``BatchSpanProcessor`` over OTLP/HTTP
in production (configured by the standard ``OTEL_*`` variables), a
``SimpleSpanProcessor`` over an in-memory exporter in tests.

Names and attributes follow the OpenTelemetry GenAI semantic conventions:
root span ``{gen_ai.operation.name} {gen_ai.request.model}``.
"""

from __future__ import annotations

import os

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from obs.conventions import OK, PHASES
from obs.record import Finished
from obs.tracecontext import new_span_id

SCOPE = InstrumentationScope("vllm_obs.sidecar", "0.1.0")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def traces_endpoint_from_env() -> str | None:
    """The OTLP/HTTP traces URL the standard OTEL_* variables name, or None (unset or disabled)."""
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").lower() == "none":
        return None
    if url := os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return url
    if url := os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return url.rstrip("/") + "/v1/traces"
    return None


def otlp_processor(endpoint: str | None = None) -> SpanProcessor:
    """A batch processor exporting over OTLP/HTTP (protobuf), env-configured."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return BatchSpanProcessor(
        OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
    )


def _attributes(f: Finished) -> dict[str, str | bool | int | float | list[str]]:
    ev = f.event
    attrs: dict[str, str | bool | int | float | list[str]] = {
        "gen_ai.operation.name": f.operation,
        "gen_ai.system": "vllm",
        "gen_ai.provider.name": "vllm",
        "vllm_obs.lane": ev.lane,
        "vllm_obs.pool": ev.pool,
        "vllm_obs.request_id": ev.request_id,
        "vllm_obs.status": ev.status,
        "http.route": ev.route,
        "http.request.method": "POST",
    }
    optional: dict[str, object] = {
        "gen_ai.request.model": ev.model,
        "gen_ai.request.max_tokens": ev.max_tokens,
        "gen_ai.usage.input_tokens": ev.prompt_tokens,
        "gen_ai.usage.output_tokens": ev.completion_tokens,
        "gen_ai.usage.cache_read.input_tokens": ev.cached_tokens,
        "http.response.status_code": ev.http_status,
        "server.address": ev.replica,
        "error.type": ev.error_class,
        "vllm_obs.tenant": ev.tenant,
        "vllm_obs.ttft_ms": ev.ttft_ms,
        "vllm_obs.tpot_ms": ev.tpot_ms,
        "vllm_obs.stream_blocked_ms": ev.stream_blocked_ms,
        "vllm_obs.rejection_reason": ev.rejection_reason,
    }
    for k, v in optional.items():
        if v is not None:
            attrs[k] = v  # type: ignore[assignment]
    attrs["gen_ai.request.stream"] = ev.stream
    if ev.finish_reason:
        attrs["gen_ai.response.finish_reasons"] = [ev.finish_reason]
    return attrs


class SpanExporter:
    """Turns finished requests into spans for a span processor."""

    name = "otel"

    def __init__(self, processor: SpanProcessor, resource: Resource | None = None) -> None:
        self._processor = processor
        self._resource = resource or Resource.create({"service.name": "vllm-obs-sidecar"})

    def export(self, finished: Finished) -> None:
        ids = finished.ids
        if not ids.sampled:
            return
        ev = finished.event
        clock = finished.clock
        root = SpanContext(ids.trace_id, ids.span_id, is_remote=False, trace_flags=_SAMPLED)
        parent = (
            SpanContext(ids.trace_id, ids.parent_span_id, is_remote=True, trace_flags=_SAMPLED)
            if ids.parent_span_id
            else None
        )
        start = finished.wall_start_ns
        end = finished.wall_ns(clock.end or clock.received)
        failed = ev.status != OK
        status = Status(StatusCode.ERROR, ev.error_class or ev.status) if failed else Status()
        name = f"{finished.operation} {ev.model}" if ev.model else finished.operation
        spans = [
            ReadableSpan(
                name,
                context=root,
                parent=parent,
                resource=self._resource,
                attributes=_attributes(finished),
                kind=SpanKind.SERVER,
                status=status,
                start_time=start,
                end_time=end,
                instrumentation_scope=SCOPE,
            )
        ]
        t = start
        for phase, dur_ns in zip(PHASES, clock.phases_ns().values(), strict=True):
            child = SpanContext(ids.trace_id, new_span_id(), is_remote=False, trace_flags=_SAMPLED)
            phase_failed = failed and ev.error_phase == phase
            spans.append(
                ReadableSpan(
                    phase,
                    context=child,
                    parent=root,
                    resource=self._resource,
                    attributes={"vllm_obs.phase": phase},
                    kind=SpanKind.INTERNAL,
                    status=Status(StatusCode.ERROR, ev.error_class) if phase_failed else Status(),
                    start_time=t,
                    end_time=t + dur_ns,
                    instrumentation_scope=SCOPE,
                )
            )
            t += dur_ns
        for span in spans:
            self._processor.on_end(span)

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        return self._processor.force_flush(int(timeout_s * 1000))

    def shutdown(self, timeout_s: float = 10.0) -> None:
        self._processor.shutdown()
