"""``vllm-obs sweep --short`` against real CPU vLLM pools: the matrix, its files, clean stops.

Every vLLM start costs ~22 s here, so the real sweep runs the shipped profiles that cover each
shape of local pools (one pool of two replicas, two pools: the shipped lanes; a pool of one
replica starts as each of those replicas does) and one whose pool cannot start. The other
shipped profiles serve the same six lanes
(test_sweep_profiles.py) and get the same seeded plan, which reaches every lane within
--short's 5 s (tests/deploy/test_demo.py); vLLM's own parser accepts the serve line of every
pool of every shipped profile (tests/deploy/test_vllm_serve_lines.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from obs.demo.stack import pid_alive
from obs.procs import group_alive
from obs.sweep.profile import resolve
from tests.support import QUICK_DRAIN

SWEEP_TIMEOUT_S = 3600
BROKEN = "needs-partial-prefills"
SLOS = resolve("class-aware").gates()
# The baseline, a pool of two replicas, first; then the shipped lanes' two pools.
REAL = ("prefix-routing", "class-aware")


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def short_sweep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    """One `sweep --short` over the ``REAL`` shipped profiles plus one whose pool cannot start
    (vLLM 0.32 refuses --max-num-partial-prefills); yields (out, the finished process)."""
    root = tmp_path_factory.mktemp("sweep")
    broken = root / "broken.yaml"
    broken.write_text(
        yaml.safe_dump(
            {
                "name": BROKEN,
                "base_lanes": "default",
                "pools": [{"name": "main", "engine": {"max_num_partial_prefills": 2}}],
                "lanes": {lane: {"pool": "main"} for lane in SLOS},
            }
        )
    )
    profiles = [REAL[0], str(broken), *REAL[1:]]
    out = root / "out"
    cmd = [sys.executable, "-m", "obs.cli", "sweep", "--short", *QUICK_DRAIN, "--out", str(out)]
    for p in profiles:
        cmd += ["--profile", p]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S, check=False)
    print(f"sweep --short took {time.monotonic() - started:.0f} s\n{proc.stderr[-6000:]}")
    yield out, proc


@pytest.mark.engine
def test_short_sweep_has_a_row_per_lane_for_every_profile(short_sweep: tuple[Path, Any]) -> None:
    """Every profile on real pools ran and has a matrix row for every lane it serves, with its
    gate verdict; each other profile is tested against the baseline per lane."""
    out, proc = short_sweep
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads((out / "matrix.json").read_text())
    assert list(doc["profiles"]) == list(REAL)
    for name in REAL:
        lanes = {r["lane"] for r in doc["rows"] if r["profile"] == name}
        assert lanes == set(resolve(name).config.lane_names), name
        assert doc["profiles"][name]["verdict"]
    for row in doc["rows"]:
        assert row["requests"] > 0
        assert row["good"] <= row["requests"]
        assert row["gates"] == "met" or row["gates"].startswith(("misses", "no gate"))
    tested = {s["profile"] for s in doc["significance"]}
    assert tested == set(REAL[1:]) and doc["baseline"] == REAL[0]
    assert {b["lane"] for b in doc["best"]} == set(resolve("class-aware").config.lane_names)
    csv_lines = (out / "matrix.csv").read_text().splitlines()
    assert csv_lines[0].startswith("profile,lane,pool,requests,good,goodput_rps")
    assert len(csv_lines) == 1 + len(doc["rows"])
    report = (out / "report" / "report.html").read_text()
    assert report.count('src="data:image/png;base64,') >= 1 + len(doc["best"])
    assert "Profile matrix" in proc.stdout and "Verdict per profile" in proc.stdout


@pytest.mark.engine
def test_short_sweep_sends_the_same_seeded_plan_to_every_profile(
    short_sweep: tuple[Path, Any],
) -> None:
    """Every profile got the same requests: same classes, sessions and turns, each session at the
    same planned arrival time."""
    out, _ = short_sweep
    plans = {}
    for name in REAL:
        records = _lines(out / "runs" / name / "round-1" / "load.jsonl")
        plans[name] = {
            r["index"]: (r["client_class"], r["session"], r["turn"], r["planned_offset_s"])
            for r in records
            if r["turn"] == 0
        } | {r["index"]: (r["client_class"], r["session"], r["turn"]) for r in records if r["turn"]}
        events = _lines(out / "runs" / name / "round-1" / "events.jsonl")
        assert {e["request_id"] for e in events} == {r["request_id"] for r in records}
    first = plans[REAL[0]]
    assert len({v[0] for v in first.values()}) == 6
    assert all(plan == first for plan in plans.values())


@pytest.mark.engine
def test_a_pool_that_fails_is_reported_and_the_sweep_goes_on(
    short_sweep: tuple[Path, Any],
) -> None:
    """A profile whose vLLM refuses a flag is reported as pool-failed, left out of the
    matrix, and the profiles after it still run; no process the sweep started survives."""
    out, proc = short_sweep
    runs = json.loads((out / "runs.json").read_text())["runs"]
    status = {r["profile"]: r["status"] for r in runs}
    assert status[BROKEN] == "pool-failed"
    assert all(status[name] == "ok" for name in REAL)
    failed = next(r for r in runs if r["profile"] == BROKEN)
    assert "exited with status" in failed["message"]
    assert f"{BROKEN} round 1: pool-failed" in proc.stdout
    assert f"run 2/{len(REAL) + 1}: round 1/1, profile needs-partial-prefills" in proc.stderr
    tracked = json.loads((out / "pids.json").read_text())
    assert len(tracked) >= 2 * len(REAL)
    for t in tracked:
        assert not pid_alive(t["pid"]), t
        if t["pgid"] is not None:
            assert not group_alive(t["pgid"]), t


def _read_until(stream: Any, text: str) -> str:
    seen = []
    for line in stream:
        seen.append(line)
        if text in line:
            break
    return "".join(seen)


@pytest.mark.engine
def test_ctrl_c_keeps_the_finished_runs_of_an_external_sweep(vllm: Any, tmp_path: Path) -> None:
    """With --external (the sidecar only, in front of a running vLLM), Ctrl-C in the third run
    stops it cleanly: no fourth run, and the matrix covers both profiles' finished rounds."""
    files = []
    for name, pools in (("ext-one", ["main"]), ("ext-two", ["main", "side"])):
        data = {
            "name": name,
            "base_lanes": "default",
            "pools": [{"name": p, "replicas": [vllm.url]} for p in pools],
            "lanes": {lane: {"pool": pools[-1] if lane == "chat" else "main"} for lane in SLOS},
        }
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        files += ["--profile", str(path)]
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "obs.cli", "sweep", "--external", *files, "--rounds", "2"]
    cmd += ["--duration", "3", *QUICK_DRAIN, "--out", str(out)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        assert p.stderr is not None
        try:
            seen = _read_until(p.stderr, "run 3/4")
            time.sleep(1)
            p.send_signal(signal.SIGINT)
            stdout, rest = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
    stderr = seen + rest
    assert p.returncode in (0, 128 + signal.SIGINT), stderr
    assert "run 4/4" not in stderr
    runs = json.loads((out / "runs.json").read_text())["runs"]
    assert [(r["profile"], r["status"]) for r in runs[:2]] == [("ext-one", "ok"), ("ext-two", "ok")]
    assert all(r["status"] == "interrupted" for r in runs[2:])
    doc = json.loads((out / "matrix.json").read_text())
    assert list(doc["profiles"]) == ["ext-one", "ext-two"]
    assert {r["lane"] for r in doc["rows"] if r["profile"] == "ext-two"} >= {"chat"}
    assert "Profile matrix" in stdout
    for t in json.loads((out / "pids.json").read_text()):
        assert not pid_alive(t["pid"]), t
