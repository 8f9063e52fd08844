"""Test helpers users can use too: a sidecar process and an OTLP/HTTP trace receiver.

``SidecarProcess`` runs ``vllm-obs sidecar`` as a real subprocess on a free
loopback port (an ``obs.procs.ManagedProcess``) and stops it by PID, reaping its
process group (the workers of ``--workers``). ``OtlpReceiver`` is a real OTLP/HTTP
(protobuf) endpoint in a thread that decodes every span, metric point and log record it
receives (``/v1/traces``, ``/v1/metrics``, ``/v1/logs``), so a test can assert on what the
sidecar and vLLM actually exported.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson

from obs.procs import ManagedProcess, free_port, read_tail, wait_http
from obs.sidecar.otlp import (
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


class SidecarProcess:
    """``vllm-obs sidecar`` in a subprocess on 127.0.0.1; ``stop()`` by PID."""

    def __init__(
        self,
        *,
        upstream: str | None = None,
        config: Path | None = None,
        events: Path | None = None,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.events_path = events
        cmd = [sys.executable, "-m", "obs.cli", "sidecar", "--port", str(self.port)]
        cmd += ["--upstream", upstream] if upstream else ["--config", str(config)]
        cmd += ["--events", str(events) if events else "none", *args]
        self.cmd = cmd
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path
        self._process = ManagedProcess(
            "sidecar", cmd, log_path=log_path, env=self.env, append_log=True
        )

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        """The sidecar's process once started (None before)."""
        return self._process.popen

    @property
    def pid(self) -> int:
        return self._process.pid

    def start(self, timeout_s: float = 30.0) -> SidecarProcess:
        """Launch and wait for ``/health``; RuntimeError with the log tail if it never answers."""
        self._process.start()
        try:
            wait_http(self.url + "/health", timeout_s, self.proc)
        except Exception:
            self.stop()
            raise RuntimeError(f"sidecar did not start; log: {self.log_tail()}") from None
        return self

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait, then SIGKILL; reaps its process group; returns the exit code."""
        return self._process.stop(timeout_s)

    def kill(self) -> None:
        """SIGKILL its process group and reap it."""
        self._process.kill()

    def events(self) -> list[dict[str, Any]]:
        """Every whole event line written so far."""
        if self.events_path is None or not self.events_path.exists():
            return []
        lines = self.events_path.read_bytes().splitlines()
        return [orjson.loads(line) for line in lines if line.strip()]

    def wait_events(self, n: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """Wait until at least ``n`` events are on disk (the writer flushes within ~0.2 s)."""
        deadline = time.monotonic() + timeout_s
        while True:
            evs = self.events()
            if len(evs) >= n or time.monotonic() > deadline:
                return evs
            time.sleep(0.05)

    def events_of(self, request_id: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """The events of ``request_id`` once one is on disk; empty after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = [e for e in self.events() if e.get("request_id") == request_id]
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def log_tail(self, n: int = 4000) -> str:
        """The last ``n`` characters of the sidecar's log."""
        return read_tail(self.log_path, n) or "(no log)"

    def __enter__(self) -> SidecarProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


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
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as collectors do

            def do_POST(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(n)
                with receiver._lock:
                    refused = receiver.refuse.pop(0) if receiver.refuse else None
                if refused is not None:
                    self.send_response(refused)
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
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

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
