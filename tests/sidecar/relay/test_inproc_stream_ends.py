"""Where a relayed stream ends. A completion's ends at ``[DONE]``, a response's at its last
event, a message's at ``message_stop``: one cut before that gets an error frame. A stream of
another relayed route (an operator's ``extra_routes``) ends where its pool's ends, and its
bytes go through untouched.

The pool is ``ScriptedUpstream`` (a fake, in this process): a cut stream is a precise fault,
and the other route's format is one no engine here writes."""

from __future__ import annotations

import httpx
import pytest

from tests.sidecar.conftest import InprocFactory
from tests.support.inproc import InProcessSidecar, lane_config, request_id
from tests.support.scripted_upstream import Script, ScriptedUpstream

CUSTOM = "/v1/custom/stream"
MESSAGE_FRAMES = [
    b'event: message_start\ndata: {"type":"message_start","message":{"usage":'
    b'{"input_tokens":3,"output_tokens":0}}}\n\n',
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"hi"}}\n\n',
]
MESSAGE_END = [
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
    b'"usage":{"output_tokens":1}}\n\n',
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
]


@pytest.fixture(scope="module")
def sidecar(scripted: ScriptedUpstream, inproc: InprocFactory) -> InProcessSidecar:
    """One lane on the scripted pool; ``CUSTOM`` relayed too."""
    return inproc(lane_config({"main": [scripted.url]}), extra_routes=(CUSTOM,))


def _post(sidecar: InProcessSidecar, path: str, rid: str) -> httpx.Response:
    body = {"model": "tiny", "max_tokens": 4, "stream": True, "messages": []}
    url = f"http://127.0.0.1:{sidecar.port}{path}"
    return httpx.post(url, json=body, headers={"x-request-id": rid}, timeout=10)


def test_a_whole_message_stream_is_relayed_byte_for_byte(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """Ending at ``message_stop``: the client gets the pool's bytes, the event is ok."""
    rid = request_id()
    scripted.scripts[rid] = Script(pieces=MESSAGE_FRAMES + MESSAGE_END)
    r = _post(sidecar, "/v1/messages", rid)
    assert r.content == b"".join(MESSAGE_FRAMES + MESSAGE_END)
    ev = sidecar.event(rid)
    assert (ev["status"], ev["completion_tokens"], ev["finish_reason"]) == ("ok", 1, "stop")


def test_a_message_stream_cut_before_message_stop_ends_with_an_error_frame(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """The pool's chunked body ended cleanly, but before ``message_stop``: the frames it sent,
    then the relay's error frame; the event says the pool broke its protocol."""
    rid = request_id()
    scripted.scripts[rid] = Script(pieces=MESSAGE_FRAMES)
    r = _post(sidecar, "/v1/messages", rid)
    assert r.content.startswith(b"".join(MESSAGE_FRAMES))
    assert b"without its last frame" in r.content[len(b"".join(MESSAGE_FRAMES)) :]
    ev = sidecar.event(rid)
    assert (ev["status"], ev["error_class"]) == ("error", "upstream_protocol")


def test_another_routes_stream_ends_where_its_pool_ends(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A stream whose format the sidecar does not know, without ``[DONE]``: relayed as it
    came, nothing added, and recorded as ok."""
    rid = request_id()
    frames = [b"event: tick\ndata: 1\n\n", b'id: 2\ndata: {"n": 2}\n\n']
    scripted.scripts[rid] = Script(pieces=frames)
    r = _post(sidecar, CUSTOM, rid)
    assert r.content == b"".join(frames)
    assert sidecar.event(rid)["status"] == "ok"
