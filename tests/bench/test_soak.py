"""The soak script, short: 24 s of mixed load while a replica is frozen and one is killed.

The freeze comes 3 s in and the kill 13 s in, so the restart (which the soak waits for) starts
under the load. That restart, ~22 s on an idle machine, took 40 s under 30 s of load and 33 s
under 24 s (one run each), so the load is kept short; at 3 sessions/s it still sends ~100
requests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]


def test_short_soak_logs_every_request_and_leaks_nothing(tmp_path: Path) -> None:
    """Under load and faults: one event per request, metrics agree, no fd growth, recovery."""
    out = tmp_path / "soak.json"
    cmd = [sys.executable, "-m", "bench.soak", "--minutes", "0.4", "--rate", "3"]
    cmd += ["--fault-every", "6.5", "--stop-s", "6", "--sample-s", "3"]
    cmd += ["--out", str(out), "--workdir", str(tmp_path / "work")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    checks = result["checks"]
    assert result["requests_sent"] > 50, result["client_outcomes"]
    assert checks["faults_injected"], result["faults"]
    assert not result["missing_events"] and not result["duplicate_events"], result
    assert result["events_for_them"] == result["requests_sent"]
    assert checks["metrics_count_every_event"], (
        result["metrics_requests_total"],
        result["events_total"],
    )
    assert checks["no_close_wait"], result["sidecar"]["sockets_end"]
    assert checks["no_fd_leak"], (result["sidecar"]["fds"], result["sidecar"]["sockets_end"])
    assert checks["recovered"], result["recovery_statuses"]
    assert checks["sidecar_exit_clean"], result["sidecar"]["exit_code"]
    # Faults show up as failed requests, never as lost ones.
    assert sum(result["event_outcomes"].values()) == result["events_total"]
    assert proc.returncode == (0 if result["ok"] else 1)
