"""Failover in process: a busy replica's 503 sent on to the pool's other replica, a replica
that refuses connections passed over, a pool with none left, and a lane's fallback pool.

Two scripted pools (``ScriptedUpstream``, fakes in this process) answer as replicas, so a
test chooses which one refuses which request; a port nothing listens on is a dead replica.
Failover between real engines (one killed, one frozen) is in test_faults_replica.py.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import orjson
import pytest

from obs import conventions as c
from tests.sidecar.conftest import InprocFactory
from tests.support import chat_body
from tests.support.inproc import InProcessSidecar, lane_config, request_id
from tests.support.probes import CHAT, DONE_FRAME, metric, refused_url, stream_error
from tests.support.scripted_upstream import Script, ScriptedUpstream, token_frame

STREAM = [token_frame("a"), token_frame(" b", "stop"), DONE_FRAME]
BUSY = orjson.dumps({"error": {"message": "busy", "type": "ServiceUnavailable", "code": 503}})
FIRST_TOKEN_S = 0.4


@pytest.fixture(scope="module")
def silent() -> Iterator[str]:
    """A pool's URL that accepts connections and never answers (it listens, never accepts)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


@pytest.fixture(scope="module")
def dead() -> Iterator[str]:
    """A replica's URL that refuses connections while the module runs."""
    with refused_url() as url:
        yield url


@pytest.fixture(scope="module")
def second() -> Iterator[ScriptedUpstream]:
    """A second scripted replica beside the module's ``scripted`` one."""
    with ScriptedUpstream() as fake:
        yield fake


def _lane(name: str, pool: str, **fields: object) -> dict[str, object]:
    return {"name": name, "pool": pool, "match": [{"header": {"x-lane": name}}], **fields}


@pytest.fixture(scope="module")
def sidecar(
    scripted: ScriptedUpstream,
    second: ScriptedUpstream,
    silent: str,
    dead: str,
    inproc: InprocFactory,
) -> InProcessSidecar:
    """Lanes by the x-lane header: ``main`` on two live replicas, ``half`` on a dead and a
    live one, ``down`` on a dead one, ``fb`` on one replica falling back to the other,
    ``hush`` on a silent pool falling back after 0.4 s without a first token."""
    pools = {
        "pair": [scripted.url, second.url],
        "half": [dead, second.url],
        "down": [dead],
        "solo": [scripted.url],
        "spare": [second.url],
        "silent": [silent],
    }
    extra = [
        _lane("half", "half"),
        _lane("down", "down"),
        _lane("fb", "solo", fallback="spare"),
        _lane("hush", "silent", fallback="spare", timeouts={"first_token_s": FIRST_TOKEN_S}),
    ]
    return inproc(lane_config(pools, *extra))


def _post(sidecar: InProcessSidecar, rid: str, lane: str = "main") -> httpx.Response:
    headers = {"x-request-id": rid, "x-lane": lane}
    return sidecar.client.post(CHAT, json=chat_body(rid, stream=True), headers=headers)


def _reached(upstream: ScriptedUpstream, rid: str) -> bool:
    return any(rid.encode() in body for _, body in upstream.received)


