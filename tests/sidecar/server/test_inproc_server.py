"""The in-process server is the production one: the connection limits hold on it, and its
shutdown ends a stream still running with a frame and an event.

``relay_server`` builds the server ``vllm-obs sidecar`` runs, so these pin the harness as
much as the server. The pool is ``ScriptedUpstream`` (a fake, in this process), held open
past the shutdown grace, which a real engine cannot be made to do on cue. The limits
against a subprocess sidecar are in test_hardening_*.py.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from obs import conventions as c
from obs.sidecar.server.limits import Limits
from tests.sidecar.conftest import InprocFactory
from tests.support import chat_body
from tests.support.inproc import InProcessSidecar, lane_config, request_id
from tests.support.probes import CHAT, metric, stream_error, wait_for
from tests.support.rawhttp import connect, exchange, read_all, status
from tests.support.scripted_upstream import Script, ScriptedUpstream, token_frame

pytestmark = pytest.mark.inproc


@pytest.fixture(scope="module")
def sidecar(scripted: ScriptedUpstream, inproc: InprocFactory) -> InProcessSidecar:
    """An in-process sidecar allowing 20 headers and 0.3 s to send them."""
    limits = Limits(max_headers=20, header_timeout_s=0.3)
    return inproc(lane_config({"main": [scripted.url]}), limits=limits)


def _limit_hits(sidecar: InProcessSidecar, limit: str) -> float:
    return metric(sidecar.url, c.CONNECTION_LIMITS.name + "_total", limit=limit)


def test_header_count_limit(sidecar: InProcessSidecar) -> None:
    """A request with more headers than max_headers is answered 431 before the app sees it,
    and counted under its limit."""
    headers = b"".join(b"x-h%d: v\r\n" % i for i in range(30))
    answer = exchange(sidecar.port, b"GET /health HTTP/1.1\r\nhost: x\r\n" + headers + b"\r\n")
    assert status(answer) == 431
    assert b"RequestLimitError" in answer
    assert _limit_hits(sidecar, "header_count") == 1


def test_header_timeout(sidecar: InProcessSidecar) -> None:
    """A client that starts a request and stalls in its headers gets 408 and is closed once
    header_timeout_s passes."""
    with connect(sidecar.port) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        answer = read_all(s)
    assert status(answer) == 408
    assert _limit_hits(sidecar, "header_timeout") == 1


def test_shutdown_ends_running_stream(scripted: ScriptedUpstream, inproc: InprocFactory) -> None:
    """A stream still running when the shutdown grace ends gets a 503 ServiceUnavailableError
    frame, and its event is written before the server exits (error class shutdown)."""
    sidecar, rid, hold = (
        inproc(lane_config({"main": [scripted.url]})),
        request_id(),
        threading.Event(),
    )
    scripted.scripts[rid] = Script(pieces=[token_frame("a")], hold=hold)
    try:
        with ThreadPoolExecutor(1) as pool:
            body = chat_body(rid, stream=True)
            answer = pool.submit(
                httpx.post, sidecar.url + CHAT, json=body, headers={"x-request-id": rid}, timeout=30
            )
            wait_for(
                "the stream at the pool",
                lambda: any(rid.encode() in b for _, b in scripted.received),
                10,
                0.01,
            )
            sidecar.stop()
            r = answer.result()
    finally:
        hold.set()
    error = stream_error(r.content)
    assert (error["type"], error["code"]) == ("ServiceUnavailableError", 503)
    ev = sidecar.event(rid)
    assert (ev["status"], ev["error_class"]) == (c.ERROR, "shutdown")
