"""Outcomes in process: each way a request ends, the status or frame its client reads, and
the event's outcome and error class, which must say the same thing.

The pool is ``ScriptedUpstream`` (a fake, in this process): a real engine cannot be made to
send a 500, cut a body or break its stream on cue. The sidecar's own refusals need no pool.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import httpx
import orjson
import pytest

from obs import conventions as c
from obs.config import Auth
from tests.sidecar.conftest import InprocFactory
from tests.support import chat_body
from tests.support.inproc import InProcessSidecar, lane_config, request_id
from tests.support.probes import CHAT, DONE_FRAME, metric, stream_error
from tests.support.quick_ack import quick_ack_client
from tests.support.scripted_upstream import Script, ScriptedUpstream, sse_frame, token_frame

pytestmark = pytest.mark.inproc

MAX_BODY = 4096
JSON = "application/json"


def _error(code: int, type_: str) -> bytes:
    return orjson.dumps(_error_obj(code, type_))


def _error_frame(code: int, type_: str) -> bytes:
    return sse_frame(_error_obj(code, type_))


def _error_obj(code: int, type_: str) -> dict[str, dict[str, object]]:
    return {"error": {"message": "from the pool", "type": type_, "code": code}}


@dataclass(frozen=True)
class Case:
    """A pool's answer, and what the client and the event then say."""

    script: Script
    stream: bool
    status: int  # the client's HTTP status
    error: tuple[str, int] | None  # the error (type, code) the client reads, in body or frame
    outcome: str  # the event's status
    error_class: str | None


