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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import orjson

from bench.client_time import KINDS, raw_post, read_paced, small_socket

__all__ = [
    "KINDS",
    "RCVBUF",
    "SmallWindow",
    "raw_post",
    "read_paced",
    "small_socket",
    "small_window_post",
]

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
