"""The exporter interface, and the fan-out the record pipeline ends in.

Like OpenTelemetry's processor/exporter split: ``export`` is called once per
finished request on the event loop and must return quickly (queue, don't do
I/O); ``force_flush`` and ``shutdown`` are called at graceful shutdown. An
exporter that raises is logged and counted; it never reaches the client.
"""

from __future__ import annotations

from typing import Protocol

import structlog

from obs.record import Finished

log = structlog.get_logger("vllm_obs.exporters")


class Exporter(Protocol):
    name: str

    def export(self, finished: Finished) -> None: ...

    def force_flush(self, timeout_s: float = 10.0) -> bool: ...

    def shutdown(self, timeout_s: float = 10.0) -> None: ...


class FailureCounter(Protocol):
    def exporter_failed(self, exporter: str) -> None: ...


class Fanout:
    """Hands each finished request to every exporter, isolating their failures."""

    def __init__(self, exporters: list[Exporter], failures: FailureCounter | None = None) -> None:
        self.exporters = exporters
        self._failures = failures

    def export(self, finished: Finished) -> None:
        for exp in self.exporters:
            try:
                exp.export(finished)
            except Exception as e:  # an exporter must never break a client's request
                log.error("exporter_failed", exporter=exp.name, error=repr(e))
                if self._failures is not None:
                    self._failures.exporter_failed(exp.name)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        for exp in self.exporters:
            try:
                exp.force_flush(timeout_s)
                exp.shutdown(timeout_s)
            except Exception as e:
                log.error("exporter_shutdown_failed", exporter=exp.name, error=repr(e))
