"""Deadlines in process: the lane's first-token deadline and its idle timeout, on a stream
and on a whole answer, each with the frame or status the client reads and the event.

The pool is ``ScriptedUpstream`` (a fake, in this process), held silent for as long as a
test needs: a real engine cannot be made to go quiet at a chosen byte. The same deadlines
against a frozen real vLLM are in test_faults_replica.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import orjson
import pytest

from obs import conventions as c
from tests.sidecar.conftest import InprocFactory
from tests.support import chat_body
from tests.support.inproc import InProcessSidecar, lane_config, request_id
from tests.support.probes import CHAT, DONE_FRAME, stream_error, wait_for
from tests.support.scripted_upstream import Script, ScriptedUpstream, token_frame

FIRST_TOKEN_S = 0.4
IDLE_S = 0.4


@pytest.fixture(scope="module")
def sidecar(scripted: ScriptedUpstream, inproc: InprocFactory) -> InProcessSidecar:
    """An in-process sidecar whose lane allows 0.4 s to the first token and between tokens."""
    timeouts = {"first_token_s": FIRST_TOKEN_S, "idle_s": IDLE_S}
    return inproc(lane_config({"main": [scripted.url]}, timeouts=timeouts))


@pytest.fixture
def hold() -> Iterator[threading.Event]:
    """Keeps a scripted answer open after its pieces until the test ends."""
    event = threading.Event()
    yield event
    event.set()


def _post(sidecar: InProcessSidecar, rid: str, stream: bool) -> httpx.Response:
    body = chat_body(rid, stream=stream)
    return sidecar.client.post(CHAT, json=body, headers={"x-request-id": rid}, timeout=30)


def test_idle_timeout_mid_stream(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar, hold: threading.Event
) -> None:
    """A pool silent mid-stream past idle_s: the client's stream ends with a 504
    GatewayTimeoutError frame, the event records the same timeout in decode, and the pool's
    connection is closed."""
    rid = request_id()
    scripted.scripts[rid] = Script(pieces=[token_frame("a"), token_frame(" b")], hold=hold)
    r = _post(sidecar, rid, stream=True)
    assert r.status_code == 200
    assert r.content.startswith(token_frame("a") + token_frame(" b"))
    error = stream_error(r.content)
    assert (error["type"], error["code"]) == ("GatewayTimeoutError", 504)
    ev = sidecar.event(rid)
    assert (ev["status"], ev["error_class"], ev["error_phase"]) == (
        c.ERROR,
        "upstream_timeout",
        "decode",
    )
    assert ev["error_message"] == error["message"]
    assert ev["completion_tokens"] == 2
    wait_for("the sidecar to hang up on the pool", lambda: rid in scripted.cut_off, 10, 0.01)


def test_first_token_deadline_on_stream(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar, hold: threading.Event
) -> None:
    """A stream whose pool sends its headers and keep-alives but no token within
    first_token_s ends with a 504 frame naming the first-token deadline, in prefill."""
    rid = request_id()
    scripted.scripts[rid] = Script(pieces=[b": keep-alive\n\n"], hold=hold)
    r = _post(sidecar, rid, stream=True)
    assert r.status_code == 200
    error = stream_error(r.content)
    assert (error["type"], error["code"]) == ("GatewayTimeoutError", 504)
    ev = sidecar.event(rid)
    assert (ev["status"], ev["error_class"], ev["error_phase"]) == (
        c.ERROR,
        "upstream_timeout",
        "prefill",
    )
    assert ev["ttft_ms"] is None


def test_first_token_deadline_on_whole_answer(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar, hold: threading.Event
) -> None:
    """A non-streamed answer not whole within first_token_s is the lane's deadline, not the
    pool's fault: the client gets a 504 GatewayTimeoutError saying so, and the event records
    the same 504 and message as a ``deadline`` (no ``upstream_*`` class: miss attribution
    does not charge it to the pool). Scripted: the pool sends part of a body, then holds."""
    rid = request_id()
    scripted.scripts[rid] = Script(content_type="application/json", pieces=[b'{"id":'], hold=hold)
    r = _post(sidecar, rid, stream=False)
    assert r.status_code == 504
    error = orjson.loads(r.content)["error"]
    assert (error["type"], error["code"]) == ("GatewayTimeoutError", 504)
    assert "not whole within the lane's first_token_s (0.4 s)" in error["message"]
    ev = sidecar.event(rid)
    assert (ev["status"], ev["http_status"], ev["error_class"], ev["error_message"]) == (
        c.ERROR,
        504,
        "deadline",
        error["message"],
    )


def test_steady_stream_outlives_deadlines(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A stream that lasts several times idle_s and first_token_s, with every gap well under
    idle_s, is relayed whole: the idle timeout bounds silences, not the stream."""
    rid = request_id()
    pieces = [token_frame(f"t{i}") for i in range(20)] + [DONE_FRAME]
    scripted.scripts[rid] = Script(pieces=pieces, gap_s=IDLE_S / 8)
    r = _post(sidecar, rid, stream=True)
    assert r.content == b"".join(pieces)
    ev = sidecar.event(rid)
    assert (ev["status"], ev["completion_tokens"]) == (c.OK, 20)
    assert ev["e2e_ms"] > 2 * IDLE_S * 1000
