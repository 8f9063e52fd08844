"""The relay in process: what the pool sends reaches the client byte for byte, whole or
streamed, and what the client sends reaches the pool as sent.

The pool is ``ScriptedUpstream`` (a fake, in this process): these tests pin the relay's
bytes against a known answer, which a real engine's sampled text cannot give; the same
paths against a real vLLM are in test_sidecar_vllm.py.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import pytest

from obs import conventions as c
from obs.procs import free_port
from tests.sidecar.conftest import InprocFactory
from tests.support import chat_body
from tests.support.inproc import InProcessSidecar, lane_config, request_id
from tests.support.probes import CHAT, COMPLETIONS, DONE_FRAME
from tests.support.scripted_upstream import (
    Script,
    ScriptedUpstream,
    chunk_frame,
    token_frame,
    usage_frame,
)

COMPLETION = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "tiny",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "a b c"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }
)
STREAM = [
    chunk_frame({"delta": {"role": "assistant", "content": ""}, "finish_reason": None}),
    token_frame("a"),
    token_frame(" b\u00e9"),
    token_frame(" c", "stop"),
]


@pytest.fixture(scope="module")
def sidecar(scripted: ScriptedUpstream, inproc: InprocFactory) -> InProcessSidecar:
    """One in-process sidecar in front of the module's scripted pool."""
    return inproc(lane_config({"main": [scripted.url]}))


