"""Issue 42's bar: events recorded by a real sidecar in front of simulated GPU pools (``vllm-obs
engine sim`` processes, driven by the repo's load generator through ``vllm-obs sweep --engine
sim``) planned for 8x the traffic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import QUICK_DRAIN

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.process
def test_plan_at_growth_8_meets_every_slo_and_one_fewer_misses(tmp_path: Path) -> None:
    """plan.json names the pool's replicas and each lane's max_concurrency, max_queue and
    expected attainment; every lane meets its SLO at the plan, a lane misses with one
    replica fewer, and the written lanes.yaml passes `vllm-obs config check`."""
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "obs.cli", "sweep", "--engine", "sim", "--short"]
    cmd += ["--profile", "single-balanced", "--duration", "6", *QUICK_DRAIN, "--out", str(sweep)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    assert r.returncode == 0, r.stderr[-4000:]
    run = sweep / "runs" / "single-balanced" / "round-1"
    events, config = run / "events.jsonl", run / "lanes.yaml"
    assert len(events.read_text().splitlines()) > 20  # recorded by the sidecar
    out = tmp_path / "plan"
    cmd = [sys.executable, "-m", "obs.cli", "plan", str(events), "--config", str(config)]
    r = subprocess.run(
        [*cmd, "--growth", "8", "--out", str(out)], capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, r.stderr[-4000:]
    doc = json.loads((out / "plan.json").read_text())
    (pool,) = doc["pools"]
    assert pool["name"] == "main" and pool["replicas"] >= 1
    lanes = {lane["name"]: lane for lane in doc["lanes"]}
    assert set(lanes) == {"slow-stream", "agent", "rag", "batch", "long-prefill", "chat"}
    for lane in lanes.values():
        assert lane["max_concurrency"] >= 1 and lane["max_queue"] >= 1
        assert lane["expected_attainment"] is not None
    at_plan = doc["check"]["at_plan"]
    assert {row["lane"] for row in at_plan} == set(lanes)
    assert all(row["met"] for row in at_plan)
    (fewer,) = doc["check"]["one_fewer"]
    assert fewer["pool"] == "main" and fewer["replicas"] == pool["replicas"] - 1
    assert fewer["missing"], "no lane misses with one replica fewer"
    check = [sys.executable, "-m", "obs.cli", "config", "check", str(out / "lanes.yaml")]
    c = subprocess.run(check, capture_output=True, text=True, timeout=120)
    assert c.returncode == 0 and ": ok" in c.stdout, c.stderr
