"""The relay's own HTTP server in process: keep-alive, pipelining, HTTP/1.0, request bodies
and the answers it gives itself, over raw sockets.

The pool is ``ScriptedUpstream`` (a fake, in this process) for the relayed request: the test
knows the exact bytes it answers. Limits and smuggling against a subprocess sidecar are in
test_hardening_*.py; header count and timeout in process in test_inproc_server.py.
"""

from __future__ import annotations

import time

import orjson
import pytest

from obs import conventions as c
from obs.sidecar.server.limits import Limits
from tests.sidecar.conftest import InprocFactory
from tests.support import chat_body
from tests.support.inproc import InProcessSidecar, lane_config, request_id
from tests.support.probes import CHAT, metric
from tests.support.rawhttp import closed_within, connect, exchange, read_all, status
from tests.support.scripted_upstream import Script, ScriptedUpstream

ANSWER = b'{"id":"cmpl-1","object":"chat.completion","choices":[]}'
HEALTH = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
IDLE_S = 0.5  # the sidecar's idle timeout


@pytest.fixture(scope="module")
def sidecar(scripted: ScriptedUpstream, inproc: InprocFactory) -> InProcessSidecar:
    """An in-process sidecar whose idle connections close after ``IDLE_S``."""
    return inproc(lane_config({"main": [scripted.url]}), limits=Limits(idle_timeout_s=IDLE_S))


def _post(rid: str, body: bytes, *more: bytes, version: bytes = b"1.1") -> bytes:
    head = b"POST %b HTTP/%b\r\nhost: x\r\ncontent-type: application/json\r\n" % (
        CHAT.encode(), version
    )  # fmt: skip
    head += b"x-request-id: %b\r\ncontent-length: %d\r\n" % (rid.encode(), len(body))
    return head + b"".join(more) + b"\r\n" + body


def _responses(data: bytes) -> list[tuple[int, bytes]]:
    """Split raw HTTP/1.1 responses (each with a content-length or chunked body)."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        headers = dict(line.lower().split(b": ", 1) for line in lines[1:])
        if b"content-length" in headers:
            n = int(headers[b"content-length"])
            body, data = rest[:n], rest[n:]
        else:
            assert headers.get(b"transfer-encoding") == b"chunked", head
            body = b""
            while True:
                size, _, rest = rest.partition(b"\r\n")
                n = int(size, 16)
                body, rest = body + rest[:n], rest[n + 2 :]
                if n == 0:
                    break
            data = rest
        out.append((int(lines[0].split()[1]), body))
    return out


def _script(scripted: ScriptedUpstream) -> str:
    rid = request_id()
    scripted.scripts[rid] = Script(content_type="application/json", pieces=[ANSWER])
    return rid


def test_pipelined_requests_are_answered_in_order(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """Three requests in one write (relayed, 404, /health) get three answers, in order."""
    rid = _script(scripted)
    body = orjson.dumps(chat_body())
    missing = b"GET /nowhere HTTP/1.1\r\nhost: x\r\n\r\n"
    close = b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    answer = exchange(sidecar.port, _post(rid, body) + missing + close)
    got = _responses(answer)
    assert [s for s, _ in got] == [200, 404, 200]
    assert got[0][1] == ANSWER
    assert orjson.loads(got[1][1])["error"]["code"] == 404
    assert orjson.loads(got[2][1])["status"] == "ok"
    assert sidecar.event(rid)["status"] == c.OK


def test_keep_alive_connection_serves_requests_then_closes_when_idle(
    sidecar: InProcessSidecar,
) -> None:
    """Two requests one after the other on one connection; then closed after the idle
    timeout, not counted as a limit hit (that is for a connection that never sent one). The
    close comes no sooner than the idle timeout after the last request was sent (its timer
    cannot start before the request arrives), whatever the machine's speed, to uvloop's
    millisecond."""
    before = metric(sidecar.url, c.CONNECTION_LIMITS.name + "_total", limit="idle_timeout")
    with connect(sidecar.port) as s:
        for _ in range(2):
            sent = time.monotonic()
            s.sendall(HEALTH)
            time.sleep(0.05)
            assert status(s.recv(65536)) == 200
        assert closed_within(s, 30) is not None, "the idle connection was not closed"
        # uvloop's timers run on the loop's time, cached in whole milliseconds when its
        # iteration began: the timeout may end up to a millisecond short by this clock.
        assert time.monotonic() - sent >= IDLE_S - 0.001
    after = metric(sidecar.url, c.CONNECTION_LIMITS.name + "_total", limit="idle_timeout")
    assert after == before


def test_http10_request_gets_its_answer_and_the_connection_closes(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """HTTP/1.0 without keep-alive: the whole answer, ``connection: close``, then EOF."""
    rid = _script(scripted)
    answer = exchange(sidecar.port, _post(rid, orjson.dumps(chat_body()), version=b"1.0"), 5)
    assert status(answer) == 200
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower()
    assert body == ANSWER


def test_chunked_request_body_reaches_the_pool_whole(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A chunked request body, sent in pieces, is relayed as one body."""
    rid = _script(scripted)
    body = orjson.dumps(chat_body())
    head = (
        b"POST %b HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-request-id: %b\r\n"
        b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n" % (CHAT.encode(), rid.encode())
    )
    with connect(sidecar.port) as s:
        s.sendall(head + b"%x\r\n%b\r\n" % (10, body[:10]))
        time.sleep(0.1)
        s.sendall(b"%x\r\n%b\r\n0\r\n\r\n" % (len(body) - 10, body[10:]))
        answer = read_all(s)
    assert _responses(answer) == [(200, ANSWER)]
    assert any(orjson.loads(b) == orjson.loads(body) for _, b in scripted.received if b)


