"""What the client lived, against a real `vllm serve`: a slow upload is the client's time, and a
slow reader's stream phase runs to the last byte its side acknowledged, on every connection kind.

Raw sockets with a 4 KiB receive buffer set before ``connect`` (bench/client_time.py's client,
which measures the same with 600 tokens too).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import orjson
import pytest

from bench.client_time import KINDS, raw_post, read_paced, small_socket
from obs import conventions as c
from obs.engines.server import VllmServer
from tests.conftest import SidecarFactory
from tests.support import chat_body
from tests.support.probes import CHAT

pytestmark = pytest.mark.engine

RATE = 4096  # bytes/s: a 150-token answer (~33 KB) takes about 8 s


def _body(rid: str, tokens: int) -> bytes:
    return orjson.dumps(chat_body(f"tell me {rid}", tokens, stream=True, ignore_eos=True))


def _read(port: int, kind: str, out: dict[str, Any]) -> None:
    rid = uuid.uuid4().hex[:16]
    with small_socket(port) as sock:
        t0 = time.monotonic()
        sock.sendall(raw_post(CHAT, _body(rid, 150), kind, {"x-request-id": rid}))
        _, t_end = read_paced(sock, kind, RATE)
    out[kind] = (rid, t_end - t0)


def test_slow_upload_and_slow_readers_are_the_clients_time(
    vllm: VllmServer, sidecar: SidecarFactory
) -> None:
    """A body sent over 1.5 s: its TTFT and queue phase start when it is complete, the 1.5 s is
    upload_ms. Then three clients reading ~4 KB/s, kept alive, Connection: close and HTTP/1.0:
    each event's e2e within 20% of the client's own time, or client_unread_bytes > 0."""
    sc = sidecar(vllm.url, traces=False)
    rid = uuid.uuid4().hex[:16]
    head, rest = raw_post(CHAT, _body(rid, 8), "close", {"x-request-id": rid}).split(b"\r\n\r\n", 1)
    step = max(1, len(rest) // 10)
    with small_socket(sc.port, rcvbuf=None) as sock:
        sock.sendall(head + b"\r\n\r\n")
        for i in range(0, len(rest), step):
            time.sleep(0.15)
            sock.sendall(rest[i : i + step])
        read_paced(sock, "close", 1e12, chunk=65536)
    ev = sc.events_of(rid)[0]
    assert ev["status"] == c.OK
    assert ev["upload_ms"] >= 1400
    assert ev["queue_ms"] < 100
    assert ev["ttft_ms"] < 1000  # the engine's own time on a busy CPU: never the upload's

    got: dict[str, Any] = {}
    threads = [threading.Thread(target=_read, args=(sc.port, kind, got)) for kind in KINDS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert set(got) == set(KINDS)
    for kind, (rid, client_s) in got.items():
        ev = sc.events_of(rid)[0]
        assert ev["status"] == c.OK, kind
        e2e_s = ev["e2e_ms"] / 1000
        assert ev["client_unread_bytes"] or abs(e2e_s - client_s) <= 0.2 * client_s, (
            kind,
            e2e_s,
            client_s,
        )
        assert ev["stream_ms"] > ev["decode_ms"], kind  # the client's reading, not decode
