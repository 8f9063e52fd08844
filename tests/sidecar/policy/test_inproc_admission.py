"""Admission in process: a lane's concurrency slot, its bounded queue and the 429s and 413s
it answers, each with its event and counter.

The pool is ``ScriptedUpstream`` (a fake, in this process), held open until the test
lets it finish, so a slot stays taken exactly as long as a test needs; no engine could be
held that precisely. Admission in front of a real vLLM is in test_lanes_admission.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import orjson
import pytest

from obs import conventions as c
from tests.sidecar.conftest import InprocFactory
from tests.support import chat_body
from tests.support.inproc import InProcessSidecar, lane_config, request_id
from tests.support.probes import CHAT, DONE_FRAME, metric, wait_for
from tests.support.rawhttp import connect
from tests.support.scripted_upstream import Script, ScriptedUpstream, token_frame

ONE_SLOT = {"max_concurrency": 1, "max_queue": 1}


@pytest.fixture(scope="module")
def sidecar(scripted: ScriptedUpstream, inproc: InprocFactory) -> InProcessSidecar:
    """Lanes of one slot and one queue place each: ``main`` (queue timeout 30 s), ``brief``
    (0.3 s) and ``capped`` (prompts of at most 5 tokens), chosen by the x-lane header."""
    pools = {"main": [scripted.url]}
    brief = {"max_concurrency": 1, "max_queue": 1, "queue_timeout_s": 0.3}
    return inproc(
        lane_config(
            pools,
            {"name": "brief", "pool": "main", "match": [{"header": {"x-lane": "brief"}}],
             "admission": brief},
            {"name": "capped", "pool": "main", "match": [{"header": {"x-lane": "capped"}}],
             "admission": {"max_prompt_tokens": 5}},
            admission={**ONE_SLOT, "queue_timeout_s": 30},
        )
    )  # fmt: skip


@pytest.fixture
def clients() -> Iterator[ThreadPoolExecutor]:
    """Threads for requests that wait (a held slot, a queue place)."""
    with ThreadPoolExecutor(4) as pool:
        yield pool


def _post(sidecar: InProcessSidecar, rid: str, lane: str = "main") -> httpx.Response:
    headers = {"x-request-id": rid, "x-lane": lane}
    return sidecar.client.post(CHAT, json=chat_body(rid), headers=headers, timeout=30)


def _hold_slot(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar, pool: ThreadPoolExecutor, lane: str
) -> tuple[threading.Event, Future[httpx.Response]]:
    """A request that takes ``lane``'s slot and keeps it until the returned event is set."""
    rid, release = request_id(), threading.Event()
    scripted.scripts[rid] = Script(pieces=[token_frame("a"), DONE_FRAME], hold=release)
    answer = pool.submit(_post, sidecar, rid, lane)
    wait_for(
        "the slot's request at the pool",
        lambda: metric(sidecar.url, c.IN_FLIGHT.name, lane=lane),
        10,
        0.01,
    )
    return release, answer


def _queued(sidecar: InProcessSidecar, lane: str) -> float:
    return metric(sidecar.url, c.QUEUED.name, lane=lane)


def _rejections(sidecar: InProcessSidecar, lane: str, reason: str) -> float:
    return metric(sidecar.url, c.ADMISSION_REJECTIONS.name + "_total", lane=lane, reason=reason)


def test_queue_full_refused_queued_served(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar, clients: ThreadPoolExecutor
) -> None:
    """With the slot taken and the queue full, a third request is refused at once (429
    RateLimitError, Retry-After, never sent to the pool); the queued one is served once the
    slot frees."""
    release, first = _hold_slot(scripted, sidecar, clients, "main")
    try:
        queued_id, refused_id = request_id(), request_id()
        scripted.scripts[queued_id] = Script(pieces=[token_frame("q"), DONE_FRAME])
        queued = clients.submit(_post, sidecar, queued_id)
        wait_for("a request in the queue", lambda: _queued(sidecar, "main") == 1, 10, 0.01)
        refusals = _rejections(sidecar, "main", c.QUEUE_FULL)
        r = _post(sidecar, refused_id)
        assert r.status_code == 429
        assert r.headers["retry-after"] == "1"
        assert orjson.loads(r.content)["error"]["type"] == "RateLimitError"
        assert not queued.done()
    finally:
        release.set()
    assert first.result().status_code == 200
    assert queued.result().status_code == 200
    ev = sidecar.event(refused_id)
    assert (ev["status"], ev["rejection_reason"], ev["http_status"]) == (
        c.REJECTED,
        c.QUEUE_FULL,
        429,
    )
    assert _rejections(sidecar, "main", c.QUEUE_FULL) == refusals + 1
    assert sidecar.event(queued_id)["status"] == c.OK
    assert all(refused_id.encode() not in body for _, body in scripted.received)


def test_queue_timeout_refused(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar, clients: ThreadPoolExecutor
) -> None:
    """A request that waits queue_timeout_s without a slot is refused with 429 queue_timeout,
    its whole wait recorded as the queue phase."""
    release, first = _hold_slot(scripted, sidecar, clients, "brief")
    try:
        rid = request_id()
        r = _post(sidecar, rid, "brief")
    finally:
        release.set()
    assert r.status_code == 429
    assert first.result().status_code == 200
    ev = sidecar.event(rid)
    assert (ev["status"], ev["rejection_reason"], ev["error_phase"]) == (
        c.REJECTED,
        c.QUEUE_TIMEOUT,
        "queue",
    )
    # uvloop's timers run on the loop time cached when its iteration began, in whole ms: the
    # 300 ms wait may end up to a millisecond short by the request's perf_counter clock.
    assert ev["queue_ms"] >= 299


def test_client_leaving_queue_never_reaches_pool(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar, clients: ThreadPoolExecutor
) -> None:
    """A client that hangs up while queued leaves the queue at once, is recorded as a
    client_disconnect in the queue phase, and its request never reaches the pool."""
    release, first = _hold_slot(scripted, sidecar, clients, "main")
    rid = request_id()
    try:
        body = orjson.dumps(chat_body(rid))
        with connect(sidecar.port) as s:
            head = b"POST %b HTTP/1.1\r\nhost: x\r\nx-request-id: %b\r\n" % (
                CHAT.encode(),
                rid.encode(),
            )
            s.sendall(head + b"content-length: %d\r\n\r\n%b" % (len(body), body))
            wait_for("a request in the queue", lambda: _queued(sidecar, "main") == 1, 10, 0.01)
        wait_for("the queue to empty", lambda: _queued(sidecar, "main") == 0, 10, 0.01)
    finally:
        release.set()
    assert first.result().status_code == 200
    ev = sidecar.event(rid)
    assert (ev["status"], ev["error_phase"]) == (c.DISCONNECTED, "queue")
    assert all(rid.encode() not in body for _, body in scripted.received)


def test_prompt_over_lane_cap_refused(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A prompt over the lane's max_prompt_tokens is refused with 413 before any pool sees
    it, with no Retry-After (waiting does not help)."""
    rid = request_id()
    headers = {"x-request-id": rid, "x-lane": "capped"}
    body = chat_body("many words " * 50)
    r = sidecar.client.post(CHAT, json=body, headers=headers)
    assert r.status_code == 413
    assert "retry-after" not in r.headers
    assert orjson.loads(r.content)["error"]["type"] == "PayloadTooLargeError"
    ev = sidecar.event(rid)
    assert (ev["status"], ev["rejection_reason"], ev["lane"]) == (
        c.REJECTED,
        c.PROMPT_TOO_LONG,
        "capped",
    )
    assert all(rid.encode() not in b for _, b in scripted.received)
