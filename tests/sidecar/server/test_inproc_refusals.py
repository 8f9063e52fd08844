"""The server's refusals of a request whose head it read: the event has the status the
client received (408 for a body too slow, 503 for a body past the client's memory budget).

Raw sockets against the in-process sidecar: a client that stalls mid-body or announces
more than its budget is what these limits are for; no pool is reached.
"""

from __future__ import annotations

import pytest

from obs import conventions as c
from obs.sidecar.server.limits import Limits
from tests.sidecar.conftest import InprocFactory
from tests.support.inproc import InProcessSidecar, lane_config, request_id
from tests.support.probes import CHAT
from tests.support.rawhttp import connect, read_all, status
from tests.support.scripted_upstream import ScriptedUpstream

BODY_TIMEOUT_S = 0.3
CLIENT_BODY_BYTES = 64 << 10


@pytest.fixture(scope="module")
def sidecar(scripted: ScriptedUpstream, inproc: InprocFactory) -> InProcessSidecar:
    """An in-process sidecar allowing 0.3 s for a body and 64 KiB of bodies per client."""
    limits = Limits(body_timeout_s=BODY_TIMEOUT_S, max_client_body_memory=CLIENT_BODY_BYTES)
    return inproc(lane_config({"main": [scripted.url]}), limits=limits)


def _head(rid: str, length: int) -> bytes:
    return (
        b"POST %b HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"x-request-id: %b\r\ncontent-length: %d\r\n\r\n" % (CHAT.encode(), rid.encode(), length)
    )


def test_slow_body_408_is_the_events_status(sidecar: InProcessSidecar) -> None:
    """A body that stalls past body_timeout_s: the client reads 408, and the event says 408
    (client_error, request_limit), not that the client left."""
    rid = request_id()
    with connect(sidecar.port) as s:
        s.sendall(_head(rid, 1000) + b"{")
        answer = read_all(s)
    assert status(answer) == 408
    ev = sidecar.event(rid)
    assert (ev["http_status"], ev["status"], ev["error_class"]) == (
        408,
        c.CLIENT_ERROR,
        "request_limit",
    )
    assert "too slow sending the request" in ev["error_message"]


def test_body_over_the_memory_budget_503_is_the_events_status(sidecar: InProcessSidecar) -> None:
    """A body announced past the client's body memory: answered 503 at once, and the event
    says 503 (a refusal by the sidecar's limits: rejected, not an error against the SLOs)."""
    rid = request_id()
    with connect(sidecar.port) as s:
        s.sendall(_head(rid, 4 * CLIENT_BODY_BYTES))
        answer = read_all(s)
    assert status(answer) == 503
    assert b"request bodies" in answer
    ev = sidecar.event(rid)
    assert (ev["http_status"], ev["status"], ev["error_class"]) == (
        503,
        c.REJECTED,
        "request_limit",
    )
