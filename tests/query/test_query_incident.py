"""`vllm-obs query incident`: the postmortem's first draft in words, from a window of events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from obs.cli import main
from obs.conventions import CAUSE_WORDS
from obs.procs import free_port
from obs.query.testing import event, ts, write_jsonl

LANES = {
    "version": 1,
    "pools": [{"name": "p", "replicas": ["http://r1"]}],
    "lanes": [
        {"name": "chat", "pool": "p", "slo": {"ttft": {"threshold_ms": 300, "objective": 0.95}}},
        {"name": "batch", "pool": "p"},
    ],
    "default_lane": "chat",
}


def _log(tmp_path: Path) -> tuple[str, str]:
    """Ten minutes of chat: good requests throughout, and from minute 4 to 6 a saturated
    pool (engine wait inferred) behind most misses; the replica's settings change at minute
    5. Returns (log, config)."""
    events = []
    for i in range(120):
        t = i * 5.0
        pool = {"pool_in_flight": 0, "pool_max_running": 2, "settings_fingerprint": "aaaa"}
        if t >= 300:
            pool["settings_fingerprint"] = "bbbb"
        kw: dict[str, Any] = {"queue_ms": 2.0, "prefill_ms": 40.0, "decode_ms": 200.0}
        if 240 <= t < 360:
            pool |= {"pool_in_flight": 6, "pool_max_running": 2}
            kw = {"queue_ms": 900.0, "prefill_ms": 40.0, "decode_ms": 200.0}
            kw |= {"engine_view": "inferred", "engine_queue_ms": 898.0}
        events.append(
            event(ts=ts(t), lane="chat", pool="p", replica="http://r1", tenant="acme", **kw, **pool)
        )
    log = str(write_jsonl(tmp_path / "events.jsonl", events))
    config = tmp_path / "lanes.yaml"
    config.write_text(yaml.safe_dump(LANES), encoding="utf-8")
    return log, str(config)


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["query", "incident", *args, "--no-progress"]) == 0
    return capsys.readouterr().out


def test_incident_tells_which_lane_when_why_and_the_lever(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The draft names the lane and SLO that missed, from when to when, the budget burned, the
    phase and cause behind it with the runbook's lever, the tenant and replica, and the
    settings change inside the window."""
    log, config = _log(tmp_path)
    window = ["--since", "2025-06-02T12:00:00Z", "--until", "2025-06-02T12:10:00Z"]
    text = _run(capsys, log, "--config", config, *window)
    assert "Lane chat missed its ttft SLO on 24 of 120 requests, 400% of its budget" in text
    assert "from 2025-06-02T12:04:00 to 2025-06-02T12:05:55" in text
    assert "Behind 100% of it: phase queue, cause engine_queue" in text
    assert CAUSE_WORDS["engine_queue"][1] in text
    assert "replica http://r1 (100%), tenant acme (100%)" in text
    assert "replica http://r1 settings aaaa -> bbbb" in text
    assert "Alerts: not read (give --prometheus URL)." in text

    doc = json.loads(_run(capsys, log, "--config", config, *window, "--format", "json"))
    (s,) = doc["slos"]
    assert (s["lane"], s["slo"], s["phase"], s["cause"]) == (
        "chat",
        "ttft",
        "queue",
        "engine_queue",
    )
    assert s["most_from"] >= "2025-06-02T12:04:00" and s["most_until"] < "2025-06-02T12:06:00"


def test_incident_with_nothing_missed_and_prometheus_down(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A window with no miss says so; a Prometheus that does not answer is named in the
    draft, never a traceback."""
    log, config = _log(tmp_path)
    url = f"http://127.0.0.1:{free_port()}"
    window = ["--since", "2025-06-02T12:00:00Z", "--until", "2025-06-02T12:03:00Z"]
    text = _run(capsys, log, "--config", config, *window, "--prometheus", url)
    assert "No lane missed an SLO in the window." in text
    assert f"Alerts: not read from {url}" in text
