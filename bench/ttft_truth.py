"""How true is the event's TTFT? Client TTFT from the kernel's arrival time, minus ttft_ms.

A raw-socket client sends each streamed chat request through the sidecar (in
front of a real `vllm serve`) and reads the response with ``SO_TIMESTAMPNS``:
the kernel stamps each received segment, so the client's TTFT is the arrival of
the segment that completed the first output frame minus the moment the request
was sent. The event's ``ttft_ms`` starts at the first bytes the sidecar read and
ends when it handed the frame to the kernel; the difference is what the record
misses (loopback transfer both ways, the accept). Prints median and p95 of the
difference at each concurrency, and, to tell where a large difference went: how many
requests missed more than 50 ms, over how long a span of send times they were sent, and
how many of the sidecar's event-loop lag samples (``vllm_obs_event_loop_lag_seconds``)
in that run were above 100 ms (a stalled loop, rather than the kernel or the client).

``--target`` runs the same client against other servers in front of the same vLLM, to
tell the sidecar's own delays from the machine's: ``nginx`` (the relay benchmark's SSE
proxy), ``asyncio`` (a minimal byte forwarder on uvloop, this module run with
``--forward``) and ``vllm`` (no proxy). For every target it samples the listening
socket's accept queue (``bench.procs.AcceptQueue``): the longest queue, how often one
connection or more waited, and the mean wait of a connection before the server accepted
it. ``--rounds`` repeats the targets in turn, so that a quiet or busy spell of the machine
falls on all of them.

    .venv/bin/python -m bench.ttft_truth --concurrency 1 8 --requests 200
    .venv/bin/python -m bench.ttft_truth --concurrency 8 --requests 200 --rounds 3 \\
        --target sidecar nginx asyncio vllm
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import struct
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.procs import ROOT, AcceptQueue, Nginx, Server, vllm_and_sidecar
from obs import conventions as c
from obs.procs import free_port
from obs.prom.api import sample_sum, scrape
from obs.sidecar.testing import SidecarProcess

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
CHAT = "/v1/chat/completions"


def one_request(port: int, rid: str, max_tokens: int) -> tuple[int, float]:
    """(send time in ns, client TTFT in ms: send to kernel arrival of the first output)."""
    body = json.dumps(
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "def fibonacci(n):"}],
            "max_tokens": max_tokens,
            "stream": True,
            "ignore_eos": True,
        }
    ).encode()
    head = (
        f"POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"x-request-id: {rid}\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sent = time.time_ns()
        s.sendall(head + body)
        got = b""
        first: int | None = None
        while True:
            data, anc, _, _ = s.recvmsg(65536, 64)
            if not data:
                break
            got += data
            if first is None and b'"content":"' in got.replace(b'"content":""', b""):
                first = _stamp(anc)
        if first is None:
            raise RuntimeError(f"no output in the response to {rid}: {got[:300]!r}")
    return sent, (first - sent) / 1e6


def _stamp(anc: list[tuple[int, int, bytes]]) -> int:
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, nsec = struct.unpack("qq", data[:16])
            return sec * 1_000_000_000 + nsec
    return time.time_ns()  # no stamp: the read's time (never seen on Linux loopback)


def run(port: int, concurrency: int, n: int, max_tokens: int) -> dict[str, tuple[int, float]]:
    out: dict[str, tuple[int, float]] = {}
    lock = threading.Lock()
    todo = iter(range(n))

    def worker() -> None:
        while True:
            with lock:
                if next(todo, None) is None:
                    return
            rid = uuid.uuid4().hex[:16]
            t = one_request(port, rid, max_tokens)
            with lock:
                out[rid] = t

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def stalls(url: str) -> float:
    """The sidecar's event-loop lag samples so far that were above 100 ms."""
    name, now = c.EVENT_LOOP_LAG.name, scrape(url)
    return sample_sum(now, name + "_count") - sample_sum(now, name + "_bucket", le="0.1")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def wait_events(sc: SidecarProcess, total: int) -> dict[str, Any]:
    """Every event by request id, once ``total`` are written (one per request sent)."""
    return {e["request_id"]: e for e in sc.wait_events(total, timeout_s=30)}


def summarize(client: dict[str, tuple[int, float]], queue: dict[str, float]) -> dict[str, Any]:
    """Client TTFT's spread and the accept queue's figures: any target."""
    ttft = [t for _, t in client.values()]
    return {
        "requests": len(ttft),
        "client_ttft_p50_ms": statistics.median(ttft),
        "client_ttft_p95_ms": pct(ttft, 0.95),
        "client_ttft_max_ms": max(ttft),
        "accept_queue_max": queue["accept_queue_max"],
        "accept_queue_busy_share": queue["accept_queue_busy_share"],
        "accept_wait_mean_ms": queue["accept_queued_s"] * 1000 / max(len(ttft), 1),
        "accept_busy_asleep_share": queue["accept_busy_asleep_share"],
        "server_cpu_ms_per_request": queue["server_cpu_s"] * 1000 / max(len(ttft), 1),
        "server_runqueue_ms_per_request": queue["server_runqueue_s"] * 1000 / max(len(ttft), 1),
    }


