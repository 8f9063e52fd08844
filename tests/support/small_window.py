"""An HTTP client whose socket advertises a small receive window from its first packet.

A slow reader (a phone on a slow link) is a client whose window is small: what it has not
read stays on the sender's side. httpx applies ``socket_options`` after ``connect``, when
the window the SYN advertised (about 64 KiB on loopback) is already granted, and Linux
takes one segment of any size into an empty receive queue: a sender that writes in large
pieces (the relay writes once per pool read) then lands a whole answer in the client's
kernel. Here SO_RCVBUF is set before ``connect``, so the window is small from the start.
"""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import orjson

RCVBUF = 4096


class SmallWindow(http.client.HTTPConnection):
    """``http.client`` over a socket with a ``rcvbuf``-byte receive buffer from before connect
    (None: the kernel's default, a fast reader)."""

    def __init__(self, url: str, timeout_s: float = 120, rcvbuf: int | None = RCVBUF) -> None:
        parts = urlsplit(url)
        super().__init__(parts.hostname or "127.0.0.1", parts.port, timeout=timeout_s)
        self.rcvbuf = rcvbuf

    def connect(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if self.rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.timeout)
        sock.connect((self.host, self.port))
        self.sock = sock

    def post_json(
        self, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> http.client.HTTPResponse:
        """POST ``body`` as JSON; the response with only its head read (``read(n)`` for more)."""
        self.request(
            "POST", path, orjson.dumps(body), {"content-type": "application/json", **headers}
        )
        return self.getresponse()


@contextmanager
def small_window_post(
    url: str,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    timeout_s: float = 120,
    rcvbuf: int | None = RCVBUF,
) -> Iterator[http.client.HTTPResponse]:
    """``SmallWindow.post_json`` on a new connection, closed when the block ends, read or not."""
    conn = SmallWindow(url, timeout_s, rcvbuf)
    try:
        yield conn.post_json(path, body, headers)
    finally:
        conn.close()


# ---- raw sockets: each connection kind, read at a set pace -------------------------------

KINDS = ("keep-alive", "close", "http/1.0")  # how the client asks for its connection's end


def raw_post(path: str, body: bytes, kind: str, headers: dict[str, str] | None = None) -> bytes:
    """A POST as ``kind`` writes it: HTTP/1.1 kept alive, HTTP/1.1 with ``Connection:
    close``, or HTTP/1.0 (whose response ends where the connection does)."""
    version = "HTTP/1.0" if kind == "http/1.0" else "HTTP/1.1"
    lines = [
        f"POST {path} {version}",
        "Host: 127.0.0.1",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    if kind == "close":
        lines.append("Connection: close")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def small_socket(port: int, rcvbuf: int | None = RCVBUF, timeout_s: float = 120) -> socket.socket:
    """A connected socket whose receive buffer is ``rcvbuf`` from before ``connect``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(timeout_s)
    sock.connect(("127.0.0.1", port))
    return sock


def read_paced(
    sock: socket.socket, kind: str, bytes_per_s: float, chunk: int = 512
) -> tuple[bytes, float]:
    """Read a whole response at ``bytes_per_s`` (``chunk`` bytes a read): until the server
    closes, or, kept alive, until the chunked body's end; the bytes and the monotonic time the
    last one was read."""
    data = bytearray()
    t0 = time.monotonic()
    while True:
        piece = sock.recv(chunk)
        if not piece:
            break
        data += piece
        if kind == "keep-alive" and data.endswith(b"\r\n0\r\n\r\n"):
            break
        due = t0 + len(data) / bytes_per_s
        if due > time.monotonic():
            time.sleep(due - time.monotonic())
    return bytes(data), time.monotonic()
