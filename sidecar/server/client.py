"""The client connection's write buffer, used as each stream's bounded buffer.

Slow-client isolation without a copy or a task per stream: the relay writes
every chunk as soon as the pool sends it; what the client has not taken yet
waits in the connection's write buffer (kernel send buffer, then the event
loop's). The kernel part is pinned (``KERNEL_SNDBUF``; Linux doubles it) rather
than left to autotune to megabytes, and what it still holds is read with the
``SIOCOUTQ`` ioctl, so the bound and the lag are both seen here. Per stream,
the lane's ``slow_client`` policy applies:

- ``wait``: the buffer's high-water mark is the bound; past it, the server's
  ``send`` waits, so the relay stops reading and the pool's socket backs up.
- ``abort``: no waiting; when the unread bytes (both buffers) pass the bound,
  the relay ends the stream with an error and closes the pool connection.

At the end of a stream :meth:`ClientConn.drained` waits until the client's
side has acknowledged every byte (the kernel's unacknowledged send queue,
``SIOCOUTQ``, is empty; it looks again when the client sends, whose bytes carry its
acknowledgement, or after a pause of at most ``DRAIN_POLL_MAX_S``), so the event's
stream phase is the time the client's slowness cost, whatever the connection kind: a
stream the relay writes
``lingers`` (``Exchange.linger``), so a ``Connection: close`` or HTTP/1.0
response is closed only after that wait, and a kept-alive connection's idle
clock starts only then. The wait is bounded by the lane's
``slow_client.record_wait_s``; what the client's side had not acknowledged by
then is returned (the event's ``client_unread_bytes``). A lingering connection
holds no more than it did while streaming (its pinned kernel buffer; the
write buffer is empty before the kernel's queue is watched) and stays counted
in the connection limits.

The relay's server (obs.sidecar.server.connection) puts each request's ``ClientConn``
under ``scope["extensions"]``, with when its first bytes were read; the relay refuses a
request that comes without it (under another ASGI server).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import struct
import termios
import time
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from obs.sidecar.outcomes import Refusal
    from obs.sidecar.server.connection import HttpConnection
    from obs.sidecar.server.wire import Exchange

EXTENSION = "vllm_obs.client_conn"
# scope["extensions"]["vllm_obs"]: {"received_ns": perf_counter_ns of the read that began the
# request, "body_ns": of the read that completed its body (once it has)}, set by the relay's
# server (obs.sidecar.server.connection)
OBS_EXTENSION = "vllm_obs"
KERNEL_SNDBUF = 64 << 10
DEFAULT_HIGH_WATER = 64 << 10  # asyncio's and uvloop's default, restored after each stream
NEVER_WAIT = (1 << 31) - 1  # abort policy: the relay checks the bound itself
# How often, at most, the end of a stream looks whether the client's side has acknowledged
# every byte: the stream phase ends at most this late (a client's delayed ACK is ~40 ms).
DRAIN_POLL_MAX_S = 0.01
# A receiver may hold its ACK this long (Linux's TCP_DELACK_MAX): bytes still unacknowledged
# when a client resets within it may have been read; later, the client was behind.
DELAYED_ACK_MAX_S = 0.2


class ClientConn:
    """The transport of one client connection, seen by the relay."""

    __slots__ = ("_conn", "_ex", "_fd", "_flow", "_sock", "_transport", "acked_ns")

    def __init__(self, conn: HttpConnection, ex: Exchange) -> None:
        self._conn = conn
        # perf_counter_ns when ``drained`` found every byte acknowledged (or the client gone):
        # the read of the client's bytes that woke it (they carry the ACK), else its look.
        self.acked_ns = 0
        self._ex = ex  # the request this connection answers
        self._transport: asyncio.Transport = conn.transport
        self._flow = conn.flow
        self._sock = conn.sock
        self._fd = conn.fd

    def writable(self) -> asyncio.Future[None]:
        """Done once the client has taken enough for writing to go on (or has left)."""
        return self._flow.writable()

    def on_disconnect(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` (once, in the connection's callback) if the client leaves before
        the response ends; at once if it has left already."""
        self._ex.on_lost = callback
        if callback is not None and self._ex.disconnected:
            callback()

    @property
    def refusal(self) -> Refusal | None:
        """What the server refused this request with (408, 503, ...), if it did."""
        return self._ex.refusal

    def next_path(self) -> str | None:
        """The path of the client's next request on this connection once its handler has
        started (this response is complete, lingering at most), else None."""
        cur = self._conn.current
        return None if cur is None or cur is self._ex else cur.scope["path"]

    @property
    def paused(self) -> bool:
        """The write buffer is past its high-water mark (the client is behind)."""
        return bool(self._flow.write_paused)

    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> bool:
        """Start the response now, without an ASGI message (a stream the relay starts in the
        pool socket's callback); False, and nothing written, if the client has left or the
        response has started."""
        ex = self._ex
        if ex.disconnected or ex.response_started or self._transport.is_closing():
            return False
        ex.start(status, headers)
        return True

    def write_body(self, data: bytes) -> None:
        """Write one piece of a started response's body, framed as its head said.

        The relay's per-token path: no ASGI message, no coroutine. The response is
        started and ended through the request's ``send`` as usual.
        """
        self._ex.write(data)

    def body_in_hand(self) -> None:
        """The response's last piece is held for its end, written within the loop's next turn:
        its head waits to go with it (``Exchange.head_with_end``)."""
        self._ex.head_with_end()

    @property
    def left(self) -> bool:
        """The client's connection is gone (it closed or reset it)."""
        return self._conn.lost

    def bound(self, limit: int, *, wait: bool) -> None:
        """Start a stream: buffer up to ``limit`` bytes, waiting (or not) past it. The
        response lingers: its connection is closed (or its keep-alive clock started) when the
        request's handler returns, after :meth:`drained`."""
        if self._transport.is_closing():
            return  # the client reset the connection as its stream starts: the relay sees it
        self._ex.linger = True
        if self._sock is not None and not self._conn.sndbuf_pinned:  # once per connection
            with contextlib.suppress(OSError, ValueError):  # uvloop: ValueError once closed
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, KERNEL_SNDBUF)
                self._conn.sndbuf_pinned = True
        high = limit if wait else NEVER_WAIT
        self._transport.set_write_buffer_limits(high=high, low=high // 4)

    def abort(self) -> None:
        """Close the connection now, whatever is still buffered (a client that never reads)."""
        self._transport.abort()

    def unsent(self) -> int:
        """Bytes in the kernel's send queue that the client's side has not acknowledged."""
        if self._fd < 0:
            return 0
        try:
            raw = fcntl.ioctl(self._fd, termios.TIOCOUTQ, b"\0\0\0\0")
        except OSError:
            return 0
        return int(struct.unpack("i", raw)[0])

    def buffered(self) -> int:
        """Bytes the relay wrote that the client's side has not received yet."""
        return self._transport.get_write_buffer_size() + self.unsent()

    async def drained(self, timeout_s: float) -> int:
        """Wait until the client's side has acknowledged every byte written, at most
        ``timeout_s``; the bytes it had not acknowledged then (0: it had them all).

        A client that resets the connection during the wait returns what it had not
        acknowledged at the last look (``DRAIN_POLL_MAX_S`` old at most), provided that look
        came ``DELAYED_ACK_MAX_S`` after the wait began (before, the last bytes may be read
        but not yet acknowledged: a receiver delays its ACK); a client that closes cleanly
        had read all it received. The kernel's queue is read only while the connection is
        open: once closed, its descriptor may name another socket.
        """
        t = self._transport
        loop = asyncio.get_running_loop()
        began = loop.time()
        deadline = began + timeout_s
        left, looks, behind, woke = 0, 0, False, 0
        self.acked_ns = 0
        try:
            if not t.is_closing() and t.get_write_buffer_size():
                left, looks = self.buffered(), 1  # the client is behind: the relay holds bytes
                t.set_write_buffer_limits(high=0, low=0)  # pauses the protocol until empty
                await asyncio.wait_for(self._flow.drain(), timeout_s)
            pause = 0.002
            while True:
                if self._conn.lost:
                    self.acked_ns = woke or time.perf_counter_ns()
                    return left if behind and self._conn.reset_by_peer else 0
                # A closing transport (closed at shutdown) still flushes its buffer: wait for
                # that too, or the process could exit with the stream's end unsent.
                left = t.get_write_buffer_size()
                if not t.is_closing():
                    left += self.unsent()
                looks += 1
                if not left:
                    self.acked_ns = woke or time.perf_counter_ns()
                    return 0
                behind = looks > 1 and loop.time() - began >= DELAYED_ACK_MAX_S
                if loop.time() >= deadline:
                    return left
                woke = await self._client_sends(loop, pause)
                pause = min(pause * 2, DRAIN_POLL_MAX_S)
        except TimeoutError:
            return self.buffered() if not t.is_closing() else t.get_write_buffer_size()
        finally:
            self.reset()

    async def _client_sends(self, loop: asyncio.AbstractEventLoop, pause: float) -> int:
        """Until the client sends (its next request carries the ACK of this response, so the
        look after it finds the queue empty) or leaves, at most ``pause`` seconds: when the
        client's bytes were read (perf_counter_ns; 0: it did not send)."""
        flow = self._flow
        waiter = flow.acked = loop.create_future()
        timer = loop.call_later(pause, _wake, waiter)
        try:
            return await waiter
        finally:
            timer.cancel()
            if flow.acked is waiter:
                flow.acked = None

    def reset(self) -> None:
        if not self._transport.is_closing():
            self._transport.set_write_buffer_limits(high=DEFAULT_HIGH_WATER)


def _wake(waiter: asyncio.Future[int]) -> None:
    if not waiter.done():
        waiter.set_result(0)


def client_conn(scope: MutableMapping[str, Any]) -> ClientConn | None:
    ext = scope.get("extensions")
    return ext.get(EXTENSION) if ext else None


def received_ns(scope: MutableMapping[str, Any]) -> int | None:
    """When the request's first bytes were read (under our server), else None."""
    ours = (scope.get("extensions") or {}).get(OBS_EXTENSION)
    return ours.get("received_ns") if ours else None


def body_ns(scope: MutableMapping[str, Any]) -> int | None:
    """When the request's body was complete (under our server, once it is), else None."""
    ours = (scope.get("extensions") or {}).get(OBS_EXTENSION)
    return ours.get("body_ns") if ours else None