def test_busy_replica_fails_over(
    scripted: ScriptedUpstream, second: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A replica that sheds the request with vLLM's 503: the other replica of the pool
    answers, and the client sees only its stream."""
    rid = request_id()
    scripted.scripts[rid] = Script(status=503, content_type="application/json", pieces=[BUSY])
    second.scripts[rid] = Script(pieces=STREAM)
    r = _post(sidecar, rid)
    assert r.status_code == 200
    assert r.content == b"".join(STREAM)
    assert _reached(scripted, rid) and _reached(second, rid)
    ev = sidecar.event(rid)
    assert (ev["status"], ev["replica"], ev["pool"]) == (c.OK, second.url, "pair")


def test_both_replicas_busy(
    scripted: ScriptedUpstream, second: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """When both replicas shed the request, the last one's 503 reaches the client as it
    came, recorded as the engine's own refusal (rejected, engine_queue_full)."""
    rid = request_id()
    for upstream in (scripted, second):
        upstream.scripts[rid] = Script(status=503, content_type="application/json", pieces=[BUSY])
    r = _post(sidecar, rid)
    assert (r.status_code, r.content) == (503, BUSY)
    ev = sidecar.event(rid)
    assert (ev["status"], ev["rejection_reason"], ev["replica"]) == (
        c.REJECTED,
        c.ENGINE_QUEUE_FULL,
        second.url,
    )


def test_dead_replica_passed_over(
    second: ScriptedUpstream, sidecar: InProcessSidecar, dead: str
) -> None:
    """A pool with a replica that refuses connections serves the request from its live
    replica, and /health reports the dead one down."""
    rid = request_id()
    second.scripts[rid] = Script(pieces=STREAM)
    r = _post(sidecar, rid, "half")
    assert (r.status_code, r.content) == (200, b"".join(STREAM))
    assert sidecar.event(rid)["replica"] == second.url
    health = sidecar.client.get("/health").json()
    assert health["pools"]["half"] == {dead: False, second.url: True}


def test_pool_without_replicas_unavailable(sidecar: InProcessSidecar) -> None:
    """A pool none of whose replicas accepts a connection: 503 ServiceUnavailableError with
    Retry-After, recorded as an error (it counts against the SLO) with pool_unavailable."""
    rid = request_id()
    r = _post(sidecar, rid, "down")
    assert r.status_code == 503
    assert r.headers["retry-after"] == "1"
    assert orjson.loads(r.content)["error"]["type"] == "ServiceUnavailableError"
    ev = sidecar.event(rid)
    assert (ev["status"], ev["error_class"], ev["rejection_reason"]) == (
        c.ERROR,
        "upstream_connect",
        c.POOL_UNAVAILABLE,
    )


def test_lane_falls_back_to_other_pool(
    scripted: ScriptedUpstream, second: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A pool answering 500 before anything reached the client: the lane's fallback pool
    answers, and the event names both pools and why."""
    rid = request_id()
    failed = b'{"error":{"message":"boom","type":"InternalServerError","code":500}}'
    scripted.scripts[rid] = Script(status=500, content_type="application/json", pieces=[failed])
    second.scripts[rid] = Script(pieces=STREAM)
    r = _post(sidecar, rid, "fb")
    assert (r.status_code, r.content) == (200, b"".join(STREAM))
    ev = sidecar.event(rid)
    assert (ev["status"], ev["pool"], ev["fallback_from"], ev["fallback_reason"]) == (
        c.OK,
        "spare",
        "solo",
        c.FALLBACK_SERVER_ERROR,
    )


def test_silent_pool_falls_back_after_first_token_deadline(
    second: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A pool that takes the connection and never answers: after first_token_s the lane's
    fallback answers, and the wait on the silent pool is recorded as queueing."""
    rid = request_id()
    second.scripts[rid] = Script(pieces=STREAM)
    r = _post(sidecar, rid, "hush")
    assert (r.status_code, r.content) == (200, b"".join(STREAM))
    ev = sidecar.event(rid)
    assert (ev["status"], ev["fallback_from"], ev["fallback_reason"]) == (
        c.OK,
        "silent",
        c.FALLBACK_TIMEOUT,
    )
    assert ev["queue_ms"] >= FIRST_TOKEN_S * 1000 - 1  # the loop's timer may fire 0.1 ms early


def test_a_non_streamed_timeout_never_falls_back(
    second: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A non-streamed request past first_token_s on the silent pool is the lane's deadline: a
    504 recorded as ``deadline``, and the fallback pool is never asked (before: both pools
    generated it, and the event blamed the first pool as ``upstream_timeout``)."""
    rid = request_id()
    second.scripts[rid] = Script(pieces=STREAM)
    headers = {"x-request-id": rid, "x-lane": "hush"}
    r = sidecar.client.post(CHAT, json=chat_body(rid, stream=False), headers=headers)
    assert r.status_code == 504, r.text
    ev = sidecar.event(rid)
    assert (ev["error_class"], ev["fallback_from"], ev["pool"]) == ("deadline", None, "silent")
    assert not _reached(second, rid)


def test_started_stream_never_falls_back(
    scripted: ScriptedUpstream, second: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A stream cut after its first token ends with an error frame; the fallback pool is
    never asked (a client must not get two answers)."""
    rid = request_id()
    scripted.scripts[rid] = Script(pieces=[STREAM[0]], ending="cut")
    second.scripts[rid] = Script(pieces=STREAM)
    fallbacks = metric(sidecar.url, c.FALLBACKS.name + "_total")
    r = _post(sidecar, rid, "fb")
    assert r.status_code == 200
    assert r.content.startswith(STREAM[0])
    assert stream_error(r.content)["code"] == 502
    ev = sidecar.event(rid)
    assert (ev["status"], ev["pool"], ev["fallback_from"]) == (c.ERROR, "solo", None)
    assert not _reached(second, rid)
    assert metric(sidecar.url, c.FALLBACKS.name + "_total") == fallbacks
