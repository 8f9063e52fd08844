"""A client that never reads cannot hold a lane slot for ever (issue 22, item 11).

A real vLLM streams a long answer to a raw socket with a tiny receive buffer that
is never read; the lane (one slot, ``slow_client: wait``) must be free again soon
after ``max_blocked_s``, and the stalled request's event must say why.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import orjson
import pytest
import yaml

from obs.engines.server import VllmServer
from tests.conftest import SidecarFactory

pytestmark = pytest.mark.engine

CHAT = "/v1/chat/completions"


def _config(tmp_path: Path, replica: str) -> Path:
    lane = {
        "name": "a",
        "pool": "p",
        "admission": {
            "max_concurrency": 1,
            "slow_client": {"policy": "wait", "buffer_bytes": 4096, "max_blocked_s": 1},
        },
        "timeouts": {"connect_s": 30, "first_token_s": 120, "idle_s": 120},
    }
    data = {"version": 1, "pools": [{"name": "p", "replicas": [replica]}], "lanes": [lane],
            "default_lane": "a"}  # fmt: skip
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_a_never_reading_client_frees_its_slot_after_max_blocked(
    vllm: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """The stalled stream ends after max_blocked_s: the next request is served; the event says."""
    sc = sidecar(config=_config(tmp_path, vllm.url), traces=False)
    # Top logprobs make each frame a few kB: the buffers between vLLM and the socket fill
    # within a few dozen tokens even on a slow machine.
    body = {"model": "tiny", "messages": [{"role": "user", "content": "count"}],
            "max_tokens": 1900, "ignore_eos": True, "stream": True, "logprobs": True,
            "top_logprobs": 20}  # fmt: skip
    raw = orjson.dumps(body)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", sc.port))
    s.sendall(
        b"POST %b HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-request-id: stall"
        b"\r\ncontent-length: %d\r\n\r\n%b" % (CHAT.encode(), len(raw), raw)
    )
    small = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    served_at = None
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < 60:
            r = httpx.post(sc.url + CHAT, json=small, timeout=60)
            if r.status_code == 200:
                served_at = time.monotonic() - t0
                break
            assert r.status_code == 429
            time.sleep(0.5)
    finally:
        s.close()
    assert served_at is not None and served_at < 30
    # The 429s before the slot came free are events too: wait for the stalled one itself.
    found = sc.events_of("stall")
    assert found, sc.log_tail()
    stalled = found[0]
    assert stalled["error_class"] == "slow_client"
    assert stalled["status"] == "client_error"
    assert stalled["stream_blocked_ms"] >= 900
