"""`vllm-obs engine sim check`: the simulator against real `vllm bench serve` result files.

The files in tests/data/vllm-bench-serve are what vLLM 0.32's own benchmark client wrote
(bench/sim_calibration_capture.py): against the CPU vLLM of `engine setup`, Poisson rates
2, 4 and 8 requests/s with --save-detailed and rate 2 without it (the host's "GPU" is its
CPU, given as a spec file, cpu-host.yaml; the model the tiny model's config.json); and
against `engine sim` (H100, Llama-3.1-8B) running a host calibration whose corrections are
known (sim-host-truth.json), Poisson 4, 8 and 16 requests/s: a host a fit can be seen to
recover.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from obs.engines.sim.calibration import load_calibration
from obs.engines.sim.results import read_runs
from obs.errors import ConfigError, InputError
from obs.plan import check
from obs.plan.command import host_margin

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm-bench-serve"
HOST = ["--gpu", str(DATA / "cpu-host.yaml"), "--model-config", str(DATA / "config.json")]
RATES = [DATA / f"rate{r}.json" for r in (2, 4, 8)]
SIM_HOST = ["--gpu", "H100", "--model", "llama-3.1-8b", "--max-num-seqs", "256"]
SIM_RATES = [DATA / f"sim-h100-rate{r}.json" for r in (4, 8, 16)]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "obs.cli", "engine", "sim", "check", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def test_a_detailed_file_replays_each_request_as_sent() -> None:
    """A --save-detailed file gives each successful request's lengths and send time (from
    the first's); the figures the file has are what is compared."""
    (run,) = read_runs(RATES[0])
    doc = json.loads(RATES[0].read_text(encoding="utf-8"))
    assert run.detailed and len(run.inputs) == doc["completed"]
    assert list(run.inputs) == doc["input_lens"] and list(run.outputs) == doc["output_lens"]
    assert run.offsets is not None and run.offsets[0] == 0.0 and max(run.offsets) > 0
    assert run.request_rate == doc["request_rate"] and run.max_concurrency is None
    assert run.measured["mean_ttft_ms"] == doc["mean_ttft_ms"]


