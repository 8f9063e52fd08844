"""The relay bench's split of CPU into a cost per request and per token, and its Python floor."""

from __future__ import annotations

import http.client
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bench import report
from bench.vllm_bench import RunResult
from obs.procs import free_port, poll_until, port_in_use

ROOT = Path(__file__).resolve().parents[2]


def _row(level: str, target: str, requests: int, tokens: int, cpu_s: float) -> report.Row:
    res = RunResult(
        duration_s=10.0,
        completed=requests,
        failed=0,
        output_tokens=tokens,
        ttfts_ms=[20.0],
        itls_ms=[5.0],
        errors=[],
        relayed_requests=requests,
        relayed_tokens=tokens,
    )
    (row,) = report.rows(level, {target: [report.Run(1, res, cpu_s, 10.0)]})
    return row


def test_split_recovers_the_cost_per_request_and_per_token() -> None:
    """CPU = requests x 0.5 ms + tokens x 12 us at both lengths gives back 0.5 ms and 12 us."""
    rows = []
    for target, per_req, per_tok in (("sidecar", 0.5e-3, 12e-6), ("nginx", 0.07e-3, 10e-6)):
        for level, n, tok in (("short", 1500, 2), ("long", 800, 160)):
            rows.append(_row(level, target, n, n * tok, n * per_req + n * tok * per_tok))
    table = report.cost_split(rows)
    assert "| sidecar | 0.500 | 7.1x | 12.0 | 1.20x |" in table, table
    assert "| nginx | 0.070 | 1.0x | 10.0 | 1.00x |" in table, table


def test_split_needs_both_lengths() -> None:
    """Without the long run there is nothing to split: no table."""
    assert report.cost_split([_row("short", "sidecar", 100, 200, 0.1)]) == ""


class _Answer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: both requests use one connection

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-length", str(len(body) + 4))
        self.end_headers()
        self.wfile.write(b"got " + body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.process
def test_pyforward_relays_requests_and_answers_as_they_are() -> None:
    """The floor target forwards bytes both ways on a kept-alive connection."""
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = free_port()
    cmd = [sys.executable, "-m", "bench.pyforward", "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--upstream-port", str(upstream.server_port)], cwd=ROOT)
    try:
        poll_until(lambda: port_in_use(port), 20.0, "listening", proc)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            for body in (b"one", b"two" * 1000):
                conn.request("POST", "/x", body=body)
                resp = conn.getresponse()
                assert (resp.status, resp.read()) == (200, b"got " + body)
        finally:
            conn.close()
    finally:
        proc.terminate()
        proc.wait(10)
        upstream.shutdown()
        upstream.server_close()


@pytest.mark.process
@pytest.mark.parametrize("bad", [["--port", "1"], []])
def test_pyforward_says_what_it_needs(bad: list[str]) -> None:
    """Missing ports are a usage error, not a traceback."""
    r = subprocess.run(
        [sys.executable, "-m", "bench.pyforward", *bad], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 2 and "required" in r.stderr and "Traceback" not in r.stderr
