"""`vllm-obs query` over events a real sidecar wrote in front of a real vLLM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

import obs.query as q
from obs.config import default_config_path
from obs.engines.server import VllmServer
from tests.conftest import require_binary

pytestmark = pytest.mark.engine

CHAT = "/v1/chat/completions"


def _linear(values: list[float], p: float) -> float:
    """Linearly interpolated percentile, computed independently of the query code."""
    v = sorted(values)
    pos = (len(v) - 1) * p
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


@pytest.fixture(scope="module")
def logged(
    vllm: VllmServer, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, list[dict[str, Any]]]:
    """Events from the default lanes (both pools on the test engine) under a small mixed load."""
    from obs.sidecar.testing import SidecarProcess

    work = tmp_path_factory.mktemp("query-real")
    cfg = yaml.safe_load(default_config_path().read_text())
    for pool in cfg["pools"]:
        pool["replicas"] = [vllm.url]
    cfg_path = work / "lanes.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    with SidecarProcess(config=cfg_path, events=work / "events.jsonl") as sc:
        msgs = [{"role": "user", "content": "def add(a, b):"}]
        for i in range(5):
            body = {"model": "tiny", "messages": msgs, "max_tokens": 8 + i, "stream": True}
            httpx.post(sc.url + CHAT, json=body, headers={"X-Client-Class": "chat"}, timeout=60)
        for _ in range(3):
            body = {"model": "tiny", "messages": msgs, "max_tokens": 6, "stream": True}
            httpx.post(sc.url + CHAT, json=body, headers={"X-Client-Class": "rag"}, timeout=60)
        for _ in range(2):
            body = {"model": "tiny", "messages": msgs, "max_tokens": 12}
            httpx.post(sc.url + CHAT, json=body, headers={"X-Client-Class": "batch"}, timeout=60)
        too_long = {"model": "tiny", "prompt": "x " * 3000, "max_tokens": 4}
        r = httpx.post(sc.url + "/v1/completions", json=too_long, timeout=60)
        assert r.status_code == 400
        events = sc.wait_events(11)
    return work / "events.jsonl", cfg_path, events


def test_summary_agrees_with_a_direct_computation(
    logged: tuple[Path, Path, list[dict[str, Any]]],
) -> None:
    """Counts, outcome rates and percentiles per lane equal those computed from the raw events."""
    events_path, cfg_path, events = logged
    df = q.summary([str(events_path)], config=str(cfg_path)).set_index("lane")
    lanes = {e["lane"] for e in events}
    assert lanes == {"chat", "rag", "batch"}
    for lane in lanes:
        mine = [e for e in events if e["lane"] == lane]
        ok = [e for e in mine if e["status"] == "ok"]
        row = df.loc[lane]
        assert row["requests"] == len(mine)
        assert row["ok"] == len(ok)
        errors = sum(e["status"] == "client_error" for e in mine) / len(mine)
        assert row["client_error_rate"] == pytest.approx(errors)
        for field in ("e2e", "queue", "prefill"):
            expected = _linear([e[f"{field}_ms"] for e in ok], 0.5)
            assert row[f"{field}_p50_ms"] == pytest.approx(expected, abs=0.01)
        streamed = [e["ttft_ms"] for e in ok if e["ttft_ms"] is not None]
        if streamed:
            assert row["ttft_p95_ms"] == pytest.approx(_linear(streamed, 0.95), abs=0.01)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "obs.cli", "query", *args, "--no-progress"],
        capture_output=True,
        text=True,
    )


def test_every_command_runs_on_real_events(
    logged: tuple[Path, Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """slowest, show, timeline, compare and export answer consistently on the sidecar's events."""
    events_path, cfg_path, events = logged
    log = str(events_path)
    slow = json.loads(_cli("slowest", log, "-n", "3", "--format", "json").stdout)
    top = max(events, key=lambda e: e["e2e_ms"])
    assert slow[0]["request_id"] == top["request_id"]
    shown = _cli("show", top["request_id"], log, "--format", "json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["event"]["e2e_ms"] == top["e2e_ms"]
    timeline = json.loads(_cli("timeline", log, "--interval", "1h", "--format", "json").stdout)
    assert sum(row["requests"] for row in timeline) == len(events)
    cmp = _cli("compare", log, log, "--config", str(cfg_path), "--format", "json")
    assert cmp.returncode == 0, cmp.stderr
    exported = _cli("export", log, "--out", str(tmp_path / "pq"))
    assert exported.returncode == 0, exported.stderr
    from_parquet = q.summary([str(tmp_path / "pq")], config=str(cfg_path)).set_index("lane")
    from_jsonl = q.summary([log], config=str(cfg_path)).set_index("lane")
    assert from_parquet["requests"].to_dict() == from_jsonl["requests"].to_dict()
    assert from_parquet["e2e_p50_ms"].to_dict() == pytest.approx(from_jsonl["e2e_p50_ms"].to_dict())


def test_report_renders_in_a_browser(
    logged: tuple[Path, Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """The HTML report of real events renders in headless Chromium with its plots."""
    chromium = require_binary("chromium")
    events_path, cfg_path, _ = logged
    out = tmp_path / "report"
    r = _cli("report", str(events_path), "--config", str(cfg_path), "--out", str(out))
    assert r.returncode == 0, r.stderr
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 4
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1200,1600",
            (out / "report.html").as_uri(),
        ],
        capture_output=True,
        timeout=120,
    )
    assert shot.exists() and shot.stat().st_size > 20_000
