"""Issue 22's abuse, all at once, against a sidecar in front of the fake vLLM (loopback only).

While legitimate streamed requests run, attackers send: thousands of idle
connections, slowloris headers and bodies, 32 MB headers, 100k headers, gzip
bombs and 1 MB-attribute spans to ``/v1/traces``, forged spans with NaN
timings, 30 MB bodies of empty objects, and requests with made-up model names.
A prober (its own process) reads ``/health`` every 20 ms. Reported: the sidecar's peak RSS, the
slowest ``/health``, legitimate requests answered vs their events written, and
the limit counters. Bounded: every attack has a count and the run a duration.

    .venv/bin/python -m bench.abuse --seconds 30 --out bench/results/abuse.json

``--scenario flood`` measures issue 25's bar instead: 2,048 silent sockets from one
address, ``/health`` probed from another (a new connection each, as a kubelet's) on the
relay port and on ``--health-address``, chats from a third:

    .venv/bin/python -m bench.abuse --scenario flood --seconds 30 \\
        --out bench/results/abuse-flood.json

``--scenario server``: issue 38's attacks on the relay's own server (bench.abuse_server),
``--out bench/results/abuse-server.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import socket
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.abuse_liveness import measure_liveness
from bench.abuse_server import measure_server, sidecar_command
from bench.procs import FakeVllm, ProcStat, Server
from obs.procs import free_port
from obs.sidecar.testing import llm_request_export

CHAT = "/v1/chat/completions"
PROTOBUF = {"content-type": "application/x-protobuf"}
COUNTERS = (
    "vllm_obs_connection_limits_total",
    "vllm_obs_trace_exports_refused_total",
    "vllm_obs_engine_spans_total",
)


class Run:
    """The sidecar under attack and what the probes saw."""

    def __init__(self, port: int, seconds: float) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.until = time.monotonic() + seconds
        self.health_ms: list[float] = []
        self.legit_ok = 0
        self.legit_failed = 0
        self.lock = threading.Lock()

    def running(self) -> bool:
        return time.monotonic() < self.until

    def sock(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        s.settimeout(30)
        return s


def probe_health(url: str, seconds: float, out: Any) -> None:
    """In its own process: the attackers' threads must not delay the probe's own clock."""
    times: list[float] = []
    until = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=10) as client:
        while time.monotonic() < until:
            t0 = time.perf_counter()
            with contextlib.suppress(httpx.HTTPError):
                client.get("/health")
            times.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.02)
    out.put(times)


def probe_fresh(url: str, seconds: float, out: Any, source: str) -> None:
    """In its own process, a new connection from ``source`` per probe, as a kubelet's is;
    puts each probe's (ms, status), status 0 for no answer."""
    probes: list[tuple[float, int]] = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        t0 = time.perf_counter()
        code = 0
        transport = httpx.HTTPTransport(local_address=source)
        with contextlib.suppress(httpx.HTTPError), httpx.Client(transport=transport) as c:
            code = c.get(url + "/health", timeout=10, headers={"connection": "close"}).status_code
        probes.append(((time.perf_counter() - t0) * 1000, code))
        time.sleep(0.02)
    out.put(probes)


def legit(run: Run, source: str = "127.0.0.1") -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "max_tokens": 16}  # fmt: skip
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(base_url=run.url, timeout=60, transport=transport) as client:
        while run.running():
            try:
                with client.stream("POST", CHAT, json=body) as r:
                    data = r.read()
                ok = r.status_code == 200 and data.endswith(b"data: [DONE]\n\n")
            except httpx.HTTPError:
                ok = False
            with run.lock:
                if ok:
                    run.legit_ok += 1
                else:
                    run.legit_failed += 1


def idle_connections(run: Run, n: int = 3000) -> None:
    time.sleep(2)  # the slow senders first: they are cut by their timeouts, not refused
    held = []
    for _ in range(n):
        with contextlib.suppress(OSError):
            held.append(run.sock())
    while run.running():
        time.sleep(0.2)
    for s in held:
        s.close()


def slowloris(run: Run, n: int = 50, body: bool = False) -> None:
    socks = []
    for _ in range(n):
        with contextlib.suppress(OSError):
            s = run.sock()
            head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
            s.sendall(head + (b"content-length: 100000\r\n\r\n{" if body else b""))
            socks.append(s)
    while run.running() and socks:
        for s in list(socks):
            try:
                s.sendall(b" " if body else b"x")
            except OSError:
                socks.remove(s)
        time.sleep(2)
    for s in socks:
        s.close()


