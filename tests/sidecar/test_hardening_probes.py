"""The health listener under silent sockets, and overload as readiness, not liveness (issue 63).

The listener (``--health-address``) runs in this process; attackers and probes are raw sockets
and a real HTTP client on 127.0.6.x. No timer is waited on: a silent socket is shut for a
newcomer at once, never after its per-connection timeout (set to a minute here).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import httpx
import pytest

from obs.procs import free_port
from obs.sidecar.server.guard import Guard
from obs.sidecar.server.health_listener import (
    MAX_HANDLERS,
    MAX_PER_ADDRESS,
    STALL_S,
    HealthListener,
    Slots,
)
from obs.sidecar.server.limits import Limits

pytestmark = pytest.mark.inproc

ATTACKER, PROBER = "127.0.6.2", "127.0.6.3"


@pytest.fixture
def listener() -> Iterator[tuple[HealthListener, int]]:
    """A health listener whose silent connections are not timed out within the test."""
    port = free_port()
    hl = HealthListener("127.0.0.1", port, lambda: {"status": "ok"}, timeout_s=60.0)
    yield hl, port
    asyncio.run(hl.stop())


def _silent(addr: str, port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(addr, 0))
    s.settimeout(10)
    return s


def _probe(port: int, path: str = "/health") -> int:
    """A kubelet-style probe from ``PROBER``: a new connection, one GET; its status (0: none)."""
    transport = httpx.HTTPTransport(local_address=PROBER)
    try:
        with httpx.Client(transport=transport, timeout=5) as client:
            return client.get(f"http://127.0.0.1:{port}{path}").status_code
    except httpx.HTTPError:
        return 0


def _shut(s: socket.socket) -> bool:
    """The listener closed ``s`` (a read finds its end)."""
    try:
        return s.recv(1) == b""
    except OSError:
        return True


def test_130_silent_sockets_from_one_address_fail_no_probe(
    listener: tuple[HealthListener, int],
) -> None:
    """130 silent sockets from one address (over the listener's 128): 15 of 15 probes from
    another address are 200 (before: every probe closed unanswered, the pod restarted)."""
    _, port = listener
    flood = [_silent(ATTACKER, port) for _ in range(130)]
    try:
        probes = [_probe(port) for _ in range(15)]
    finally:
        for s in flood:
            s.close()
    assert probes == [200] * 15


def test_one_address_keeps_its_newest_silent_sockets(listener: tuple[HealthListener, int]) -> None:
    """Past ``MAX_PER_ADDRESS`` silent sockets from one address, its oldest are shut for its
    newest: the first ones read their end, the last ones are still open."""
    _, port = listener
    flood = [_silent(ATTACKER, port) for _ in range(MAX_PER_ADDRESS + 4)]
    try:
        assert _probe(port) == 200  # every connection before it has been taken
        oldest = [_shut(s) for s in flood[:4]]
        newest = flood[-1]
        newest.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        answer = newest.recv(100)
    finally:
        for s in flood:
            s.close()
    assert oldest == [True] * 4
    assert answer.startswith(b"HTTP/1.1 200")


def test_a_full_relay_fails_readiness_never_liveness(listener: tuple[HealthListener, int]) -> None:
    """A relay refusing every newcomer at its cap for over ``STALL_S``: ``/ready`` is 503
    relay_full, ``/health`` (liveness) stays 200 (before: /health 503, the pod restarted);
    one accepted connection, or a slot freed, makes ``/ready`` 200 again (before: a relay
    emptied after refusals stayed 'full' until someone else connected)."""
    hl, port = listener
    guard = Guard(Limits(max_connections=1))
    hl.watch(lambda: guard.full_for() + STALL_S)  # as if refused for STALL_S already
    guard.budgets.connect("127.0.6.4")  # the one slot serves
    guard.hit("max_connections")
    transport = httpx.HTTPTransport(local_address=PROBER)
    with httpx.Client(transport=transport, timeout=5) as client:
        ready = client.get(f"http://127.0.0.1:{port}/ready")
        live = client.get(f"http://127.0.0.1:{port}/health")
        guard.accepted()
        again = client.get(f"http://127.0.0.1:{port}/ready")
        guard.hit("max_connections")  # refused again; then the slot frees, nobody comes
        full = client.get(f"http://127.0.0.1:{port}/ready").status_code
        guard.budgets.disconnect("127.0.6.4")
        freed = client.get(f"http://127.0.0.1:{port}/ready").status_code
    assert (ready.status_code, ready.json()["status"]) == (503, "relay_full")
    assert live.status_code == 200
    assert again.status_code == 200
    assert (full, freed) == (503, 200)  # room again is ready, before anyone is accepted


def test_slots_shut_the_oldest_silent_of_the_address_holding_most() -> None:
    """At the total cap, a newcomer from a fresh address takes the place of the oldest silent
    connection of the address holding the most; a connection answering a request is kept."""
    slots = Slots(total=4, per_address=3)
    for i in range(3):
        assert slots.take(f"a{i}", "A") == (True, None)
    assert slots.take("b0", "B") == (True, None)
    slots.busy("a0", True)  # answering: not silent
    assert slots.take("c0", "C") == (True, "a1")
    assert len(slots) == 4
    for c in ("a0", "a2", "b0", "c0"):
        slots.busy(c, True)
    assert slots.take("d0", "D") == (False, None)  # every one serves: refused
    assert MAX_PER_ADDRESS < MAX_HANDLERS
