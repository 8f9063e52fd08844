"""A finished request leaves no reference cycle: its objects go with their last reference.

Under load a request whose objects form a cycle is freed only by the cycle collector: every
request's graph (request, pool response, stream sink, deadline, client connection, exchange)
then waits in the young generation, is traversed, promoted and traversed again (23-40 µs of
CPU per short stream at 64 streams, ~35 objects: ``bench.collector_cost``). With the collector
off, nothing of a finished request may stay alive, however it ended. The pool is
``ScriptedUpstream`` (a fake in this process: the test counts this process's objects).
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from obs import conventions as c
from obs.sidecar.pools.upstream import Response
from obs.sidecar.relay.deadline import Deadline
from obs.sidecar.relay.request import Request
from obs.sidecar.relay.streaming import StreamSink
from obs.sidecar.server.client import ClientConn
from tests.sidecar.conftest import InprocFactory
from tests.support import chat_body
from tests.support.inproc import InProcessSidecar, lane_config, request_id
from tests.support.probes import CHAT, DONE_FRAME
from tests.support.scripted_upstream import Script, ScriptedUpstream, token_frame, usage_frame

PER_REQUEST = (Request, Response, StreamSink, Deadline, ClientConn)
REQUESTS = 6


@pytest.fixture(scope="module")
def sidecar(scripted: ScriptedUpstream, inproc: InprocFactory) -> InProcessSidecar:
    """One in-process sidecar in front of the module's scripted pool."""
    return inproc(lane_config({"main": [scripted.url]}))


@pytest.fixture
def no_collector() -> Iterator[None]:
    """The cycle collector off for the test (what it would free stays countable)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


def _alive(sidecar: InProcessSidecar) -> Counter[str]:
    """The request objects alive, counted on the sidecar's loop between its callbacks: from the
    test's thread, ``gc.get_objects()`` could count a request whose handler was still ending,
    and could hold a tuple the loop's thread was building (CPython then raises SystemError in
    that thread: ``_PyTuple_Resize`` of a tuple with two references)."""
    kinds = {id(k): k.__name__ for k in PER_REQUEST}

    def count() -> Counter[str]:
        return Counter(kinds[id(type(o))] for o in gc.get_objects() if id(type(o)) in kinds)

    return sidecar.on_loop(count)


def _ok(scripted: ScriptedUpstream, sidecar: InProcessSidecar, i: int) -> None:
    rid, stream = request_id(), i % 2 == 0
    pieces = [token_frame("a"), token_frame(" b", "stop"), usage_frame(5, 2), DONE_FRAME]
    if stream:
        scripted.scripts[rid] = Script(pieces=pieces)
    else:
        scripted.scripts[rid] = Script(content_type="application/json", pieces=[b"{}"])
    r = sidecar.client.post(CHAT, json=chat_body(stream=stream), headers={"x-request-id": rid})
    assert r.status_code == 200
    assert sidecar.event(rid)["http_status"] == 200


def _bad_body(scripted: ScriptedUpstream, sidecar: InProcessSidecar, i: int) -> None:
    rid = request_id()  # refused before a pool: the outcome is raised, with its traceback
    r = sidecar.client.post(
        CHAT, json={**chat_body(), "max_tokens": "x"}, headers={"x-request-id": rid}
    )
    assert r.status_code == 400 and sidecar.event(rid)["http_status"] == 400


def _pool_cut(scripted: ScriptedUpstream, sidecar: InProcessSidecar, i: int) -> None:
    rid = request_id()  # the pool's connection fails mid-stream: raised from its futures
    scripted.scripts[rid] = Script(pieces=[token_frame("a"), token_frame("b")], ending="cut")
    sidecar.client.post(CHAT, json=chat_body(stream=True), headers={"x-request-id": rid})
    assert sidecar.event(rid)["status"] == c.ERROR


def _pool_500(scripted: ScriptedUpstream, sidecar: InProcessSidecar, i: int) -> None:
    rid = request_id()
    scripted.scripts[rid] = Script(
        status=500, content_type="application/json", pieces=[b'{"error":{"message":"x"}}']
    )
    r = sidecar.client.post(CHAT, json=chat_body(), headers={"x-request-id": rid})
    assert r.status_code == 500 and sidecar.event(rid)["http_status"] == 500


def _client_leaves(scripted: ScriptedUpstream, sidecar: InProcessSidecar, i: int) -> None:
    rid = request_id()  # the client closes after the first bytes: the pool's response closed
    scripted.scripts[rid] = Script(pieces=[token_frame("a")] * 50, gap_s=0.01)
    with (
        httpx.Client(base_url=sidecar.url) as client,
        client.stream(
            "POST", CHAT, json=chat_body(stream=True), headers={"x-request-id": rid}
        ) as r,
    ):
        next(r.iter_raw())
    assert sidecar.event(rid)["status"] == c.DISCONNECTED


KINDS = {
    "ok": _ok,
    "bad body": _bad_body,
    "pool cut": _pool_cut,
    "pool 500": _pool_500,
    "client leaves": _client_leaves,
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_finished_requests_leave_nothing_for_the_collector(
    kind: str, scripted: ScriptedUpstream, sidecar: InProcessSidecar, no_collector: None
) -> None:
    """Requests that end each way (answered, streamed or whole; refused with a raised
    outcome; the pool cut or 500; the client gone), once recorded, leave no request,
    response, sink, deadline or client connection alive with the cycle collector off."""
    before = _alive(sidecar)
    for i in range(REQUESTS):
        KINDS[kind](scripted, sidecar, i)
    left = _alive(sidecar) - before
    assert not left, f"objects of finished requests wait for the cycle collector: {dict(left)}"