def against_events(
    client: dict[str, tuple[int, float]], events: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """What the sidecar's events miss of the client's TTFT."""
    diff = {r: t - events[r]["ttft_ms"] for r, (_, t) in client.items() if r in events}
    late = sorted(client[r][0] for r, d in diff.items() if d > 50)
    return {
        "diff_p50_ms": statistics.median(diff.values()),
        "diff_p95_ms": pct(list(diff.values()), 0.95),
        "diff_max_ms": max(diff.values()),
        "missed_over_50ms": len(late),
        "their_send_span_ms": (late[-1] - late[0]) / 1e6 if late else 0.0,
    }


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError):
        writer.close()


async def _forward(port: int, upstream_port: int) -> None:
    """Accept on ``port`` and copy bytes both ways to ``upstream_port``: nothing else."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    # the sidecar's backlog (obs.sidecar.serve.BACKLOG), so the queue has the same room
    server = await asyncio.start_server(connection, "127.0.0.1", port, backlog=2048)
    async with server:
        await server.serve_forever()


class Forwarder(Server):
    """This module's ``--forward`` as a subprocess: the smallest asyncio server there is."""

    def __init__(self, work: Path, upstream_port: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "bench.ttft_truth", "--forward", str(upstream_port)]
        cmd += ["--port", str(self.port)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        super().__init__("forwarder", cmd, work / "forwarder.log", self.url + "/health", env=env)


TARGETS = ("sidecar", "nginx", "asyncio", "vllm")


@contextlib.contextmanager
def targets(names: list[str]) -> Iterator[tuple[SidecarProcess, dict[str, int]]]:
    """vLLM, the sidecar, and each other target of ``names`` in front of vLLM: their ports."""
    no_spans = {"OTEL_TRACES_EXPORTER": "none"}
    with vllm_and_sidecar("vllm-obs-ttft-truth-", no_spans) as (vllm, sc, work):
        others: dict[str, Nginx | Forwarder] = {}
        if "nginx" in names:
            others["nginx"] = Nginx(work, vllm.port)
        if "asyncio" in names:
            others["asyncio"] = Forwarder(work, vllm.port)
        try:
            for server in others.values():
                server.start()
            ports = {"sidecar": sc.port, "vllm": vllm.port}
            ports |= {name: server.port for name, server in others.items()}
            yield sc, {n: ports[n] for n in names}
        finally:
            for server in others.values():
                server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--requests", type=int, default=200, help="requests per concurrency")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--target", nargs="+", choices=TARGETS, default=["sidecar"])
    ap.add_argument("--rounds", type=int, default=1, help="times each target runs, in turn")
    ap.add_argument("--out", type=Path, default=Path("bench/results/ttft_truth.json"))
    ap.add_argument("--forward", type=int, metavar="UPSTREAM_PORT", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.forward is not None:
        import uvloop

        uvloop.run(_forward(args.port, args.forward))
        return 0
    results: dict[str, Any] = {}
    with targets(args.target) as (sc, ports):
        for port in ports.values():  # warm-up, not counted
            run(port, 1, 5, args.max_tokens)
        sent = 5 if "sidecar" in ports else 0
        for rnd, conc, (name, port) in (
            (r, c_, t) for r in range(args.rounds) for c_ in args.concurrency for t in ports.items()
        ):
            key = f"{name} c{conc}" + (f" r{rnd + 1}" if args.rounds > 1 else "")
            stalled_before = stalls(sc.url)
            queue = AcceptQueue(port).start()
            client = run(port, conc, args.requests, args.max_tokens)
            results[key] = summarize(client, queue.stop())
            if name == "sidecar":
                sent += len(client)
                results[key] |= against_events(client, wait_events(sc, sent))
                results[key]["loop_stalls_over_100ms"] = stalls(sc.url) - stalled_before
            print(f"[ttft-truth] {key}: {results[key]}", flush=True)
    print_tables(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, **results}))
    return 0


def print_tables(results: dict[str, Any]) -> None:
    print(
        "| run | requests | client TTFT p50 (ms) | p95 | max | accept queue max | "
        "queue busy | mean accept wait (ms) | server asleep while busy | "
        "server CPU / req (ms) | server run-queue wait / req (ms) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for key, r in results.items():
        print(
            f"| {key} | {r['requests']} | {r['client_ttft_p50_ms']:.2f} | "
            f"{r['client_ttft_p95_ms']:.2f} | {r['client_ttft_max_ms']:.2f} | "
            f"{r['accept_queue_max']} | {r['accept_queue_busy_share']:.1%} | "
            f"{r['accept_wait_mean_ms']:.2f} | {r['accept_busy_asleep_share']:.1%} | "
            f"{r['server_cpu_ms_per_request']:.2f} | {r['server_runqueue_ms_per_request']:.2f} |"
        )
    sidecar = {k: r for k, r in results.items() if "diff_p50_ms" in r}
    if sidecar:
        print("\n| run | client - event p50 (ms) | p95 | max |")
        print("|---|---|---|---|")
        for key, r in sidecar.items():
            print(
                f"| {key} | {r['diff_p50_ms']:.3f} | {r['diff_p95_ms']:.3f} | "
                f"{r['diff_max_ms']:.3f} |"
            )


if __name__ == "__main__":
    sys.exit(main())
