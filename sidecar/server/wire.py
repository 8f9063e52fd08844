"""One request on a client connection, as the relay and the app see it: ``Exchange``.

The relay's server (``obs.sidecar.server.connection``) makes one ``Exchange`` per request
when the request's head has been read (or, refused within it, of the part read, so the
refusal's event is written). It is the request's ASGI ``scope``, ``receive`` and ``send``,
kept to what the sidecar's routes use, and the writer of the response's bytes: the head
(status line, headers, ``content-length`` or
``transfer-encoding: chunked``, ``connection: close`` when the connection is not kept
alive), then the body, framed. ``receive`` hands over the body read so far (reading from the
client pauses while more than ``BODY_HIGH_WATER`` bytes wait), then ``http.disconnect`` once
the client has gone or the response is complete. ``send`` waits while the connection's write
buffer is past its high-water mark. The per-token path does not go through ``send``: the relay
writes each piece of a stream with ``ClientConn.write_body`` (obs.sidecar.server.client).

The head is written with the body's first piece when that piece comes before the event loop's
next turn (a pool that sent its head and first bytes together), else on that turn: one
write, and one wake-up of the client, instead of two; with the whole body in hand (a short
answer read at once), with its end. Nothing waits for a body still to come.

A response that ``lingers`` (a stream the relay writes: it waits, after the last byte,
until the client's side has acknowledged it) is not closed at its end, and its
connection's keep-alive clock does not start then: both happen when the app returns
(``Exchange.settle``, called by ``run_app`` whatever the app did).
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

import httptools
import structlog

from obs.sidecar.endings import BUG, Ending, outcome
from obs.sidecar.outcomes import Refusal, RelayError
from obs.sidecar.server.client import EXTENSION
from obs.sidecar.types import Message, Receive, Scope, Send

log = structlog.get_logger("vllm_obs.server")

BODY_HIGH_WATER = 64 << 10  # request body bytes waiting for the app before reading pauses
_STATUS_LINES = {s.value: b"HTTP/1.1 %d %b\r\n" % (s.value, s.phrase.encode()) for s in HTTPStatus}
_NO_BODY = (204, 304)


class Flow:
    """Write flow control of one connection: ``drain`` waits while writing is paused (on
    ``writable()``, the future a paused stream's sink resumes from); ``acked``, a look at what
    the client acknowledged, is woken when it sends or leaves."""

    __slots__ = ("_waiter", "acked", "write_paused")

    def __init__(self) -> None:
        self.write_paused = False
        self._waiter: asyncio.Future[None] | None = None
        self.acked: asyncio.Future[int] | None = None

    def pause(self) -> None:
        self.write_paused = True

    def resume(self) -> None:
        """Writing goes on (or the connection is gone: ``connection_lost`` calls this too)."""
        self.write_paused = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        self._waiter = None
        self.client_sent()

    def client_sent(self, at_ns: int = 0) -> None:
        """Bytes came from the client (read at ``at_ns``: they carry its acknowledgement), or
        it left (0)."""
        waiter, self.acked = self.acked, None
        if waiter is not None and not waiter.done():
            waiter.set_result(at_ns)

    def writable(self) -> asyncio.Future[None]:
        """Done once the transport takes writes again (the client read enough, or it left)."""
        waiter = self._waiter or asyncio.get_running_loop().create_future()
        if self.write_paused:
            self._waiter = waiter
        else:
            waiter.set_result(None)  # a new one: only a paused transport has a waiter
        return waiter

    async def drain(self) -> None:
        """Until the transport takes writes again (the client read enough, or it left)."""
        if self.write_paused:
            await asyncio.shield(self.writable())


class Clock:
    """The ``date`` header's value, formatted once a second."""

    __slots__ = ("_at", "_value")

    def __init__(self) -> None:
        self._at = 0
        self._value = b""

    def date(self) -> bytes:
        now = int(time.time())
        if now != self._at:
            self._at = now
            self._value = formatdate(now, usegmt=True).encode()
        return self._value


class Exchange:
    """One request and its response on a connection (see the module's doc)."""

    __slots__ = (
        "_event", "_head", "_head_with_end", "_reading_paused", "_resume_reading", "body",
        "body_bytes", "body_ns", "chunked", "clock", "disconnected", "expected", "flow",
        "head_only", "keep_alive", "linger", "more_body", "on_complete", "on_lost", "on_settle",
        "refusal", "response_complete", "response_started", "scope", "transport",
    )  # fmt: skip

    def __init__(
        self,
        scope: Scope,
        transport: asyncio.Transport,
        flow: Flow,
        clock: Clock,
        *,
        keep_alive: bool,
        on_complete: Callable[[Exchange], None],
        resume_reading: Callable[[], None],
        on_settle: Callable[[], None] | None = None,
    ) -> None:
        self.scope = scope
        self.transport = transport
        self.flow = flow
        self.clock = clock
        self.keep_alive = keep_alive
        self.on_complete = on_complete
        self.head_only = scope["method"] == "HEAD"
        self.body: list[bytes] = []
        self.body_bytes = 0  # bytes in ``body``, not yet handed over
        self.more_body: bool | None = True  # None: the whole body was handed over
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self.chunked = False
        self.expected = 0  # body bytes still owed under the response's content-length
        self.on_lost: Callable[[], None] | None = None  # the client left before the end
        self.on_settle = on_settle  # a kept-alive lingering response settled: the next request
        self.linger = False  # close / keep-alive clock deferred to ``settle``
        self.body_ns = 0  # perf_counter_ns of the read that completed the body; 0: not yet
        self.refusal: Refusal | None = None  # the server refused it (connection.py)
        self._event = asyncio.Event()
        self._head = b""  # the response's head, until the body's first write or the next turn
        self._head_with_end = False  # the body's end is in hand: the head waits for it
        self._reading_paused = False
        self._resume_reading = resume_reading

    # ---- the request side (called by the connection) ------------------------------------

    def feed(self, data: bytes) -> bool:
        """A piece of the body arrived; True when reading should pause until it is taken."""
        self.body.append(data)
        self.body_bytes += len(data)
        self._event.set()
        return self.body_bytes > BODY_HIGH_WATER

    def body_complete(self, at_ns: int = 0) -> None:
        self.body_ns = at_ns or time.perf_counter_ns()
        self.more_body = False
        self._event.set()

    def refused(self, refusal: Refusal) -> None:
        """The server answered ``refusal`` and closed: the app sees the client go, and
        ``refusal`` says why (the relay records it as the event's outcome)."""
        self.refusal = refusal
        self.lost()

    def lost(self) -> None:
        """The client's connection closed."""
        if not self.response_complete:
            self.disconnected = True
            if self.on_lost is not None:
                self.on_lost()
        self._event.set()

    # ---- ASGI ----------------------------------------------------------------------------

    async def receive(self) -> Message:
        gone = self._gone
        while not self.body and self.more_body is True and not gone():
            self._resume_reading()
            self._event.clear()
            await self._event.wait()
        if (self.body or self.more_body is False) and not gone():
            data = self.body[0] if len(self.body) == 1 else b"".join(self.body)
            self.body = []
            self.body_bytes = 0
            more = self.more_body
            if not more:
                self.more_body = None  # handed over: what follows is the disconnect
            self._resume_reading()
            return {"type": "http.request", "body": data, "more_body": more}
        while not gone():  # the body was handed over: until the client leaves or the end
            self._event.clear()
            await self._event.wait()
        return {"type": "http.disconnect"}

    def _gone(self) -> bool:
        return self.disconnected or self.response_complete

    async def send(self, message: Message) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"expected http.response.start, got {kind!r}")
            self.start(message["status"], message.get("headers", ()))
        elif kind == "http.response.body" and not self.response_complete:
            if message.get("more_body", False):
                self.write(message.get("body", b""))
            else:
                self.end(message.get("body", b""))
        else:
            raise RuntimeError(f"unexpected {kind!r} after the response was complete")

    # ---- the response's bytes ------------------------------------------------------------

    def start(self, status: int, headers: Any) -> None:
        """Write the response head."""
        self.response_started = True
        if self.more_body is True:  # answered before its body was read (401, 413): the
            self.keep_alive = False  # connection closes, never a second answer to it
        parts = [_STATUS_LINES.get(status) or b"HTTP/1.1 %d Unknown\r\n" % status]
        sized = False
        for name, value in headers:
            if b"\n" in value or b"\r" in value or b"\n" in name or b"\r" in name:
                raise RuntimeError("invalid HTTP header")
            name = name.lower()
            if name == b"content-length" and not sized:
                self.expected = int(value)
                sized = True
            elif name == b"connection":
                if b"close" in value.lower():
                    self.keep_alive = False
                continue
            elif name == b"transfer-encoding" or name == b"date":
                continue
            parts += (name, b": ", value, b"\r\n")
        parts += (b"date: ", self.clock.date(), b"\r\n")
        if not sized and not self.head_only and status not in _NO_BODY:
            if self.scope["http_version"] == "1.0":
                self.keep_alive = False  # the body ends where the connection does
            else:
                self.chunked = True
                parts.append(b"transfer-encoding: chunked\r\n")
        if not self.keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        self._head = b"".join(parts)
        asyncio.get_running_loop().call_soon(self._head_due)

    def head_with_end(self) -> None:
        """The whole body is in hand, its end written soon: the head goes with it, one write."""
        self._head_with_end = True

    def _head_due(self) -> None:  # the loop's next turn after the head
        if not self._head_with_end:
            self.flush_head()

    def flush_head(self) -> None:
        """Write the head now, if it still waits for the body's first piece."""
        head, self._head = self._head, b""
        if head and not self.transport.is_closing():
            self.transport.write(head)

    def write(self, data: bytes) -> None:
        """Write one piece of the body, framed as the head said."""
        if self.head_only or not data or self.disconnected:
            self.flush_head()
            return
        head, self._head = self._head, b""
        if self.chunked:
            self.transport.write(b"%b%x\r\n%b\r\n" % (head, len(data), data))
            return
        self.expected -= len(data)
        self.transport.write(head + data if head else data)

    def end(self, data: bytes = b"") -> None:
        """The body's last piece, ``data``: the connection goes on to the next request, or
        closes. A chunked body's last piece and its end go out in one write."""
        if self.response_complete:
            return
        if self.chunked and not self.head_only and not self.disconnected:
            head, self._head = self._head, b""
            if data:
                self.transport.write(b"%b%x\r\n%b\r\n0\r\n\r\n" % (head, len(data), data))
            else:
                self.transport.write(head + b"0\r\n\r\n")
        else:
            self.write(data)
        self.response_complete = True
        self._event.set()
        if not self.keep_alive and not self.linger:
            self.transport.close()
        self.on_complete(self)

    def settle(self) -> None:
        """A lingering response's end, once the app is done with it: close the connection
        when it is not kept alive, else start its keep-alive clock."""
        if not self.linger:
            return
        self.linger = False
        if not self.keep_alive:
            self.transport.close()
        elif self.on_settle is not None:
            self.on_settle()


