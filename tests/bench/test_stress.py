"""The stress replay's small version (bench/stress.py): six profiles x 2,000 requests of the
six-class mix through the sidecar's classifier, admission and routing onto simulated pools."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import orjson
import pytest

from bench import stress
from obs.sweep.profile import SHIPPED, resolve

REQUESTS = 2000


@pytest.mark.process
def test_small_stress_accounts_for_every_request_and_names_the_best_profile(
    tmp_path: Path,
) -> None:
    """Every planned request of every profile becomes exactly one event (none lost), the
    matrix has each profile's whole-system row over those requests and a best profile,
    each event's lane and pool are the profile's own, and each streamed answer of more
    than one token carries its inter-token gaps."""
    out = tmp_path / "stress.json"
    args = ["--profile", "all", "--requests", str(REQUESTS), "--events", str(tmp_path)]
    assert stress.main([*args, "--matrix", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["accounted"] is True and doc["simulated"] is True
    assert [r["profile"] for r in doc["runs"]] == list(SHIPPED)
    assert all(r["events"] == r["sent"] == REQUESTS for r in doc["runs"])
    assert [r["profile"] for r in doc["system"]] == list(SHIPPED)
    assert all(r["offered"] == REQUESTS for r in doc["system"])
    assert doc["best_overall"]["best"] in SHIPPED
    for name in SHIPPED:
        config = resolve(name).config
        with gzip.open(tmp_path / f"{name}.jsonl.gz") as f:
            events = [orjson.loads(line) for line in f]
        assert len(events) == REQUESTS
        assert len({e["request_id"] for e in events}) == REQUESTS
        for e in events:
            assert config.lane(e["lane"]).pool == e["pool"]
            assert e["status"] in ("ok", "rejected", "error")
            if e["status"] == "ok" and e["stream"] and e["completion_tokens"] > 1:
                assert 0 < e["itl_p50_ms"] <= e["itl_p95_ms"] <= e["itl_max_ms"]


@pytest.mark.process
def test_load_sweep_runs_each_profile_at_each_load_and_pairs_it_with_the_baseline(
    tmp_path: Path,
) -> None:
    """``--sweep`` replays the six profiles at each load and calibration scale, every
    planned request accounted for, each run naming its load; each profile but the baseline
    is paired with it, and the interval with the calibration band holds the plain one;
    ``--resume`` keeps the replays already done and gives the same result."""
    out = tmp_path / "sweep.json"
    args = ["--sweep", "--requests", "300", "--loads", "0.5,1.2", "--band", "0.1"]
    assert stress.main([*args, "--events", str(tmp_path), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["accounted"] is True and doc["simulated"] is True
    assert doc["requests_per_run"] == 300 and doc["scales"] == [0.9, 1.0, 1.1]
    assert len(doc["runs"]) == 6 * 2 * 3
    assert {r["load"] for r in doc["runs"]} == {0.5, 1.2}
    for level in doc["levels"]:
        system = level["system"]
        assert [r["profile"] for r in system] == list(SHIPPED)
        for r in system:
            low, high = r["good_share_band"]
            assert low <= r["goodput_share"] <= high
        for r in system[1:]:
            v = r["vs_baseline"]
            low, high = v["interval_with_calibration"]
            assert low <= v["interval_95"][0] <= v["difference"] <= v["interval_95"][1] <= high
    again = tmp_path / "again.json"
    assert stress.main([*args, "--resume", "--events", str(tmp_path), "--out", str(again)]) == 0
    redo = json.loads(again.read_text())
    assert redo["runs"] == doc["runs"] and redo["levels"] == doc["levels"]
