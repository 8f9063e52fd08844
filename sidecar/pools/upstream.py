"""The relay's HTTP/1.1 client to the pools: keep-alive connections, bodies in callbacks.

Why not aiohttp here (it still serves pool polling and ``/v1/models``): on the
token path aiohttp hands each read to a ``StreamReader`` and wakes the relay's
task to take it, one task switch and a few Python frames per token. Here a
pool connection is a plain asyncio protocol with an httptools parser; the
de-chunked body of each socket read goes to the response's ``sink`` in one
piece inside the socket's ``data_received``, so the relay can time, classify
and forward a token without a task switch, and writes once per read however
many HTTP chunks the read carried. Whole bodies (non-streamed answers, errors) are
buffered and awaited once.

Connections are kept per replica and reused while idle for less than
``IDLE_S`` (below uvicorn's, and so vLLM's, 5 s keep-alive: a connection is
never reused just as the server closes it). A request is never retried: a
pool that fails after the request was written may have started generating.

A connection is never reused after any surprise: bytes after the end of a
response (in the same read or later), an interim (1xx) or unknown status (the
request fails as a 502), invalid HTTP. Each such connection is aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

import httptools

from obs.sidecar.outcomes import ConnectFailed, UpstreamError

IDLE_S = 3.0  # reuse a connection idle for less than this
MAX_IDLE_PER_REPLICA = 512


class Sink(Protocol):
    def on_body(self, data: bytes) -> None: ...
    def on_end(self, exc: UpstreamError | None) -> None: ...


class _Conn(asyncio.Protocol):
    """One connection to a replica; one response at a time."""

    def __init__(self, key: str, upstream: Upstream) -> None:
        self.key = key
        self.upstream = upstream
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.resp: Response | None = None
        self.idle_since = 0.0
        self.lost = False
        self.paused = False  # reading paused for a slow client
        self.parts: list[bytes] = []  # body pieces of the read being parsed, for the sink

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self.resp is None:  # bytes on an idle connection: not a state to reuse
            if self.transport is not None:
                self.transport.abort()
            return
        self.resp.read_ns = time.perf_counter_ns()  # one arrival time for the whole read
        try:
            self.parser.feed_data(data)
            self._deliver()
        except httptools.HttpParserCallbackError as err:
            cause = err.__context__
            self._fail(cause if isinstance(cause, UpstreamError) else UpstreamError(str(err)))
        except httptools.HttpParserError as err:
            self._fail(UpstreamError(f"the pool sent invalid HTTP ({err})"))
        except Exception as err:  # a sink's failure must not kill the loop's callback
            self._fail(UpstreamError(f"relaying failed: {err!r}"))

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.upstream._forget(self)
        resp = self.resp
        if resp is None or resp.complete:
            return
        if resp.status and resp.until_eof:  # a body delimited by the connection's end
            resp._complete()
            return
        doing = "streaming" if resp.status else "waiting for the response"
        how = f"{exc.__class__.__name__}: {exc}" if exc else "closed by the pool"
        resp._fail(UpstreamError(f"the pool's connection failed while {doing} ({how})"))

    def _deliver(self) -> None:
        """Hand the sink the body bytes of this read's HTTP chunks as one piece: one write to
        the client per pool read, however many chunks it carried (a read under load carries
        several)."""
        parts = self.parts
        if parts:
            data = parts[0] if len(parts) == 1 else b"".join(parts)
            parts.clear()
            assert self.resp is not None and self.resp.sink is not None
            self.resp.sink.on_body(data)

    def _fail(self, err: UpstreamError) -> None:
        self.lost = True  # never parked again, even before connection_lost runs
        # What came before the failure is relayed, then the failure. A sink that fails on it
        # too is not told twice (_deliver empties the parts before handing them over).
        with contextlib.suppress(Exception):
            self._deliver()
        if self.resp is not None and not self.resp.complete:
            self.resp._fail(err)
        if self.transport is not None:
            self.transport.abort()

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self.resp is None or self.resp.complete or self.resp.status:
            raise UpstreamError("the pool sent bytes after the end of its response")

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.resp is not None
        self.resp.raw_headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        resp = self.resp
        assert resp is not None
        resp.status = self.parser.get_status_code()
        if not 200 <= resp.status <= 599:  # an interim 1xx (we never ask for one) or nonsense
            raise UpstreamError(f"the pool answered with status {resp.status}")
        resp.keep_alive = self.parser.should_keep_alive()
        names = dict(resp.raw_headers)
        te = names.get(b"transfer-encoding", b"").lower()
        resp.until_eof = b"content-length" not in names and b"chunked" not in te
        resp.content_type = names.get(b"content-type", b"").decode("latin-1")
        on_head, resp.on_head = resp.on_head, None  # once; it holds the request
        if on_head is not None:  # before the body of this read is parsed
            on_head(resp)
        if not resp.head.done():
            resp.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        resp = self.resp
        assert resp is not None
        if resp.sink is not None:
            self.parts.append(body)  # to the sink at the end of the read (_deliver)
        else:
            resp.chunks.append(body)

    def on_message_complete(self) -> None:
        assert self.resp is not None
        self.resp.ending = True  # what _deliver hands over now is the body's last piece
        self._deliver()
        self.resp._complete()


class Response:
    """One pool response: head awaited by ``request``, then the body whole or to a sink."""

    __slots__ = (
        "_conn", "_done", "chunks", "complete", "content_type", "ending", "head", "keep_alive",
        "on_head", "raw_headers", "read_ns", "sink", "status", "until_eof",
    )  # fmt: skip

    def __init__(self, conn: _Conn, loop: asyncio.AbstractEventLoop) -> None:
        self._conn = conn
        self.head: asyncio.Future[None] = loop.create_future()
        self._done: asyncio.Future[None] = loop.create_future()
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []  # names in lower case, as they came
        self.content_type = ""
        self.keep_alive = False
        self.until_eof = False
        self.complete = False
        self.ending = False  # the body's last piece is being handed to the sink
        self.chunks: list[bytes] = []
        self.sink: Sink | None = None
        # Called in the socket's callback once the head is parsed, before the body that came
        # with it: the relay starts a stream to its client there (``attach``).
        self.on_head: Callable[[Response], None] | None = None
        # perf_counter_ns of the socket read being parsed: the pieces of one read share it, so a
        # sink can tell chunks that arrived together (a burst) from chunks that arrived apart.
        self.read_ns = 0

    async def wait_head(self) -> None:
        """Until the response's head is in (raises UpstreamError if the connection fails
        first); cancelled, the response is closed: never reused."""
        try:
            await self.head
        except BaseException:
            self.close()
            raise

    async def read(self) -> bytes:
        """The whole body (raises UpstreamError if the connection fails first)."""
        await asyncio.shield(self._done)
        return b"".join(self.chunks)

    def attach(self, sink: Sink) -> None:
        """Hand the body to ``sink`` from now on, in the socket's callback (``stream`` awaits
        its end); what came before goes to it at once, and so does the end if it came."""
        self.sink = sink
        if self.chunks:
            buffered, self.chunks = b"".join(self.chunks), []
            sink.on_body(buffered)
        if self._done.done():
            exc = self._done.exception()
            sink.on_end(exc if isinstance(exc, UpstreamError) else None)

    async def stream(self, sink: Sink) -> None:
        """Hand the body to ``sink`` (``attach``, unless it was) as it arrives; returns when it
        is complete or failed. ``sink.on_end`` is called once (in the socket's callback)
        before this returns."""
        if self.sink is not sink:
            self.attach(sink)
        if self._done.done():
            return
        with contextlib.suppress(UpstreamError):  # the sink has it
            await asyncio.shield(self._done)

    def pause_reading(self) -> None:
        conn = self._conn
        if conn.resp is self and not conn.paused and conn.transport is not None:
            conn.paused = True
            conn.transport.pause_reading()

    def resume_reading(self) -> None:
        conn = self._conn
        if conn.resp is self and conn.paused and conn.transport is not None:
            conn.paused = False
            if not conn.transport.is_closing():
                conn.transport.resume_reading()

    def close(self) -> None:
        """Abort the connection (vLLM aborts a request whose connection closes)."""
        if self._conn.resp is self and self._conn.transport is not None:
            self._conn.transport.abort()
        if not self.complete:
            self._fail(UpstreamError("the sidecar closed the pool's connection"))

    def release(self) -> None:
        """Done with this response: the connection goes back to the pool, or is closed."""
        conn = self._conn
        if conn.resp is not self:
            return  # released already
        if self.complete and self.keep_alive and not conn.lost:
            self.resume_reading()  # the body's last read may have come with a pause
            conn.resp = None
            conn.upstream._park(conn)
        else:
            self.close()
            conn.resp = None  # a closed connection lets go of it too
        # The sink holds the request and its deadline, which hold this response, and a failure
        # raised from this response's futures holds the frames that awaited them: let go, they
        # are freed by their last reference instead of by the cycle collector.
        self.sink = None
        for done in (self.head, self._done):
            if done.done() and not done.cancelled() and (exc := done.exception()) is not None:
                exc.__traceback__ = None

    def _complete(self) -> None:
        self.complete = True
        if not self.head.done():
            self.head.set_result(None)
        if not self._done.done():
            self._done.set_result(None)
            if self.sink is not None:
                self.sink.on_end(None)

    def _fail(self, err: UpstreamError) -> None:
        if not self.head.done():
            self.head.set_exception(err)
            self.head.exception()  # retrieved: nobody may await it (a failure while idle)
        if not self._done.done():
            self._done.set_exception(err)
            self._done.exception()
            if self.sink is not None:
                self.sink.on_end(err)


class Upstream:
    """Keep-alive HTTP/1.1 connections to the pools' replicas, used by the relay."""

    def __init__(self, idle_s: float = IDLE_S) -> None:
        self.idle_s = idle_s
        self.connections_opened = 0
        self._idle: dict[str, list[_Conn]] = {}
        self._targets: dict[str, tuple[str, int, bool, str, bytes]] = {}
        self._all: set[_Conn] = set()
        self._tls: ssl.SSLContext | None = None

    def _target(self, base_url: str) -> tuple[str, int, bool, str, bytes]:
        target = self._targets.get(base_url)
        if target is None:
            parts = urlsplit(base_url)
            tls = parts.scheme == "https"
            host = parts.hostname or "127.0.0.1"
            port = parts.port or (443 if tls else 80)
            host_header = parts.netloc.rsplit("@", 1)[-1].encode("idna")
            target = self._targets[base_url] = (
                host, port, tls, parts.path.rstrip("/"), host_header
            )  # fmt: skip
        return target

    async def connect(self, base_url: str, connect_s: float | None) -> _Conn:
        """A new connection to ``base_url``; ``ConnectFailed`` when none is made within
        ``connect_s`` (None: no limit)."""
        host, port, tls, _, _ = self._target(base_url)
        loop = asyncio.get_running_loop()
        if tls and self._tls is None:
            self._tls = ssl.create_default_context()
        try:
            async with asyncio.timeout(connect_s):
                _, conn = await loop.create_connection(
                    lambda: _Conn(base_url, self),
                    host,
                    port,
                    ssl=self._tls if tls else None,
                    server_hostname=host if tls else None,
                )
        except TimeoutError as err:
            raise ConnectFailed(f"connection not accepted within {connect_s:g} s") from err
        except OSError as err:
            raise ConnectFailed(f"cannot connect: {err.strerror or err}") from err
        self._all.add(conn)
        self.connections_opened += 1
        return conn

    def open_connections(self) -> int:
        """Connections open now, busy or idle."""
        return len(self._all)

    def idle(self, base_url: str) -> _Conn | None:
        """A kept-alive connection to ``base_url`` still fresh, taken from the idle ones."""
        idle = self._idle.get(base_url)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.lost and now - conn.idle_since < self.idle_s:
                return conn
            if conn.transport is not None:
                conn.transport.close()
        return None

    async def post(
        self,
        base_url: str,
        path: str,
        body: bytes,
        headers: dict[str, str],
        connect_s: float | None = None,
    ) -> Response:
        """Send one POST and return once the response's head is in."""
        conn = self.idle(base_url) or await self.connect(base_url, connect_s)
        resp = self.send(conn, base_url, path, body, headers)
        await resp.wait_head()
        return resp

    def send(
        self, conn: _Conn, base_url: str, path: str, body: bytes, headers: dict[str, str],
        method: str = "POST",
    ) -> Response:  # fmt: skip
        """Write one request (a POST, or a ``method`` one) on ``conn`` (from ``idle`` or
        ``connect``); its head is awaited with ``Response.wait_head``."""
        _, _, _, prefix, host = self._target(base_url)
        resp = conn.resp = Response(conn, asyncio.get_running_loop())
        verb = b"POST " if method == "POST" else method.encode("ascii") + b" "
        head = [verb, (prefix + path).encode("latin-1"), b" HTTP/1.1\r\nhost: ", host]
        for k, v in headers.items():
            head += (b"\r\n", k.encode("latin-1"), b": ", v.encode("latin-1"))
        head += (b"\r\ncontent-length: %d\r\n\r\n" % len(body), body)
        assert conn.transport is not None
        conn.transport.write(b"".join(head))
        return resp

    def _park(self, conn: _Conn) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= MAX_IDLE_PER_REPLICA or conn.transport is None:
            if conn.transport is not None:
                conn.transport.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def _forget(self, conn: _Conn) -> None:
        self._all.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def close(self) -> None:
        for conn in list(self._all):
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()
