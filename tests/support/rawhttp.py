"""Raw-socket HTTP for the hardening tests: bytes exactly as an attacker would send them."""

from __future__ import annotations

import contextlib
import socket
import time


def connect(port: int, timeout_s: float = 10.0) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    s.settimeout(timeout_s)
    return s


def read_all(s: socket.socket, limit: int = 1 << 20) -> bytes:
    """Everything the server sends until it closes (or the socket's timeout, or ``limit``)."""
    out = b""
    try:
        while len(out) < limit:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return out


def exchange(port: int, data: bytes, timeout_s: float = 10.0) -> bytes:
    """Send ``data`` on a new connection; the whole answer, read until the server closes."""
    with connect(port, timeout_s) as s:
        # The server may answer and close before taking it all: read what it said.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(data)
        return read_all(s)


def status(response: bytes) -> int:
    """The status code of a raw HTTP/1.1 response (0 when there is none)."""
    line = response.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) > 1 and line[1].isdigit() else 0


def closed_within(s: socket.socket, timeout_s: float) -> float | None:
    """Seconds until the server closed ``s`` (reading whatever it says), None if it did not."""
    t0 = time.monotonic()
    s.settimeout(timeout_s)
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - t0


def trickle(s: socket.socket, byte: bytes, seconds: float, every_s: float = 0.3) -> bool:
    """Send ``byte`` every ``every_s`` until the server cuts ``s``: whether it did within
    ``seconds`` (a hang guard: which timer cut it, the caller reads from the server)."""
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < seconds:
            s.sendall(byte)
            time.sleep(every_s)
    except (BrokenPipeError, ConnectionResetError):
        return True
    return False


def read_response(s: socket.socket) -> bytes:
    """One response with a Content-Length, read whole from a kept-alive connection: its body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += s.recv(65536)
    return body
