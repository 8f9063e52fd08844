"""The client connection's write buffer, used as each stream's bounded buffer.

Slow-client isolation without a copy or a task per stream: the relay writes
every chunk as soon as the pool sends it; what the client has not taken yet
waits in the connection's write buffer (kernel send buffer, then the event
loop's). The kernel part is kept small (``KERNEL_SNDBUF``) so that the bound
and the lag are visible here, not hidden in a socket buffer that autotunes to
megabytes. Per stream, the lane's ``slow_client`` policy applies:

- ``wait``: the buffer's high-water mark is the bound; past it, the server's
  ``send`` waits, so the relay stops reading and the pool's socket backs up.
- ``abort``: no waiting; when the buffered bytes pass the bound, the relay
  ends the stream with an error and closes the pool connection.

At the end of a stream :meth:`ClientConn.drained` waits for the buffer to
empty, so the event's stream phase is the time the client's slowness cost.

``SidecarHttpProtocol`` is uvicorn's httptools protocol with one addition:
each request's scope carries its connection under ``scope["extensions"]``.
Under another server the extension is absent and streams are relayed at the
client's pace (the ASGI default).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

EXTENSION = "vllm_obs.client_conn"
KERNEL_SNDBUF = 64 << 10
DEFAULT_HIGH_WATER = 64 << 10  # asyncio's and uvloop's default, restored after each stream


class ClientConn:
    """The transport of one client connection, seen by the relay."""

    __slots__ = ("_flow", "_transport")

    def __init__(self, transport: asyncio.Transport, flow: Any) -> None:
        self._transport = transport
        self._flow = flow

    def bound(self, limit: int, *, wait: bool) -> None:
        """Start a stream: buffer up to ``limit`` bytes, waiting (or not) past it."""
        sock = self._transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, KERNEL_SNDBUF)
        high = limit if wait else 1 << 62
        self._transport.set_write_buffer_limits(high=high, low=high // 4)

    def buffered(self) -> int:
        """Bytes written by the relay that the client has not taken yet (beyond the kernel's)."""
        return self._transport.get_write_buffer_size()

    async def drained(self, timeout_s: float) -> bool:
        """Wait until the client has taken every byte (True), or ``timeout_s`` passes."""
        t = self._transport
        if t.is_closing() or not t.get_write_buffer_size():
            self.reset()
            return True
        t.set_write_buffer_limits(high=0, low=0)  # pauses the protocol until the buffer empties
        try:
            await asyncio.wait_for(self._flow.drain(), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            self.reset()

    def reset(self) -> None:
        if not self._transport.is_closing():
            self._transport.set_write_buffer_limits(high=DEFAULT_HIGH_WATER)


def client_conn(scope: dict[str, Any]) -> ClientConn | None:
    ext = scope.get("extensions")
    return ext.get(EXTENSION) if ext else None


class SidecarHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, exposing the connection to the relay."""

    def on_message_begin(self) -> None:
        super().on_message_begin()
        ext: dict[str, Any] = {EXTENSION: ClientConn(self.transport, self.flow)}
        self.scope["extensions"] = ext