def huge_headers(run: Run, n: int = 10) -> None:
    for _ in range(n):
        with contextlib.suppress(OSError), run.sock() as s:
            s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: ")
            for _ in range(32):
                s.sendall(b"a" * (1 << 20))
    with contextlib.suppress(OSError), run.sock() as s:
        s.sendall(b"GET /health HTTP/1.1\r\n" + b"x: a\r\n" * 100_000 + b"\r\n")


def trace_abuse(run: Run) -> None:
    z = zlib.compressobj(1, zlib.DEFLATED, 31)
    bomb = b"".join(z.compress(b"\0" * (16 << 20)) for _ in range(64)) + z.flush()
    big = "x" * (1 << 20)
    with httpx.Client(base_url=run.url, timeout=60) as client:
        for _ in range(5):
            with contextlib.suppress(httpx.HTTPError):
                client.post(
                    "/v1/traces", content=bomb, headers={**PROTOBUF, "content-encoding": "gzip"}
                )
        for i in range(300):
            with contextlib.suppress(httpx.HTTPError):
                body = llm_request_export(i.to_bytes(16, "big"), **{"gen_ai.request.id": big})
                client.post("/v1/traces", content=body, headers=PROTOBUF)
        for i in range(100):
            with contextlib.suppress(httpx.HTTPError):
                nan = {"gen_ai.latency.time_in_queue": float("nan")}
                forged = llm_request_export(i.to_bytes(16, "little"), **nan)
                client.post("/v1/traces", content=forged, headers=PROTOBUF)


def big_bodies(run: Run, n: int = 3) -> None:
    body = b'{"model":"tiny","messages":[' + b",".join([b"{}"] * 10_000_000) + b"]}"
    with httpx.Client(base_url=run.url, timeout=120) as client:
        for _ in range(n):
            with contextlib.suppress(httpx.HTTPError):
                client.post(CHAT, content=body, headers={"content-type": "application/json"})


def made_up_models(run: Run, n: int = 3000) -> None:
    with httpx.Client(base_url=run.url, timeout=30) as client:
        for i in range(n):
            if not run.running():
                return
            body = {"model": f"m{i}" * 10, "messages": [], "max_tokens": 1}
            with contextlib.suppress(httpx.HTTPError):
                client.post(CHAT, json=body, headers={"x-tenant": f"t{i}"})


ATTACKS: dict[str, Callable[[Run], None]] = {
    "idle_connections": idle_connections,
    "slowloris_headers": slowloris,
    "slowloris_body": lambda run: slowloris(run, body=True),
    "huge_headers": huge_headers,
    "trace_abuse": trace_abuse,
    "big_bodies": big_bodies,
    "made_up_models": made_up_models,
}


def silent_flood(run: Run, n: int = 2048, source: str = "127.0.0.2") -> None:
    """``n`` silent sockets from ``source``, held all run: those the sidecar closes (its idle
    timeout, its refusals) are opened again every second."""
    held: list[socket.socket] = []
    while run.running():
        alive = []
        for s in held:
            try:
                s.setblocking(False)
                if s.recv(1, socket.MSG_PEEK) == b"":
                    s.close()
                    continue
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                continue
            alive.append(s)
        held = alive
        while len(held) < n and run.running():
            try:
                held.append(
                    socket.create_connection(
                        ("127.0.0.1", run.port), timeout=5, source_address=(source, 0)
                    )
                )
            except OSError:
                break
        time.sleep(1.0)
    for s in held:
        s.close()