POOL_CASES = {
    "whole answer": Case(
        Script(content_type=JSON, pieces=[b'{"choices":[]}']), False, 200, None, c.OK, None
    ),
    "pool 500": Case(
        Script(500, JSON, [_error(500, "InternalServerError")]),
        False, 500, ("InternalServerError", 500), c.ERROR, "upstream_status",
    ),
    "pool 400": Case(
        Script(400, JSON, [_error(400, "BadRequestError")]),
        False, 400, ("BadRequestError", 400), c.CLIENT_ERROR, "upstream_status",
    ),
    "engine 503": Case(
        Script(503, JSON, [_error(503, "ServiceUnavailableError")]),
        False, 503, ("ServiceUnavailableError", 503), c.REJECTED, "admission",
    ),
    "whole body cut": Case(
        Script(content_type=JSON, pieces=[b'{"choi'], ending="cut"),
        False, 502, ("BadGatewayError", 502), c.ERROR, "upstream_protocol",
    ),
    "stream without [DONE]": Case(
        Script(pieces=[token_frame("a")]),
        True, 200, ("BadGatewayError", 502), c.ERROR, "upstream_protocol",
    ),
    "stream cut mid-frame": Case(
        Script(pieces=[token_frame("a"), b'data: {"id":'], ending="cut"),
        True, 200, ("BadGatewayError", 502), c.ERROR, "upstream_protocol",
    ),
    "pool error frame 4xx": Case(
        Script(pieces=[token_frame("a"), _error_frame(400, "BadRequestError"), DONE_FRAME]),
        True, 200, ("BadRequestError", 400), c.CLIENT_ERROR, "upstream_stream_error",
    ),
    "pool error frame 5xx": Case(
        Script(pieces=[token_frame("a"), _error_frame(500, "InternalServerError"), DONE_FRAME]),
        True, 200, ("InternalServerError", 500), c.ERROR, "upstream_stream_error",
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def sidecar(scripted: ScriptedUpstream, inproc: InprocFactory) -> InProcessSidecar:
    """An in-process sidecar taking request bodies of at most 4 KiB."""
    return inproc(lane_config({"main": [scripted.url]}), max_body_bytes=MAX_BODY)


def _client_error(r: httpx.Response, stream: bool) -> tuple[str, int] | None:
    """The (type, code) of the error the client read: the body's, or the stream's last."""
    if stream and b'"error"' in r.content:
        error = stream_error(r.content)
    elif not stream and r.status_code >= 400:
        error = orjson.loads(r.content)["error"]
    else:
        return None
    return error["type"], error["code"]


@pytest.mark.parametrize("name", list(POOL_CASES))
def test_pool_answer_outcome(
    name: str, scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """Each kind of pool answer: the client's status and error type agree with the event's
    outcome and error class (a 4xx is the client's, a 5xx or a broken answer an error)."""
    case, rid = POOL_CASES[name], request_id()
    scripted.scripts[rid] = case.script
    body = chat_body(rid, stream=case.stream)
    r = sidecar.client.post(CHAT, json=body, headers={"x-request-id": rid})
    assert r.status_code == case.status
    assert _client_error(r, case.stream) == case.error
    ev = sidecar.event(rid)
    assert (ev["status"], ev["error_class"]) == (case.outcome, case.error_class)
    if case.error is not None and not case.stream:
        assert ev["http_status"] == case.status


def test_sidecar_refusals(sidecar: InProcessSidecar) -> None:
    """The sidecar's own refusals, each an OpenAI-style error with its status, recorded as
    the client's (client_error, bad_request): a GET on a relayed route (405), a body over
    --max-body-bytes (413); an unrouted path is a 404 and no request of a pool."""
    get_id, big_id = request_id(), request_id()
    r = sidecar.client.get(CHAT, headers={"x-request-id": get_id})
    assert (r.status_code, r.json()["error"]["type"]) == (405, "MethodNotAllowedError")
    big = chat_body("x" * MAX_BODY)
    r = sidecar.client.post(CHAT, json=big, headers={"x-request-id": big_id})
    assert (r.status_code, r.json()["error"]["type"]) == (413, "PayloadTooLargeError")
    for rid in (get_id, big_id):
        ev = sidecar.event(rid)
        assert (ev["status"], ev["error_class"]) == (c.CLIENT_ERROR, "bad_request")
    r = sidecar.client.post("/v1/unknown", json={})
    assert (r.status_code, r.json()["error"]["type"]) == (404, "NotFoundError")


def test_unknown_key_unauthorized(scripted: ScriptedUpstream, inproc: InprocFactory) -> None:
    """With API keys configured, a request with another key gets 401 AuthenticationError,
    is recorded as unauthorized, and never reaches the pool."""
    keys = {"api_keys": [{"sha256": hashlib.sha256(b"right").hexdigest(), "tenant": "team"}]}
    config = lane_config({"main": [scripted.url]})
    config = config.model_copy(update={"auth": Auth.model_validate(keys)})
    sidecar, rid = inproc(config), request_id()
    headers = {"x-request-id": rid, "authorization": "Bearer wrong"}
    r = sidecar.client.post(CHAT, json=chat_body(rid), headers=headers)
    assert (r.status_code, r.json()["error"]["type"]) == (401, "AuthenticationError")
    ev = sidecar.event(rid)
    assert (ev["status"], ev["error_class"]) == (c.CLIENT_ERROR, "unauthorized")
    assert all(rid.encode() not in b for _, b in scripted.received)


def test_outcomes_counted(scripted: ScriptedUpstream, sidecar: InProcessSidecar) -> None:
    """Every finished request is counted once in /metrics under its event's outcome."""
    cases = [POOL_CASES[n] for n in ("whole answer", "pool 500", "pool 400", "engine 503")]
    before = {case.outcome: _requests(sidecar, case.outcome) for case in cases}
    for case in cases:
        rid = request_id()
        scripted.scripts[rid] = case.script
        sidecar.client.post(CHAT, json=chat_body(rid), headers={"x-request-id": rid})
        sidecar.event(rid)
    for case in cases:
        assert _requests(sidecar, case.outcome) == before[case.outcome] + 1


def _requests(sidecar: InProcessSidecar, outcome: str) -> float:
    return metric(sidecar.url, c.REQUESTS.name + "_total", outcome=outcome)


@pytest.mark.parametrize(("code", "outcome"), [(400, c.CLIENT_ERROR), (500, c.ERROR)])
def test_client_leaving_on_the_pools_error_frame_records_that_frame(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar, code: int, outcome: str
) -> None:
    """A client that closes on the pool's error frame (the openai SDK raises on it) before
    the pool ends its body: the event is the frame's outcome, not a client_disconnect."""
    rid = request_id()
    frame = _error_frame(code, "BadRequestError" if code == 400 else "InternalServerError")
    scripted.scripts[rid] = Script(pieces=[token_frame("x"), frame, DONE_FRAME], end_delay_s=2)
    body = chat_body(rid, stream=True)
    read = b""
    with (
        quick_ack_client(sidecar.url) as client,
        client.stream("POST", sidecar.url + CHAT, json=body, headers={"x-request-id": rid}) as r,
    ):
        for piece in r.iter_raw():
            read += piece
            if b'"error"' in read:
                break  # leave on the error, as the SDK does
    ev = sidecar.event(rid)
    assert (ev["status"], ev["error_class"]) == (outcome, "upstream_stream_error")
