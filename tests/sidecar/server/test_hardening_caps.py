"""The connection cap and liveness under floods (issue 38): a few addresses cannot fill the cap,
the health listener frees silent sockets, and liveness reflects a relay that serves nobody.

Real sidecar processes (the health listener alone in this process, with a short timeout) and
raw sockets from distinct loopback addresses (127.0.0.x); the pool is ``ScriptedUpstream``
(these tests are about the relay's port, not a pool).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from obs.procs import free_port
from obs.sidecar.server.guard import Guard
from obs.sidecar.server.health_listener import STALL_S, HealthListener
from obs.sidecar.server.limits import Limits
from tests.conftest import SidecarFactory
from tests.support.probes import metric
from tests.support.rawhttp import closed_within
from tests.support.scripted_upstream import ScriptedUpstream

pytestmark = pytest.mark.inproc

SHORT_S = 0.5  # the in-process health listener's per-connection timeout
BODY = b'{"model":"tiny","messages":[{"role":"user","content":"hi"}]}'


@pytest.fixture
def pool() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as up:
        yield up


def _from(addr: str, port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(addr, 0))
    s.settimeout(10)
    return s


@pytest.mark.process
def test_silent_sockets_from_four_addresses_cannot_fill_the_cap(
    sidecar: SidecarFactory, pool: ScriptedUpstream
) -> None:
    """Four addresses each hold their quarter of the cap with silent sockets: a fifth client's
    /health and chats are still served (an idle socket is evicted for each; before: 503)."""
    sc = sidecar(pool.url, args=("--idle-timeout", "60", "--max-connections", "64"), traces=False)
    held: list[socket.socket] = []
    try:
        for i in range(4 * 16):
            with contextlib.suppress(OSError):
                held.append(_from(f"127.0.0.{2 + i % 4}", sc.port))
        time.sleep(0.3)
        client = httpx.Client(base_url=sc.url, timeout=10,
                              transport=httpx.HTTPTransport(local_address="127.0.0.9"))  # fmt: skip
        with client:
            health = [client.get("/health").status_code for _ in range(10)]
            chats = [client.post("/v1/chat/completions", content=BODY,
                                 headers={"content-type": "application/json"}).status_code
                     for _ in range(5)]  # fmt: skip
        evicted = metric(sc.url, "vllm_obs_connection_limits_total", limit="evicted")
    finally:
        for s in held:
            s.close()
    assert health == [200] * 10
    assert chats == [200] * 5
    assert evicted >= 1


def test_health_listener_closes_silent_connections() -> None:
    """Fifty silent sockets on the health listener are each closed within its per-connection
    timeout, and a probe after them answers 200 (before: a thread held per socket, forever).
    The listener runs in this process with a 0.5 s timeout (the sidecar's is ``TIMEOUT_S``)."""
    port = free_port()
    listener = HealthListener("127.0.0.1", port, lambda: {"status": "ok"}, timeout_s=SHORT_S)
    try:
        silent = [_from("127.0.0.2", port) for _ in range(50)]
        closed = [closed_within(s, SHORT_S + 5) for s in silent]
        for s in silent:
            s.close()
        probe = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
    finally:
        asyncio.run(listener.stop())
    assert all(c is not None and c <= SHORT_S + 2 for c in closed), closed
    assert probe.status_code == 200


def test_readiness_fails_when_the_relay_refuses_everyone() -> None:
    """A relay whose cap has refused every new connection for over STALL_S answers its
    readiness probe 503 (relay_full); one accepted connection makes it 200 again."""
    guard = Guard(Limits(max_connections=1))
    port = free_port()
    listener = HealthListener("127.0.0.1", port, lambda: {"status": "ok"})
    listener.watch(lambda: guard.full_for() + STALL_S)  # as if refused STALL_S already
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/ready").status_code == 200
        guard.budgets.connect("127.0.0.2")  # the one slot serves
        guard.hit("max_connections")
        time.sleep(0.05)
        full = httpx.get(f"http://127.0.0.1:{port}/ready")
        guard.accepted()
        again = httpx.get(f"http://127.0.0.1:{port}/ready")
    finally:
        asyncio.run(listener.stop())
    assert full.status_code == 503 and full.json()["status"] == "relay_full"
    assert again.status_code == 200
