"""One client connection of the relay's server: HTTP/1.1 on httptools, behind the limits.

``HttpConnection`` is an asyncio protocol on ``httptools.HttpRequestParser`` (under
uvloop). It reads requests, one ``Exchange`` each (obs.sidecar.server.wire), runs the app on
it (relayed routes to the relay, others to the sidecar's own), and keeps the connection alive
between requests; pipelined requests are answered in order. What a client sends is parsed a
piece at a time (obs.sidecar.server.intake): while a request waits behind another or its
body waits for the app, parsing and reading stop, so a connection's memory is its buffers.

The limits of ``Limits`` are enforced where the bytes arrive, before the app sees them,
with the counters of ``Guard`` (obs.sidecar.server.guard); docs/security.md lists them:
head size (414, 431), header and body timeouts (408), idle connections (closed), the
connection caps (an idle or slow connection evicted, else 503), body memory as bytes arrive
(503), protocol switches (400; a bodiless GET or HEAD is served as HTTP/1.1). An answer
before its body was read closes the connection; trailers never join the headers.

A stream the relay writes lingers after its last byte (wire.py; bytes from the client wake
its look at what was acknowledged). A request's scope's ``extensions`` hold its ``ClientConn``,
``received_ns`` (the read that began it) and ``body_ns`` (the read that completed its body).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

import httptools

from obs.sidecar.endings import outcome
from obs.sidecar.outcomes import CONNECTION, Refusal, Refused
from obs.sidecar.server import wire
from obs.sidecar.server.body_clock import BodyClock
from obs.sidecar.server.client import EXTENSION, OBS_EXTENSION, ClientConn
from obs.sidecar.server.guard import Guard, content_length, plain_get
from obs.sidecar.server.intake import BODY_PIECE, PIECE, Intake
from obs.sidecar.server.limit_timer import LimitTimer
from obs.sidecar.server.wire import BODY_HIGH_WATER, Clock, Exchange, Flow, http_scope, run_app

BAD_REQUEST = "Invalid HTTP request received."


class ServerState:
    """What every connection of one server shares: the app, the limits, the open ones."""

    def __init__(self, app: Any, guard: Guard) -> None:
        self.app = app
        self.guard = guard
        self.clock = Clock()
        self.connections: set[HttpConnection] = set()
        self.tasks: set[asyncio.Task[None]] = set()


class HttpConnection(asyncio.Protocol):
    """One client connection (see the module's doc)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.guard = state.guard
        self.limits = state.guard.limits
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.flow = Flow()
        self.sock: Any = None  # the transport's socket (uvloop's pseudo-socket), for the relay
        self.fd: int = -1
        self.sndbuf_pinned = False  # the kernel send buffer was pinned for a stream (client.py)
        self.client: tuple[str, int] | None = None
        self.server: tuple[str, int] | None = None
        self.current: Exchange | None = None  # the request being answered
        self.reading: Exchange | None = None  # the request whose body is being read
        self.pipeline: deque[Exchange] = deque()
        self._timer = LimitTimer(self.loop, self._expired)
        self._in_message = self._in_body = False
        self._head = 0  # bytes read since the current request's head began
        self._headers: list[tuple[bytes, bytes]] = []
        self._header_bytes = 0
        self._url = b""
        self._read_ns = 0  # the read that began the current request
        self._received_ns = 0
        self._expect_continue = False
        self._counted = False
        self._refusal: Refusal | None = None  # raised in a parser callback: answered
        self.addr = ""
        self._bodies: deque[int] = deque()  # body bytes held, per request not yet answered
        self.intake = Intake(self._feed_piece, self._piece_size)
        self._body_left = 0  # bytes of a sized body still to parse
        self.body = BodyClock()  # the body being read, on the loop's clock
        self.lost = self.reset_by_peer = False  # connection_lost was called (with an error)
        self._garbage = False  # bytes that are no request follow the one being answered

    # ---- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport (uvloop's)
        self.intake.transport = self.transport
        self.sock = transport.get_extra_info("socket")
        self.fd = self.sock.fileno() if self.sock is not None else -1
        self.state.connections.add(self)
        peer = transport.get_extra_info("peername")
        self.client = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else None
        local = transport.get_extra_info("sockname")
        self.server = (str(local[0]), int(local[1])) if isinstance(local, tuple) else None
        self.addr = self.client[0] if self.client else ""
        over = self.guard.budgets.connect(self.addr)
        if over == "max_connections" and self.guard.evict(self.state.connections):
            over = self.guard.budgets.connect(self.addr)
        if over is not None:
            whose = "the sidecar has" if over == "max_connections" else "this client has"
            self._refuse(_limit(503, over, f"{whose} too many open connections"))
            return
        self._counted = True
        self.guard.accepted()
        self._arm(self.limits.idle_timeout_s, "idle_timeout")

    def evictable(self) -> int:
        """2: idle (waits for a request), 1: a request's head trickles in, or its body does
        (``BodyClock.stalled``) with nothing answered yet, 0: serving."""
        if not self._counted or self.pipeline or self.transport.is_closing():
            return 0
        cur = self.current  # a lingering answer still serves its request
        if self._in_body:
            if cur is not self.reading or cur is None or cur.response_started:
                return 0
            return int(self.body.stalled(self.limits, self.loop.time()))
        if cur is not None and (not cur.response_complete or cur.linger):
            return 0
        return 1 if self._in_message else 2

    def evicted(self) -> None:
        self._counted = False
        self.guard.budgets.disconnect(self.addr)
        if self._in_body:  # its request's event says what its client got
            self._refuse(_limit(408, "body_timeout", "the request body stalled while "
                                      "the sidecar was full"))  # fmt: skip
            return
        self._disarm()
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.reset_by_peer = exc is not None
        self.state.connections.discard(self)
        self._timer.stop()
        if self._counted:
            self._counted = False
            self.guard.budgets.disconnect(self.addr)
        self.guard.budgets.free_body(self.addr, sum(self._bodies))
        self._bodies.clear()
        self.intake.clear()
        for ex in (self.current, self.reading, *self.pipeline):
            if ex is not None:
                ex.lost()
        self.flow.resume()  # a drain waiting on the client ends; the relay sees it leave

    def pause_writing(self) -> None:
        self.flow.pause()

    def resume_writing(self) -> None:
        self.flow.resume()

    def data_received(self, data: bytes) -> None:
        self._read_ns = time.perf_counter_ns()
        # A kept-alive client's next request also acknowledges the previous response, whose
        # relay waits for that (``ClientConn.drained``): the request is parsed and its handler
        # started first, so that it runs (to its pool) before the previous one's end and
        # record do; that end is dated at this read (``ClientConn.acked_ns``), not later.
        self.intake.received(data)
        self.flow.client_sent(self._read_ns)

    def _piece_size(self) -> int:
        if self._in_body and self._body_left > 0:
            return min(self._body_left, BODY_PIECE)
        return PIECE

    def _feed_piece(self, piece: bytes) -> None:
        if not self._in_message:  # the first bytes of a new request
            self._received_ns = self._read_ns
            if self._timer.limit != "header_timeout":
                self._arm(self.limits.header_timeout_s, "header_timeout")
        if not self._in_body:
            self._head += len(piece)
        try:
            self.parser.feed_data(piece)
        except httptools.HttpParserUpgrade as up:  # a plain GET: served as HTTP/1.1
            self.parser = httptools.HttpRequestParser(self)
            rest = piece[up.args[0] :] if up.args else b""
            self.intake.unread(rest)  # parsed next, by the intake's loop: no recursion
        except httptools.HttpParserError:
            if self._refusal is not None:
                self._refuse(self._refusal)
                return
            cur = self.current
            if self.reading is None and cur is not None and not self._idle(cur):
                self._garbage = True  # answered once the requests before it are (_next)
                self.intake.hold()
                return
            self._bad_request()
            return
        if (
            not self._in_body
            and self._head > self.limits.max_header_bytes
            and not self.transport.is_closing()
        ):
            self._refuse(_limit(431, "header_bytes", "request headers are too large"))

    # ---- httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_message = True
        self._headers = []
        self._header_bytes = 0
        self._url = b""
        self._expect_continue = False
        if not self._received_ns:
            self._received_ns = self._read_ns or time.perf_counter_ns()

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self.limits.max_request_line:
            raise self._refused(414, "request_line", "the request line is too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_body:  # a chunked body's trailer: read, never one of the request's headers
            return
        self._header_bytes += len(name) + len(value) + 4
        if len(self._headers) >= self.limits.max_headers:
            raise self._refused(431, "header_count", "the request has too many headers")
        if self._header_bytes + len(self._url) > self.limits.max_header_bytes:
            raise self._refused(431, "header_bytes", "request headers are too large")
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self._expect_continue = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser, headers = self.parser, self._headers
        method = parser.get_method()
        if not self._url.startswith(b"/") and not _absolute(self._url):  # CONNECT's, ``*``
            raise self._refused(400, "request_target", "the request target must be a path")
        if parser.should_upgrade() and not plain_get(method, headers):
            # httptools skips the body of a request that asks to switch protocols and parses
            # what follows as a new request: a body would be smuggled past a proxy in front.
            raise self._refused(400, "upgrade", "the sidecar does not switch protocols (Upgrade)")
        declared = content_length(headers)
        self._body_left = declared or 0
        self._bodies.append(0)  # counted as the body's bytes arrive (on_body)
        self._in_body = True
        self._head = 0
        self.body.start(self.loop.time(), self.limits)
        self._arm(min(self.limits.body_timeout_s, self.limits.body_idle_timeout_s), "body_timeout")
        version = parser.get_http_version()
        ex = self.reading = self._exchange(version != "1.0" and parser.should_keep_alive())
        if self.current is None or self.current.response_complete:
            self._start(ex, self._expect_continue)
        else:  # pipelined: answered in order, after the one before; parsing waits
            self.intake.hold()
            self.pipeline.append(ex)
            self._disarm()  # its body's time starts when it is read
        if declared and declared > self.guard.budgets.max_client_body_bytes:  # never fits
            raise self._refused(503, "body_memory", "the body exceeds the request bodies one "
                                "client may hold")  # fmt: skip

    def on_body(self, body: bytes) -> None:
        self._body_left -= len(body)
        self.body.progress(len(body), self.loop.time())  # the idle deadline moves (_expired)
        ex = self.reading
        if ex is None or ex.response_complete:
            return  # answered already (the connection closes): nothing keeps it
        if self._bodies:
            self._hold_body(len(body))
        if ex.feed(body):  # the app has not read what came: no client's slowness meanwhile
            self.intake.hold()
            self._disarm()

    def on_message_complete(self) -> None:
        self._in_body = self._in_message = False
        self._body_left = 0
        self._disarm()
        if self.reading is not None:
            self.reading.body_complete(self._read_ns)
            obs = self.reading.scope["extensions"][OBS_EXTENSION]
            obs["body_ns"] = self.reading.body_ns
            self.reading = None

    # ---- requests ------------------------------------------------------------------------

    def _exchange(self, keep_alive: bool) -> Exchange:
        """The request whose head the parser read (or, when refused, the part it read)."""
        p = self.parser
        scope = http_scope(p.get_method(), p.get_http_version(), self._url, self._headers,
                           self.client, self.server)  # fmt: skip
        ex = Exchange(scope, self.transport, self.flow, self.state.clock, keep_alive=keep_alive,
                      on_complete=self._answered, resume_reading=self._resume_reading,
                      on_settle=self._next)  # fmt: skip
        obs, self._received_ns = {"received_ns": self._received_ns}, 0
        scope["extensions"] = {EXTENSION: ClientConn(self, ex), OBS_EXTENSION: obs}
        return ex

    def _head_refused(self) -> Exchange | None:
        """A request refused within its head (431, 408, an Upgrade's 400), run refused so its
        event says what its client got; None before its request line ended (414): no request."""
        if not self._in_message or self._in_body or self.parser.get_http_version() == "0.0":
            return None
        self._start(ex := self._exchange(keep_alive=False))
        return ex

    def _start(self, ex: Exchange, expect_continue: bool = False) -> None:
        self.current = ex
        if expect_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        task = self.loop.create_task(run_app(self.state.app, ex))
        self.state.tasks.add(task)
        task.add_done_callback(self.state.tasks.discard)

    def _answered(self, ex: Exchange) -> None:
        """``ex``'s response is complete: free its body, go on to the next request."""
        if self._bodies:  # the oldest request still held is the one answered
            self.guard.budgets.free_body(self.addr, self._bodies.popleft())
        if not ex.linger:  # else when it settles (obs.sidecar.server.wire)
            self._next()

    def _next(self) -> None:
        """Go on to the next request: a pipelined one, or wait for one."""
        if self.transport.is_closing():
            return
        if self.pipeline:
            self._start(self.pipeline.popleft())
        elif self._garbage:  # what followed the requests answered was no request: 400
            if self._idle(self.current):
                self._bad_request()
            return
        self._resume_reading()
        cur = self.current  # not while answering a request that came while one lingered
        if self._idle(cur) and not self._in_message and not self.transport.is_closing():
            self._arm(self.limits.idle_timeout_s, "keep_alive")

    @staticmethod
    def _idle(cur: Exchange | None) -> bool:
        """No request is being answered (its response done, not lingering)."""
        return cur is None or (cur.response_complete and not cur.linger)

    def shutdown(self) -> None:
        """The server stops: close now when idle, else after the response under way."""
        if self.current is None or self.current.response_complete:
            self.transport.close()
            return
        self.current.keep_alive = False
        for ex in self.pipeline:
            ex.keep_alive = False

    def _resume_reading(self) -> None:  # unless a pipelined request waits for its turn
        if self.pipeline or self._garbage or self.transport.is_closing():
            return
        ex = self.reading
        if ex is not None and ex.body_bytes > BODY_HIGH_WATER:
            return
        if self._in_body and not self._timer.limit:
            self.body.resume(self.loop.time(), self.limits)  # held for the app till now
            self._arm_body()
        self.intake.release()

    # ---- limits --------------------------------------------------------------------------

    def _hold_body(self, n: int) -> None:
        """Count ``n`` more bytes of the current request's body, within the budgets; when all
        bodies fill the memory but this address has room, the slowest bodies being read are
        refused to make it (``Guard.shed_bodies``)."""
        budgets, guard = self.guard.budgets, self.guard
        if not budgets.hold_body(self.addr, n) and not (
            budgets.client_body_fits(self.addr, n)
            and guard.shed_bodies(self.state.connections, n, self, self.loop.time())
            and budgets.hold_body(self.addr, n)
        ):
            raise self._refused(503, "body_memory", "the sidecar holds too many request bodies")
        self._bodies[-1] += n

    def body_rate(self, now: float) -> float | None:
        """Bytes a second of the body being read, while it holds some and nothing answered."""
        cur = self.current
        if not self._in_body or cur is None or cur is not self.reading or cur.response_started:
            return None
        if not self._bodies or not self._bodies[-1] or self.transport.is_closing():
            return None
        return self.body.rate(now)

    def shed_body(self) -> int:
        """Refuse the body being read to free body memory for others (503)."""
        freed = sum(self._bodies)
        self.guard.budgets.free_body(self.addr, freed)
        self._bodies.clear()
        self._refuse(_limit(503, "body_memory", "the sidecar needed the memory this "
                                  "slow request body held"))  # fmt: skip
        return freed

    def _bad_request(self) -> None:
        if self.transport.is_closing():
            return
        wire.answer_and_close(self.transport, outcome(Refusal(400, BAD_REQUEST)))

    def _refused(self, status: int, limit: str, message: str) -> Refused:
        """The refusal a parser callback raises (the parser stops; ``_feed`` answers it)."""
        self._refusal = _limit(status, limit, message)
        return Refused(self._refusal)

    def _refuse(self, refusal: Refusal) -> None:
        """Answer ``refusal`` (when no response is under way) and close the connection; the
        request whose body was being read is told (``Exchange.refused``), so its event
        records the status its client received."""
        self.guard.hit(refusal.reason or "")
        self._disarm()
        transport = self.transport
        if transport.is_closing():
            return
        ex = self.current
        answer = ex is None or ex.response_complete or not ex.response_started
        reading = self.reading
        if ex is not None and ex is not reading:  # its own answer goes nowhere; it sees that
            ex.lost()
        if reading is None and answer:  # refused within its head: its request, if it has one
            reading = self._head_refused()
        if reading is not None:
            reading.refused(refusal)
        if answer:
            wire.answer_and_close(transport, outcome(refusal))  # as the relay records it
        else:
            transport.close()

    def _arm(self, delay_s: float, limit: str) -> None:
        self._timer.arm(delay_s, limit)

    def _disarm(self) -> None:
        self._timer.disarm()

    def _arm_body(self) -> bool:
        """Arm the body's next deadline: its whole one, or ``body_idle_timeout_s`` after its
        last byte, whichever comes first; False when that has passed."""
        now = self.loop.time()
        at = self.body.deadline(self.limits)
        if at - now <= 0:
            return False
        self._arm(at - now, "body_timeout")
        return True

    def _expired(self, limit: str) -> None:
        if limit == "body_timeout" and self._in_body and self._arm_body():
            return  # bytes came meanwhile: the idle deadline moved
        if limit == "keep_alive":
            self.transport.close()
        elif limit == "idle_timeout":
            self.guard.hit(limit)
            self.transport.close()
        else:
            self._refuse(
                _limit(408, limit, f"the client was too slow sending the request ({limit})")
            )


def _limit(status: int, limit: str, message: str) -> Refusal:
    """The connection's ``limit`` refusing a request (the guard counts it by that name)."""
    return Refusal(status, message, limit, CONNECTION)


def _absolute(target: bytes) -> bool:
    """An absolute-form target (``http://host/path``, as sent to a proxy)."""
    return target[:8].lower().startswith((b"http://", b"https://"))
