"""Test helpers users can use too: an OTLP/HTTP receiver, spans as vLLM exports them, and
the sidecar as a process (``SidecarProcess``, from :mod:`obs.sidecar.process`).

``OtlpReceiver`` is a real OTLP/HTTP
(protobuf) endpoint in a thread that decodes every span, metric point and log record it
receives (``/v1/traces``, ``/v1/metrics``, ``/v1/logs``), so a test can assert on what the
sidecar and vLLM actually exported.
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from obs.procs import free_port
from obs.sidecar.process import SidecarProcess
from obs.sidecar.record.otlp import (
    ReceivedLog,
    ReceivedPoint,
    ReceivedSpan,
    decode_logs,
    decode_metrics,
    decode_traces,
)

__all__ = [
    "OtlpReceiver",
    "ReceivedLog",
    "ReceivedPoint",
    "ReceivedSpan",
    "SidecarProcess",
    "llm_request_export",
    "llm_request_under",
]


def llm_request_export(trace_id: bytes, **attrs: float | str) -> bytes:
    """An OTLP/HTTP protobuf export holding one ``llm_request`` span of ``trace_id``.

    What vLLM sends to ``/v1/traces``, with the attributes given (numbers as doubles).
    """
    return llm_request_under(trace_id, b"", **attrs)


def llm_request_under(trace_id: bytes, parent: bytes, **attrs: float | str) -> bytes:
    """``llm_request_export`` with the span's parent span id ``parent`` (vLLM's is the span
    id of the ``traceparent`` it was sent)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    req = ExportTraceServiceRequest()
    span = req.resource_spans.add().scope_spans.add().spans.add()
    span.name, span.trace_id, span.span_id = "llm_request", trace_id, b"\x01" * 8
    span.parent_span_id = parent
    for k, v in attrs.items():
        kv = span.attributes.add()
        kv.key = k
        if isinstance(v, str):
            kv.value.string_value = v
        else:
            kv.value.double_value = v
    return req.SerializeToString()


class OtlpReceiver:
    """A real OTLP/HTTP endpoint on 127.0.0.1 (traces, metrics, logs) that keeps what it
    receives; ``url`` is its traces URL, ``base`` what ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.base}/v1/traces"
        self.metrics_url = f"{self.base}/v1/metrics"
        self.logs_url = f"{self.base}/v1/logs"
        self.spans: list[ReceivedSpan] = []
        self.points: list[ReceivedPoint] = []  # every histogram point of every metrics export
        self.logs: list[ReceivedLog] = []
        self.raw: list[bytes] = []
        self.headers: list[dict[str, str]] = []  # each accepted POST's headers, lower-cased
        self.refuse: list[int] = []  # statuses to answer the next POSTs with (a fault, for tests)
        self.set_cookie: str | None = None  # a Set-Cookie every accepted POST answers with
        self.location: str | None = None  # the Location a refusal answers with (a redirect)
        self.close_each = False  # True: close each connection after answering (``_answered``)
        self.closed = 0
        # Set to an unset Event, every POST waits for it before it is read (a slow collector).
        self.hold: threading.Event | None = None
        self.held = 0  # POSTs that have waited on ``hold``
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as collectors do

            def do_POST(self) -> None:
                if (hold := receiver.hold) is not None:
                    with receiver._lock:
                        receiver.held += 1
                    hold.wait(30)
                n = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(n)
                with receiver._lock:
                    refused = receiver.refuse.pop(0) if receiver.refuse else None
                if refused is not None:
                    self.send_response(refused)
                    if receiver.location is not None:
                        self.send_header("location", receiver.location)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                path = self.path.split("?")[0]
                points: list[ReceivedPoint] = []
                logs: list[ReceivedLog] = []
                spans: list[ReceivedSpan] = []
                try:
                    if path == "/v1/metrics":
                        points = decode_metrics(body)
                    elif path == "/v1/logs":
                        logs = decode_logs(body)
                    else:
                        spans = decode_traces(body)
                except Exception:
                    self.send_response(400)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                with receiver._lock:
                    if path not in ("/v1/metrics", "/v1/logs"):
                        receiver.raw.append(body)  # raw trace exports only
                    receiver.spans.extend(spans)
                    receiver.points.extend(points)
                    receiver.logs.extend(logs)
                    receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                if receiver.set_cookie is not None:
                    self.send_header("set-cookie", receiver.set_cookie)
                self.send_header("content-length", "0")
                self.end_headers()
                receiver._answered(self)

            def log_message(self, *args: object) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _answered(self, handler: BaseHTTPRequestHandler) -> None:
        """With ``close_each``, close the connection of the POST just answered without a
        ``Connection: close`` (as a collector's idle timeout does) and count it in ``closed``."""
        if self.close_each:
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self.closed += 1

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def points_of(self, metric: str, **attrs: object) -> list[ReceivedPoint]:
        """Points of ``metric`` received so far whose attributes include ``attrs``."""
        with self._lock:
            return [
                p
                for p in self.points
                if p.metric == metric and all(p.attributes.get(k) == v for k, v in attrs.items())
            ]

    def logs_of(self, **attrs: object) -> list[ReceivedLog]:
        """Log records received so far whose attributes include ``attrs``."""
        with self._lock:
            return [r for r in self.logs if all(r.attributes.get(k) == v for k, v in attrs.items())]

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(
        self, trace_id: str, names: Sequence[str], timeout_s: float = 15.0
    ) -> list[ReceivedSpan]:
        """Spans of ``trace_id`` once every name in ``names`` has arrived (or the timeout)."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.trace(trace_id)
            have = {s.name for s in spans}
            if all(n in have for n in names) or time.monotonic() > deadline:
                return spans
            time.sleep(0.1)
