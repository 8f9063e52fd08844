"""Issue 38's attacks on the relay's own server, one after another, against a sidecar in front of
the fake vLLM (loopback only): ``python -m bench.abuse --scenario server``.

1. pipelining: ``--sockets`` sockets from 127.0.0.2, each writing 6,000 pipelined
   ``GET /health`` and reading nothing; meanwhile chats from 127.0.0.3. Reported: the
   sidecar's memory high-water mark (VmHWM) and the chats' latencies.
2. reserved bodies: eight sockets from four addresses declare 32 MiB bodies and send none;
   five POSTs from 127.0.0.9. Reported: their statuses.
3. silent sockets: 512 from each of four addresses; /health and chats from 127.0.0.9.
   Reported: their statuses and the connections evicted.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.procs import FakeVllm, ProcStat, Server
from obs.procs import free_port


def sidecar_command(upstream: str, port: int, events: Path, *extra: str) -> list[str]:
    """The sidecar in front of the fake vLLM, as the abuse benchmarks start it."""
    head = [sys.executable, "-m", "obs.cli", "sidecar", "--upstream", upstream, "--model", "tiny"]
    return [*head, "--port", str(port), "--events", str(events), *extra]


CHAT = json.dumps(
    {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
).encode()
PIPELINED = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n" * 6000
DECLARED = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    b"content-length: 33554432\r\n\r\n"
)


def _sock(addr: str, port: int, timeout_s: float = 30) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout_s, source_address=(addr, 0))
    s.settimeout(timeout_s)
    return s


def _chats(url: str, addr: str, n: int) -> list[tuple[int, float]]:
    """``n`` chats from ``addr``, one after another: (status, seconds) each."""
    out = []
    with httpx.Client(
        base_url=url, timeout=60, transport=httpx.HTTPTransport(local_address=addr)
    ) as c:
        for _ in range(n):
            t0 = time.monotonic()
            try:
                code = c.post(
                    "/v1/chat/completions",
                    content=CHAT,
                    headers={"content-type": "application/json"},
                ).status_code
            except httpx.HTTPError:
                code = 0
            out.append((code, round(time.monotonic() - t0, 3)))
    return out


def pipelining(url: str, port: int, pid: int, sockets: int) -> dict[str, Any]:
    held: list[socket.socket] = []
    stop = threading.Event()

    def attack() -> None:
        with contextlib.suppress(OSError):
            s = _sock("127.0.0.2", port)
            held.append(s)
            s.sendall(PIPELINED)  # blocks once the sidecar stops reading
            stop.wait(60)

    threads = [threading.Thread(target=attack, daemon=True) for _ in range(sockets)]
    for t in threads:
        t.start()
    time.sleep(3)
    chats = _chats(url, "127.0.0.3", 5)
    peak = ProcStat(pid).peak_rss_mib()
    stop.set()
    for s in held:
        s.close()
    return {
        "sockets": sockets,
        "requests_each": 6000,
        "high_water_mib": round(peak, 1),
        "chat_status": [c for c, _ in chats],
        "chat_s": [s for _, s in chats],
    }


def reserved_bodies(url: str, port: int) -> dict[str, Any]:
    held = []
    for i in range(8):
        s = _sock(f"127.0.0.{2 + i % 4}", port)
        s.sendall(DECLARED)
        held.append(s)
    time.sleep(0.5)
    chats = _chats(url, "127.0.0.9", 5)
    for s in held:
        s.close()
    return {"declared_sockets": 8, "post_status": [c for c, _ in chats]}


def silent(url: str, port: int) -> dict[str, Any]:
    held = []
    for i in range(4 * 512):
        with contextlib.suppress(OSError):
            held.append(_sock(f"127.0.0.{2 + i % 4}", port))
    time.sleep(0.5)
    with httpx.Client(
        base_url=url, timeout=30, transport=httpx.HTTPTransport(local_address="127.0.0.9")
    ) as c:
        health = [c.get("/health").status_code for _ in range(20)]
    chats = _chats(url, "127.0.0.9", 10)
    for s in held:
        s.close()
    return {
        "silent_sockets": len(held),
        "health_status_not_200": sum(h != 200 for h in health),
        "chat_status_not_200": sum(c != 200 for c, _ in chats),
    }


def measure_server(work: Path, sockets: int = 50) -> dict[str, Any]:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    fake = FakeVllm(work, ttft_ms=20, itl_ms=5)
    fake.start()
    out: dict[str, Any] = {}
    try:
        for name in ("pipelining", "reserved_bodies", "silent"):
            port = free_port()  # a fresh sidecar each: each high-water mark is its own
            cmd = sidecar_command(fake.url, port, work / f"{name}.jsonl", "--idle-timeout", "60")
            url = f"http://127.0.0.1:{port}"
            sidecar = Server("sidecar", cmd, work / f"{name}.log", url + "/health")
            sidecar.start()
            try:
                if name == "pipelining":
                    out[name] = pipelining(url, port, sidecar.pid, sockets)
                elif name == "reserved_bodies":
                    out[name] = reserved_bodies(url, port)
                else:
                    out[name] = silent(url, port)
                    metrics = httpx.get(url + "/metrics", timeout=30).text
                    out[name]["limits"] = [
                        x
                        for x in metrics.splitlines()
                        if x.startswith("vllm_obs_connection_limits_total")
                        and not x.endswith(" 0.0")
                    ]
            finally:
                sidecar.stop()
    finally:
        fake.stop()
    return out
