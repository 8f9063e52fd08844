"""The guarded protocol tells the app when each request's first bytes were read.

``scope["extensions"]["vllm_obs"]["received_ns"]`` (issue 22, for the queue
phase): a tiny ASGI app under uvicorn with the sidecar's own protocol class
answers with the value it was given, so the test compares it with its clock.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from obs.procs import free_port, wait_http
from obs.sidecar.guard import Guard
from obs.sidecar.limits import Limits
from tests.support.rawhttp import read_response


async def _echo_received(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    ns = scope["extensions"]["vllm_obs"]["received_ns"]
    body = f"{ns} {time.perf_counter_ns()}".encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def served() -> Iterator[int]:
    port = free_port()
    guard = Guard(Limits())
    config = uvicorn.Config(_echo_received, host="127.0.0.1", port=port, loop="asyncio",
                            http=guard.protocol(), lifespan="off", log_level="warning")  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    wait_http(f"http://127.0.0.1:{port}/")
    yield port
    server.should_exit = True
    thread.join(10)


def test_received_ns_is_the_first_read_of_each_request(served: int) -> None:
    """The first read of a request, before the app runs; a new value for the next request."""
    with socket.create_connection(("127.0.0.1", served)) as s:
        seen = []
        for _ in range(2):
            sent = time.perf_counter_ns()
            s.sendall(b"GET /")
            time.sleep(0.2)  # the head arrives in two reads: the first one counts
            s.sendall(b" HTTP/1.1\r\nhost: x\r\n\r\n")
            s.settimeout(5)
            received, in_app = (int(x) for x in read_response(s).split())
            assert sent < received < in_app
            assert in_app - received >= 150_000_000  # counted from the first read, not the last
            seen.append(received)
        assert seen[0] != seen[1]
