"""``query canary``: a split lane's canary arm against its baseline, and the verdict."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from obs.cli import main as cli_main
from obs.config import parse_config
from obs.events import Event
from obs.query.canary import HOLD, PROMOTE, ROLL_BACK, judge
from obs.query.testing import event, ts, write_jsonl
from tests.support.canary_support import arm_events as _arm
from tests.support.canary_support import write_config

pytestmark = pytest.mark.inproc


def _verdict(
    tmp_path: Path,
    events: list[Event],
    capsys: pytest.CaptureFixture[str],
    canary: dict[str, Any] | None = None,
) -> Any:
    log = write_jsonl(tmp_path / "events.jsonl", events)
    config = write_config(tmp_path, canary)
    args = ["query", "canary", str(log), "--lane", "chat", "--config", str(config)]
    assert cli_main([*args, "--no-progress", "--format", "json"]) == 0
    (only,) = json.loads(capsys.readouterr().out)
    assert cli_main([*args, "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert f"canary canary vs baseline stable: {only['verdict'].upper()}" in text
    return only


def test_a_canary_over_the_p95_margin_is_rolled_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A canary 30% slower than its baseline (beyond the 15% margin, significant): roll back,
    naming TTFT and TPOT."""
    got = _verdict(tmp_path, _arm("stable", 600, 1.0) + _arm("canary", 200, 1.3, seed=2), capsys)
    assert got["verdict"] == ROLL_BACK, got
    assert any("p95 TTFT" in r for r in got["reasons"]) and any("TPOT" in r for r in got["reasons"])
    ttft = next(m for m in got["metrics"] if m["metric"] == "ttft_p95_ms")
    assert ttft["delta_pct"] > 0.15 and ttft["significant"] is True


def test_a_canary_within_the_margin_is_promoted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A canary 5% slower (inside the 15% margin) with no errors: promote."""
    got = _verdict(tmp_path, _arm("stable", 600, 1.0) + _arm("canary", 200, 1.05, seed=2), capsys)
    assert got["verdict"] == PROMOTE, got


def test_a_canary_below_the_availability_objective_is_rolled_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A canary as fast as the baseline but failing 5% of requests (objective 99%): roll back."""
    events = _arm("stable", 600, 1.0) + _arm("canary", 200, 1.0, errors=10, seed=2)
    got = _verdict(tmp_path, events, capsys)
    assert got["verdict"] == ROLL_BACK and "availability" in got["reasons"][0], got


def test_a_canary_with_too_few_requests_is_held(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fewer canary requests than min_requests: hold, whatever the latencies say."""
    got = _verdict(tmp_path, _arm("stable", 600, 1.0) + _arm("canary", 40, 1.0, seed=2), capsys)
    assert got["verdict"] == HOLD and "min_requests" in got["reasons"][0], got


def test_judge_holds_a_shift_over_the_margin_that_is_not_significant() -> None:
    """p95 over the margin without significance is hold, not roll back (pure judge)."""
    lane = parse_config(
        {
            "pools": [{"name": n, "replicas": ["http://127.0.0.1:1"]} for n in ("a", "b")],
            "lanes": [{"name": "l", "split": {"a": 9, "b": 1}, "canary": {"min_requests": 1}}],
            "default_lane": "l",
        }
    ).lane("l")
    m = {
        "requests": (500, 500, 0, 0.0, None, None, None),
        "ttft_p95_ms": (100.0, 130.0, 30.0, 0.3, "mann-whitney", 0.2, False),
    }
    v = judge(lane, "b", m)
    assert v.verdict == HOLD and "not significant" in v.reasons[0], v


def test_canary_refuses_a_lane_without_a_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--lane naming a lane with one pool is a clear error, not a traceback."""
    log = write_jsonl(tmp_path / "e.jsonl", [event(lane="chat")])
    assert cli_main(["query", "canary", str(log), "--lane", "chat", "--no-progress"]) != 0
    assert "has no split" in capsys.readouterr().err


def test_window_judges_only_the_last_hour_of_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--window 1h ends at the newest event: a canary slow two hours ago, even now, is promoted."""
    early = _arm("stable", 600, 1.0) + _arm("canary", 200, 1.6, seed=2)
    late = [
        dataclasses.replace(e, ts=ts(7200 + i))
        for i, e in enumerate(_arm("stable", 600, 1.0, seed=3) + _arm("canary", 200, 1.0, seed=4))
    ]
    log = write_jsonl(tmp_path / "events.jsonl", early + late)
    args = ["query", "canary", str(log), "--lane", "chat", "--config", str(write_config(tmp_path))]
    verdicts = {}
    for window in ([], ["--window", "1h"]):
        assert cli_main([*args, *window, "--no-progress", "--format", "json"]) == 0
        (only,) = json.loads(capsys.readouterr().out)
        verdicts[bool(window)] = only["verdict"]
    assert verdicts == {False: ROLL_BACK, True: PROMOTE}


def test_a_few_identities_cannot_flip_the_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A canary as fast as its baseline, one request per client, plus five keys sending eight
    3x-slow requests each: promote (each key counts as a median client), where counting
    every request would roll back."""
    stable = _arm("stable", 600, 1.0)
    canary = _arm("canary", 200, 1.0, seed=2)
    attack = _arm("canary", 40, 3.0, seed=5)
    for i, ev in enumerate(stable + canary):
        ev.identity = f"client-{i:04d}"
    for i, ev in enumerate(attack):
        ev.identity = f"attacker-{i % 5}"
    got = _verdict(tmp_path, stable + canary + attack, capsys)
    assert got["verdict"] == PROMOTE, got
    uncapped = _verdict(
        tmp_path,
        stable + canary + attack,
        capsys,
        {"min_requests": 100, "max_identity_weight": None},
    )
    assert uncapped["verdict"] == ROLL_BACK, uncapped
