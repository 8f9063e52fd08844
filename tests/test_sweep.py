"""``vllm-obs sweep --short`` against real CPU vLLM pools: the matrix, its files, clean stops."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from obs.demo.stack import pid_alive
from obs.engine.server import group_alive
from obs.sweep.profile import SHIPPED, resolve

SWEEP_TIMEOUT_S = 3600
BROKEN = "needs-partial-prefills"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def short_sweep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    """One `sweep --short` over the six shipped profiles plus one whose pool cannot start
    (vLLM 0.32 refuses --max-num-partial-prefills); yields (out, the finished process)."""
    root = tmp_path_factory.mktemp("sweep")
    broken = root / "broken.yaml"
    broken.write_text(
        yaml.safe_dump(
            {
                "name": BROKEN,
                "base_lanes": "default",
                "pools": [{"name": "main", "engine": {"max_num_partial_prefills": 2}}],
                "lanes": {lane: {"pool": "main"} for lane in resolve("class-aware").gates()},
            }
        )
    )
    profiles = [*SHIPPED[:2], str(broken), *SHIPPED[2:]]
    out = root / "out"
    cmd = [sys.executable, "-m", "obs.cli", "sweep", "--short", "--out", str(out)]
    for p in profiles:
        cmd += ["--profile", p]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S, check=False)
    print(f"sweep --short took {time.monotonic() - started:.0f} s\n{proc.stderr[-6000:]}")
    yield out, proc


@pytest.mark.engine
@pytest.mark.slow
def test_short_sweep_has_a_row_per_lane_for_every_profile(short_sweep: tuple[Path, Any]) -> None:
    """Every shipped profile ran and has a matrix row for every lane it serves, with its
    gate verdict; each other profile is tested against the baseline per lane."""
    out, proc = short_sweep
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads((out / "matrix.json").read_text())
    assert list(doc["profiles"]) == list(SHIPPED)
    for name in SHIPPED:
        lanes = {r["lane"] for r in doc["rows"] if r["profile"] == name}
        assert lanes == set(resolve(name).config.lane_names), name
        assert doc["profiles"][name]["verdict"]
    for row in doc["rows"]:
        assert row["requests"] > 0
        assert row["good"] <= row["requests"]
        assert row["gates"] == "met" or row["gates"].startswith(("misses", "no gate"))
    tested = {s["profile"] for s in doc["significance"]}
    assert tested == set(SHIPPED[1:]) and doc["baseline"] == SHIPPED[0]
    assert {b["lane"] for b in doc["best"]} == set(resolve("class-aware").config.lane_names)
    csv_lines = (out / "matrix.csv").read_text().splitlines()
    assert csv_lines[0].startswith("profile,lane,pool,requests,good,goodput_rps")
    assert len(csv_lines) == 1 + len(doc["rows"])
    report = (out / "report" / "report.html").read_text()
    assert report.count('src="data:image/png;base64,') >= 1 + len(doc["best"])
    assert "Profile matrix" in proc.stdout and "Verdict per profile" in proc.stdout


@pytest.mark.engine
@pytest.mark.slow
def test_short_sweep_sends_the_same_seeded_plan_to_every_profile(
    short_sweep: tuple[Path, Any],
) -> None:
    """Every profile got the same sessions: same classes at the same planned arrival times."""
    out, _ = short_sweep
    plans = {}
    for name in SHIPPED:
        records = _lines(out / "runs" / name / "round-1" / "load.jsonl")
        plans[name] = {
            r["index"]: (r["client_class"], r["planned_offset_s"])
            for r in records
            if r["turn"] == 0
        }
        events = _lines(out / "runs" / name / "round-1" / "events.jsonl")
        assert {e["request_id"] for e in events} == {r["request_id"] for r in records}
    first = plans[SHIPPED[0]]
    assert len({c for c, _ in first.values()}) == 6
    assert all(plan == first for plan in plans.values())


@pytest.mark.engine
@pytest.mark.slow
def test_a_pool_that_fails_is_reported_and_the_sweep_goes_on(
    short_sweep: tuple[Path, Any],
) -> None:
    """A profile whose vLLM refuses a flag is reported as pool-failed, left out of the
    matrix, and the profiles after it still run; no process the sweep started survives."""
    out, proc = short_sweep
    runs = json.loads((out / "runs.json").read_text())["runs"]
    status = {r["profile"]: r["status"] for r in runs}
    assert status[BROKEN] == "pool-failed"
    assert all(status[name] == "ok" for name in SHIPPED)
    failed = next(r for r in runs if r["profile"] == BROKEN)
    assert "exited with status" in failed["message"]
    assert f"{BROKEN} round 1: pool-failed" in proc.stdout
    assert "run 3/7: round 1/1, profile needs-partial-prefills" in proc.stderr
    tracked = json.loads((out / "pids.json").read_text())
    assert len(tracked) >= 2 * len(SHIPPED)
    for t in tracked:
        assert not pid_alive(t["pid"]), t
        if t["pgid"] is not None:
            assert not group_alive(t["pgid"]), t