def test_a_summary_file_replays_its_means() -> None:
    """Without --save-detailed the file's totals give every request the mean lengths."""
    (run,) = read_runs(DATA / "rate2-summary.json")
    doc = json.loads((DATA / "rate2-summary.json").read_text(encoding="utf-8"))
    assert not run.detailed and run.offsets is None and len(run.inputs) == doc["completed"]
    assert sum(run.outputs) == doc["total_output_tokens"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not JSON"),
        ('{"duration": 1}', "not a `vllm bench serve --save-result` file"),
        ('{"duration": 1, "completed": 1, "total_input_tokens": 5, "request_rate": "inf", '
         '"total_output_tokens": 5, "spec_decode_acceptance_rate": 0.5}', "speculative"),
    ],
)  # fmt: skip
def test_a_file_that_is_not_a_result_is_refused(tmp_path: Path, text: str, message: str) -> None:
    """Another JSON file, or a run with a feature the simulator lacks, is an input error."""
    path = tmp_path / "x.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match=message.replace("`", ".")):
        read_runs(path)


def test_drawn_arrivals_follow_the_rate_and_burstiness() -> None:
    """Without recorded send times, arrivals are drawn as vllm bench serve draws them: at
    the file's rate, more even with a higher burstiness, all at once at an infinite rate."""
    import random

    even = check._arrivals(2000, 4.0, 8.0, random.Random(1))
    poisson = check._arrivals(2000, 4.0, 1.0, random.Random(1))
    assert even[-1] / 1999 == pytest.approx(0.25, rel=0.05)
    assert poisson[-1] / 1999 == pytest.approx(0.25, rel=0.1)
    gaps = [b - a for a, b in itertools.pairwise(poisson)]
    even_gaps = [b - a for a, b in itertools.pairwise(even)]
    assert max(even_gaps) < max(gaps)
    assert check._arrivals(3, math.inf, 1.0, random.Random(1)) == (0.0, 0.0, 0.0)


def test_percentiles_are_numpys_linear_ones() -> None:
    """The figures' percentiles interpolate as np.percentile (vLLM's benchmark) does."""
    assert check.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert check.percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert check.percentile([5.0], 99) == 5.0


@pytest.mark.process
def test_check_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    """`check` on the three detailed files prints each file's measured, simulated and ratio
    rows and a summary, and --json writes the same rows and summary."""
    out = tmp_path / "check.json"
    r = _cli(*map(str, RATES), *HOST, "--json", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text(encoding="utf-8"))
    files = {row["file"] for row in doc["rows"]}
    assert files == {str(p) for p in RATES}
    metrics = {row["metric"] for row in doc["rows"]}
    assert {"mean_ttft_ms", "p99_tpot_ms", "median_itl_ms", "mean_e2el_ms"} <= metrics
    assert {"request_throughput", "output_throughput"} <= metrics
    for row in doc["rows"]:
        assert row["ratio"] == pytest.approx(row["simulated"] / row["measured"], rel=1e-3)
    s = doc["summary"]
    assert set(s) >= {"median_abs_error", "worst_ratio", "within_25"}
    assert s["points"] == len(doc["rows"])
    assert "summary:" in r.stdout and f"== {RATES[0]}" in r.stdout
    assert "warning" not in r.stderr


@pytest.mark.process
def test_a_summary_file_is_checked_with_a_warning(tmp_path: Path) -> None:
    """A file saved without --save-detailed is replayed from its totals, with a warning."""
    r = _cli(str(DATA / "rate2-summary.json"), *HOST)
    assert r.returncode == 0, r.stderr
    assert "--save-detailed" in r.stderr and "mean_ttft_ms" in r.stdout


def test_fitting_two_rates_lowers_the_third_rates_error() -> None:
    """Corrections fitted on rates 4 and 16 of one host bring the simulator closer to that
    host's rate-8 run, which the fit never saw."""
    from obs.engines.sim.hardware import perf_model
    from obs.engines.sim.scheduler import SchedulerConfig

    perf = perf_model("H100", "llama-3.1-8b")
    setup = check.Setup(perf, SchedulerConfig(8192, 256))
    fit_runs = [r for p in (SIM_RATES[0], SIM_RATES[2]) for r in read_runs(p)]
    held = read_runs(SIM_RATES[1])
    cal, fitted_loss = check.fit(fit_runs, setup)
    assert fitted_loss < check.loss(fit_runs, setup)
    corrected = check.Setup(perf.__class__(perf.gpu, perf.model, cal), setup.scheduler)
    assert check.loss(held, corrected) < check.loss(held, setup)


@pytest.mark.process
def test_fit_writes_a_calibration_that_check_and_plan_take(tmp_path: Path) -> None:
    """--fit writes a host calibration with its error on runs left out of the fit;
    `check --calibration` on another rate reports a lower median error than without it,
    and the plan's margin from the file is that held-out error, saying where it came from."""
    cal_path = tmp_path / "host.json"
    r = _cli(str(SIM_RATES[0]), str(SIM_RATES[2]), *SIM_HOST, "--fit", str(cal_path))
    assert r.returncode == 0, r.stderr
    host = load_calibration(cal_path)
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    assert _cli(str(SIM_RATES[1]), *SIM_HOST, "--json", str(before)).returncode == 0
    r = _cli(str(SIM_RATES[1]), *SIM_HOST, "--calibration", str(cal_path), "--json", str(after))
    assert r.returncode == 0, r.stderr
    err = [json.loads(p.read_text())["summary"]["median_abs_error"] for p in (before, after)]
    assert err[1] < err[0]
    doc = json.loads(cal_path.read_text(encoding="utf-8"))
    held = doc["checked"]["held_out"]  # each rate under a fit on the other one
    assert held["points"] > 0
    margin, source = host_margin(host)
    assert host.held_out and margin == held["max_abs_error"] > 0
    assert str(cal_path) in source and "held-out" in source


@pytest.mark.process
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--speculative-config", "{}"], "does not model speculative decoding"),
        (["--gpu", "Z9000"], "choose one of"),
        (["--model-config", "/nonexistent/config.json"], "no such file"),
    ],
)
def test_check_refuses_what_it_cannot_model(args: list[str], message: str) -> None:
    """An unmodelled vLLM flag, an unknown GPU or a missing config exits 2 with a message."""
    r = _cli(str(RATES[0]), *HOST, *args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_a_calibration_file_of_another_kind_is_refused(tmp_path: Path) -> None:
    """A JSON file that is not a host calibration is refused, saying how to make one."""
    path = tmp_path / "c.json"
    path.write_text('{"calibration": {}}', encoding="utf-8")
    with pytest.raises(ConfigError, match="engine sim check --fit"):
        load_calibration(path)


@pytest.mark.process
def test_plan_takes_a_host_calibrations_held_out_error_as_its_margin(tmp_path: Path) -> None:
    """`plan --calibration FILE` pads latencies by the file's held-out error and says so in
    its output and plan.json, naming the file."""
    from obs.engines.sim.calibration import calibration_doc
    from obs.engines.sim.hardware import CALIBRATION
    from obs.loadgen.mix import load_mix
    from obs.sweep.profile import resolve
    from obs.sweep.replay import Replay

    events = tmp_path / "events.jsonl.gz"
    Replay(resolve("single-balanced"), load_mix(), events).run(60, 4.0, 0)
    host = tmp_path / "host.json"
    cal = CALIBRATION.__class__(mbu=0.7)
    held = {"points": 12, "median_abs_error": 0.05, "max_abs_error": 0.123}
    checked = {"points": 24, "median_abs_error": 0.03, "max_abs_error": 0.08, "held_out": held}
    host.write_text(json.dumps(calibration_doc(cal, {"gpu": "H100"}, checked)), "utf-8")
    root = Path(__file__).resolve().parents[2]
    profile = root / "obs" / "data" / "profile-single-balanced.yaml"
    cmd = [sys.executable, "-m", "obs.cli", "plan", str(events), "--config", str(profile)]
    r = subprocess.run(
        [*cmd, "--calibration", str(host), "--out", str(tmp_path / "plan")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode in (0, 1), r.stderr
    settings = json.loads((tmp_path / "plan" / "plan.json").read_text("utf-8"))["settings"]
    assert settings["margin"] == 0.123
    assert str(host) in settings["margin_source"] and "held-out" in settings["margin_source"]
    assert "margin 12.3%" in r.stdout


def test_a_closed_loop_run_keeps_at_most_its_concurrency_in_flight() -> None:
    """A run with max_concurrency C replays behind a semaphore of C, as vllm bench serve
    sends: at an infinite rate its throughput is C's, below a run of the same requests
    sent all at once, and its TTFT (from each request's own start) is lower."""
    from obs.engines.sim.hardware import perf_model
    from obs.engines.sim.results import BenchRun
    from obs.engines.sim.scheduler import SchedulerConfig

    setup = check.Setup(perf_model("H100", "llama-3.1-8b"), SchedulerConfig(8192, 256))
    lengths = ((512,) * 64, (64,) * 64)
    closed = BenchRun("c2", *lengths, None, math.inf, 1.0, 2, {}, True)
    burst = BenchRun("burst", *lengths, None, math.inf, 1.0, None, {}, True)
    two, every = check.replay([closed, burst], setup, fresh=True)
    assert two["request_throughput"] < every["request_throughput"]
    assert two["mean_ttft_ms"] < every["mean_ttft_ms"]
    assert two["mean_tpot_ms"] < every["mean_tpot_ms"]  # a batch of 2 decodes faster
