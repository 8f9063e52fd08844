"""The client's upload is the client's time, against a real `vllm serve`: a body sent over
1.5 s starts the server's clock when it is complete.

A raw socket sends the body in ten pieces (bench/client_time.py's client, which also measures
slow readers on each connection kind; tests/sidecar/server/test_inproc_client_time.py pins
those against a scripted pool, where the bytes on the wire do not depend on the engine's pace).
"""

from __future__ import annotations

import time
import uuid

import orjson
import pytest

from bench.client_time import raw_post, read_paced, small_socket
from obs import conventions as c
from obs.engines.server import VllmServer
from tests.conftest import SidecarFactory
from tests.support import chat_body
from tests.support.probes import CHAT

pytestmark = pytest.mark.engine


def test_a_slow_upload_is_not_queue_or_ttft(vllm: VllmServer, sidecar: SidecarFactory) -> None:
    """A body sent over 1.5 s to an idle pool: upload_ms holds the 1.5 s; the queue phase (and so
    TTFT, queue + prefill + first token) starts when the body is complete."""
    sc = sidecar(vllm.url, traces=False)
    rid = uuid.uuid4().hex[:16]
    body = orjson.dumps(chat_body(f"tell me {rid}", 8, stream=True))
    head, rest = raw_post(CHAT, body, "close", {"x-request-id": rid}).split(b"\r\n\r\n", 1)
    step = max(1, len(rest) // 10)
    with small_socket(sc.port, rcvbuf=None) as sock:
        sock.sendall(head + b"\r\n\r\n")
        for i in range(0, len(rest), step):
            time.sleep(0.15)
            sock.sendall(rest[i : i + step])
        data, _ = read_paced(sock, "close", 1e12, chunk=65536)
    assert b"data: [DONE]" in data
    ev = sc.events_of(rid)[0]
    assert ev["status"] == c.OK
    assert ev["upload_ms"] >= 1400
    assert ev["queue_ms"] < 100
    ttft = ev["queue_ms"] + ev["prefill_ms"] + ev["first_token_ms"]
    assert ev["ttft_ms"] == pytest.approx(ttft, abs=0.01)
