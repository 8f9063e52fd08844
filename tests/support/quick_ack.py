"""An httpx client whose socket acknowledges what it reads at once (``TCP_QUICKACK``).

At the end of a stream the sidecar waits until the client's side has acknowledged every
byte (``obs.sidecar.server.client.ClientConn.drained``), so the event's stream phase is the
time the client's slowness cost. A keep-alive client that has sent a request soon after an
answer is in Linux's "ping-pong" mode, in which it holds its ACKs up to 40 ms hoping to
piggyback them on its next request: an in-process test that reads a streamed request's event
would wait those 40 ms for nothing. This client sets ``TCP_QUICKACK`` after each read and
each write (the option does not stick: the kernel leaves quick-ack mode by itself), so its
side acknowledges each piece as it reads it, as a client that is not behind would. The
sidecar is unchanged; tests that pin a delayed or missing ACK drive their own sockets.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

import httpcore
import httpx

_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only; elsewhere a plain client


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner
        self._sock: socket.socket | None = inner.get_extra_info("socket")

    def _ack(self) -> None:
        if self._sock is not None and _QUICKACK is not None:
            # OSError: the connection is gone, which the next read or write says
            with contextlib.suppress(OSError):
                self._sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = self._inner.read(max_bytes, timeout)
        self._ack()
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, timeout)
        self._ack()

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        return self._inner.start_tls(*args, **kwargs)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_tcp(*args, **kwargs))

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        return self._inner.connect_unix_socket(*args, **kwargs)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class QuickAckTransport(httpx.HTTPTransport):
    """``httpx.HTTPTransport`` (plain HTTP, httpx's default limits) on quick-ACK sockets."""

    def __init__(self) -> None:
        # No TLS here: verify=False spares loading the CA bundle (17 ms a client).
        super().__init__(verify=False)
        self._pool = httpcore.ConnectionPool(
            ssl_context=None,
            max_connections=100,  # httpx's defaults
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
            network_backend=_Backend(),
        )


def quick_ack_client(base_url: str, timeout: float = 30) -> httpx.Client:
    """A keep-alive ``httpx.Client`` for ``base_url`` that acknowledges what it reads at once."""
    return httpx.Client(base_url=base_url, timeout=timeout, transport=QuickAckTransport())
