"""The accept-queue sampler of ``bench.ttft_truth`` reads a real listening socket's queue."""

from __future__ import annotations

import os
import socket
import time

import pytest

from bench.procs import AcceptQueue

pytestmark = pytest.mark.inproc


def test_counts_the_connections_waiting_to_be_accepted() -> None:
    """Connections the kernel completed but nobody accepted are counted; an accept removes one."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as server:
        port = server.getsockname()[1]
        queue = AcceptQueue(port)
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4) as diag:
            assert queue.queued(diag) == 0
            clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
            try:
                assert queue.queued(diag) == 3
                server.accept()[0].close()
                assert queue.queued(diag) == 2
            finally:
                for c in clients:
                    c.close()


def test_a_run_reports_the_wait_and_who_holds_the_socket() -> None:
    """Over a run: the longest queue, connection-seconds waited, and this process as the holder."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as server:
        port = server.getsockname()[1]
        t0 = time.monotonic()
        queue = AcceptQueue(port, interval_s=0.002).start()
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        try:
            time.sleep(0.2)
            figures = queue.stop()
            elapsed = time.monotonic() - t0
        finally:
            for c in clients:
                c.close()
    assert queue.pids == [os.getpid()]
    assert figures["accept_queue_max"] == 2
    assert figures["accept_queue_busy_share"] > 0.5
    # two connections waited, at most as long as the run lasted
    assert 0 < figures["accept_queued_s"] <= 2 * elapsed
