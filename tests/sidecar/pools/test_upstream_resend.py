"""A request written on a kept-alive pool connection that the pool closes before a byte of
its answer is written once more on a new connection; nothing else is ever sent twice.

The pool here is a raw socket (a fake, and the test says why): it closes a kept-alive
connection exactly as the next request arrives, the race a loaded sidecar loses when the
pool's keep-alive runs out while the close waits in the loop's queue; a real vLLM closes an
idle connection only after its 5 s keep-alive, never on cue."""

from __future__ import annotations

import itertools
import socket
import threading
from collections.abc import Callable

import httpx
import pytest
import uvloop

from obs.sidecar.pools.upstream import Upstream, UpstreamError
from tests.sidecar.conftest import InprocFactory
from tests.support.inproc import lane_config, request_id

pytestmark = pytest.mark.inproc

ANSWER = b'{"ok":true}'


class _Pool:
    """Answers requests on each connection, but closes the connection without a byte of
    answer where ``closes(connection, request)`` (both numbered from 1) says so. ``seen``
    counts the requests it read, over all connections."""

    def __init__(self, closes: Callable[[int, int], bool]) -> None:
        self.closes = closes
        self.connections = itertools.count(1)
        self.seen = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            number = next(self.connections)
            threading.Thread(target=self._serve, args=(conn, number), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        with conn:
            data, n = b"", 0
            while True:
                while b"\r\n\r\n" not in data:
                    more = conn.recv(65536)
                    if not more:
                        return
                    data += more
                head, _, data = data.partition(b"\r\n\r\n")
                if not head.startswith(b"POST "):  # the sidecar's polls: answered, not counted
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    continue
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                while len(data) < length:
                    data += conn.recv(65536)
                data, n = data[length:], n + 1
                self.seen += 1
                if self.closes(number, n):
                    return  # closed: not a byte of answer
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%b" % (len(ANSWER), ANSWER)
                )

    def close(self) -> None:
        self.sock.close()


async def _two_posts(url: str) -> tuple[list[bytes | str], Upstream]:
    """Two POSTs one after the other (the second on the first's kept-alive connection)."""
    up = Upstream()
    out: list[bytes | str] = []
    try:
        for _ in range(2):
            try:
                resp = await up.post(url, "/v1/completions", b"{}", {}, 5.0)
                out.append(await resp.read())
                resp.release()
            except UpstreamError as err:
                out.append(f"failed: {err}")
        return out, up
    finally:
        up.close()


def test_a_kept_alive_connection_closed_as_the_request_went_out_is_resent_once() -> None:
    """The second request's connection closes before its answer: it is written again on a
    new connection and answered (before: the request failed, a 502 to its client)."""
    pool = _Pool(lambda conn, n: n == 2)
    try:
        out, up = uvloop.run(_two_posts(pool.url))
    finally:
        pool.close()
    assert out == [ANSWER, ANSWER]
    assert (up.connections_opened, up.resent, pool.seen) == (2, 1, 3)


def test_a_new_connection_closed_before_the_answer_is_the_requests_failure() -> None:
    """A request on a connection made for it is never sent twice: the pool may have read it
    and started generating."""
    pool = _Pool(lambda conn, n: n == 1)
    try:
        out, up = uvloop.run(_two_posts(pool.url))
    finally:
        pool.close()
    assert all(isinstance(o, str) and "waiting for the response" in o for o in out), out
    assert (up.resent, pool.seen) == (0, 2)


def test_a_resent_request_that_fails_again_fails_and_is_not_sent_a_third_time() -> None:
    """The new connection closes before the answer too: one re-send, then the failure."""
    pool = _Pool(lambda conn, n: n == 2 or conn == 2)
    try:
        out, up = uvloop.run(_two_posts(pool.url))
    finally:
        pool.close()
    assert out[0] == ANSWER and isinstance(out[1], str) and "waiting for the response" in out[1]
    assert (up.connections_opened, up.resent, pool.seen) == (2, 1, 3)


def test_through_the_relay_the_client_gets_its_answer_and_one_ok_event(
    inproc: InprocFactory,
) -> None:
    """A chat relayed on a kept-alive connection the pool closes as it goes out: the client
    gets the pool's answer and its event is ok, once (before: a 502 and an error event)."""
    pool = _Pool(lambda conn, n: n == 2)
    try:
        sidecar = inproc(lane_config({"main": [pool.url]}))
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(2):
            rid = request_id()
            r = httpx.post(
                f"{sidecar.url}/v1/chat/completions", json=body,
                headers={"x-request-id": rid}, timeout=10,
            )  # fmt: skip
            assert (r.status_code, r.content) == (200, ANSWER)
            assert sidecar.event(rid)["status"] == "ok"
    finally:
        pool.close()
    assert pool.seen == 3
