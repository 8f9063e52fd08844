"""Streaming in process: the usage the sidecar asks the pool for and strips again, and a
client that leaves mid-stream.

The pool is ``ScriptedUpstream`` (a fake, in this process): it records what the sidecar
sent it and when the sidecar hung up, which a real engine does not show a test; the same
paths against a real vLLM are in test_sidecar_vllm.py and test_faults_sidecar.py.
"""

from __future__ import annotations

import threading

import openai
import orjson
import pytest

from obs import conventions as c
from tests.sidecar.conftest import InprocFactory
from tests.support import chat_body
from tests.support.inproc import InProcessSidecar, lane_config, request_id
from tests.support.probes import CHAT, DONE_FRAME, wait_for
from tests.support.quick_ack import quick_ack_client
from tests.support.scripted_upstream import Script, ScriptedUpstream, token_frame, usage_frame

TOKENS = [token_frame("a"), token_frame(" b"), token_frame(" c", "stop")]


@pytest.fixture(scope="module")
def sidecar(scripted: ScriptedUpstream, inproc: InprocFactory) -> InProcessSidecar:
    """One in-process sidecar in front of the module's scripted pool."""
    return inproc(lane_config({"main": [scripted.url]}))


def _sent(scripted: ScriptedUpstream, rid: str) -> dict[str, object]:
    """The body the pool received for the request scripted under ``rid``."""
    bodies = [body for _, body in scripted.received if rid.encode() in body]
    assert len(bodies) == 1, f"{len(bodies)} requests reached the pool"
    result: dict[str, object] = orjson.loads(bodies[0])
    return result


def test_usage_injected_and_stripped(scripted: ScriptedUpstream, sidecar: InProcessSidecar) -> None:
    """A stream that did not ask for usage: the pool is asked for it, the client never sees
    the usage frame, and the event's token counts are the pool's."""
    rid = request_id()
    scripted.scripts[rid] = Script(pieces=[*TOKENS, usage_frame(7, 3), DONE_FRAME])
    body = chat_body(rid, stream=True)
    r = sidecar.client.post(CHAT, json=body, headers={"x-request-id": rid})
    assert r.status_code == 200
    assert r.content == b"".join([*TOKENS, DONE_FRAME])
    sent = _sent(scripted, rid)["stream_options"]
    assert sent == {"include_usage": True, "continuous_usage_stats": False}
    ev = sidecar.event(rid)
    assert (ev["status"], ev["usage_injected"]) == (c.OK, True)
    assert (ev["prompt_tokens"], ev["completion_tokens"]) == (7, 3)


def test_continuous_usage_without_usage_turned_off(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A client's ``continuous_usage_stats`` without usage (which gives it no usage at all) is
    turned off where the sidecar asks for usage, and the client still gets no usage frame."""
    rid = request_id()
    scripted.scripts[rid] = Script(pieces=[*TOKENS, usage_frame(7, 3), DONE_FRAME])
    body = chat_body(rid, stream=True, stream_options={"continuous_usage_stats": True})
    r = sidecar.client.post(CHAT, json=body, headers={"x-request-id": rid})
    assert r.content == b"".join([*TOKENS, DONE_FRAME])
    sent = _sent(scripted, rid)["stream_options"]
    assert sent == {"continuous_usage_stats": False, "include_usage": True}
    assert sidecar.event(rid)["completion_tokens"] == 3


def test_several_choices_not_injected(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A stream asking for several choices reaches the pool unchanged (no usage injected):
    the tokens are counted from the frames instead."""
    rid = request_id()
    scripted.scripts[rid] = Script(pieces=[*TOKENS, DONE_FRAME])
    raw = orjson.dumps(chat_body(rid, stream=True, n=2))
    headers = {"x-request-id": rid, "content-type": "application/json"}
    r = sidecar.client.post(CHAT, content=raw, headers=headers)
    assert r.content == b"".join([*TOKENS, DONE_FRAME])
    assert (CHAT, raw) in scripted.received
    ev = sidecar.event(rid)
    assert (ev["usage_injected"], ev["completion_tokens"], ev["tokens_source"]) == (
        False,
        3,
        "counted",
    )


def test_client_disconnect_mid_stream(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A client that leaves mid-stream: the sidecar hangs up on the pool (vLLM then aborts
    the request), gives the lane slot back and records a client_disconnect in decode."""
    rid = request_id()
    scripted.scripts[rid] = Script(pieces=[token_frame("x")] * 400, gap_s=0.01)
    body = chat_body(rid, stream=True)
    with (
        quick_ack_client(sidecar.url) as client,
        client.stream("POST", sidecar.url + CHAT, json=body, headers={"x-request-id": rid}) as r,
    ):
        first = next(r.iter_raw())
    assert first.startswith(b"data: ")
    ev = sidecar.event(rid)
    assert (ev["status"], ev["error_class"], ev["error_phase"]) == (
        c.DISCONNECTED,
        "client_disconnect",
        "decode",
    )
    assert 0 < ev["completion_tokens"] < 400
    wait_for("the sidecar to hang up on the pool", lambda: rid in scripted.cut_off, 10, 0.01)
    in_flight = sidecar.samples()[c.IN_FLIGHT.name]
    assert in_flight == [({"lane": "main"}, 0.0)]


def test_openai_client_closing_after_done_is_ok(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """The openai SDK reads to [DONE] and closes while the pool's body is still open: a
    delivered stream (ok, the pool's usage counts), not a client that left."""
    rid, hold = request_id(), threading.Event()
    scripted.scripts[rid] = Script(pieces=[*TOKENS, usage_frame(7, 3), DONE_FRAME], hold=hold)
    client = openai.OpenAI(base_url=sidecar.url + "/v1", api_key="unused", max_retries=0)
    try:
        with client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": rid}],
            stream=True,
            extra_headers={"x-request-id": rid},
            timeout=10,
        ) as chunks:
            text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    finally:
        hold.set()
        client.close()
    assert text == "a b c"
    ev = sidecar.event(rid)
    assert (ev["status"], ev["error_class"], ev["completion_tokens"]) == (c.OK, None, 3)
    assert ev["tokens_source"] == c.TOKENS_FROM_USAGE
