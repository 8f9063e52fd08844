"""A finished request leaves no reference cycle: its objects go with their last reference.

Under load a request whose objects form a cycle is freed only by the cycle collector: every
request's graph (request, pool response, stream sink, deadline, client connection, exchange)
then waits in the young generation, is traversed, promoted and traversed again (the collector
was ~15% of the relay's CPU per short request at 64 streams, docs/performance.md). With the
collector off, nothing of a finished request may stay alive. The pool is ``ScriptedUpstream``
(a fake in this process: the test counts this process's objects).
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator

import pytest

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
REQUESTS = 20


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


def _alive() -> Counter[str]:
    kinds = {id(k): k.__name__ for k in PER_REQUEST}
    return Counter(kinds[id(type(o))] for o in gc.get_objects() if id(type(o)) in kinds)


def test_finished_requests_leave_nothing_for_the_collector(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar, no_collector: None
) -> None:
    """Streamed and whole answers, once recorded, leave no request, response, sink, deadline
    or client connection alive with the cycle collector off."""
    before = _alive()
    for i in range(REQUESTS):
        rid = request_id()
        stream = i % 2 == 0
        pieces = [token_frame("a"), token_frame(" b", "stop"), usage_frame(5, 2), DONE_FRAME]
        if stream:
            scripted.scripts[rid] = Script(pieces=pieces)
        else:
            scripted.scripts[rid] = Script(content_type="application/json", pieces=[b"{}"])
        r = sidecar.client.post(CHAT, json=chat_body(stream=stream), headers={"x-request-id": rid})
        assert r.status_code == 200
        assert sidecar.event(rid)["http_status"] == 200
    left = _alive() - before
    assert not left, f"objects of finished requests wait for the cycle collector: {dict(left)}"
