"""A flood of clients that leave right after dispatch, before any output (issue 38: 454 full
events/s escaped the event budget): past ``--client-events-per-s`` their events become
summary records whose counts are exact, and a legitimate client's events are all written.

Real sockets against the in-process sidecar, whose clock the test holds still
(``tests.support.clock.ManualClock``): the budget is spent in the sidecar's time, so the count
written one by one is exact whatever the machine's speed. The pool is ``ScriptedUpstream``,
holding each attacker's stream open with no output until the sidecar hangs up: the test must
know that every attacker's request reached the pool before its client left, and no real vLLM
holds back its first token on cue (the tiny model's comes within milliseconds, a race).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from typing import Any

import pytest

from obs import conventions as c
from obs.sidecar.record.record_rate import SUMMARY_PREFIX
from tests.sidecar.conftest import InprocFactory
from tests.support import chat_body
from tests.support.clock import ManualClock
from tests.support.inproc import InProcessSidecar, lane_config, request_id
from tests.support.probes import CHAT, DONE_FRAME, metric, wait_for
from tests.support.rawhttp import connect
from tests.support.scripted_upstream import Script, ScriptedUpstream, token_frame

pytestmark = pytest.mark.inproc

BUDGET = 2.0  # --client-events-per-s (bursts of as many)
ATTACKERS = 60  # connections that send a stream request and leave before its first token
LEGIT = 10  # a legitimate client's streams, before the attackers leave and after
STREAM = [token_frame("a"), token_frame(" b", "stop"), DONE_FRAME]


def _send(port: int, rid: str) -> socket.socket:
    body = json.dumps(chat_body(stream=True)).encode()
    s = connect(port)
    s.sendall(
        b"POST %b HTTP/1.1\r\nhost: x\r\nx-request-id: %b\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%b" % (CHAT.encode(), rid.encode(), len(body), body)
    )
    return s


def _legit(sc: InProcessSidecar, scripted: ScriptedUpstream, n: int) -> list[str]:
    """``n`` whole streams of the legitimate client, one after another: their request ids."""
    rids = []
    for _ in range(n):
        rid = request_id()
        scripted.scripts[rid] = Script(pieces=STREAM)
        r = sc.client.post(CHAT, json=chat_body(stream=True), headers={"x-request-id": rid})
        assert r.status_code == 200 and r.content.endswith(DONE_FRAME), r.content[-200:]
        rids.append(rid)
    return rids


def _disconnects(events: list[dict[str, Any]]) -> int:
    """client_disconnect requests the record counts: one per event, ``summarized`` per summary."""
    return sum(e.get("summarized") or 1 for e in events if e["status"] == c.DISCONNECTED)


def test_disconnects_after_dispatch_past_the_budget_are_summarized_exactly(
    scripted: ScriptedUpstream, inproc: InprocFactory
) -> None:
    """60 clients send a stream and leave once the pool has it, before any output (budget 2
    a second, the sidecar's clock standing still): exactly the budget's events are written one
    by one, the rest are summary records that count them exactly, the skipped counter equals
    what they stand for, and a legitimate client's 10 streams around the flood each have
    their event."""
    clock = ManualClock()
    sc = inproc(lane_config({"main": [scripted.url]}), rejected_events_per_s=BUDGET, clock=clock)
    hold = threading.Event()  # never set: the pool sends no output until the sidecar hangs up
    attackers = [request_id() for _ in range(ATTACKERS)]
    for rid in attackers:
        scripted.scripts[rid] = Script(hold=hold)
    legit = _legit(sc, scripted, LEGIT // 2)
    socks = [_send(sc.port, rid) for rid in attackers]
    try:
        wait_for(
            "every attacker's request at the pool",
            lambda: all(rid in scripted.traceparents for rid in attackers),
            10,
            0.01,
        )
    finally:
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()
    legit += _legit(sc, scripted, LEGIT - LEGIT // 2)

    def counted() -> list[dict[str, Any]]:
        events = sc.memory.events()
        return events if _disconnects(events) >= ATTACKERS else []

    # Summaries are written a wall second after the first event they hold: a wait for them.
    events = wait_for("the flood's summaries", counted, 30, 0.05)
    mine = set(attackers)
    one_by_one = [e for e in events if e["request_id"] in mine]
    summaries = [e for e in events if e.get("summarized")]
    assert len({e["request_id"] for e in one_by_one}) == len(one_by_one)  # one event each
    assert all(e["status"] == c.DISCONNECTED and e["replica"] for e in one_by_one), one_by_one
    assert all(not e.get("output_chunks") for e in one_by_one)  # left before any output
    assert all(e["request_id"].startswith(SUMMARY_PREFIX) for e in summaries)
    assert all(e["status"] == c.DISCONNECTED for e in summaries), summaries
    skipped = sum(e["summarized"] for e in summaries)
    assert len(one_by_one) + skipped == ATTACKERS  # exact: every attacker counted once
    assert len(one_by_one) == BUDGET  # the burst the budget holds, and no token more
    assert metric(sc.url, c.REJECTED_EVENTS_SKIPPED.name + "_total") == skipped
    assert metric(sc.url, c.REFUSED_SUMMARIES.name + "_total") == len(summaries)
    assert metric(sc.url, "vllm_obs_requests_total", outcome=c.DISCONNECTED) == ATTACKERS
    for rid in legit:  # each of the legitimate client's streams: its one event, ok
        ev = sc.event(rid)
        assert (ev["status"], ev["http_status"]) == (c.OK, 200), ev
    assert scripted.cut_off >= mine  # the sidecar hung up on the pool for every attacker
