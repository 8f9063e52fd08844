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

    .venv/bin/python -m bench.ttft_truth --concurrency 1 8 --requests 200
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.procs import vllm_and_sidecar
from obs import conventions as c
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


def summarize(
    client: dict[str, tuple[int, float]], events: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    diff = {r: t - events[r]["ttft_ms"] for r, (_, t) in client.items() if r in events}
    late = sorted(client[r][0] for r, d in diff.items() if d > 50)
    return {
        "requests": len(diff),
        "client_ttft_p50_ms": statistics.median(t for _, t in client.values()),
        "diff_p50_ms": statistics.median(diff.values()),
        "diff_p95_ms": pct(list(diff.values()), 0.95),
        "diff_max_ms": max(diff.values()),
        "missed_over_50ms": len(late),
        "their_send_span_ms": (late[-1] - late[0]) / 1e6 if late else 0.0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--requests", type=int, default=200, help="requests per concurrency")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--out", type=Path, default=Path("bench/results/ttft_truth.json"))
    args = ap.parse_args()
    results: dict[str, Any] = {}
    no_spans = {"OTEL_TRACES_EXPORTER": "none"}
    with vllm_and_sidecar("vllm-obs-ttft-truth-", no_spans) as (_, sc, _work):
        sent = len(run(sc.port, 1, 5, args.max_tokens))  # warm-up, not counted
        for conc in args.concurrency:
            stalled_before = stalls(sc.url)
            client = run(sc.port, conc, args.requests, args.max_tokens)
            sent += len(client)
            results[str(conc)] = summarize(client, wait_events(sc, sent))
            results[str(conc)]["loop_stalls_over_100ms"] = stalls(sc.url) - stalled_before
            print(f"[ttft-truth] c{conc}: {results[str(conc)]}", flush=True)
    print("| concurrency | requests | client TTFT p50 (ms) | client - event p50 (ms) | p95 | max |")
    print("|---|---|---|---|---|---|")
    for conc, r in results.items():
        print(
            f"| {conc} | {r['requests']} | {r['client_ttft_p50_ms']:.2f} | "
            f"{r['diff_p50_ms']:.3f} | {r['diff_p95_ms']:.3f} | {r['diff_max_ms']:.3f} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, **results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
