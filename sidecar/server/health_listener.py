"""``--health-address``: ``/health`` on its own listener, ahead of everything on the relay port.

A liveness probe must not fail because clients flood the relay's port (its
connection caps, its accept queue, its event loop's other work). This listener is
a small threaded HTTP server of its own: it answers from a snapshot that the relay's
event loop refreshes every ``REFRESH_S``, so a probe never waits on the loop, yet a
loop that stops turning for ``STALL_S`` is seen and answered 503 (the pod is then
restarted, as it should be). Overload is readiness, not liveness: ``GET /ready`` also
answers 503 ``relay_full`` while the relay has refused every new connection at its cap for
``STALL_S`` (``watch``: every slot busy serving, nothing could be evicted), so the pod is
taken out of the Service, never restarted for what its clients do (a restart would drop
every request in flight and the flood would resume). ``GET /health`` is liveness. Anything
else is 404.

Silent sockets cannot hold its threads: each connection has ``TIMEOUT_S`` to send its
request; one address holds at most ``MAX_PER_ADDRESS`` connections and all together at most
``MAX_HANDLERS``; past either, the oldest connection that has not sent a request (from that
address, else from the address holding the most) is shut for the newcomer, so a probe is
never refused while a socket waits silently (``Slots``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
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
MAX_PER_ADDRESS = 16


class Slots:
    """The listener's connections: who holds one, since when, and whether it is silent (no
    whole request head since it opened or since its last answer). ``take`` admits a
    newcomer, naming the silent connection to shut for it; thread-safe."""

    def __init__(self, total: int = MAX_HANDLERS, per_address: int = MAX_PER_ADDRESS) -> None:
        self.total, self.per_address = total, per_address
        self._lock = threading.Lock()
        self._held: dict[object, tuple[str, int]] = {}  # connection: (address, order)
        self._busy: set[object] = set()
        self._order = 0

    def __len__(self) -> int:
        return len(self._held)

    def take(self, conn: object, addr: str) -> tuple[bool, object | None]:
        """Admit ``conn`` from ``addr``: (admitted, the connection to shut for it, if any)."""
        with self._lock:
            mine = [c for c, (a, _) in self._held.items() if a == addr]
            victim: object | None = None
            if len(mine) >= self.per_address:
                victim = self._oldest_silent(mine)
            elif len(self._held) >= self.total:
                counts: dict[str, int] = {}
                for a, _ in self._held.values():
                    counts[a] = counts.get(a, 0) + 1
                for a in sorted(counts, key=counts.__getitem__, reverse=True):
                    victim = self._oldest_silent([c for c, (b, _) in self._held.items() if b == a])
                    if victim is not None:
                        break
            else:
                self._add(conn, addr)
                return True, None
            if victim is None:
                return False, None
            self._held.pop(victim)
            self._add(conn, addr)
            return True, victim

    def _add(self, conn: object, addr: str) -> None:
        self._order += 1
        self._held[conn] = (addr, self._order)

    def _oldest_silent(self, conns: list[object]) -> object | None:
        silent = [c for c in conns if c not in self._busy]
        return min(silent, key=lambda c: self._held[c][1]) if silent else None

    def busy(self, conn: object, busy: bool) -> None:
        """``conn`` is reading a request now (True) or waits for one (False)."""
        with self._lock:
            if busy:
                self._busy.add(conn)
            else:
                self._busy.discard(conn)

    def drop(self, conn: object) -> None:
        with self._lock:
            self._held.pop(conn, None)
            self._busy.discard(conn)


class BoundedServer(ThreadingHTTPServer):
    """A thread per connection, within ``Slots``: a silent one is shut for a newcomer."""

    daemon_threads = True
    request_queue_size = MAX_HANDLERS  # socketserver's 5 drops a burst's SYNs (1 s retries)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slots = Slots()

    def process_request(self, request: Any, client_address: Any) -> None:
        addr = str(client_address[0]) if isinstance(client_address, tuple) else ""
        admitted, victim = self.slots.take(request, addr)
        if victim is not None:  # its thread's read ends at once, and the thread with it
            with contextlib.suppress(OSError):
                victim.shutdown(socket.SHUT_RDWR)  # type: ignore[attr-defined]
        if not admitted:
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.drop(request)


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
                server.slots.busy(self.request, True)  # its head came: answered, not shut
                path = self.path
                known = path in ("/health", "/ready")
                status, body = listener.answer(ready=path == "/ready") if known else (404, b"")
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                server.slots.busy(self.request, False)  # waits for its next request, silent

            def log_message(self, *args: object) -> None:
                return None

        try:
            server = self._server = BoundedServer((host, port), Handler)
        except OSError as err:
            raise ConfigError(f"--health-address {host}:{port}: {err.strerror}") from err
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="health", daemon=True
        )
        self._thread.start()

    def answer(self, ready: bool = False) -> tuple[int, bytes]:
        """200 with the last snapshot, or 503 when the event loop stopped refreshing it; for
        readiness (``ready``) also while the relay refuses every newcomer (``watch``)."""
        stalled = time.monotonic() - self._at
        if stalled > STALL_S:
            return 503, orjson.dumps({"status": "stalled", "event_loop_stalled_s": stalled})
        full = self._full_for() if ready else 0.0
        if full > STALL_S:
            return 503, orjson.dumps({"status": "relay_full", "refusing_connections_s": full})
        return 200, self._body

    def watch(self, full_for: Callable[[], float]) -> None:
        """Answer ``/ready`` 503 while ``full_for()`` (seconds the relay refused every new
        connection) is over ``STALL_S``."""
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
