"""The relay benchmark: its arithmetic, and one tiny real run of the whole driver."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report
from bench.vllm_bench import RunResult
from tests.conftest import require_binary

ROOT = Path(__file__).resolve().parents[2]


def _run(rnd: int, ttft: float, tok_s: float, cpu: float | None) -> report.Run:
    res = RunResult(
        duration_s=10.0,
        completed=100,
        failed=0,
        output_tokens=int(tok_s * 10),
        ttfts_ms=[ttft] * 100,
        itls_ms=[5.0] * 1000,
        errors=[],
        relayed_requests=100,
        relayed_tokens=int(tok_s * 10),
    )
    return report.Run(rnd, res, cpu, None if cpu is None else 80.0)


def test_rows_compare_each_round_with_its_direct_run() -> None:
    """Added TTFT is against direct; throughput share is the median of same-round ratios."""
    runs = {
        "direct": [_run(1, 20.0, 10_000, None), _run(2, 21.0, 8_000, None)],
        "sidecar": [_run(1, 20.5, 9_900, 2.0), _run(2, 21.5, 8_000, 2.0)],
    }
    direct, sidecar = report.rows("c64", runs)
    assert direct.added_ttft_p50 is None and direct.cpu_s_per_100k_tokens is None
    assert sidecar.added_ttft_p50 == pytest.approx(0.5)
    assert sidecar.share_of_direct == pytest.approx((0.99 + 1.0) / 2)
    assert sidecar.share_range == pytest.approx((0.99, 1.0))
    assert sidecar.cpu_s_per_1k_requests == pytest.approx(4.0 / 200 * 1000)
    assert sidecar.cpu_s_per_100k_tokens == pytest.approx(4.0 / 179_000 * 100_000)
    assert "| c64 | sidecar | +0.50 / +0.50 |" in report.markdown([direct, sidecar])


@pytest.mark.engine
def test_driver_runs_every_path_and_writes_results(tmp_path: Path) -> None:
    """A tiny run: direct, sidecar (all exporters) and nginx; table on stdout, JSON written."""
    require_binary("nginx")
    out = tmp_path / "relay.json"
    cmd = [sys.executable, "-m", "bench.relay", "--levels", "c64", "--prompts", "12"]
    cmd += ["--rounds", "1", "--warmup-prompts", "0", "--idle-seconds", "0", "--out", str(out)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| c64 | sidecar |" in r.stdout and "| c64 | nginx |" in r.stdout
    assert "[relay] round 1/1" in r.stderr
    doc = json.loads(out.read_text())
    rows = {row["target"]: row for row in doc["rows"]}
    assert set(rows) == {"direct", "sidecar", "nginx"}
    assert all(row["requests"] == 12 and row["failed"] == 0 for row in rows.values())
    assert rows["sidecar"]["cpu_s_per_100k_tokens"] > 0
    assert doc["events_written"] == {"sidecar": 12 + 1}  # vllm bench's first test request
    assert doc["spans_received"] == 13 * 6  # a root span and five phases per request