def answer_and_close(transport: asyncio.Transport, err: RelayError) -> None:
    """The server's own answer of ``err`` (no app ran, or its answer goes nowhere): its
    status and JSON body, as the relay answers an outcome and records it; then close."""
    body = err.body()
    transport.write(
        b"%bcontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%b"
        % (_STATUS_LINES[err.status], len(body), body)
    )
    transport.close()


def http_scope(
    method: bytes,
    version: str,
    url: bytes,
    headers: list[tuple[bytes, bytes]],
    client: tuple[str, int] | None,
    server: tuple[str, int] | None,
) -> Scope:
    """A request's ASGI scope from its parsed request line and headers."""
    try:
        parsed = httptools.parse_url(url)
        raw_path, query = parsed.path or b"", parsed.query or b""
    except httptools.HttpParserInvalidURLError:  # CONNECT's host:port: refused (connection.py)
        raw_path = query = b""
    path = raw_path.decode("ascii")
    if "%" in path:
        path = urllib.parse.unquote(path)
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": version,
        "method": method.decode("ascii"),
        "scheme": "http",
        "path": path,
        "raw_path": raw_path,
        "query_string": query,
        "root_path": "",
        "headers": headers,
        "client": client,
        "server": server,
        "state": {},
    }


async def run_app(app: Callable[[Scope, Receive, Send], Awaitable[None]], ex: Exchange) -> None:
    """Run the app on one request; an app that fails before answering gets a 500."""
    try:
        await app(ex.scope, ex.receive, ex.send)
    except BaseException as exc:
        ex.linger = False
        if not isinstance(exc, asyncio.CancelledError):
            log.error("app_failed", error=type(exc).__name__, exc_info=exc)
        if not ex.response_started and not ex.disconnected:
            _internal_error(ex)
        else:
            ex.flush_head()
            ex.transport.close()
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
            raise
    else:
        if not ex.response_started and not ex.disconnected:
            log.error("app_returned_without_an_answer", path=ex.scope["path"])
            _internal_error(ex)
        elif not ex.response_complete and not ex.disconnected:
            ex.flush_head()
            ex.transport.close()
    finally:
        ex.settle()
        # Its ClientConn holds the exchange, whose scope holds it: unhooked, no cycle is left.
        if ext := ex.scope.get("extensions"):
            ext.pop(EXTENSION, None)


def _internal_error(ex: Exchange) -> None:
    """The app failed (or returned) before answering: our own 500, as an outcome."""
    ex.keep_alive = False
    err = outcome(Ending(BUG, "the app ended without an answer"))
    body = err.body()
    ex.start(err.status, [*err.headers(), (b"content-length", b"%d" % len(body))])
    ex.write(body)
    ex.end()
