"""Issue 63's liveness attacks on a sidecar process in front of the fake vLLM (loopback only):
``python -m bench.abuse --scenario liveness``.

1. trickling bodies: from four addresses (127.0.6.2-5), each of ``--max-connections``' slots
   gets a POST declaring a 100-byte body and sending one byte; once they have stalled, chats
   from 127.0.6.9 and, ``STALL_S`` later, ``/health`` and ``/ready`` on ``--health-address``.
   Reported: their statuses and the connections evicted.
2. silent sockets on the health listener: 130 from 127.0.6.2, then 15 probes (a new
   connection each, as a kubelet makes) from 127.0.6.3. Reported: the probes' statuses.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import httpx

from bench.abuse_server import _chats, _sock, sidecar_command
from bench.procs import FakeVllm, Server
from obs.procs import free_port
from obs.sidecar.server.health_listener import STALL_S
from obs.sidecar.server.limits import Limits

TRICKLE = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    b"content-length: 100\r\n\r\n{"
)
ATTACKERS = tuple(f"127.0.6.{i}" for i in (2, 3, 4, 5))
CAP = 256


def _probes(url: str, path: str, n: int, addr: str) -> list[int]:
    """``n`` probes of ``path``, each on a new connection from ``addr``: their statuses."""
    out = []
    for _ in range(n):
        try:
            with httpx.Client(
                timeout=5, transport=httpx.HTTPTransport(local_address=addr)
            ) as client:
                out.append(client.get(url + path).status_code)
        except httpx.HTTPError:
            out.append(0)
    return out


def trickling(url: str, port: int, health: str) -> dict[str, Any]:
    held = []
    for i in range(CAP):
        with contextlib.suppress(OSError):
            s = _sock(ATTACKERS[i % 4], port)
            s.sendall(TRICKLE)
            held.append(s)
    time.sleep(Limits().body_stall_s + 1)  # the bodies have stalled
    chats = _chats(url, "127.0.6.9", 10)
    time.sleep(STALL_S + 1)  # as long as the relay would have refused everyone before
    live = _probes(health, "/health", 15, "127.0.6.10")
    ready = _probes(health, "/ready", 15, "127.0.6.10")
    for s in held:
        s.close()
    return {
        "trickling_sockets": len(held),
        "chat_status": [c for c, _ in chats],
        "health_status": live,
        "ready_status": ready,
    }


def silent_health(health: str, health_port: int) -> dict[str, Any]:
    held = []
    for _ in range(130):
        with contextlib.suppress(OSError):
            held.append(_sock("127.0.6.2", health_port))
    probes = _probes(health, "/health", 15, "127.0.6.3")
    for s in held:
        s.close()
    return {"silent_sockets": len(held), "probe_status": probes}


def measure_liveness(work: Path) -> dict[str, Any]:
    fake = FakeVllm(work, ttft_ms=20, itl_ms=5)
    fake.start()
    port, health_port = free_port(), free_port()
    health = f"http://127.0.0.1:{health_port}"
    cmd = sidecar_command(
        fake.url,
        port,
        work / "liveness.jsonl",
        "--max-connections",
        str(CAP),
        "--idle-timeout",
        "60",
        "--header-timeout",
        "60",
        "--health-address",
        f"127.0.0.1:{health_port}",
    )
    url = f"http://127.0.0.1:{port}"
    sidecar = Server("sidecar", cmd, work / "liveness.log", url + "/health")
    sidecar.start()
    out: dict[str, Any] = {}
    try:
        out["trickling"] = trickling(url, port, health)
        out["silent_health"] = silent_health(health, health_port)
        metrics = httpx.get(url + "/metrics", timeout=30).text
        out["limits"] = [
            x
            for x in metrics.splitlines()
            if x.startswith("vllm_obs_connection_limits_total") and not x.endswith(" 0.0")
        ]
    finally:
        sidecar.stop()
        fake.stop()
    return out
