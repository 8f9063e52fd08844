"""The relay's server tells the app when each request's first bytes were read.

``scope["extensions"]["vllm_obs"]["received_ns"]`` (issue 22, for the queue
phase): a tiny ASGI app on the sidecar's own server (``RelayServer``, in a thread)
answers with the value it was given, so the test compares it with its clock.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from obs.sidecar.types import Receive, Scope, Send
from tests.support.inproc import served_app
from tests.support.probes import wait_for
from tests.support.rawhttp import read_response
from tests.support.tcp import unread

pytestmark = pytest.mark.inproc


async def _echo_received(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    ns = scope["extensions"]["vllm_obs"]["received_ns"]
    body = f"{ns} {time.perf_counter_ns()}".encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def served() -> Iterator[int]:
    with served_app(_echo_received) as port:
        yield port


def test_received_ns_is_the_first_read_of_each_request(served: int) -> None:
    """The first read of a request, before the app runs; a new value for the next request.
    The head comes in two reads: the test sends its second part only once the server has
    read the first (its receive queue empty: tests.support.tcp), on any machine."""
    with socket.create_connection(("127.0.0.1", served)) as s:
        me = s.getsockname()[1]
        seen = []
        for _ in range(2):
            sent = time.perf_counter_ns()
            s.sendall(b"GET /")
            wait_for("the server to read the head's first part", lambda: unread(served, me) == 0)
            time.sleep(0.2)
            s.sendall(b" HTTP/1.1\r\nhost: x\r\n\r\n")
            s.settimeout(30)
            received, in_app = (int(x) for x in read_response(s).split())
            assert sent < received < in_app
            assert in_app - received >= 200_000_000  # counted from the first read, not the last
            seen.append(received)
        assert seen[0] != seen[1]
