"""``query canary`` on ClickHouse: one identity's weight is capped there as on local files."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from obs.cli import main as cli_main
from obs.clickhouse.schema import TableSpec, init
from obs.clickhouse.testing import ClickHouseServer
from obs.events import Event
from obs.query.canary import PROMOTE, ROLL_BACK
from obs.query.clickhouse_load import load
from obs.query.testing import write_jsonl
from tests.support.canary_support import arm_events, write_config

UNCAPPED = {"min_requests": 100, "max_identity_weight": None}


def _flooded() -> list[Event]:
    """600 baseline and 200 canary clients, one request each, as fast as each other; then one
    identity sends 400 3x-slow requests into the canary arm."""
    stable = arm_events("stable", 600, 1.0)
    canary = arm_events("canary", 200, 1.0, seed=2)
    flood = arm_events("canary", 400, 3.0, seed=5, start_s=1000)
    for i, ev in enumerate(stable + canary):
        ev.identity = f"client-{i:04d}"
    for ev in flood:
        ev.identity = "attacker"
    return stable + canary + flood


def _verdict(
    source: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], canary: dict[str, Any] | None
) -> dict[str, Any]:
    config = write_config(tmp_path, canary)
    args = ["query", "canary", source, "--lane", "chat", "--config", str(config)]
    assert cli_main([*args, "--no-progress", "--format", "json"]) == 0
    (only,) = json.loads(capsys.readouterr().out)
    return dict(only)


def _requests(verdict: dict[str, Any]) -> tuple[int, int]:
    row = next(m for m in verdict["metrics"] if m["metric"] == "requests")
    return int(row["baseline_value"]), int(row["canary_value"])


def test_one_identity_flooding_the_canary_cannot_move_the_verdict_on_clickhouse(
    clickhouse: ClickHouseServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One identity's 400 slow requests in the canary arm count as one median client on
    ClickHouse as on the JSONL log (promote, 201 canary requests counted); uncapped, the
    same events on the same table roll back."""
    events = _flooded()
    log = write_jsonl(tmp_path / "events.jsonl", events)
    spec = TableSpec("canary", f"events_{uuid.uuid4().hex[:8]}")
    client = clickhouse.client()
    init(client, spec)
    load(client, spec, [str(log)])
    url = f"clickhouse://{clickhouse.url.removeprefix('http://')}/{spec.name}"

    on_clickhouse = _verdict(url, tmp_path, capsys, None)
    on_file = _verdict(str(log), tmp_path, capsys, None)
    assert on_clickhouse["verdict"] == on_file["verdict"] == PROMOTE, on_clickhouse
    assert _requests(on_clickhouse) == _requests(on_file) == (600, 201)
    uncapped = _verdict(url, tmp_path, capsys, UNCAPPED)
    assert uncapped["verdict"] == ROLL_BACK, uncapped
    assert _requests(uncapped) == (600, 600)
