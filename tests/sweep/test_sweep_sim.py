"""``vllm-obs sweep --engine sim --short``: simulated GPU-scale pools, the real sidecar and load,
and the matrix's whole-system verdict (sim replicas are light: no real engine starts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from obs.sweep.profile import resolve
from tests.support import QUICK_DRAIN

PROFILES = ("single-balanced", "class-aware")


@pytest.mark.process
def test_sim_sweep_writes_whole_system_rows_and_marks_pools_simulated(tmp_path: Path) -> None:
    """Each profile gets a whole-system row (offered, accepted share, good), the best profile
    overall is named, the pools ran as ``engine: sim`` at their GPU-scale sizes, the per-lane
    rows are still there, and every request the client sent has its event (none lost)."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "obs.cli", "sweep", "--engine", "sim", "--short"]
    cmd += ["--duration", "3", *QUICK_DRAIN, "--out", str(out)]
    for p in PROFILES:
        cmd += ["--profile", p]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads((out / "matrix.json").read_text())
    assert doc["engine"] == "sim" and doc["simulated"] is True
    assert [r["profile"] for r in doc["system"]] == list(PROFILES)
    for row in doc["system"]:
        assert row["offered"] > 0
        assert row["accepted"] <= row["offered"] and 0 <= row["accepted_share"] <= 1
        lanes = [r for r in doc["rows"] if r["profile"] == row["profile"]]
        assert row["good"] == sum(r["good"] for r in lanes)
        assert row["offered"] == sum(r["requests"] for r in lanes)
    assert doc["best_overall"]["best"] in PROFILES
    assert doc["best_overall"]["runner_up"] in PROFILES
    assert "Whole system per profile" in proc.stdout and "SIMULATED" in proc.stdout
    for name in PROFILES:
        lanes_file = next((out / "runs" / name).glob("round-*/lanes.yaml"))
        pools = yaml.safe_load(lanes_file.read_text())["pools"]
        assert {p["engine"] for p in pools} == {"sim"}
        events = (lanes_file.parent / "events.jsonl").read_text().splitlines()
        sent = (lanes_file.parent / "load.jsonl").read_text().splitlines()
        assert len(events) == len(sent) > 0
        gpu = resolve(name).gpu_pools()
        assert {p["name"]: len(p["replicas"]) for p in pools} == {
            k: v.replicas for k, v in gpu.items()
        }
