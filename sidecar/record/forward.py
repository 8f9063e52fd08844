"""Forwarding the pools' engine spans on to the trace collector, in the background.

The sidecar receives vLLM's ``llm_request`` spans (``POST /v1/traces``) to join them to
its events; where the sidecar exports traces itself, it also sends each received payload
on to the same collector, so a trace shows the engine's span beside the sidecar's. A
failed forward is logged and counted (``exporter="otlp_forward"``), never retried: the
spans are the engine's, the event already has what it needs from them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import structlog

from obs.exporters.otel import OtlpSettings

log = structlog.get_logger("vllm_obs.sidecar")
FORWARD_TIMEOUT_S = 10.0


class TraceForwarder:
    def __init__(
        self,
        otlp: OtlpSettings,
        session: Callable[[], aiohttp.ClientSession],
        failed: Callable[[str], None],
    ) -> None:
        self.otlp = otlp
        self.session = session
        self.failed = failed
        self.headers = dict(otlp.headers)  # OTEL_EXPORTER_OTLP_HEADERS (auth)
        self.headers["content-type"] = "application/x-protobuf"
        self._tasks: set[asyncio.Task[None]] = set()

    def forward(self, payload: bytes) -> None:
        """Send ``payload`` to the collector; returns at once."""
        task = asyncio.get_running_loop().create_task(self._post(payload))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, payload: bytes) -> None:
        timeout = aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S)
        try:
            async with self.session().post(
                self.otlp.endpoint, data=payload, headers=self.headers, timeout=timeout
            ) as resp:
                if resp.status >= 300:
                    raise aiohttp.ClientError(f"status {resp.status}")
        except (aiohttp.ClientError, TimeoutError) as e:
            log.warning("trace_forward_failed", endpoint=self.otlp.endpoint, error=str(e))
            self.failed("otlp_forward")

    async def drain(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) for the forwards still in flight."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=timeout_s)
