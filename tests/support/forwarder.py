"""A loopback TCP forwarder that can be switched off and on, to take a pool "down".

Used where a test needs a pool's address to refuse connections and later
accept them again without restarting the shared vLLM engine, and, with ``record=True``, to
keep what the server sent on each connection (``sent``; ``http_bodies`` reads the answers'
bodies out of it), so a test compares what a relay's client got with what the real server
sent the relay, whatever the server's framing that time. Bytes pass through unchanged; it is
a socket relay, not a fake server.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Forwarder:
    def __init__(self, target_port: int, port: int, record: bool = False) -> None:
        self.target_port = target_port
        self.port = port
        self.record = record
        self.sent: list[bytearray] = []  # with record: what the server sent, per connection
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self._listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def stop(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            for c in self._conns:
                with contextlib.suppress(OSError):
                    c.close()
            self._conns.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            kept = bytearray() if self.record else None
            with self._lock:
                self._conns += [client, upstream]
                if kept is not None:
                    self.sent.append(kept)
            for a, b, k in ((client, upstream, None), (upstream, client, kept)):
                threading.Thread(target=self._pump, args=(a, b, k), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, kept: bytearray | None = None) -> None:
        try:
            while data := src.recv(65536):
                if kept is not None:
                    kept += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def http_bodies(stream: bytes) -> list[bytes]:
    """The bodies of the HTTP/1.1 answers one connection carried, in order (Content-Length or
    chunked; an answer cut short ends the list)."""
    bodies: list[bytes] = []
    at = 0
    while (end := stream.find(b"\r\n\r\n", at)) >= 0:
        head = stream[at:end].decode("latin-1").lower().split("\r\n")
        fields = dict(line.split(":", 1) for line in head[1:] if ":" in line)
        at = end + 4
        if fields.get("transfer-encoding", "").strip() == "chunked":
            body = bytearray()
            while (eol := stream.find(b"\r\n", at)) >= 0:
                size = int(stream[at:eol].split(b";")[0], 16)
                body += stream[eol + 2 : eol + 2 + size]
                at = eol + 2 + size + 2
                if size == 0:
                    break
            else:
                return bodies
        else:
            size = int(fields.get("content-length", "0"))
            body = bytearray(stream[at : at + size])
            at += size
        bodies.append(bytes(body))
    return bodies
