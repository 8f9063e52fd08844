"""``vllm-obs demo``: its pure parts, then real runs (vLLM pools, sidecar, Prometheus, load)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from obs.config import default_config_path, load_config
from obs.demo import results
from obs.demo.options import LOCAL_MAX_MODEL_LEN
from obs.demo.prometheus import Alert, write_config
from obs.demo.stack import descendants, pid_alive
from obs.demo.workload import CLASSES, LiveView, load_demo_mix, write_lanes, write_mix
from obs.engines.server import VllmServer
from obs.loadgen.plan import Arrivals, bounded, iter_plan
from obs.loadgen.records import Record
from obs.procs import group_alive
from tests.conftest import require_binary
from tests.support import QUICK_DRAIN
from tests.support.probes import wait_for

LANES = load_config(default_config_path()).lane_names
DEMO_TIMEOUT_S = 600


def _demo(*args: str) -> list[str]:
    return [sys.executable, "-m", "obs.cli", "demo", *args]


def _processes_mentioning(text: str) -> list[str]:
    """Live processes whose command line contains ``text``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in argv and pid_alive(int(cmdline.parent.name)):
            found.append(f"{cmdline.parent.name}: {argv[:200]}")
    return found


def _assert_nothing_survives(out: Path) -> None:
    pids = json.loads((out / "pids.json").read_text())
    assert pids, "the demo recorded no processes"
    for entry in pids:
        assert not pid_alive(entry["pid"]), entry
        if entry["pgid"] is not None:
            assert not group_alive(entry["pgid"]), entry
    assert _processes_mentioning(str(out)) == []


def _record(client_class: str, status: str = "ok") -> Record:
    return Record(client_class=client_class, status=status)


# --- the pure parts --------------------------------------------------------------------


def test_demo_mix_fits_the_tiny_models_context(tmp_path: Path) -> None:
    """Every request of ten minutes of the demo mix fits 2048 tokens with template overhead."""
    mix = load_demo_mix(write_mix(tmp_path / "mix.yaml", full_mix=False), ())
    plan = list(bounded(iter_plan(mix, 0, Arrivals(rate=8.0)), duration_s=600))
    assert {r.client_class for r in plan} == set(CLASSES)
    for r in plan:
        messages = 2 + 2 * len(r.history)
        # ~1.15 tokens of the tiny tokenizer per planned token, ~10 template tokens a message
        assert r.total_prompt_tokens * 1.2 + 10 * messages + r.max_tokens < LOCAL_MAX_MODEL_LEN


def test_full_mix_writes_no_overlay(tmp_path: Path) -> None:
    """--full-mix uses the load generator's default mix unchanged."""
    assert write_mix(tmp_path / "mix.yaml", full_mix=True) is None
    assert not (tmp_path / "mix.yaml").exists()


def test_every_class_reaches_its_lane_early_with_the_default_seed(tmp_path: Path) -> None:
    """With seed 0 at 4/s, all six lanes get a request in the first 5 s (so --short covers them)."""
    mix = load_demo_mix(write_mix(tmp_path / "mix.yaml", full_mix=False), ())
    early = bounded(iter_plan(mix, 0, Arrivals(rate=4.0)), duration_s=5)
    assert {r.client_class for r in early} == set(CLASSES) == set(LANES)


def test_lanes_config_points_every_pool_at_the_local_replicas(tmp_path: Path) -> None:
    """The written lanes config is the default one with only the replica URLs replaced."""
    urls = {"interactive": ["http://127.0.0.1:1111"], "bulk": ["http://127.0.0.1:2222"]}
    config = write_lanes(tmp_path / "lanes.yaml", urls)
    default = load_config(default_config_path())
    assert {p.name: p.replicas for p in config.pools} == urls
    assert config.lanes == default.lanes
    assert config.default_lane == default.default_lane
    assert all(p.declared is None for p in config.pools)  # no flags these replicas may not run


def test_local_pools_declare_the_flags_they_are_started_with(tmp_path: Path) -> None:
    """Each local pool's `vllm serve` flags are generated from the engine block the demo's
    lanes config declares for it: what runs and what the record says are one."""
    from obs.config_blocks import declared_in_args
    from obs.demo.options import LOCAL_POOLS

    urls = {"interactive": ["http://127.0.0.1:1111"], "bulk": ["http://127.0.0.1:2222"]}
    engines = {s.name: s.engine_block() for s in LOCAL_POOLS}
    config = write_lanes(tmp_path / "lanes.yaml", urls, engines)
    for spec in LOCAL_POOLS:
        pool = config.pool(spec.name)
        assert pool.engine == "vllm" and pool.declared is not None
        assert declared_in_args(list(spec.vllm_args)) == pool.declared.values()
        assert pool.declared.max_num_seqs is not None


