"""The simulated replica's ``llm_request`` spans, sent as vLLM sends them (OTLP/HTTP protobuf).

vLLM started with ``--otlp-traces-endpoint URL`` sends one span per finished request:
named ``llm_request``, kind SERVER, a child of the request's ``traceparent`` header (a
new trace without one), with the ``gen_ai.latency.*`` seconds (queue, prefill, decode,
inference, time to first token, end to end), the token counts and the request's
sampling parameters as attributes (tests/data/vllm-0.32-llm_request-span.json is a
real one). Its ``gen_ai.request.id`` is vLLM's request id: ``chatcmpl-{X-Request-Id}``
for a chat completion, ``cmpl-{X-Request-Id}-0`` for a text completion (a random id
without the header; choice ``i`` of ``n > 1`` is ``{i}_{id}``, as vLLM's child requests).
An aborted request (its client left) gets no span, as in vLLM.

:func:`request_span` is pure; :class:`SpanExporter` batches spans and posts them from
the server's event loop (every :data:`FLUSH_S` or :data:`BATCH` spans), dropping a
batch the endpoint refuses (counted, logged once), as OpenTelemetry's batch processor does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from obs.engines.sim.scheduler import SimRequest

if TYPE_CHECKING:
    import aiohttp
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

SPAN_NAME: Final = "llm_request"
SCOPE: Final = "vllm.tracing.otel"
FLUSH_S: Final = 0.25
BATCH: Final = 256
MAX_QUEUE: Final = 8192  # spans kept while the endpoint is slow; older ones are dropped
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")


@dataclass(frozen=True, slots=True)
class SpanContext:
    """Where a request's span goes: its trace, its parent (``""`` for a root span)."""

    trace_id: str
    parent_span_id: str

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> SpanContext:
        """The caller's ``traceparent`` (W3C), or a new trace when it is absent or invalid."""
        m = _TRACEPARENT.fullmatch(headers.get("traceparent", "").strip().lower())
        if m is None or set(m.group(1)) == {"0"} or set(m.group(2)) == {"0"}:
            return cls(secrets.token_hex(16), "")
        return cls(m.group(1), m.group(2))


def request_ids(chat: bool, header_id: str | None, n: int) -> list[str]:
    """vLLM's request id of each choice, from the ``X-Request-Id`` header when given."""
    base = header_id or secrets.token_hex(16)
    rid = f"chatcmpl-{base}" if chat else f"cmpl-{base}-0"
    return [rid] if n == 1 else [f"{i}_{rid}" for i in range(n)]


def span_attributes(
    req: SimRequest, request_id: str, top_p: float, n: int, speed: float = 1.0
) -> dict[str, Any]:
    """The span's attributes (seconds on the modelled clock, divided by ``speed``)."""
    arrival, scheduled = req.arrival_s, req.scheduled_s or req.arrival_s
    first = req.first_token_s if req.first_token_s is not None else scheduled
    end = req.finished_s if req.finished_s is not None else first
    s = 1.0 / speed
    return {
        "gen_ai.latency.time_to_first_token": (first - arrival) * s,
        "gen_ai.latency.e2e": (end - arrival) * s,
        "gen_ai.latency.time_in_queue": (scheduled - arrival) * s,
        "gen_ai.usage.prompt_tokens": req.prompt_tokens,
        "gen_ai.usage.completion_tokens": req.output,
        "gen_ai.latency.time_in_model_prefill": (first - scheduled) * s,
        "gen_ai.latency.time_in_model_decode": (end - first) * s,
        "gen_ai.latency.time_in_model_inference": (end - scheduled) * s,
        "gen_ai.request.id": request_id,
        "gen_ai.request.top_p": float(top_p),
        "gen_ai.request.max_tokens": req.max_tokens,
        "gen_ai.request.n": n,
    }


def set_any_value(value: Any, v: Any) -> None:
    """Set an OTLP ``AnyValue`` from a Python scalar (bool, int, float, else its string)."""
    if isinstance(v, bool):
        value.bool_value = v
    elif isinstance(v, int):
        value.int_value = v
    elif isinstance(v, float):
        value.double_value = v
    else:
        value.string_value = str(v)


def request_span(
    ctx: SpanContext, attributes: Mapping[str, Any], start_ns: int, end_ns: int
) -> Span:
    """One ``llm_request`` span (protobuf)."""
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    span = Span()
    span.name = SPAN_NAME
    span.kind = Span.SpanKind.SPAN_KIND_SERVER
    span.trace_id = bytes.fromhex(ctx.trace_id)
    span.span_id = secrets.token_bytes(8)
    if ctx.parent_span_id:
        span.parent_span_id = bytes.fromhex(ctx.parent_span_id)
    span.start_time_unix_nano, span.end_time_unix_nano = start_ns, max(start_ns, end_ns)
    for k, v in attributes.items():
        kv = span.attributes.add()
        kv.key = k
        set_any_value(kv.value, v)
    return span


def resource_attributes() -> dict[str, str]:
    """What vLLM's OpenTelemetry SDK puts on its resource (the capture's keys)."""
    from importlib.metadata import version

    return {
        "telemetry.sdk.language": "python",
        "telemetry.sdk.name": "opentelemetry",
        "telemetry.sdk.version": version("opentelemetry-sdk"),
        "service.instance.id": str(uuid.uuid4()),
        "vllm.instrumenting_module_name": "vllm.llm_engine",
        "vllm.process_id": str(os.getpid()),
        "service.name": os.environ.get("OTEL_SERVICE_NAME", "unknown_service:python"),
    }


def export_body(spans: list[Span], resource: Mapping[str, str]) -> bytes:
    """One ``ExportTraceServiceRequest`` holding ``spans``."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    for k, v in resource.items():
        kv = rs.resource.attributes.add()
        kv.key = k
        kv.value.string_value = v
    ss = rs.scope_spans.add()
    ss.scope.name = SCOPE
    ss.spans.extend(spans)
    return req.SerializeToString()


class SpanExporter:
    """Batches spans and posts them to ``endpoint`` (OTLP/HTTP, protobuf)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.resource = resource_attributes()
        self.sent = 0
        self.dropped = 0
        self._queue: list[Span] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._warned = False

    def add(self, span: Span) -> None:
        self._queue.append(span)
        if len(self._queue) > MAX_QUEUE:
            self.dropped += len(self._queue) - MAX_QUEUE
            del self._queue[: len(self._queue) - MAX_QUEUE]
        if len(self._queue) >= BATCH:
            self._wake.set()

    def start(self) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Send what is queued, then close."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await self._flush()
        if self._session is not None:
            await self._session.close()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), FLUSH_S)
            self._wake.clear()
            await self._flush()

    async def _flush(self) -> None:
        while self._queue and self._session is not None:
            batch, self._queue = self._queue[:BATCH], self._queue[BATCH:]
            body = export_body(batch, self.resource)
            headers = {"content-type": "application/x-protobuf"}
            try:
                async with self._session.post(self.endpoint, data=body, headers=headers) as r:
                    await r.read()
                    ok = r.status < 300
                    why = f"HTTP {r.status}"
            except Exception as e:  # the endpoint is down or slow: drop, as OTel's exporter
                ok, why = False, str(e) or type(e).__name__
            if ok:
                self.sent += len(batch)
                continue
            self.dropped += len(batch)
            if not self._warned:
                self._warned = True
                print(
                    f"engine sim: spans to {self.endpoint} dropped ({why})",
                    file=sys.stderr,
                    flush=True,
                )


def now_ns() -> int:
    return time.time_ns()