def measure_flood(seconds: float, work: Path, flood: bool = True) -> dict[str, Any]:
    """Issue 25's bar: 2,048 silent sockets from 127.0.0.2 while /health is probed from
    127.0.0.3 on the relay port and on --health-address, and chats come from 127.0.0.4."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    fake = FakeVllm(work, ttft_ms=20, itl_ms=5)
    fake.start()
    port, health_port = free_port(), free_port()
    cmd = sidecar_command(
        fake.url, port, work / "events.jsonl", "--health-address", f"127.0.0.1:{health_port}"
    )
    sidecar = Server("sidecar", cmd, work / "sidecar.log", f"http://127.0.0.1:{port}/health")
    sidecar.start()
    run = Run(port, seconds)
    ctx = multiprocessing.get_context("spawn")
    queues: dict[str, Any] = {}
    probers = []
    for name, url in (
        ("relay_port", run.url),
        ("health_address", f"http://127.0.0.1:{health_port}"),
    ):
        queues[name] = ctx.Queue()
        probers.append(
            ctx.Process(target=probe_fresh, args=(url, seconds, queues[name], "127.0.0.3"))
        )
    threads = [threading.Thread(target=legit, args=(run, "127.0.0.4")) for _ in range(4)]
    if flood:
        threads.append(threading.Thread(target=silent_flood, args=(run,)))
    try:
        for t in threads:
            t.start()
        for pr in probers:
            pr.start()
        for t in threads:
            t.join(seconds + 60)
        probes = {name: q.get(timeout=60) for name, q in queues.items()}
        for pr in probers:
            pr.join(10)
        metrics = httpx.get(run.url + "/metrics", timeout=30).text
    finally:
        sidecar.stop()
        fake.stop()
    out: dict[str, Any] = {"flood": flood, "seconds": seconds}
    for name, got in probes.items():
        ms = sorted(m for m, _ in got)
        out[f"health_{name}"] = {
            "probes": len(got),
            "not_200": sum(1 for _, code in got if code != 200),
            "over_100_ms": sum(1 for m in ms if m > 100),
            "p50_ms": round(ms[len(ms) // 2], 1) if ms else None,
            "p99_ms": round(ms[int(len(ms) * 0.99)], 1) if ms else None,
            "max_ms": round(ms[-1], 1) if ms else None,
        }
    out["legit_answered"], out["legit_failed"] = run.legit_ok, run.legit_failed
    out["limits"] = [
        x for x in metrics.splitlines() if x.startswith(COUNTERS[0]) and not x.endswith(" 0.0")
    ]
    return out


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(seconds: float, work: Path, attacks: bool = True) -> dict[str, Any]:
    fake = FakeVllm(work, ttft_ms=20, itl_ms=5)
    fake.start()
    port = free_port()
    events = work / "events.jsonl"
    cmd = sidecar_command(fake.url, port, events, "--engine-traces", "--engine-join-wait", "0.5")
    sidecar = Server("sidecar", cmd, work / "sidecar.log", f"http://127.0.0.1:{port}/health")
    sidecar.start()
    stat = ProcStat(sidecar.pid)
    stat.reset_peak_rss()
    run = Run(port, seconds)
    rss_start = _rss_mib(sidecar.pid)
    ctx = multiprocessing.get_context("spawn")
    probes: Any = ctx.Queue()
    prober = ctx.Process(target=probe_health, args=(run.url, seconds, probes))
    prober.start()
    threads = [threading.Thread(target=legit, args=(run,)) for _ in range(4)]
    if attacks:
        threads += [threading.Thread(target=fn, args=(run,), name=n) for n, fn in ATTACKS.items()]
    t0 = time.monotonic()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 180)
        elapsed = time.monotonic() - t0
        run.health_ms = probes.get(timeout=60)
        prober.join(10)
        time.sleep(1.5)  # the join wait and the event writer's flush
        metrics = httpx.get(run.url + "/metrics", timeout=30).text
        peak = stat.peak_rss_mib()
        rss_end = _rss_mib(sidecar.pid)
    finally:
        sidecar.stop()
        fake.stop()
    lines = [json.loads(x) for x in events.read_bytes().splitlines()] if events.exists() else []
    legit_events = sum(1 for e in lines if e["model"] == "tiny" and e["status"] == "ok")
    health = sorted(run.health_ms)
    return {
        "seconds": round(elapsed, 1),
        "peak_rss_mib": round(peak, 1),
        "rss_start_mib": round(rss_start, 1),
        "rss_end_mib": round(rss_end, 1),
        "health_probes": len(health),
        "health_max_ms": round(health[-1], 1) if health else None,
        "health_p99_ms": round(health[int(len(health) * 0.99)], 1) if health else None,
        "legit_answered": run.legit_ok,
        "legit_failed": run.legit_failed,
        "legit_events_ok": legit_events,
        "limits": [x for x in metrics.splitlines() if x.startswith(COUNTERS)],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="how long the abuse lasts")
    ap.add_argument("--out", type=Path, help="also write the JSON summary here")
    ap.add_argument(
        "--baseline", action="store_true", help="legitimate load and the probe only, no attack"
    )
    ap.add_argument(
        "--scenario",
        choices=["all", "flood", "server", "liveness"],
        default="all",
        help="all: every attack at once; flood: 2,048 silent sockets from one address, /health "
        "probed from another on the relay port and on --health-address; server: the relay "
        "server's attacks; liveness: trickling bodies at the cap and silent sockets on "
        "--health-address (default: all)",
    )
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vllm-obs-abuse-") as tmp:
        if args.scenario == "server":
            summary = measure_server(Path(tmp))
        elif args.scenario == "liveness":
            summary = measure_liveness(Path(tmp))
        elif args.scenario == "flood":
            summary = measure_flood(args.seconds, Path(tmp), flood=not args.baseline)
        else:
            summary = measure(args.seconds, Path(tmp), attacks=not args.baseline)
    summary["attacks"] = not args.baseline
    summary["load_average_1m"] = round(os.getloadavg()[0], 1)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