def test_whole_answer_relayed_byte_for_byte(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A non-streamed answer reaches the client as the pool sent it (bytes, status, type)."""
    rid = request_id()
    scripted.scripts[rid] = Script(
        content_type="application/json", pieces=[COMPLETION[:40], COMPLETION[40:]]
    )
    r = sidecar.client.post(CHAT, json=chat_body(), headers={"x-request-id": rid})
    assert r.status_code == 200
    assert r.content == COMPLETION
    assert r.headers["content-type"] == "application/json"
    assert r.headers["x-request-id"] == rid
    ev = sidecar.event(rid)
    assert (ev["status"], ev["http_status"], ev["stream"]) == (c.OK, 200, False)
    assert (ev["prompt_tokens"], ev["completion_tokens"]) == (5, 3)


def test_stream_relayed_byte_for_byte(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A stream whose client asked for usage itself reaches the client frame for frame,
    the usage frame included, under the request's id (the pool sent none), and its token
    counts are the usage frame's."""
    rid = request_id()
    pieces = [*STREAM, usage_frame(5, 3), DONE_FRAME]
    scripted.scripts[rid] = Script(pieces=pieces)
    body = chat_body(stream=True, stream_options={"include_usage": True})
    r = sidecar.client.post(CHAT, json=body, headers={"x-request-id": rid})
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream"
    assert r.headers["x-request-id"] == rid
    assert r.content == b"".join(pieces)
    ev = sidecar.event(rid)
    assert (ev["status"], ev["usage_injected"]) == (c.OK, False)
    assert (ev["prompt_tokens"], ev["completion_tokens"], ev["output_chunks"]) == (5, 3, 3)


def test_stream_read_in_one_burst_relayed_whole(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A stream whose frames the sidecar reads all at once is relayed whole and recorded
    without a cadence (one read gives no inter-token gap)."""
    rid = request_id()
    pieces = [*STREAM, usage_frame(5, 3), DONE_FRAME]
    scripted.scripts[rid] = Script(pieces=pieces, burst=True)
    body = chat_body(stream=True, stream_options={"include_usage": True})
    r = sidecar.client.post(CHAT, json=body, headers={"x-request-id": rid})
    assert r.content == b"".join(pieces)
    ev = sidecar.event(rid)
    assert ev["status"] == c.OK
    assert ev["burst_chunks"] == 3
    assert ev["itl_p50_ms"] is None


def test_request_body_reaches_pool_as_sent(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A request the sidecar need not change (not a stream) reaches the pool byte for byte,
    odd spacing and key order included, on the route the client named."""
    rid = request_id()
    raw = b'{"prompt":  "x",\n "model": "tiny", "max_tokens": 2, "temperature": 0}'
    scripted.scripts[rid] = Script(content_type="application/json", pieces=[b'{"choices":[]}'])
    r = sidecar.client.post(
        COMPLETIONS,
        content=raw,
        headers={"x-request-id": rid, "content-type": "application/json"},
    )
    assert r.status_code == 200
    assert (COMPLETIONS, raw) in scripted.received
    assert sidecar.event(rid)["route"] == COMPLETIONS


def test_streams_share_one_sidecar(scripted: ScriptedUpstream, sidecar: InProcessSidecar) -> None:
    """Concurrent streams on one sidecar each get their own pool answer, none mixed up."""
    rids = [request_id() for _ in range(8)]
    for n, rid in enumerate(rids):
        scripted.scripts[rid] = Script(
            pieces=[token_frame(f"t{n}-{i}") for i in range(5)] + [DONE_FRAME], gap_s=0.01
        )
    body = chat_body(stream=True, stream_options={"include_usage": True})
    limits = httpx.Limits(max_connections=8)
    with httpx.Client(base_url=sidecar.url, limits=limits) as client, ThreadPoolExecutor(8) as ex:
        answers = list(
            ex.map(lambda rid: client.post(CHAT, json=body, headers={"x-request-id": rid}), rids)
        )
    for rid, r in zip(rids, answers, strict=True):
        assert r.content == b"".join(scripted.scripts[rid].pieces)
        assert sidecar.event(rid)["completion_tokens"] == 5


def test_large_body_relayed_as_sent(scripted: ScriptedUpstream, sidecar: InProcessSidecar) -> None:
    """A body past the size parsed on the event loop (300 KB of prompt) is parsed off it and
    still reaches the pool byte for byte."""
    rid = request_id()
    raw = orjson.dumps(chat_body(rid + " " + "word " * 60_000))
    scripted.scripts[rid] = Script(content_type="application/json", pieces=[COMPLETION])
    headers = {"x-request-id": rid, "content-type": "application/json"}
    r = sidecar.client.post(CHAT, content=raw, headers=headers)
    assert (r.status_code, r.content) == (200, COMPLETION)
    assert (CHAT, raw) in scripted.received
    assert sidecar.event(rid)["status"] == c.OK


def test_body_over_json_element_cap_refused(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A large body holding more JSON values than --max-json-elements (200,000) is refused
    with 413 before it is parsed, and never reaches the pool."""
    rid = request_id()
    raw = orjson.dumps({**chat_body(rid), "logit_bias": [0] * 250_000})
    headers = {"x-request-id": rid, "content-type": "application/json"}
    r = sidecar.client.post(CHAT, content=raw, headers=headers)
    assert (r.status_code, r.json()["error"]["type"]) == (413, "PayloadTooLargeError")
    ev = sidecar.event(rid)
    assert (ev["status"], ev["error_class"]) == (c.CLIENT_ERROR, "bad_request")
    assert all(rid.encode() not in body for _, body in scripted.received)


def test_prefix_fingerprint_on_sent_and_unsent_requests(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar, inproc: InprocFactory
) -> None:
    """A generate request's event carries its prompt's prefix fingerprint whether the request
    reached its pool or ended never sent (no replica accepted a connection): the same
    prompt the same value, another prompt another."""
    dead = inproc(lane_config({"main": [f"http://127.0.0.1:{free_port()}"]}))
    prints = {}
    for name, sc, text in [
        ("sent", sidecar, "one"),
        ("unsent", dead, "one"),
        ("other", sidecar, "two"),
    ]:
        rid = request_id()
        scripted.scripts[rid] = Script(pieces=[*STREAM, DONE_FRAME])
        r = sc.client.post(CHAT, json=chat_body(text, stream=True), headers={"x-request-id": rid})
        assert (r.status_code == 200) == (name != "unsent")
        prints[name] = sc.event(rid)["prefix_fingerprint"]
    assert prints["sent"] == prints["unsent"]
    assert prints["other"] != prints["sent"]
    assert all(isinstance(v, str) and len(v) == 16 for v in prints.values())