@pytest.mark.stack
def test_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    """The scrape config with the generated rules is valid for promtool."""
    promtool = require_binary("promtool")
    rules = tmp_path / "rules"
    subprocess.run(
        [sys.executable, "-m", "obs.cli", "alerts", "--out", str(rules)],
        check=True,
        capture_output=True,
    )
    path = write_config(
        tmp_path / "prometheus.yml",
        sidecar_url="http://127.0.0.1:9000",
        pools={"interactive": ["http://127.0.0.1:8001"], "bulk": ["http://127.0.0.1:8002"]},
        rules_dir=rules,
        interval_s=2,
    )
    check = subprocess.run(
        [promtool, "check", "config", str(path)], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout + check.stderr


def test_screen_table_keeps_the_header_and_chosen_rows() -> None:
    """The on-screen summary keeps the lane header, the rule and the chosen rows."""
    table = "lane      chat\n--------  ----\nrequests  3\nqueue_p50_ms  1.0\ngoodput_ratio  100%\n"
    shown = results.screen_table(table)
    assert shown.splitlines() == [
        "lane      chat",
        "--------  ----",
        "requests  3",
        "goodput_ratio  100%",
    ]


def test_slo_table_shows_attainment_against_objective() -> None:
    """Each SLO is shown as attained of objective, with the verdict."""
    row = {
        "lane": "chat",
        "ttft_objective": 0.95,
        "ttft_attainment": 0.8,
        "ttft_slo_ms": 500.0,
        "ttft_slo_met": False,
        "tpot_objective": None,
        "availability_objective": 0.995,
        "availability": 1.0,
        "availability_slo_met": True,
        "goodput_ratio": 0.8,
        "slo_met": False,
    }
    text = results.slo_table([row])
    assert "80.0% of 95% <= 500 ms NO" in text
    assert "100.00% of 99.5% yes" in text
    assert text.splitlines()[2].split()[-1] == "NO"


def test_alerts_text_lists_state_name_and_where() -> None:
    """Alerts are listed firing first with their lane, SLO and windows; none says so."""
    labels = {"lane": "chat", "slo": "ttft", "severity": "page"}
    alert = Alert(
        "VllmObsTTFTBudgetBurn", "firing", {**labels, "long_window": "1h", "short_window": "5m"}, ""
    )
    text = results.alerts_text([alert])
    assert text.split() == [
        "firing",
        "VllmObsTTFTBudgetBurn",
        "lane=chat",
        "slo=ttft",
        "severity=page",
        "windows=1h/5m",
    ]
    assert "none" in results.alerts_text([])


def test_live_view_prints_periodic_lines_when_not_a_terminal() -> None:
    """Without a terminal the view prints a line per interval and a final one."""
    now = [0.0]
    out = io.StringIO()
    view = LiveView(out, 60, in_place=False, every_s=10, clock=lambda: now[0])
    view.add(_record("chat"))
    view.add(_record("batch", status="error"))
    view.update(3)
    now[0] = 11.0
    view.update(2)
    view.update(1, final=True)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "chat 1" in lines[0] and "batch 1" in lines[0] and "errors 1" in lines[0]
    assert "\r" not in out.getvalue()


def test_live_view_redraws_one_line_on_a_terminal() -> None:
    """On a terminal every update redraws the same line; the final one ends it."""
    now = [0.0]
    out = io.StringIO()
    view = LiveView(out, 15, in_place=True, clock=lambda: now[0])
    view.update(0)
    now[0] = 20.0
    view.update(0, final=True)
    text = out.getvalue()
    assert text.count("\r\x1b[K") == 2 and text.endswith("\n") and text.count("\n") == 1
    assert "draining" in text


@pytest.mark.process
def test_descendants_sees_a_child_until_it_is_reaped() -> None:
    """The survivor check finds a live child process and not a stopped one."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert child.pid in descendants(os.getpid())
    finally:
        child.terminate()
        child.wait()
    assert child.pid not in descendants(os.getpid())


@pytest.mark.process
def test_bad_duration_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """A non-positive --duration exits 2 naming the flag, and creates no output folder."""
    out = tmp_path / "out"
    proc = subprocess.run(
        _demo("--duration", "0", "--out", str(out)), capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2
    assert "--duration" in proc.stderr
    assert not out.exists()


# --- real runs -------------------------------------------------------------------------


@pytest.fixture
def short_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """One short demo run (two local pools, sidecar, Prometheus); yields (out, stdout)."""
    out = tmp_path_factory.mktemp("demo") / "out"
    started = time.monotonic()
    proc = subprocess.run(
        # The labelled run (X-Client-Class): every lane gets requests within 15 s, so each
        # lane's artefacts are checked; the unlabelled default is test_sim_demo_tells_the_story.
        _demo("--duration", "15", "--class-headers", *QUICK_DRAIN, "--out", str(out)),
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        check=False,
    )
    print(f"demo --duration 15 took {time.monotonic() - started:.1f} s\n{proc.stderr}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    yield out, proc.stdout


@pytest.mark.engine
def test_short_demo_leaves_every_artefact_and_no_process(short_demo: tuple[Path, str]) -> None:
    """A 15 s demo writes events for every lane, each served or shed by its lane's admission,
    valid rules and dashboards, a report with images and the summary, and stops every process
    it started."""
    out, stdout = short_demo
    _assert_nothing_survives(out)

    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert {e["lane"] for e in events} == set(LANES)
    # The incident (24 long RAG prompts) can fill the rag and chat lanes' admission on a fast
    # machine, whose probe sets a higher rate: the sidecar then sheds by its lanes' policy, which
    # the demo reports. Anything else (an error, a client error, another refusal) is a fault.
    shed = {(e["status"], e.get("rejection_reason")) for e in events if e["status"] != "ok"}
    assert shed <= {("rejected", "queue_timeout"), ("rejected", "queue_full")}, shed
    assert {e["pool"] for e in events} == {"interactive", "bulk"}

    dashboards = sorted((out / "dashboards").glob("*.json"))
    assert dashboards
    for path in dashboards:
        assert json.loads(path.read_text())["panels"]
    lanes, boards = str(out / "lanes.yaml"), str(out / "dashboards")
    check = subprocess.run(
        [
            sys.executable,
            "-m",
            "obs.cli",
            "dashboards",
            "--config",
            lanes,
            "--out",
            boards,
            "--check",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stderr

    rules = sorted((out / "rules").glob("*.yml"))
    assert rules
    promtool = require_binary("promtool")
    check = subprocess.run(
        [promtool, "check", "rules", *map(str, rules)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr

    report = (out / "report" / "report.html").read_text()
    assert report.count('src="data:image/png;base64,') >= 3

    assert "Per-lane summary" in stdout and "SLO attainment" in stdout
    for lane in LANES:
        assert lane in stdout
    assert (out / "summary.txt").read_text().count("ttft_p95_ms") == 1
    alerts = json.loads((out / "alerts.json").read_text())
    assert all(a["state"] in ("pending", "firing") for a in alerts)


def _read_until(stream: IO[str], prefix: str) -> str:
    """Lines of ``stream`` up to and including the first that starts with ``prefix``."""
    seen = []
    for line in stream:
        seen.append(line)
        if line.startswith(prefix):
            break
    return "".join(seen)


@pytest.mark.engine
def test_sigterm_while_pools_start_stops_everything(tmp_path: Path) -> None:
    """SIGTERM while the vLLM pools are starting stops them and exits 143, leaving nothing."""
    out = tmp_path / "out"
    cmd = _demo("--out", str(out))
    with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as p:
        assert p.stderr is not None
        try:
            seen = _read_until(p.stderr, "[pools] starting")
            time.sleep(3)  # the servers are launched and loading
            p.send_signal(signal.SIGTERM)
            seen += p.stderr.read()
            status = p.wait(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
    assert status == 128 + signal.SIGTERM, seen
    assert "none left running" in seen
    entries = json.loads((out / "pids.json").read_text())
    assert sorted(e["name"] for e in entries) == ["vLLM pool bulk", "vLLM pool interactive"]
    _assert_nothing_survives(out)


@pytest.mark.engine
def test_ctrl_c_during_the_load_still_reports(vllm: VllmServer, tmp_path: Path) -> None:
    """With --upstream, one Ctrl-C during the load stops it early, the incident not yet sent
    included; results are still written. The load is 600 s (the incident due 240 s in), so
    only the Ctrl-C can end the run within the 120 s the test waits for it (a hang guard,
    not a bound on how fast it stops); it comes once the first request is on record."""
    out = tmp_path / "out"
    cmd = _demo("--upstream", vllm.url, "--duration", "600", *QUICK_DRAIN, "--out", str(out))
    events = out / "events.jsonl"
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        assert p.stderr is not None
        try:
            _read_until(p.stderr, "[load]")
            wait_for(
                "the load's first event",
                lambda: events.exists() and b"\n" in events.read_bytes(),
                120,
                every_s=0.1,
            )
            p.send_signal(signal.SIGINT)
            stdout, stderr = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
    assert p.returncode == 0, stderr
    assert "stopping the load" in stderr
    assert "incident:" not in stderr
    assert "Per-lane summary" in stdout
    assert (out / "report" / "report.html").exists()
    assert (out / "events.jsonl").read_text().strip()
    _assert_nothing_survives(out)
