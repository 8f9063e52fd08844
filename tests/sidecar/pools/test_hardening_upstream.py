"""A pool that breaks HTTP: its connection is never reused, the client gets a 502 (item 13).

The pool is ``ScriptedPool`` below, a raw-socket server that answers each
connection's first request with scripted bytes: no real vLLM sends stray bytes,
interim or unknown statuses, so only a fake can.
"""

from __future__ import annotations

import contextlib
import socket
import threading

import httpx
import pytest

from obs.sidecar.testing import SidecarProcess
from tests.conftest import SidecarFactory
from tests.support.rawhttp import read_all

CHAT = "/v1/chat/completions"
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
JSON_OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class ScriptedPool:
    """Answers the first request on each connection with the next script; later ones never."""

    def __init__(self, scripts: list[bytes]) -> None:
        self.scripts = scripts
        self.connections = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._open: list[socket.socket] = []
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self._open.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):  # stop() closes the sockets under the threads
            self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        script = self.scripts[min(self.connections, len(self.scripts) - 1)]
        self.connections += 1
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        if b"/metrics" in data.split(b"\r\n", 1)[0]:  # the sidecar's engine-state polls
            conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            self.connections -= 1
        else:
            conn.sendall(script)
        conn.settimeout(30)
        read_all(conn)  # a second request on this connection is never answered

    def stop(self) -> None:
        # Stop accepting first (shutdown wakes the blocked accept): no connection accepted
        # after the loop below is left for the collector unclosed.
        self._sock.shutdown(socket.SHUT_RDWR)
        self._acceptor.join()
        self._sock.close()
        for c in self._open:
            c.close()


def _start(sidecar: SidecarFactory, scripts: list[bytes]) -> tuple[ScriptedPool, SidecarProcess]:
    pool = ScriptedPool(scripts)
    return pool, sidecar(pool.url, args=("--pool-poll-interval", "60"), traces=False)


def test_stray_bytes_after_a_response_never_reach_the_next_client(
    sidecar: SidecarFactory,
) -> None:
    """A response followed by junk in the same read: the connection is dropped, not parked."""
    pool, sc = _start(sidecar, [JSON_OK + b"HTTP/1.1 200 OK\r\ncontent-le", JSON_OK])
    try:
        first = httpx.post(sc.url + CHAT, json=BODY, timeout=10)
        second = httpx.post(sc.url + CHAT, json=BODY, timeout=10)
        assert (first.status_code, second.status_code) == (200, 200)
        assert second.json() == {}
    finally:
        pool.stop()


@pytest.mark.parametrize(
    "head",
    [b"HTTP/1.1 100 Continue\r\n\r\n" + JSON_OK, b"HTTP/1.1 999 Odd\r\ncontent-length: 0\r\n\r\n"],
)
def test_interim_and_unknown_statuses_are_a_502(sidecar: SidecarFactory, head: bytes) -> None:
    """A 100 Continue is not relayed as the answer, nor a 999 as an empty reply: both 502."""
    pool, sc = _start(sidecar, [head, JSON_OK])
    try:
        r = httpx.post(sc.url + CHAT, json=BODY, timeout=10)
        assert r.status_code == 502
        assert r.json()["error"]["type"] == "BadGatewayError"
        assert httpx.post(sc.url + CHAT, json=BODY, timeout=10).status_code == 200
        (bad, good) = sc.wait_events(2)
        assert bad["error_class"] == "upstream_protocol" and good["status"] == "ok"
    finally:
        pool.stop()


def test_a_stream_with_a_content_length_is_relayed_whole(sidecar: SidecarFactory) -> None:
    """SSE sent with a Content-Length: the client still gets every frame, no internal error."""
    frames = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: [DONE]\n\n'
    sse = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%b" % (
        len(frames),
        frames,
    )
    pool, sc = _start(sidecar, [sse])
    try:
        body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
        r = httpx.post(sc.url + CHAT, json=body, timeout=10)
        assert r.status_code == 200
        assert r.content.endswith(b"data: [DONE]\n\n")
        assert "relay_internal_error" not in sc.log_tail(100_000)
    finally:
        pool.stop()
