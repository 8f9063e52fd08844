"""The relay's readiness from the attacker's side (issues 38, 63): a relay whose every
connection slot serves a request, refusing every newcomer, is answered 503 by
``--health-address``'s ``/ready``; its ``/health`` (liveness) stays 200.

A real sidecar process with ``--max-connections 4``; four addresses (127.0.0.2-5) each hold
one chat that the pool never finishes. The pool is ``ScriptedUpstream`` holding its answers
open until the test lets them go: a real engine cannot be made to keep a request for a set
time. Slow: the probe turns only after 10 s (``STALL_S``) of refusals.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from obs.procs import free_port
from obs.sidecar.server.health_listener import STALL_S
from tests.conftest import SidecarFactory
from tests.support import chat_body
from tests.support.rawhttp import read_all, status
from tests.support.scripted_upstream import Script, ScriptedUpstream, token_frame

pytestmark = pytest.mark.process


@pytest.fixture
def pool() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as up:
        yield up


def _held_chat(addr: str, port: int, rid: str) -> socket.socket:
    """A streamed chat from ``addr`` that the pool holds open; the socket (not read)."""
    body = json.dumps(chat_body(rid, stream=True)).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(addr, 0))
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"x-request-id: %b\r\ncontent-length: %d\r\n\r\n%b" % (rid.encode(), len(body), body)
    )
    return s


def _newcomer(port: int) -> int:
    """A GET /health from 127.0.0.6 on the relay's port: its status (0: no answer)."""
    try:
        with socket.create_connection(
            ("127.0.0.1", port), timeout=5, source_address=("127.0.0.6", 0)
        ) as s:
            s.settimeout(5)
            s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            return status(read_all(s))
    except OSError:
        return 0


def test_readiness_fails_while_every_slot_serves_and_newcomers_are_refused(
    sidecar: SidecarFactory, pool: ScriptedUpstream
) -> None:
    """Four held chats fill --max-connections 4; newcomers get 503 for over 10 s, and then the
    listener's readiness answers 503 relay_full (200 while refusals were younger) while its
    liveness stays 200; once the chats end, a newcomer is served and the probe is 200 again."""
    health = free_port()
    args = ("--max-connections", "4", "--health-address", f"127.0.0.1:{health}")
    sc = sidecar(pool.url, traces=False, args=args)
    probe = f"http://127.0.0.1:{health}/ready"  # readiness: overload is never liveness
    live = f"http://127.0.0.1:{health}/health"
    hold = threading.Event()
    held = []
    try:
        for i in range(4):
            rid = uuid.uuid4().hex
            pool.scripts[rid] = Script(pieces=[token_frame("a")], hold=hold)
            held.append(_held_chat(f"127.0.0.{2 + i}", sc.port, rid))
        time.sleep(1)  # all four are in flight
        t0 = time.monotonic()
        refused = [_newcomer(sc.port)]
        early = httpx.get(probe, timeout=5).status_code
        while time.monotonic() - t0 < STALL_S + 2:
            refused.append(_newcomer(sc.port))
            time.sleep(1)
        late = httpx.get(probe, timeout=5)
        alive = httpx.get(live, timeout=5).status_code
    finally:
        hold.set()
        for s in held:
            s.close()
    time.sleep(1)  # the held chats end and their slots free
    served = _newcomer(sc.port)
    again = httpx.get(probe, timeout=5).status_code
    assert set(refused) == {503}, refused
    assert early == 200
    assert late.status_code == 503 and late.json()["status"] == "relay_full", late.text
    assert alive == 200  # the pod is taken out of the Service, never restarted
    assert served == 200
    assert again == 200
