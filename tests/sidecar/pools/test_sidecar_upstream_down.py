"""The sidecar when its pool is unreachable, and after the pool comes back."""

from __future__ import annotations

import httpx
import pytest

from obs.engines.server import VllmServer
from obs.procs import free_port
from tests.conftest import SidecarFactory
from tests.support.forwarder import Forwarder

pytestmark = pytest.mark.engine

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_upstream_down_fails_fast_then_recovers(vllm: VllmServer, sidecar: SidecarFactory) -> None:
    """Pool refusing connections: an OpenAI-style 503 at once, recorded; then it serves again.

    "At once" is judged by the event, not the clock: the request ended in the queue phase as
    a refused connection (upstream_connect), not a timeout, while the pool was still down (the
    client's 60 s are a hang guard)."""
    fwd = Forwarder(vllm.port, free_port())
    sc = sidecar(fwd.url, traces=False)
    r = httpx.post(sc.url + "/v1/chat/completions", json=BODY, timeout=60)
    assert r.status_code == 503
    assert r.headers["retry-after"] == "1"
    err = r.json()["error"]
    assert "unavailable" in err["message"] and err["type"] == "ServiceUnavailableError"
    assert err["code"] == 503
    fwd.start()
    try:
        r2 = httpx.post(sc.url + "/v1/chat/completions", json=BODY, timeout=30)
        assert r2.status_code == 200
        down, up = sc.wait_events(2)
    finally:
        fwd.stop()
    assert (down["status"], down["error_class"], down["http_status"]) == (
        "error",
        "upstream_connect",
        503,
    )
    assert down["error_phase"] == "queue"
    assert up["status"] == "ok"
    health = httpx.get(sc.url + "/health").json()
    assert health["pools"]["default"][fwd.url] is True
