"""Holding finished requests briefly until the engine's span arrives, then exporting them.

A request is held only when its pool sends spans (``engine_traces``), it
succeeded (vLLM exports no span for aborted or failed requests), and the
join wait is positive. It is exported as soon as its ``llm_request`` span
arrives, or after ``wait_s`` without it (``engine_view: absent``). A span
for a request already exported is counted as late. Spans are matched by
trace id, and the span's ``gen_ai.request.id`` must be the id vLLM derived
from our ``X-Request-Id``.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from obs import conventions as c
from obs.engine_view import apply_engine_view, engine_request_ids
from obs.record import Finished

ExportFn = Callable[[Finished], None]
MAX_PENDING = 100_000


class EngineJoin:
    def __init__(
        self,
        export: ExportFn,
        wait_s: float,
        on_late: Callable[[], None] = lambda: None,
        on_joined: Callable[[], None] = lambda: None,
    ) -> None:
        self._export = export
        self.wait_s = wait_s
        self._on_late = on_late
        self._on_joined = on_joined
        self._pending: dict[str, tuple[Finished, asyncio.TimerHandle]] = {}
        # Spans that arrived before their request finished relaying (rare): kept briefly.
        self._early: OrderedDict[str, Mapping[str, Any]] = OrderedDict()
        self._done: OrderedDict[str, None] = OrderedDict()

    def submit(self, finished: Finished, engine_traces: bool) -> None:
        """Export now, or hold until the engine span arrives (at most ``wait_s``)."""
        ev = finished.event
        if not engine_traces or self.wait_s <= 0 or ev.status != c.OK or not ev.request_id:
            self._export(finished)
            return
        key = ev.trace_id or ""
        early = self._early.pop(key, None)
        if early is not None and self._matches(finished, early):
            apply_engine_view(finished, early)
            self._on_joined()
            self._export(finished)
            return
        if len(self._pending) >= MAX_PENDING:
            self._export(finished)
            return
        handle = asyncio.get_running_loop().call_later(self.wait_s, self._expire, key)
        self._pending[key] = (finished, handle)

    def on_span(self, trace_id: str, attrs: Mapping[str, Any]) -> None:
        """An ``llm_request`` span arrived."""
        held = self._pending.get(trace_id)
        if held is None:
            if trace_id in self._done:
                self._on_late()
            else:
                self._early[trace_id] = attrs
                while len(self._early) > 10_000:
                    self._early.popitem(last=False)
            return
        finished, handle = held
        if not self._matches(finished, attrs):
            return
        del self._pending[trace_id]
        handle.cancel()
        apply_engine_view(finished, attrs)
        self._on_joined()
        self._emit(trace_id, finished)

    def _matches(self, finished: Finished, attrs: Mapping[str, Any]) -> bool:
        rid = attrs.get("gen_ai.request.id")
        return rid is None or rid in engine_request_ids(finished.event.request_id)

    def _expire(self, trace_id: str) -> None:
        held = self._pending.pop(trace_id, None)
        if held is not None:
            self._emit(trace_id, held[0])

    def _emit(self, trace_id: str, finished: Finished) -> None:
        self._done[trace_id] = None
        while len(self._done) > 100_000:
            self._done.popitem(last=False)
        self._export(finished)

    def flush(self) -> None:
        """Export everything still held (at shutdown)."""
        for trace_id in list(self._pending):
            finished, handle = self._pending.pop(trace_id)
            handle.cancel()
            self._emit(trace_id, finished)

    @property
    def pending(self) -> int:
        return len(self._pending)
