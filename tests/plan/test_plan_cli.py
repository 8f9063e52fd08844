"""`vllm-obs plan` end to end on events the sweep's stress replay records: the sidecar's own
admission and routing code over simulated replicas in virtual time (real parts, no fake; the
real sidecar in front of sim pools is tests/plan/test_plan_system.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from obs.clickhouse.schema import TableSpec, init
from obs.clickhouse.testing import ClickHouseServer
from obs.config import load_config
from obs.loadgen.mix import load_mix
from obs.query.clickhouse_load import load
from obs.sweep.profile import resolve
from obs.sweep.replay import Replay

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "obs" / "data" / "profile-single-balanced.yaml"


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """150 requests of the six-class mix at 4 sessions/s through the stress replay."""
    out = tmp_path_factory.mktemp("replay") / "events.jsonl.gz"
    Replay(resolve("single-balanced"), load_mix(), out).run(150, 4.0, 0)
    return out


def plan(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "obs.cli", "plan", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.mark.process
def test_the_plan_meets_every_slo_and_one_replica_fewer_misses(
    events: Path, tmp_path: Path
) -> None:
    """At growth 3 the plan names the pool's replicas and every lane's limits, every lane
    meets its SLOs at the plan, a lane misses with one replica fewer, and it writes a
    lanes.yaml that loads, a kustomize patch of the same size and an HTML curve."""
    out = tmp_path / "plan"
    r = plan(str(events), "--config", str(PROFILE), "--growth", "3", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "plan.json").read_text())
    (pool,) = doc["pools"]
    assert pool["name"] == "main" and pool["replicas"] >= 1 and pool["gpu"] == "H100"
    names = {lane["name"] for lane in doc["lanes"]}
    assert names == {"slow-stream", "agent", "rag", "batch", "long-prefill", "chat"}
    for lane in doc["lanes"]:
        assert lane["max_concurrency"] >= 1 and lane["max_queue"] >= 1
        assert 0 <= lane["expected_attainment"] <= 1
    assert doc["check"]["met"] and all(row["met"] for row in doc["check"]["at_plan"])
    (fewer,) = doc["check"]["one_fewer"]
    assert fewer["replicas"] == pool["replicas"] - 1 and fewer["missing"]
    config = load_config(out / "lanes.yaml")
    for lane in doc["lanes"]:
        admission = config.lane(lane["name"]).admission
        assert admission.max_concurrency == lane["max_concurrency"]
        assert admission.max_queue == lane["max_queue"]
    patch = yaml.safe_load((out / "k8s" / "main" / "replicas.yaml").read_text())
    assert patch["spec"]["replicas"] == pool["replicas"]
    assert "<svg" in (out / "report.html").read_text()
    assert "one replica fewer" in r.stdout and "[plan] pool main" in r.stderr
    curve = {point["replicas"]: point["met"] for point in pool["curve"]}
    assert curve[pool["replicas"] + 1] is True  # more replicas keep meeting the SLOs


@pytest.mark.process
def test_more_growth_needs_at_least_as_many_replicas(events: Path, tmp_path: Path) -> None:
    """Planning for 6x the traffic never asks for fewer replicas than for 1x."""
    sizes = []
    for growth in ("1", "6"):
        out = tmp_path / growth
        r = plan(str(events), "--config", str(PROFILE), "--growth", growth, "--out", str(out))
        assert r.returncode == 0, r.stderr[-3000:]
        sizes.append(json.loads((out / "plan.json").read_text())["pools"][0]["replicas"])
    assert sizes[0] <= sizes[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--growth", "0"], "--growth 0: must be positive"),
        (["--gpu", "nope=H100"], "--gpu 'nope=H100': no pool 'nope'"),
        (["--gpu", "TPU9"], "--gpu 'TPU9': choose one of"),
        (["--window", "soon"], "--window 'soon'"),
    ],
)
@pytest.mark.process
def test_bad_options_are_one_line_errors(
    events: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    """A bad option exits 2 with one line naming it, never a traceback."""
    r = plan(str(events), "--config", str(PROFILE), "--out", str(tmp_path), *args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


@pytest.mark.process
def test_events_of_no_configured_lane_are_refused(tmp_path: Path) -> None:
    """A log whose lanes the config does not know has nothing to plan: exit 2, said so."""
    log = tmp_path / "e.jsonl"
    log.write_text(
        '{"request_id": "a", "ts": "2026-01-01T00:00:00Z", "lane": "x", "status": "ok"}\n'
    )
    r = plan(str(log), "--config", str(PROFILE), "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "nothing to plan" in r.stderr


def test_clickhouse_events_plan_like_the_same_jsonl(
    clickhouse: ClickHouseServer, events: Path, tmp_path: Path
) -> None:
    """The same events loaded into ClickHouse give the same replicas and limits as the log."""
    spec = TableSpec("plan", "events")
    client = clickhouse.client()
    init(client, spec)
    load(client, spec, [str(events)])
    url = f"clickhouse://{clickhouse.url.removeprefix('http://')}/{spec.name}"
    docs: list[dict[str, Any]] = []
    for source in (str(events), url):
        out = tmp_path / str(len(docs))
        r = plan(source, "--config", str(PROFILE), "--growth", "2", "--out", str(out))
        assert r.returncode == 0, r.stderr[-3000:]
        docs.append(json.loads((out / "plan.json").read_text()))
    assert docs[0]["traffic"]["offered"] == docs[1]["traffic"]["offered"]
    assert docs[0]["pools"][0]["replicas"] == docs[1]["pools"][0]["replicas"]
    assert docs[0]["lanes"] == docs[1]["lanes"]
