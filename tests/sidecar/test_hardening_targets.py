"""Request targets that are no path (issue 63): ``CONNECT host:port`` and ``*`` are answered
400 and the connection closed, with no traceback (before: CONNECT crashed the connection's
handler: no answer, a traceback per request).

Raw sockets on 127.0.6.7 against the in-process sidecar (what an attacker sends).
"""

from __future__ import annotations

import logging
import socket

import pytest

from obs import conventions as c
from tests.sidecar.conftest import InprocFactory
from tests.support.inproc import InProcessSidecar, lane_config
from tests.support.probes import metric
from tests.support.rawhttp import read_all, status
from tests.support.scripted_upstream import ScriptedUpstream

pytestmark = pytest.mark.inproc


@pytest.fixture(scope="module")
def plain(scripted: ScriptedUpstream, inproc: InprocFactory) -> InProcessSidecar:
    return inproc(lane_config({"main": [scripted.url]}))


def _send(port: int, data: bytes) -> bytes:
    with socket.create_connection(
        ("127.0.0.1", port), timeout=10, source_address=("127.0.6.7", 0)
    ) as s:
        s.settimeout(10)
        s.sendall(data)
        return read_all(s)


@pytest.mark.parametrize(
    "request_line",
    [
        b"CONNECT example.com:443 HTTP/1.1",
        b"CONNECT 127.0.0.1:22 HTTP/1.1",
        b"OPTIONS * HTTP/1.1",
        b"GET * HTTP/1.1",
    ],
)
def test_a_target_that_is_no_path_is_a_400_without_traceback(
    plain: InProcessSidecar, request_line: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """The client reads a 400 and the connection closes; the refusal is counted as
    ``request_target`` and nothing is logged at error level."""
    before = metric(plain.url, c.CONNECTION_LIMITS.name + "_total", limit="request_target")
    with caplog.at_level(logging.ERROR):
        answer = _send(plain.port, request_line + b"\r\nhost: example.com\r\n\r\n")
        after = metric(plain.url, c.CONNECTION_LIMITS.name + "_total", limit="request_target")
    assert status(answer) == 400, answer
    assert after == before + 1
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_garbage_behind_a_request_is_answered_after_it(
    plain: InProcessSidecar, scripted: ScriptedUpstream
) -> None:
    """A valid chat with garbage pipelined behind it in one write: the client reads the
    chat's 200 and then the 400, in order (before: only the 400, while the pool ran the
    chat)."""
    body = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'
    answer = _send(
        plain.port,
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%b" % (len(body), body) + b"GARBAGE\r\n\r\n",
    )
    assert status(answer) == 200, answer[:300]
    assert b"HTTP/1.1 400 Bad Request" in answer.split(b"HTTP/1.1 200", 1)[1]
