"""The relay's pool client (``obs.sidecar.pools.upstream``) against a real ``vllm serve``.

Each test runs its own event loop (uvloop, as the sidecar does). Only the
invalid-HTTP test uses a fake pool: a raw socket that answers garbage, which no
real vLLM sends.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
import uvloop

from obs.engines.server import VllmServer
from obs.sidecar.pools.upstream import ConnectFailed, Response, Upstream, UpstreamError
from tests.support import chat_body
from tests.support.engine_core import engine_core_throttled
from tests.support.tcp import server_side, unread

pytestmark = pytest.mark.engine

CHAT = "/v1/chat/completions"
JSON = {"content-type": "application/json"}


def _chat(stream: bool, max_tokens: int = 24) -> bytes:
    return orjson.dumps(chat_body("count to ten", max_tokens, ignore_eos=True, stream=stream))


def _run(fn: Callable[[Upstream], Awaitable[Any]], **kwargs: Any) -> Any:
    async def main() -> Any:
        upstream = Upstream(**kwargs)
        try:
            return await fn(upstream)
        finally:
            upstream.close()

    return uvloop.run(main())


class Pieces:
    """A sink that keeps what it is handed, and when."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.at: list[float] = []
        self.ended: list[UpstreamError | None] = []
        self.on_first: Callable[[], None] | None = None
        self.on_piece: Callable[[], None] | None = None

    def on_body(self, data: bytes) -> None:
        self.pieces.append(data)
        self.at.append(time.monotonic())
        if len(self.pieces) == 1 and self.on_first is not None:
            self.on_first()
        if self.on_piece is not None:
            self.on_piece()

    def on_end(self, exc: UpstreamError | None) -> None:
        self.ended.append(exc)


def test_stream_reaches_the_sink_piece_by_piece_and_the_connection_is_reused(
    vllm: VllmServer,
) -> None:
    """A streamed answer reaches the sink as vLLM makes it, ending with [DONE]; the next request
    reuses the connection.

    The engine core runs in slices in step with the sink: a tiny model can make a whole short
    answer within one socket read, which the sink gets as one piece (one piece per read:
    tests/sidecar/pools/test_upstream_reads.py). A 10 ms slice makes a few of the 200 tokens;
    one that made none to read gives way to the next after 50 ms (at 2 ms and 0.5 s the
    test took 68 s of the suite)."""

    async def go(up: Upstream) -> tuple[int, Pieces, tuple[int, int], bytes]:
        with engine_core_throttled(vllm, run_s=0.01, quiet_s=0.05) as throttle:
            resp = await up.post(vllm.url, CHAT, _chat(stream=True, max_tokens=200), JSON, 5.0)
            sink = Pieces()
            sink.on_piece = throttle.read
            await resp.stream(sink)
            resp.release()
        second = await up.post(vllm.url, CHAT, _chat(stream=False, max_tokens=4), JSON, 5.0)
        whole = await second.read()
        second.release()
        return resp.status, sink, (up.connections_opened, up.open_connections()), whole

    status, sink, opened, whole = _run(go)
    assert status == 200
    assert sink.ended == [None]
    body = b"".join(sink.pieces)
    assert body.endswith(b"data: [DONE]\n\n"), body[-200:]
    assert body.count(b"data: ") >= 200
    assert len(sink.pieces) > 1, "the body came whole, not as vLLM made it"
    assert opened == (1, 1), "the second request opened a new connection"
    assert orjson.loads(whole)["usage"]["completion_tokens"] == 4


def test_connection_idle_past_idle_s_is_not_reused(vllm: VllmServer) -> None:
    """A connection idle longer than idle_s is closed, never reused (keep-alive race)."""

    async def go(up: Upstream) -> int:
        for _ in range(2):
            resp = await up.post(vllm.url, CHAT, _chat(stream=False, max_tokens=2), JSON, 5.0)
            await resp.read()
            resp.release()
            await asyncio.sleep(0.4)
        return up.connections_opened

    assert _run(go, idle_s=0.2) == 2


def test_paused_response_stops_reading_until_resumed(vllm: VllmServer) -> None:
    """pause_reading holds the rest of the body in the socket; resume_reading lets it through.

    Judged by the kernel, not the clock: once paused, the answer's next bytes sit in the
    client's socket unread (/proc/net/tcp's receive queue) while the loop runs on and the sink
    gets nothing; after the resume the rest reaches the sink. The engine core runs in slices
    in step with the reader, so the first piece comes before the answer is whole."""
    vllm_port = urlsplit(vllm.url).port
    assert vllm_port is not None

    async def go(up: Upstream) -> tuple[Pieces, int, int, int]:
        with engine_core_throttled(vllm, run_s=0.004, quiet_s=0.05) as throttle:
            before = set(server_side(vllm_port))
            resp = await up.post(vllm.url, CHAT, _chat(stream=True, max_tokens=200), JSON, 5.0)
            (client_port,) = set(server_side(vllm_port)) - before
            sink = Pieces()
            first = asyncio.Event()

            def pause() -> None:  # in the socket's callback: the rest of this read still comes
                resp.pause_reading()
                first.set()

            sink.on_first = pause
            sink.on_piece = throttle.read
            streaming = asyncio.ensure_future(resp.stream(sink))
            await first.wait()
            at_pause = len(sink.pieces)
            for _ in range(6000):  # the engine goes on, nobody reads (a hang guard, no bound)
                if unread(client_port, vllm_port):
                    break
                await asyncio.sleep(0.01)
            for _ in range(20):  # the loop runs on: a reading transport would take the bytes
                await asyncio.sleep(0)
            await asyncio.sleep(0.1)
            held, waiting = len(sink.pieces) - at_pause, unread(client_port, vllm_port) or 0
            resp.resume_reading()
            await streaming
            resp.release()
        return sink, at_pause, held, waiting

    sink, at_pause, held, waiting = _run(go)
    assert held == 0, f"{held} pieces read while paused"
    assert waiting > 0, "the bytes vLLM sent while paused were read from the socket"
    assert sink.ended == [None]
    # What vLLM wrote meanwhile waited in the socket: after the resume the rest of the
    # answer's frames reach the sink.
    assert len(sink.pieces) > at_pause
    assert b"".join(sink.pieces).endswith(b"data: [DONE]\n\n")


def test_refused_connection_is_connect_failed() -> None:
    """A port nobody listens on fails fast as ConnectFailed (the relay fails over on it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused

        async def go(up: Upstream) -> None:
            await up.post(f"http://127.0.0.1:{port}", CHAT, b"{}", JSON, 2.0)

        with pytest.raises(ConnectFailed, match="cannot connect"):
            _run(go)


def test_invalid_http_from_the_pool_is_an_upstream_error() -> None:
    """A fake pool (no real vLLM answers garbage) gets a clear UpstreamError, not a crash."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]

    def answer() -> None:
        conn, _ = srv.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: nope\r\n\r\n")
        time.sleep(0.5)
        conn.close()

    threading.Thread(target=answer, daemon=True).start()

    async def go(up: Upstream) -> Response:
        return await up.post(f"http://127.0.0.1:{port}", CHAT, b"{}", JSON, 2.0)

    try:
        with pytest.raises(UpstreamError, match="invalid HTTP"):
            _run(go)
    finally:
        srv.close()
