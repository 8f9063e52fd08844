"""Fallback on the faults no real vLLM produces on demand: a 500, a pool that accepts the
connection and never answers, a stream cut after its first token (fake pools: the scripted
pool of tests/support, and a socket that never accepts). The real-vLLM case (the first
pool refusing connections) is in test_traffic_vllm.py."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from obs import conventions as c
from obs.sidecar.testing import SidecarProcess
from tests.conftest import SidecarFactory
from tests.support import probes
from tests.support.lanes_support import CHAT, lanes_config
from tests.support.scripted_upstream import Script, ScriptedUpstream

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
TOKEN = b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'  # noqa: E501
ANSWER = b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}'  # noqa: E501


@pytest.fixture
def pools() -> Iterator[tuple[ScriptedUpstream, ScriptedUpstream, str]]:
    """The lane's pool (scripted), its fallback (scripted), and a port that never answers."""
    silent = socket.create_server(("127.0.0.1", 0))  # listens, never accepts: no answer
    with ScriptedUpstream() as primary, ScriptedUpstream() as spare:
        yield primary, spare, f"http://127.0.0.1:{silent.getsockname()[1]}"
    silent.close()


def _sidecar(sidecar: SidecarFactory, tmp_path: Path, primary: str, spare: str) -> SidecarProcess:
    lane = {
        "name": "chat",
        "pool": "primary",
        "fallback": "spare",
        "timeouts": {"connect_s": 5, "first_token_s": 4, "idle_s": 5},  # room on a loaded box
    }
    config = lanes_config(tmp_path, {"primary": [primary], "spare": [spare]}, [lane])
    return sidecar(config=config, args=("--pool-poll-interval", "60"), traces=False)


def _post(sc: SidecarProcess, rid: str, stream: bool = False) -> httpx.Response:
    body = {**BODY, "stream": stream}
    return httpx.post(sc.url + CHAT, json=body, headers={"x-request-id": rid}, timeout=30)


def test_a_5xx_and_a_silent_pool_fall_back_before_the_first_byte(
    sidecar: SidecarFactory,
    tmp_path: Path,
    pools: tuple[ScriptedUpstream, ScriptedUpstream, str],
) -> None:
    """A 500 from the lane's pool, and a pool that never sends its response head within
    first_token_s: the fallback answers, and the events say server_error and timeout."""
    primary, spare, silent = pools
    primary.scripts["r500"] = Script(500, "application/json", [b'{"error":"boom"}'])
    for rid in ("r500", "slow"):
        spare.scripts[rid] = Script(200, "application/json", [ANSWER])
    sc = _sidecar(sidecar, tmp_path, primary.url, spare.url)
    r = _post(sc, "r500")
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok"
    ev = sc.events_of("r500")[0]
    assert (ev["pool"], ev["fallback_from"], ev["fallback_reason"]) == (
        "spare",
        "primary",
        c.FALLBACK_SERVER_ERROR,
    )
    sc.stop()
    (tmp_path / "slow").mkdir()
    slow = _sidecar(sidecar, tmp_path / "slow", silent, spare.url)
    r = _post(slow, "slow")
    assert r.status_code == 200, r.text
    ev = slow.events_of("slow")[0]
    assert (ev["status"], ev["fallback_from"], ev["fallback_reason"]) == (
        c.OK,
        "primary",
        c.FALLBACK_TIMEOUT,
    )
    assert ev["queue_ms"] >= 1500  # the wait on the silent pool counts as queueing


def test_a_stream_that_started_never_falls_back(
    sidecar: SidecarFactory,
    tmp_path: Path,
    pools: tuple[ScriptedUpstream, ScriptedUpstream, str],
) -> None:
    """A stream cut after its first token ends with an error frame; the fallback pool is
    never asked (a client must not get two answers)."""
    primary, spare, _ = pools
    primary.scripts["cut"] = Script(200, "text/event-stream", [TOKEN], ending="cut")
    spare.scripts["cut"] = Script(200, "text/event-stream", [TOKEN, b"data: [DONE]\n\n"])
    sc = _sidecar(sidecar, tmp_path, primary.url, spare.url)
    r = _post(sc, "cut", stream=True)
    assert r.status_code == 200 and r.content.startswith(TOKEN)
    assert any(probes.is_error_frame(f) for f in probes.sse_frames(r.content)), r.content
    ev = sc.events_of("cut")[0]
    assert ev["status"] == c.ERROR and ev["pool"] == "primary", ev
    assert ev["fallback_from"] is None and ev["fallback_reason"] is None
    assert probes.metric(sc.url, c.FALLBACKS.name + "_total") == 0
