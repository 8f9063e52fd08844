"""OpenTelemetry spans: one SERVER span per request and one child per phase, over OTLP/HTTP.

Spans are built when the request has ended, from the recorded boundaries,
with the ids the relay fixed before dispatch (so the ``traceparent`` it sent
upstream makes vLLM's ``llm_request`` span a child of our root span). Names
and attributes follow the OpenTelemetry GenAI semantic conventions: root span
``{gen_ai.operation.name} {gen_ai.request.model}``.

``export`` appends the finished request to a bounded deque (no lock, no
wake-up unless a batch is full: the event writers' ``batching``). An exporter thread wakes
every ``OTEL_BSP_SCHEDULE_DELAY`` (or when ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` spans
are waiting, or on ``force_flush``), writes the protobuf directly
(``otlp_proto``: no SDK span objects) and POSTs it, retrying 429/502/503/504
and connection errors with backoff for up to ``OTEL_EXPORTER_OTLP_TIMEOUT``.
Why not the SDK's ``BatchSpanProcessor`` and ``OTLPSpanExporter``: they cost
~200 us of CPU per request, most of it turning spans into protobuf objects
(see ``otlp_proto``). The standard variables keep their meaning: endpoint,
headers, timeout, compression (gzip), certificates, the ``OTEL_BSP_*`` batch
settings, and ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` for the
resource. Requests whose spans are dropped (queue full, or the collector
refused them after the retries) are counted in ``vllm_obs_events_dropped_total``
(exporter ``otel``) and logged once per failure streak.
"""

from __future__ import annotations

import os
from typing import cast

import structlog
from opentelemetry.sdk.resources import Resource

from obs import conventions as c
from obs.exporters.batching import BatchingExporter
from obs.exporters.jsonl import EventCounters
from obs.exporters.otlp_http import OtlpPost, OtlpSettings, default_resource, endpoint_from_env
from obs.exporters.otlp_proto import AttrValue, export_request
from obs.exporters.otlp_spans import request_spans
from obs.record import Finished

__all__ = ["OtlpSettings", "SpanExporter", "traces_endpoint_from_env"]

log = structlog.get_logger("vllm_obs.otel")

SPANS_PER_REQUEST = 6  # the root and five phases


def traces_endpoint_from_env() -> str | None:
    """The OTLP/HTTP traces URL the standard OTEL_* variables name, or None (unset or disabled)."""
    return endpoint_from_env("traces")


class SpanExporter(BatchingExporter[Finished]):
    """Queues finished requests; a thread encodes their spans and sends them over OTLP/HTTP."""

    name = "otel"

    def __init__(
        self,
        settings: OtlpSettings,
        *,
        counters: EventCounters | None = None,
        resource: Resource | None = None,
    ) -> None:
        batch = max(1, settings.max_batch_spans // SPANS_PER_REQUEST)
        super().__init__(
            queue_size=max(1, settings.max_queue_spans // SPANS_PER_REQUEST),
            flush_interval_s=settings.schedule_delay_s,
            wake_items=batch,
            batch_items=batch,
        )
        self.settings = settings
        self._counters = counters
        # Resource values are the SDK-validated kinds the encoder writes (str, bool, int, ...).
        self._resource: dict[str, AttrValue] = (
            default_resource()
            if resource is None
            else cast(dict[str, AttrValue], dict(resource.attributes))
        )
        self._latest = c.latest_genai(os.environ)  # OTEL_SEMCONV_STABILITY_OPT_IN
        self._post = OtlpPost(settings, self.name, lambda: self._stopping, counters)
        self._start()

    def export(self, finished: Finished) -> None:
        """Queue a request's spans (called on the event loop: no I/O, no lock)."""
        if finished.ids.sampled:
            super().export(finished)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        super().shutdown(timeout_s)
        self._post.close()

    # -- the exporter thread ------------------------------------------------

    def _item(self, finished: Finished) -> Finished:
        return finished  # encoded on the thread

    def _write_batch(self, items: list[Finished]) -> None:
        latest = self._latest
        try:
            body = export_request(self._resource, [request_spans(f, latest) for f in items])
        except Exception as e:  # a bad record must not stop the thread
            log.error("otlp_encode_failed", error=repr(e))
            self._dropped("encode_error", len(items))
            return
        self._post.send(body, len(items))

    def _dropped(self, reason: str, n: int) -> None:
        if self._counters is not None:
            self._counters.event_dropped(self.name, reason, n)
