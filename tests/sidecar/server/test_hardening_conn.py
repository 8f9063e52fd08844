"""The relay port's connection limits, tried with raw sockets as an attacker would (issue 22).

Every case runs against a real sidecar process; none needs a pool to answer (the
requests are cut before one is reached), so the upstream is a closed port.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest

from obs.procs import free_port
from obs.sidecar.testing import SidecarProcess
from tests.conftest import SidecarFactory
from tests.support.probes import metric, rss_bytes, wait_for
from tests.support.rawhttp import closed_within, connect, exchange, read_all, status, trickle
from tests.support.tcp import unread

LIMITS = "vllm_obs_connection_limits_total"
SHORT_LIMITS = (
    "--header-timeout", "1", "--body-timeout", "1", "--idle-timeout", "1",
    "--max-connections", "20", "--max-client-connections", "20",  # one address: the whole cap
)  # fmt: skip


@pytest.fixture
def guarded(sidecar: SidecarFactory) -> Iterator[SidecarProcess]:
    """A sidecar with short timeouts and few connections, in front of a closed port."""
    yield sidecar(
        f"http://127.0.0.1:{free_port()}",
        args=SHORT_LIMITS,
        traces=False,
    )


def test_huge_header_is_refused_with_431_after_one_read(guarded: SidecarProcess) -> None:
    """A 32 MB header value is answered 431 at once and never held (item 4 and 12): the
    sidecar stops reading and closes, so the writer is cut before the 32 MB are sent (the
    kernel's buffers on both sides hold a few MB at most; a sidecar reading on would take it
    all). The socket's timeout is a hang guard only."""
    head = b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: "
    sent = 0
    with connect(guarded.port, timeout_s=120) as s:
        try:
            s.sendall(head)
            for _ in range(32):
                s.sendall(b"a" * (1 << 20))
                sent += 1
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            answer = s.recv(4096)
        except ConnectionResetError:
            answer = b""
    assert sent < 32, "the sidecar read the whole 32 MB header"
    assert status(answer) in (0, 431)  # 0: reset before the answer could be read
    assert rss_bytes(guarded.pid) < 200 << 20
    assert metric(guarded.url, LIMITS, limit="header_bytes") >= 1
    assert exchange(guarded.port, head + b"a" * (100 << 10) + b"\r\n\r\n").startswith(
        b"HTTP/1.1 431"
    )


def test_too_many_headers_and_a_long_request_line_are_refused(guarded: SidecarProcess) -> None:
    """500 headers get 431 and a 10 kB request target 414 (item 4), each counted."""
    many = b"".join(b"x-%d: a\r\n" % i for i in range(500))
    assert (
        status(exchange(guarded.port, b"GET /health HTTP/1.1\r\nhost: x\r\n" + many + b"\r\n"))
        == 431
    )
    long_line = b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\nhost: x\r\n\r\n"
    assert status(exchange(guarded.port, long_line)) == 414
    assert metric(guarded.url, LIMITS, limit="header_count") == 1
    assert metric(guarded.url, LIMITS, limit="request_line") == 1


def test_connection_without_a_request_is_closed_after_the_idle_timeout(
    guarded: SidecarProcess,
) -> None:
    """A connection that never sends a byte is closed by --idle-timeout (item 5): the
    sidecar closes it and counts that limit (the wait is a hang guard, not a bound)."""
    with connect(guarded.port) as s:
        assert closed_within(s, 60) is not None, "the idle connection was never closed"
    assert metric(guarded.url, LIMITS, limit="idle_timeout") == 1


def test_slowloris_headers_get_408_after_the_header_timeout(guarded: SidecarProcess) -> None:
    """One header byte every 0.3 s is cut with 408 by --header-timeout (item 5): the sidecar
    cuts the connection and counts that limit (the trickle's 60 s are a hang guard)."""
    with connect(guarded.port) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        assert trickle(s, b"x", 60), "the slow head was never cut"
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            answer = s.recv(4096)
    assert status(answer) in (0, 408)
    assert metric(guarded.url, LIMITS, limit="header_timeout") == 1


def test_slow_body_is_cut_after_the_body_timeout(guarded: SidecarProcess) -> None:
    """A body trickling in a byte at a time is cut with 408 by --body-timeout (item 5): the
    sidecar cuts it and counts that limit (the trickle's 60 s are a hang guard)."""
    with connect(guarded.port) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
            b"\r\ncontent-length: 1000\r\n\r\n{"
        )
        assert trickle(s, b" ", 60), "the slow body was never cut"
    assert metric(guarded.url, LIMITS, limit="body_timeout") == 1


def test_connections_past_the_maximum_evict_a_slow_head_and_are_served(
    sidecar: SidecarFactory,
) -> None:
    """With --max-connections 20 held by slow request heads, the next connection evicts one of
    them (counted as evicted, not refused) and its request is answered (before: 503). The
    heads' and idle timeouts are far off, so no timer frees a slot first: the newcomer finds
    the sidecar full however long the machine takes to let it in."""
    full = sidecar(
        f"http://127.0.0.1:{free_port()}",
        args=("--header-timeout", "300", "--idle-timeout", "300", "--max-connections", "20",
              "--max-client-connections", "20"),
        traces=False,
    )  # fmt: skip
    held: list[socket.socket] = []
    try:
        for _ in range(20):
            held.append(connect(full.port, timeout_s=60))
        for s in held:  # each starts a request: a slow head, not an idle connection
            s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        # Each head is with the sidecar: its side of each connection has nothing left unread.
        ports = [s.getsockname()[1] for s in held]
        wait_for(
            "the sidecar to read the 20 heads",
            lambda: all(unread(full.port, p) == 0 for p in ports),
            60,
        )
        with connect(full.port, timeout_s=60) as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            answer = read_all(extra)
        assert status(answer) == 200
    finally:
        for s in held:
            s.close()
    assert metric(full.url, LIMITS, limit="evicted") == 1
    assert metric(full.url, LIMITS, limit="max_connections") == 0
    assert metric(full.url, LIMITS, limit="header_timeout") == 0
