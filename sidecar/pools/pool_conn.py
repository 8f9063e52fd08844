"""One pool connection (an asyncio protocol with an httptools parser) and the response it
carries; ``obs.sidecar.pools.upstream.Upstream`` keeps them.

The de-chunked body of each socket read goes to the response's sink in one piece inside
``data_received``. A connection is never reused after any surprise: bytes after the end of a
response (in the same read or later), an interim (1xx) or unknown status (the request fails
as a 502), invalid HTTP. Each such connection is aborted.

A request written on a kept-alive connection that closes before a single byte of its answer
came is written once more, on a new connection (``Keeper.resend``): the pool closed that
connection idle (its keep-alive ran out) as the request went out, so it never read it. Go's
HTTP client does the same (``errServerClosedIdle``). On a loaded sidecar the pool's close can
wait in the loop's queue while the connection is taken and written. Any other failure is the
request's: a pool that fails after its answer began, or on a new connection, may have started
generating.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Protocol

import httptools

from obs.sidecar.outcomes import UpstreamError


class Keeper(Protocol):
    """What keeps the connections (``Upstream``), as a connection sees it."""

    def _park(self, conn: PoolConn) -> None: ...
    def _forget(self, conn: PoolConn) -> None: ...
    def resend(self, resp: Response) -> None: ...


class Sink(Protocol):
    def on_body(self, data: bytes) -> None: ...
    def on_end(self, exc: UpstreamError | None) -> None: ...


class PoolConn(asyncio.Protocol):
    """One connection to a replica; one response at a time."""

    def __init__(self, key: str, upstream: Keeper) -> None:
        self.key = key
        self.upstream = upstream
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.resp: Response | None = None
        self.idle_since = 0.0
        self.reused = False  # taken from the idle ones: the pool may close it as we write
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
        if resp.resend is not None and not resp.head.done():
            # Not a byte of the answer came on a kept-alive connection: the pool closed it
            # idle as the request went out (its keep-alive ran out): once more on a new one.
            self.upstream.resend(resp)
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
        self.resp.resend = None  # the pool answers: whatever happens now is not re-sent

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
        "on_head", "raw_headers", "read_ns", "resend", "sink", "status", "until_eof",
    )  # fmt: skip

    def __init__(self, conn: PoolConn, loop: asyncio.AbstractEventLoop) -> None:
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
        # (replica, request bytes) while a request written on a kept-alive connection has had
        # no byte of answer: sent again on a new connection if the pool closes that one.
        self.resend: tuple[str, bytes] | None = None

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

    def close(self, why: UpstreamError | None = None) -> None:
        """Abort the connection (vLLM aborts a request whose connection closes); an
        unfinished response fails with ``why`` (a deadline's verdict) or as closed."""
        if self._conn.resp is self and self._conn.transport is not None:
            self._conn.transport.abort()
        if not self.complete:
            self._fail(why or UpstreamError("the sidecar closed the pool's connection"))

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
