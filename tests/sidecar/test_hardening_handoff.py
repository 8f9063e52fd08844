"""The ``--workers`` span hand-off port (issue 63): a post without this start's secret is
refused and joins nothing, and silent sockets cannot hold its threads.

The real private server of a worker (``serve_private_metrics``) in this process; the forger
and the silent sockets are raw sockets on 127.0.0.1 (the port is loopback-only).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from obs.sidecar.record.otlp import ReceivedSpan
from obs.sidecar.record.span_handoff import PATH, encode
from obs.sidecar.server.health_listener import MAX_HANDLERS
from obs.sidecar.server.worker_metrics import SECRET_HEADER, WorkerSlot, serve_private_metrics
from obs.sidecar.server.workers import listen

pytestmark = pytest.mark.inproc

SPAN = ReceivedSpan("llm_request", "ab" * 16, "cd" * 8, "00000000000000ff", 2, 1, 2, "vllm", {})


@pytest.fixture
def private(tmp_path: Path) -> Iterator[tuple[int, list[bytes], WorkerSlot]]:
    """A worker's private server; yields (its port, the spans it took)."""
    sock = listen("127.0.0.1", 0, "worker metrics")
    port = sock.getsockname()[1]
    slot = WorkerSlot(0, 1, (port,), str(tmp_path), "the-secret")
    took: list[bytes] = []

    def spans(body: bytes) -> bool:
        took.append(body)
        return True

    server = serve_private_metrics(sock, CollectorRegistry(), slot, spans)
    yield port, took, slot
    server.shutdown()
    server.server_close()


def test_a_hand_off_without_the_secret_is_refused(
    private: tuple[int, list[bytes], WorkerSlot],
) -> None:
    """A forged post (no secret, or a wrong one) is 403 and nothing joins; the worker's own
    hand-off, with this start's secret, is 204 (before: any local process's spans joined)."""
    port, took, slot = private
    url = f"http://127.0.0.1:{port}{PATH}"
    body = encode([SPAN])
    none = httpx.post(url, content=body, timeout=10).status_code
    wrong = httpx.post(url, content=body, headers={SECRET_HEADER: "guess"}, timeout=10)
    assert (none, wrong.status_code, took) == (403, 403, [])
    own = httpx.post(url, content=body, headers=slot.handoff_headers(), timeout=10)
    assert own.status_code == 204 and took == [body]


def test_silent_sockets_cannot_hold_the_hand_off_port(
    private: tuple[int, list[bytes], WorkerSlot],
) -> None:
    """More silent sockets than the server's cap: the worker's own hand-off is still taken
    (before: a thread per socket without a timeout, 2,000 threads)."""
    port, took, slot = private
    silent = [socket.create_connection(("127.0.0.1", port), timeout=10)
              for _ in range(MAX_HANDLERS + 20)]  # fmt: skip
    try:
        own = httpx.post(f"http://127.0.0.1:{port}{PATH}", content=encode([SPAN]),
                         headers=slot.handoff_headers(), timeout=10)  # fmt: skip
    finally:
        for s in silent:
            s.close()
    assert own.status_code == 204 and len(took) == 1
