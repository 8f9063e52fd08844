"""``--health-address``: ``/health`` on its own listener, ahead of everything on the relay port.

A liveness probe must not fail because clients flood the relay's port (its
connection caps, its accept queue, its event loop's other work). This listener is
a small threaded HTTP server of its own: it answers from a snapshot that the relay's
event loop refreshes every ``REFRESH_S``, so a probe never waits on the loop, yet a
loop that stops turning for ``STALL_S`` is seen and answered 503 (the pod is then
restarted, as it should be), and so is a relay that has refused every new connection at
its cap for ``STALL_S`` (``watch``: every slot busy serving, nothing could be evicted): a
relay that serves nobody new is not alive. Only ``GET /health`` is served; anything else is
404. Each connection has ``TIMEOUT_S`` to send its request and at most ``MAX_HANDLERS`` are
served at once (more are closed at once): silent sockets cannot hold its threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

from obs.errors import ConfigError

REFRESH_S = 0.5
STALL_S = 10.0
TIMEOUT_S = 5.0  # for a probe to send its request
MAX_HANDLERS = 128


class _Bounded(ThreadingHTTPServer):
    """A thread per connection, at most ``MAX_HANDLERS`` at once; the rest closed at once."""

    daemon_threads = True
    request_queue_size = MAX_HANDLERS  # socketserver's 5 drops a burst's SYNs (1 s retries)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.slots = threading.BoundedSemaphore(MAX_HANDLERS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class HealthListener:
    """Serves the latest ``snapshot()`` on ``GET /health`` from a thread."""

    def __init__(
        self,
        host: str,
        port: int,
        snapshot: Callable[[], dict[str, Any]],
        *,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        self.snapshot = snapshot
        self._body = orjson.dumps({"status": "starting"})
        self._at = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._full_for: Callable[[], float] = lambda: 0.0
        listener = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = timeout_s  # a silent connection is closed, its thread freed

            def do_GET(self) -> None:
                status, body = listener.answer() if self.path == "/health" else (404, b"")
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return None

        try:
            self._server = _Bounded((host, port), Handler)
        except OSError as err:
            raise ConfigError(f"--health-address {host}:{port}: {err.strerror}") from err
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="health", daemon=True
        )
        self._thread.start()

    def answer(self) -> tuple[int, bytes]:
        """200 with the last snapshot, or 503 when the event loop stopped refreshing it."""
        stalled = time.monotonic() - self._at
        if stalled > STALL_S:
            return 503, orjson.dumps({"status": "stalled", "event_loop_stalled_s": stalled})
        full = self._full_for()
        if full > STALL_S:
            return 503, orjson.dumps({"status": "relay_full", "refusing_connections_s": full})
        return 200, self._body

    def watch(self, full_for: Callable[[], float]) -> None:
        """Answer 503 while ``full_for()`` (seconds the relay refused every new connection)
        is over ``STALL_S``."""
        self._full_for = full_for

    def start(self) -> None:
        """Refresh the snapshot on the running loop (from the app's lifespan)."""
        self._task = asyncio.get_running_loop().create_task(self._refresh())

    async def _refresh(self) -> None:
        while True:
            self._body = orjson.dumps(self.snapshot())
            self._at = time.monotonic()
            await asyncio.sleep(REFRESH_S)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._server.shutdown()
        self._server.server_close()
