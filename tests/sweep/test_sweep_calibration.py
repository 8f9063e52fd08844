"""A ``gpu:`` block's host calibration (``calibration: FILE``, written by ``engine sim check
--fit``): read once with the profile, relative to its folder, refused with the field named,
handed to the simulated replicas the sweep starts and to the stress replay."""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path

import orjson
import pytest
import yaml

from obs.cli import main
from obs.engines.sim import cli as sim_cli
from obs.engines.sim.calibration import calibration_doc
from obs.engines.sim.hardware import CALIBRATION, Calibration
from obs.errors import ConfigError
from obs.loadgen.mix import load_mix
from obs.sweep.capacity import size
from obs.sweep.profile import load_profile
from obs.sweep.replay import Replay

FIELD = "pools.0.engine.gpu.calibration"
# A slow host: every engine step costs 50 ms of CPU, 40 times the built-in 1.25 ms.
SLOW_STEP_S = 0.05


def _calibration(path: Path, cal: Calibration) -> Path:
    checked = {"points": 3, "median_abs_error": 0.05, "max_abs_error": 0.1}
    doc = calibration_doc(cal, {"gpu": "H100", "model": "llama-3.1-8b"}, checked)
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def _profile(folder: Path, name: str, calibration: str | None) -> Path:
    """One pool of one simulated H100; the lanes are the shipped six, all on it."""
    gpu: dict[str, object] = {"replicas": 1}
    if calibration is not None:
        gpu["calibration"] = calibration
    data = {
        "name": name,
        "base_lanes": "default",
        "pools": [{"name": "main", "engine": {"prefix_caching": False, "gpu": gpu}}],
        "lanes": {
            lane: {"pool": "main"}
            for lane in ("slow-stream", "agent", "rag", "batch", "long-prefill", "chat")
        },
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_a_calibration_is_read_from_the_profiles_folder_and_reaches_engine_sim(
    tmp_path: Path,
) -> None:
    """A relative ``calibration`` is the file beside the profile (not the working
    directory's); the pool's replicas model it, and the ``engine sim`` arguments the sweep
    starts them with carry its resolved path, which engine sim's own flags read to the same
    corrections."""
    _calibration(tmp_path / "host.json", Calibration(mbu=0.6, step_s=0.003))
    path = _profile(tmp_path / "profiles", "calibrated", "../host.json")
    flags = load_profile(path).gpu_pools()["main"]
    assert flags.calibration is not None
    assert flags.calibration.path == str((tmp_path / "host.json").resolve())
    assert flags.prefix_caching is False  # inherited from the pool, calibration kept
    perf = flags.perf()
    assert (perf.cal.mbu, perf.cal.step_s) == (0.6, 0.003)
    assert perf.cal.seq_s == CALIBRATION.seq_s  # the fields the file leaves: built in
    args = flags.sim_args()
    assert args[args.index("--calibration") + 1] == flags.calibration.path
    parser = argparse.ArgumentParser()
    sim_cli.add_parser(parser.add_subparsers())
    opts = sim_cli.options(parser.parse_args(["sim", *args]))
    assert opts.perf is not None and opts.perf.cal == perf.cal
    plain = load_profile(_profile(tmp_path / "profiles", "plain", None)).gpu_pools()["main"]
    assert plain.calibration is None and "--calibration" not in plain.sim_args()
    assert plain.perf().cal == CALIBRATION


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "cannot read it"),
        ("{not json", "not JSON"),
        ('{"kind": "something else"}', "not a host calibration"),
        (
            '{"kind": "vllm-obs host calibration", "calibration": {"mbu": -1}, '
            '"checked": {"median_abs_error": 0, "max_abs_error": 0}}',
            "calibration.mbu must be a number >= 0",
        ),
        (
            '{"kind": "vllm-obs host calibration", "calibration": {"speed": 2}, '
            '"checked": {"median_abs_error": 0, "max_abs_error": 0}}',
            "unknown calibration field(s) speed",
        ),
    ],
)
def test_a_missing_or_malformed_calibration_is_refused_naming_the_field(
    tmp_path: Path, content: str | None, says: str
) -> None:
    """A calibration file that is missing, not JSON, of another kind or with a bad value
    fails the profile at load, naming the profile, the field, the resolved file and what is
    wrong (not engine sim's flag)."""
    if content is not None:
        (tmp_path / "host.json").write_text(content, encoding="utf-8")
    path = _profile(tmp_path, "bad", "host.json")
    with pytest.raises(ConfigError) as caught:
        load_profile(path)
    text = str(caught.value)
    assert text.startswith(f"{path}: invalid profile")
    assert f"{FIELD}: {(tmp_path / 'host.json').resolve()}: " in text
    assert says in text and "--calibration" not in text


def test_the_sweep_refuses_a_bad_calibration_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``vllm-obs sweep --engine sim`` with a profile whose calibration is missing exits 2
    with the field named, and starts nothing (no output folder)."""
    path = _profile(tmp_path, "missing", "nowhere.json")
    out = tmp_path / "out"
    rc = main(["sweep", "--engine", "sim", "--profile", str(path), "--out", str(out)])
    assert rc == 2
    assert f"{FIELD}: {(tmp_path / 'nowhere.json').resolve()}: cannot read it" in (
        capsys.readouterr().err
    )
    assert not out.exists()


def _tpots(path: Path) -> list[float]:
    with gzip.open(path) as f:
        events = [orjson.loads(line) for line in f]
    return [e["tpot_ms"] for e in events if e["status"] == "ok" and e.get("tpot_ms")]


def test_a_calibration_changes_the_timings_and_capacity_the_stress_replay_reports(
    tmp_path: Path,
) -> None:
    """The same plan replayed on the same pool with and without a slow host's calibration:
    with it, every streamed request's TPOT is at least the host's 50 ms step (each token
    after the first waits one step or more), where the built-in H100's median is a few
    milliseconds; the pool's modelled capacity, which sizes admission, falls too."""
    _calibration(tmp_path / "slow.json", Calibration(step_s=SLOW_STEP_S))
    mix = load_mix()
    tpots = {}
    capacity = {}
    for name, cal in (("plain", None), ("slow", "slow.json")):
        profile = load_profile(_profile(tmp_path, name, cal))
        capacity[name] = size(profile, mix).sessions_per_s
        out = tmp_path / f"{name}.jsonl.gz"
        Replay(profile, mix, out).run(60, 1.0, 0)
        tpots[name] = _tpots(out)
    assert tpots["plain"] and tpots["slow"]
    assert min(tpots["slow"]) >= SLOW_STEP_S * 1000
    assert statistics.median(tpots["plain"]) < SLOW_STEP_S * 1000 / 4
    assert capacity["slow"] < capacity["plain"]
