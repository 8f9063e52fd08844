"""Holding finished requests briefly until the engine's span arrives, then exporting them.

A request is held only when its pool sends spans (``engine_traces``), it
succeeded (vLLM exports no span for aborted or failed requests), and the
join wait is positive. It is exported as soon as its engine's request span
arrives (vLLM's ``llm_request``, SGLang's root span, TGI's handler span:
``obs.engines.spans``), or after ``wait_s`` without it (``engine_view: absent``).

Requests are keyed by (trace id, the sidecar's span id): the relay sends its
own span id to the pool in ``traceparent``, the engine makes it the parent of
its request span, so two requests that share a client's trace never
collide, and a span is only ever joined to a request whose ids the sidecar
issued for it (``issue``) and, for vLLM, whose ``gen_ai.request.id`` is the id
vLLM derived from our ``X-Request-Id``. Every latency is checked first
(``obs.engines.spans.read_span``): a span with a number that is not a
plausible duration, or with no timing at all, is rejected and its request is
written at once without the engine view. Each span's result is reported to ``on_result``: joined,
late (its request was already written), rejected, or unknown (not a request
of ours).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable

import structlog

from obs import conventions as c
from obs.engines.spans import read_span
from obs.engines.view import BadEngineSpan, apply_engine_view, engine_request_ids
from obs.record import Finished
from obs.sidecar.record.otlp import ReceivedSpan

log = structlog.get_logger("vllm_obs.engine_join")

ExportFn = Callable[[Finished], None]
Key = tuple[str, str]  # (trace id, the sidecar's span id), hex
MAX_PENDING = 100_000
MAX_EARLY = 10_000
MAX_ISSUED = 200_000  # ids sent to traced pools that a span may still name


class EngineJoin:
    def __init__(
        self,
        export: ExportFn,
        wait_s: float,
        on_result: Callable[[str], None] = lambda result: None,
    ) -> None:
        self.export = export  # where a record goes once joined, or not (the pipeline's next step)
        self.wait_s = wait_s
        self._on_result = on_result
        self._pending: dict[Key, tuple[Finished, asyncio.TimerHandle]] = {}
        # Spans that arrived before their request finished relaying (rare): numbers only.
        self._early: OrderedDict[Key, tuple[str | None, dict[str, float]]] = OrderedDict()
        self._done: OrderedDict[Key, None] = OrderedDict()
        self._issued: OrderedDict[Key, None] = OrderedDict()

    def issue(self, trace_id: str, span_id: str) -> None:
        """The relay sent these ids to a pool that traces: a span may name them."""
        self._issued[(trace_id, span_id)] = None
        while len(self._issued) > MAX_ISSUED:
            self._issued.popitem(last=False)

    def knows_parent(self, trace_id: str, span_id: str) -> bool:
        """The sidecar's own span of a request sent to a traced pool (from any thread)."""
        return (trace_id, span_id) in self._issued

    def submit(self, finished: Finished, engine_traces: bool) -> None:
        """Export now, or hold until the engine span arrives (at most ``wait_s``)."""
        ev = finished.event
        if not engine_traces or self.wait_s <= 0 or ev.status != c.OK or not ev.request_id:
            self.export(finished)
            return
        key = (ev.trace_id or "", ev.span_id or "")
        early = self._early.pop(key, None)
        if early is not None and self._matches(finished, early[0]):
            self._join(finished, early[1])
            self.export(finished)
            return
        if len(self._pending) >= MAX_PENDING:
            self.export(finished)
            return
        held = self._pending.pop(key, None)
        if held is not None:  # ids are unique per request; never drop the older one
            held[1].cancel()
            self._emit(key, held[0])
        handle = asyncio.get_running_loop().call_later(self.wait_s, self._expire, key)
        self._pending[key] = (finished, handle)

    def on_span(self, span: ReceivedSpan) -> None:
        """An engine's request span arrived (``obs.engines.spans``)."""
        result = self._on_span(span)
        if result:
            self._on_result(result)

    def _on_span(self, span: ReceivedSpan) -> str:
        key = (span.trace_id, span.parent_span_id)
        if key not in self._issued:
            return "unknown"
        try:
            engine_span = read_span(span.name, span.attributes)
        except BadEngineSpan:
            self._early.pop(key, None)
            held = self._pending.pop(key, None)
            if held is not None:  # written now, without the engine view
                held[1].cancel()
                self._emit(key, held[0])
            return "rejected"
        if engine_span is None:
            return "unknown"
        rid, numbers = engine_span.request_id, engine_span.numbers
        held = self._pending.get(key)
        if held is None:
            if key in self._done:
                return "late"
            self._early[key] = (rid, numbers)
            while len(self._early) > MAX_EARLY:
                self._early.popitem(last=False)
            return ""  # counted when its request joins it
        finished, handle = held
        if not self._matches(finished, rid):
            return "unknown"
        del self._pending[key]
        handle.cancel()
        self._join(finished, numbers)
        self._emit(key, finished)
        return ""

    def _matches(self, finished: Finished, rid: str | None) -> bool:
        return rid is None or rid in engine_request_ids(finished.event.request_id)

    def _join(self, finished: Finished, numbers: dict[str, float]) -> None:
        try:
            apply_engine_view(finished, numbers)
        except Exception:  # never lose the event over what a span said
            log.exception("engine_view_failed", request_id=finished.event.request_id)
            self._on_result("rejected")
            return
        self._on_result("joined")

    def _expire(self, key: Key) -> None:
        held = self._pending.pop(key, None)
        if held is not None:
            self._emit(key, held[0])

    def _emit(self, key: Key, finished: Finished) -> None:
        self._done[key] = None
        while len(self._done) > MAX_ISSUED:
            self._done.popitem(last=False)
        self.export(finished)

    def flush(self) -> None:
        """Export everything still held (at shutdown)."""
        for key in list(self._pending):
            finished, handle = self._pending.pop(key)
            handle.cancel()
            self._emit(key, finished)

    @property
    def pending(self) -> int:
        return len(self._pending)