def test_expect_100_continue_is_answered_before_the_body(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """``Expect: 100-continue``: the interim answer comes first, then the request's own."""
    rid = _script(scripted)
    body = orjson.dumps(chat_body())
    head = _post(rid, b"", b"expect: 100-continue\r\nconnection: close\r\n")
    head = head.replace(b"content-length: 0", b"content-length: %d" % len(body))
    with connect(sidecar.port) as s:
        s.sendall(head)
        assert s.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(body)
        answer = read_all(s)
    assert _responses(answer) == [(200, ANSWER)]


def test_malformed_request_gets_400_and_close(sidecar: InProcessSidecar) -> None:
    """Bytes that are no HTTP request: 400 from the server itself, the connection closed."""
    answer = exchange(sidecar.port, b"HELLO\x00 / HTTP/1.1\r\n\r\n", 5)
    assert status(answer) == 400
    assert answer.endswith(
        b'"message":"Invalid HTTP request received.","type":"BadRequestError",'
        b'"param":null,"code":400}}'
    )


def test_upgrade_get_then_a_second_request_on_the_same_connection(
    sidecar: InProcessSidecar,
) -> None:
    """A plain GET with ``Upgrade: h2c`` is served as HTTP/1.1, and so is the next request."""
    upgrade = b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n"
    close = b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    got = _responses(exchange(sidecar.port, upgrade + close, 5))
    assert [s for s, _ in got] == [200, 200]


def test_head_request_gets_headers_without_a_body(sidecar: InProcessSidecar) -> None:
    """HEAD /health (405: the route is GET only): the head with the body's length, none of
    the body, and the next request's answer right after it on the same connection."""
    with connect(sidecar.port, 5) as s:
        s.sendall(b"HEAD /health HTTP/1.1\r\nhost: x\r\n\r\n" + HEALTH)
        time.sleep(0.2)
        answer = s.recv(65536)
    first, _, rest = answer.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 405") and b"content-length: 97" in first
    assert rest.startswith(b"HTTP/1.1 200")
