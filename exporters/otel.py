"""OpenTelemetry spans: one SERVER span per request and one child per phase, over OTLP/HTTP.

Spans are built when the request has ended, from the recorded boundaries,
with the ids the relay fixed before dispatch (so the ``traceparent`` it sent
upstream makes vLLM's ``llm_request`` span a child of our root span). Names
and attributes follow the OpenTelemetry GenAI semantic conventions: root span
``{gen_ai.operation.name} {gen_ai.request.model}``.

``export`` appends the finished request to a bounded deque (no lock, no
wake-up unless a batch is full). An exporter thread wakes every
``OTEL_BSP_SCHEDULE_DELAY`` (or when ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` spans
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

import gzip
import os
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import cast

import requests
import structlog
from opentelemetry.sdk.resources import Resource
from opentelemetry.util.re import parse_env_headers

from obs.exporters.jsonl import EventCounters
from obs.exporters.otlp_proto import AttrValue, export_request, request_spans
from obs.record import Finished

log = structlog.get_logger("vllm_obs.otel")

SPANS_PER_REQUEST = 6  # the root and five phases
RETRYABLE = frozenset({429, 502, 503, 504})


def traces_endpoint_from_env() -> str | None:
    """The OTLP/HTTP traces URL the standard OTEL_* variables name, or None (unset or disabled)."""
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").lower() == "none":
        return None
    if url := os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return url
    if url := os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return url.rstrip("/") + "/v1/traces"
    return None


def _env(name: str, default: str = "") -> str:
    """``OTEL_EXPORTER_OTLP_TRACES_<name>``, else ``OTEL_EXPORTER_OTLP_<name>``."""
    return (
        os.environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}")
        or os.environ.get(f"OTEL_EXPORTER_OTLP_{name}")
        or default
    )


def _number(raw: str, name: str, default: float) -> float:
    """``raw`` (the value of variable ``name``) as a number; ``default`` if unset or invalid."""
    try:
        return float(raw) if raw else default
    except ValueError:
        log.warning("invalid_otel_setting", variable=name, value=raw, using=default)
        return default


def _bsp(name: str, default: float) -> float:
    """``OTEL_BSP_<name>`` as a number."""
    var = f"OTEL_BSP_{name}"
    return _number(os.environ.get(var, ""), var, default)


@dataclass
class OtlpSettings:
    """Where and how spans are sent; ``from_env`` reads the standard OTEL_* variables."""

    endpoint: str
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 10.0
    gzip: bool = False
    verify: str | bool = True  # a CA bundle path, or the system's
    client_cert: tuple[str, str] | None = None
    schedule_delay_s: float = 5.0
    max_queue_spans: int = 2048
    max_batch_spans: int = 512

    @classmethod
    def from_env(cls, endpoint: str | None = None) -> OtlpSettings | None:
        """``endpoint`` (else the variables') with the variables' settings; None: no endpoint."""
        url = endpoint or traces_endpoint_from_env()
        if not url:
            return None
        compression = _env("COMPRESSION", "none").strip().lower()
        if compression not in ("none", "gzip"):
            log.warning("invalid_otel_setting", variable="COMPRESSION", value=compression)
        cert, key = _env("CLIENT_CERTIFICATE"), _env("CLIENT_KEY")
        return cls(
            endpoint=url,
            headers={"content-type": "application/x-protobuf"}
            | {k.lower(): v for k, v in parse_env_headers(_env("HEADERS"), liberal=True).items()},
            timeout_s=_number(_env("TIMEOUT"), "OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT", 10.0),
            gzip=compression == "gzip",
            verify=_env("CERTIFICATE") or True,
            client_cert=(cert, key) if cert and key else None,
            schedule_delay_s=_bsp("SCHEDULE_DELAY", 5000) / 1000,
            max_queue_spans=int(_bsp("MAX_QUEUE_SIZE", 2048)),
            max_batch_spans=int(_bsp("MAX_EXPORT_BATCH_SIZE", 512)),
        )


class SpanExporter:
    """Queues finished requests; a thread encodes their spans and sends them over OTLP/HTTP."""

    name = "otel"

    def __init__(
        self,
        settings: OtlpSettings,
        *,
        counters: EventCounters | None = None,
        resource: Resource | None = None,
    ) -> None:
        self.settings = settings
        self._counters = counters
        res = resource or Resource.create({"service.name": "vllm-obs-sidecar"})
        # Resource values are the SDK-validated kinds the encoder writes (str, bool, int, ...).
        self._resource: dict[str, AttrValue] = cast(dict[str, AttrValue], dict(res.attributes))
        self._queue: deque[Finished] = deque()
        self._max_queued = max(1, settings.max_queue_spans // SPANS_PER_REQUEST)
        self._batch = max(1, settings.max_batch_spans // SPANS_PER_REQUEST)
        self._wake = threading.Event()
        self._done = threading.Condition()
        self._asked = 0  # flush generations asked for / completed
        self._flushed = 0
        self._stopping = False
        self._failing = False
        self._session = requests.Session()
        self._thread = threading.Thread(target=self._run, name="vllm-obs-otlp", daemon=True)
        self._thread.start()

    def export(self, finished: Finished) -> None:
        """Queue a request's spans (called on the event loop: no I/O, no lock)."""
        if not finished.ids.sampled:
            return
        q = self._queue
        if len(q) >= self._max_queued:
            self._dropped("queue_full", 1)
            return
        q.append(finished)
        if len(q) == self._batch:
            self._wake.set()

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Send everything queued now; False if that took longer than ``timeout_s``."""
        with self._done:
            self._asked += 1
            target = self._asked
            self._wake.set()
            return self._done.wait_for(lambda: self._flushed >= target, timeout_s)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        self._stopping = True
        self.force_flush(timeout_s)
        self._wake.set()
        self._thread.join(timeout_s)
        self._session.close()

    # -- the exporter thread ------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait(self.settings.schedule_delay_s)
            self._wake.clear()
            with self._done:
                asked = self._asked
            while self._queue:
                self._send_batch()
            with self._done:
                self._flushed = asked
                self._done.notify_all()
            if self._stopping:
                return

    def _send_batch(self) -> None:
        q, batch = self._queue, list[Finished]()
        while q and len(batch) < self._batch:
            batch.append(q.popleft())
        try:
            body = export_request(self._resource, [request_spans(f) for f in batch])
        except Exception as e:  # a bad record must not stop the thread
            log.error("otlp_encode_failed", error=repr(e))
            self._dropped("encode_error", len(batch))
            return
        error = self._post(body)
        if error is None:
            if self._counters is not None:
                self._counters.event_written(self.name, len(batch))
            if self._failing:
                log.info("otlp_export_recovered", endpoint=self.settings.endpoint)
            self._failing = False
            return
        self._dropped("export_error", len(batch))
        if not self._failing:
            log.warning("otlp_export_failed", endpoint=self.settings.endpoint, error=error)
        self._failing = True

    def _post(self, body: bytes) -> str | None:
        """POST with retries; None when the collector took it, else why not."""
        s = self.settings
        headers = s.headers
        if s.gzip:
            body = gzip.compress(body, compresslevel=6)
            headers = headers | {"content-encoding": "gzip"}
        deadline = time.monotonic() + s.timeout_s
        backoff = 0.5
        while True:
            left = deadline - time.monotonic()
            try:
                resp = self._session.post(
                    s.endpoint,
                    data=body,
                    headers=headers,
                    timeout=max(left, 0.1),
                    verify=s.verify,
                    cert=s.client_cert,
                )
                if resp.status_code < 300:
                    return None
                error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                if resp.status_code not in RETRYABLE:
                    return error
            except requests.RequestException as e:
                error = f"{type(e).__name__}: {e}"
            pause = backoff * random.uniform(0.8, 1.2)
            if (self._stopping and self._failing) or time.monotonic() + pause >= deadline:
                return error
            time.sleep(pause)
            backoff *= 2

    def _dropped(self, reason: str, n: int) -> None:
        if self._counters is not None:
            self._counters.event_dropped(self.name, reason, n)
