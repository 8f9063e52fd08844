"""The relay's pool client hands the sink one piece per socket read, whatever the chunking.

The pool here is a raw socket (a fake, and the test says why): it has to put several HTTP
chunks in one TCP write, and the last chunk and the end of the body in another, on cue;
a real vLLM coalesces chunks only under load, never on cue.
"""

from __future__ import annotations

import socket
import threading

import pytest
import uvloop

from obs.sidecar.pools.upstream import Upstream, UpstreamError

pytestmark = pytest.mark.inproc

FRAMES = [b'data: {"n":%d}\n\n' % i for i in range(4)]


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


class _Pool:
    """Answers one POST with its head, then a chunked stream in two writes: three chunks,
    then the last chunk and the body's end, each write once the test says so."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.streaming = threading.Event()  # the client has its sink: send the chunks
        self.go_on = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            head += b"transfer-encoding: chunked\r\n\r\n"
            conn.sendall(head)
            self.streaming.wait(10)
            conn.sendall(b"".join(_chunk(f) for f in FRAMES[:3]))
            self.go_on.wait(10)
            conn.sendall(_chunk(FRAMES[3]) + b"0\r\n\r\n")
            conn.recv(1)  # until the client closes or sends again

    def close(self) -> None:
        self.streaming.set()
        self.go_on.set()
        self.sock.close()
        self.thread.join(10)


class _Sink:
    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.log: list[bytes | str] = []

    def on_body(self, data: bytes) -> None:
        self.log.append(data)
        self.pool.go_on.set()  # the first read was handed over: send the rest

    def on_end(self, exc: UpstreamError | None) -> None:
        self.log.append("end" if exc is None else f"failed: {exc}")


def test_chunks_of_one_read_reach_the_sink_as_one_piece_and_the_end_after_them() -> None:
    """Three chunks in one read are one piece; the last chunk and the end: a piece, then end."""
    pool = _Pool()

    async def go() -> list[bytes | str]:
        up = Upstream()
        try:
            resp = await up.post(pool.url, "/v1/chat/completions", b"{}", {}, 5.0)
            sink = _Sink(pool)
            pool.streaming.set()  # the loop reads the chunks only once stream() took the sink
            await resp.stream(sink)
            resp.release()
            return sink.log
        finally:
            up.close()

    try:
        log = uvloop.run(go())
    finally:
        pool.close()
    assert log == [b"".join(FRAMES[:3]), FRAMES[3], "end"]
