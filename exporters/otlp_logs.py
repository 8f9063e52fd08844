"""Events as OTLP log records (opt-in): one record per request, into a collector's pipeline.

On by ``--otlp-logs-endpoint`` or ``OTEL_EXPORTER_OTLP_LOGS_ENDPOINT`` (never by the generic
``OTEL_EXPORTER_OTLP_ENDPOINT`` alone). Each record is named ``vllm_obs.request``, holds every
event field with a value as an attribute (the JSONL keys), and carries the request's trace
and root span ids, so a log backend links it to the trace. The batching and no-block rules
are the other event writers' (``batching``): ``export`` appends the finished request on the
event loop; the thread, woken every ``OTEL_BLRP_SCHEDULE_DELAY`` or when
``OTEL_BLRP_MAX_EXPORT_BATCH_SIZE`` records wait, writes the protobuf directly
(``otlp_proto``) and POSTs it (``otlp_http``, with retries). A full queue
(``OTEL_BLRP_MAX_QUEUE_SIZE``) or a refused export is counted in
``vllm_obs_events_dropped_total{exporter="otlp_logs"}``.
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from obs.exporters.batching import BatchingExporter
from obs.exporters.jsonl import EventCounters
from obs.exporters.otlp_http import OtlpPost, OtlpSettings
from obs.exporters.otlp_proto import AttrValue, export_logs_request, log_record
from obs.record import Finished

log = structlog.get_logger("vllm_obs.otlp_logs")


class LogRecordExporter(BatchingExporter[Finished]):
    """Queues finished requests; a thread encodes their log records and sends them."""

    name = "otlp_logs"

    def __init__(
        self,
        settings: OtlpSettings,
        *,
        resource: Mapping[str, AttrValue],
        counters: EventCounters | None = None,
    ) -> None:
        super().__init__(
            queue_size=settings.max_queue_spans,
            flush_interval_s=settings.schedule_delay_s,
            wake_items=settings.max_batch_spans,
            batch_items=settings.max_batch_spans,
        )
        self.settings = settings
        self._resource = resource
        self._counters = counters
        self._post = OtlpPost(settings, self.name, lambda: self._stopping, counters)
        self._start()

    def _item(self, finished: Finished) -> Finished:
        return finished  # encoded on the thread

    def _write_batch(self, items: list[Finished]) -> None:
        try:
            body = export_logs_request(self._resource, [log_record(f) for f in items])
        except Exception as e:  # a bad record must not stop the thread
            log.error("otlp_logs_encode_failed", error=repr(e))
            self._dropped("encode_error", len(items))
            return
        self._post.send(body, len(items))

    def shutdown(self, timeout_s: float = 10.0) -> None:
        super().shutdown(timeout_s)
        self._post.close()

    def _dropped(self, reason: str, n: int) -> None:
        if self._counters is not None:
            self._counters.event_dropped(self.name, reason, n)
