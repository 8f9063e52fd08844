"""The record tells the truth where only a precise fault shows it (scripted pool), with the
sidecar in the test process (tests/support/inproc.py).

A real vLLM sends these cases only now and then (a loaded API server delivering a
whole answer in one read, a client closing between ``[DONE]`` and the body's last
chunk), so each is scripted here read by read with ``ScriptedUpstream`` to make it
happen every time. ``test_record_truth_vllm`` covers the same rules on a real engine.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from typing import Any

import httpx
import pytest

from obs import conventions as c
from tests.sidecar.conftest import InprocFactory
from tests.support.inproc import InProcessSidecar, lane_config
from tests.support.probes import DONE_FRAME, frame_json, metric, sse_frames
from tests.support.scripted_upstream import Script, ScriptedUpstream

pytestmark = pytest.mark.inproc

CHAT = "/v1/chat/completions"
FP = "vllm-0.32.0-ce866d06"


def frame(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def chunk(content: str, finish: str | None = None) -> bytes:
    """A vLLM chat token frame (as in the reference capture)."""
    choice = {"index": 0, "delta": {"content": content}, "logprobs": None, "finish_reason": finish}
    return frame({"id": "chatcmpl-x", "object": "chat.completion.chunk", "choices": [choice]})


def usage_frame(prompt: int, completion: int) -> bytes:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    return frame({"id": "chatcmpl-x", "choices": [], "usage": usage, "system_fingerprint": FP})


def answer(tokens: int) -> list[bytes]:
    """A whole streamed answer of ``tokens`` tokens with usage, as vLLM sends it."""
    body = [chunk("a") for _ in range(tokens - 1)] + [chunk("a", "length")]
    return [*body, usage_frame(5, tokens), DONE_FRAME]


def sidecar(inproc: InprocFactory, pool: ScriptedUpstream, **timeouts: float) -> InProcessSidecar:
    """A sidecar of its own (fresh /metrics) before the scripted pool (the module's
    ``scripted``: no real vLLM can be made to send these cases on demand)."""
    lane = {"timeouts": timeouts} if timeouts else {}
    return inproc(lane_config({"main": [pool.url]}, **lane))


def stream(sc: InProcessSidecar, rid: str, **extra: Any) -> httpx.Response:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": True}
    return sc.client.post(CHAT, json={**body, **extra}, headers={"X-Request-Id": rid}, timeout=30)


def test_client_closing_after_done_is_a_delivered_stream(
    scripted: ScriptedUpstream, inproc: InprocFactory
) -> None:
    """A client that closes after reading [DONE] (as the openai SDK does) got it all: ok."""
    sc = sidecar(inproc, scripted)
    rid = uuid.uuid4().hex
    # The pool ends its body 1 s after [DONE]: the client is long gone by then.
    scripted.scripts[rid] = Script(pieces=answer(4), end_delay_s=1.0)
    raw = (
        f"POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"x-request-id: {rid}\r\ncontent-length: {{n}}\r\n\r\n"
    )
    body = json.dumps({"model": "tiny", "messages": [], "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", sc.port), timeout=10) as s:
        s.sendall(raw.format(n=len(body)).encode() + body)
        got = b""
        while DONE_FRAME not in got:
            got += s.recv(65536)
    ev = sc.event(rid)
    assert (ev["status"], ev["error_class"], ev["http_status"]) == (c.OK, None, 200)
    assert (ev["completion_tokens"], ev["tokens_source"]) == (4, c.TOKENS_FROM_USAGE)


def test_answer_in_one_read_has_no_cadence(
    scripted: ScriptedUpstream, inproc: InprocFactory
) -> None:
    """A whole answer in one read: TPOT and ITL null, the burst flagged, no histogram sample."""
    sc = sidecar(inproc, scripted)
    spread, burst = uuid.uuid4().hex, uuid.uuid4().hex
    scripted.scripts[spread] = Script(pieces=answer(6), gap_s=0.05)
    scripted.scripts[burst] = Script(pieces=answer(6), burst=True)
    assert stream(sc, spread).status_code == 200
    ev = sc.event(spread)
    assert ev["burst_chunks"] == 1 and ev["tpot_ms"] > 0 and ev["itl_p50_ms"] > 0
    tpot_before = metric(sc.url, c.TPOT.series[2])
    itl_before = metric(sc.url, c.ITL.series[2])
    assert stream(sc, burst).status_code == 200
    ev = sc.event(burst)
    assert ev["burst_chunks"] == 6 and ev["output_chunks"] == 6
    assert ev["tpot_ms"] is None and ev["itl_p50_ms"] is None and ev["itl_max_ms"] is None
    assert ev["completion_tokens"] == 6 and ev["ttft_ms"] is not None
    assert metric(sc.url, c.TPOT.series[2]) == tpot_before
    assert metric(sc.url, c.ITL.series[2]) == itl_before


def test_streamed_error_reply_is_no_first_token(
    scripted: ScriptedUpstream, inproc: InprocFactory
) -> None:
    """A 5xx JSON body to a streamed request: no TTFT, no output chunk, no TTFT sample."""
    sc = sidecar(inproc, scripted)
    rid = uuid.uuid4().hex
    err = b'{"error":{"message":"boom","type":"InternalServerError","code":500}}'
    scripted.scripts[rid] = Script(status=500, content_type="application/json", pieces=[err])
    ttft_before = metric(sc.url, c.TTFT.series[2])
    r = stream(sc, rid)
    assert (r.status_code, r.content) == (500, err)
    ev = sc.event(rid)
    assert (ev["status"], ev["ttft_ms"], ev["tpot_ms"], ev["output_chunks"]) == (
        c.ERROR,
        None,
        None,
        0,
    )
    assert metric(sc.url, c.TTFT.series[2]) == ttft_before


def test_a_request_sent_slowly_is_upload_not_queue(
    scripted: ScriptedUpstream, inproc: InprocFactory
) -> None:
    """Time between the request's first bytes and its last is the client's upload
    (``upload_ms``), not the queue: the queue phase starts when the request is complete."""
    sc = sidecar(inproc, scripted)
    rid = uuid.uuid4().hex
    scripted.scripts[rid] = Script(pieces=answer(2))
    body = json.dumps({"model": "tiny", "messages": [], "stream": True}).encode()
    head = (
        f"host: x\r\ncontent-type: application/json\r\nx-request-id: {rid}\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", sc.port), timeout=10) as s:
        s.sendall(f"POST {CHAT} HTTP/1.1\r\n".encode())  # the request has begun
        time.sleep(0.4)
        s.sendall(head + body)
        while s.recv(65536):
            pass
    ev = sc.event(rid)
    # The request was complete 0.4 s after its first bytes (on a busy machine the read of
    # those bytes can itself come a little late, hence 350).
    assert ev["upload_ms"] >= 350
    assert ev["queue_ms"] <= ev["e2e_ms"] < ev["upload_ms"]  # the upload is in neither
    assert metric(sc.url, c.EVENT_LOOP_LAG.series[2]) > 0  # the loop's lag is sampled too


def test_stream_silent_past_idle_s_ends_with_a_504_frame(
    scripted: ScriptedUpstream, inproc: InprocFactory
) -> None:
    """A pool silent mid-stream past idle_s: the client's error frame is the 504 the event says.

    Scripted: a real vLLM goes silent mid-stream only when frozen, for an unpredictable while.
    """
    sc = sidecar(inproc, scripted, first_token_s=30, idle_s=0.5)
    rid = uuid.uuid4().hex
    scripted.scripts[rid] = Script(pieces=[chunk("a"), chunk("")], end_delay_s=5)
    r = stream(sc, rid)
    frames = sse_frames(r.content)
    assert r.status_code == 200 and frames[-1] + b"\n\n" == DONE_FRAME
    err = frame_json(frames[-2])["error"]
    assert (err["type"], err["code"]) == ("GatewayTimeoutError", 504)
    ev = sc.event(rid)
    assert (ev["status"], ev["error_class"], ev["error_phase"]) == (
        c.ERROR,
        "upstream_timeout",
        "decode",
    )
    assert (ev["completion_tokens"], ev["tokens_source"]) == (2, c.TOKENS_COUNTED)


@pytest.mark.parametrize(("code", "status"), [(400, c.CLIENT_ERROR), (500, c.ERROR)])
def test_error_frame_is_the_clients_or_the_pools_by_its_code(
    scripted: ScriptedUpstream, inproc: InprocFactory, code: int, status: str
) -> None:
    """An error frame inside a stream: a 4xx code is the client's mistake, a 5xx the pool's.

    Scripted for the 5xx: no real vLLM fails inside a stream on demand (its 4xx frame is
    pinned on the real engine in test_record_tokens_vllm).
    """
    sc = sidecar(inproc, scripted)
    rid = uuid.uuid4().hex
    err = frame({"error": {"message": "no", "type": "E", "param": None, "code": code}})
    scripted.scripts[rid] = Script(pieces=[chunk("a"), err, DONE_FRAME])
    r = stream(sc, rid)
    assert r.status_code == 200 and err in r.content
    ev = sc.event(rid)
    assert (ev["status"], ev["error_class"]) == (status, "upstream_stream_error")
    assert metric(sc.url, c.REQUESTS.series[0], outcome=status) == 1
