"""Floods from one client address: silent sockets and held bodies (issue 25, items 4 and 8).

Real sidecar processes, raw sockets. Loopback gives each test client its own source
address (127.0.0.2, 127.0.0.3, ...), as distinct clients would have. The pool is
``ScriptedUpstream`` (any chat is answered at once): these tests are about the relay's
port, not about what a pool does.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from obs.procs import free_port
from obs.sidecar.server.budgets import nofile_cap
from obs.sidecar.server.limits import Limits
from obs.sidecar.testing import SidecarProcess
from tests.conftest import SidecarFactory
from tests.support.probes import metric
from tests.support.rawhttp import read_all, status
from tests.support.scripted_upstream import ScriptedUpstream

LIMITS = "vllm_obs_connection_limits_total"
FLOOD = 2048
BODY = b'{"model":"tiny","messages":[{"role":"user","content":"hi"}]}'


@pytest.fixture
def pool() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as up:
        yield up


@pytest.fixture
def nofile() -> Iterator[None]:
    """Room in this process for the flood's sockets (the soft limit, restored after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 8192) if hard != resource.RLIM_INFINITY else 8192
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _from(addr: str, port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(addr, 0))
    s.settimeout(10)
    return s


def _client(addr: str, base: str) -> httpx.Client:
    return httpx.Client(
        base_url=base, timeout=30, transport=httpx.HTTPTransport(local_address=addr)
    )


def test_silent_flood_from_one_address_leaves_health_and_other_clients_served(
    sidecar: SidecarFactory, pool: ScriptedUpstream, nofile: None
) -> None:
    """2,048 silent sockets from 127.0.0.2: it holds only its quarter; /health from another
    address answers 200 every time and chats from a third all succeed."""
    sc = sidecar(pool.url, args=("--idle-timeout", "60"), traces=False)
    share = Limits().client_connections
    held: list[socket.socket] = []
    try:
        for _ in range(FLOOD):
            with contextlib.suppress(OSError):
                held.append(_from("127.0.0.2", sc.port))
        with _client("127.0.0.3", sc.url) as probe, _client("127.0.0.4", sc.url) as chat:
            health = [probe.get("/health").status_code for _ in range(30)]
            chats = [chat.post("/v1/chat/completions", content=BODY,
                               headers={"content-type": "application/json"}).status_code
                     for _ in range(10)]  # fmt: skip
        refused = metric(sc.url, LIMITS, limit="client_connections")
        open_now = metric(sc.url, "vllm_obs_client_connections")
    finally:
        for s in held:
            s.close()
    assert health == [200] * 30
    assert chats == [200] * 10
    assert refused == FLOOD - share
    assert open_now <= share + 3  # the flood's share, the probe's, the chat's and the scrape's


def test_bodies_held_by_one_address_are_bounded_and_others_still_post(
    sidecar: SidecarFactory, pool: ScriptedUpstream
) -> None:
    """One address sending big bodies and never finishing them holds at most its share of
    body memory (counted as the bytes arrive): its next body is refused 503 as it passes the
    share; another address's chat passes."""
    sc = sidecar(pool.url, args=("--max-body-memory-mb", "8", "--idle-timeout", "30"), traces=False)
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % ((1 << 20) + 1)
    )
    held = []
    try:
        for _ in range(2):  # 2 MiB sent, one byte short of each body: the address's quarter
            s = _from("127.0.0.2", sc.port)
            s.sendall(head + b" " * (1 << 20))
            held.append(s)
        time.sleep(0.5)
        with _from("127.0.0.2", sc.port) as third:
            with contextlib.suppress(OSError):  # refused (and closed) while it sends
                third.sendall(head + b" " * (256 << 10))
            answer = read_all(third)
        with _client("127.0.0.3", sc.url) as other:
            r = other.post("/v1/chat/completions", content=BODY,
                           headers={"content-type": "application/json"})  # fmt: skip
    finally:
        for s in held:
            s.close()
    assert status(answer) == 503
    assert b"request bodies" in answer
    assert r.status_code == 200
    assert metric(sc.url, LIMITS, limit="body_memory") == 1


@pytest.mark.process
def test_the_open_file_soft_limit_is_raised_at_start(
    pool: ScriptedUpstream, tmp_path: Path
) -> None:
    """Started with a soft limit of 1024, the sidecar runs with the hard limit as its soft one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 1024:
        pytest.skip("the hard open-file limit is 1024 or less: nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        sc = SidecarProcess(
            upstream=pool.url, events=tmp_path / "events.jsonl", log_path=tmp_path / "sc.log",
            env={"OTEL_TRACES_EXPORTER": "none"},
        ).start()  # fmt: skip
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        limits = Path(f"/proc/{sc.pid}/limits").read_text()
    finally:
        sc.stop()
    line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
    assert int(line.split()[3]) > 1024


def test_the_connection_cap_fits_the_open_file_limit() -> None:
    """Under nofile 1024 the 2,048 default becomes (1024 - 128) / 2; a higher limit keeps it."""
    assert Limits().fitted(nofile_cap(1024)).max_connections == 448
    assert Limits().fitted(nofile_cap(1024)).client_connections == 112
    assert Limits().fitted(nofile_cap(1 << 20)).max_connections == 2048


def test_health_listener_answers_while_the_relay_port_is_full(
    sidecar: SidecarFactory, pool: ScriptedUpstream, nofile: None
) -> None:
    """Behind one proxy address, a flood of idle sockets fills the relay port's cap: a new
    connection evicts an idle one and is served (before: 503), and --health-address answers
    200 on every probe."""
    health_port = free_port()
    sc = sidecar(
        pool.url,
        args=("--idle-timeout", "60", "--max-connections", "256",
              "--max-client-connections", "256", "--health-address", f"127.0.0.1:{health_port}"),
        traces=False,
    )  # fmt: skip
    held: list[socket.socket] = []
    try:
        for _ in range(300):
            with contextlib.suppress(OSError):
                held.append(_from("127.0.0.2", sc.port))
        with _from("127.0.0.2", sc.port) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            relay_port = status(read_all(s))
        probes = [
            httpx.get(f"http://127.0.0.1:{health_port}/health", timeout=10) for _ in range(30)
        ]
    finally:
        for s in held:
            s.close()
    assert relay_port == 200
    assert metric(sc.url, LIMITS, limit="evicted") >= 1
    assert [r.status_code for r in probes] == [200] * 30
    assert probes[-1].json()["status"] == "ok"
    assert httpx.get(f"http://127.0.0.1:{health_port}/metrics").status_code == 404
