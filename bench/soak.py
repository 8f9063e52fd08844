"""Soak: minutes of mixed load through the sidecar while its replicas are frozen and killed.

Starts two real ``vllm serve`` replicas (tiny model) behind one sidecar running the
shipped six lanes (both pools on both replicas), an OTLP receiver for its spans, and
``vllm-obs load`` (the six-class mix sized for the tiny model, open loop) for
``--minutes``. Meanwhile it injects faults every ``--fault-every`` seconds, alternating
replicas and kinds: SIGSTOP for ``--stop-s`` then SIGCONT, and SIGKILL then a restart.
Lane timeouts are short (idle 5 s) so frozen replicas produce timeouts, not hangs.

Every ``--sample-s`` it records the sidecar's RSS, open file descriptors and TCP
sockets, and prints a progress line on stderr. After the load it waits for the
replicas to be back (restarting once more one whose restart failed under load),
checks that the sidecar sees them healthy and that requests succeed again, lets idle
connections close, stops the sidecar with SIGTERM (every event flushed) and checks:

- one event per request the client sent (joined by request id, none duplicated);
- the sidecar's ``vllm_obs_requests_total`` equals the events written;
- no leaked descriptors: no client connection left open, nothing in CLOSE_WAIT (a
  peer closed it, the sidecar never did), upstream connections no more than at the
  peak (aiohttp keeps idle ones pooled, and the health poller's round-robin reuse
  keeps them alive), and every other descriptor back to its idle count (small slack);
- the sidecar exits cleanly.

The result (figures, samples, faults, checks) goes to ``bench/results/soak.json`` (or
``--out``); exit status 1 when a check fails.

    .venv/bin/python -m bench.soak --minutes 10
    .venv/bin/python -m bench.soak --minutes 0.75 --fault-every 12 --stop-s 6   # short
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from bench.soak_faults import STARTUP_TIMEOUT_S, Injector, log, restart, running, start_replicas
from bench.soak_probe import Sample, get_json, metric_sum, post_chat, sample
from obs.config import default_config_path
from obs.demo.workload import write_mix
from obs.engines.server import VllmServer
from obs.loadgen.check import check_files
from obs.loadgen.records import read_jsonl
from obs.sidecar.testing import OtlpReceiver, SidecarProcess

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results" / "soak.json"
FD_SLACK = 4  # descriptors the run may leave open beyond the idle baseline
TIMEOUTS = {"connect_s": 5, "first_token_s": 15, "idle_s": 5}


# ---- the run -----------------------------------------------------------------------------


def lanes_config(path: Path, replicas: list[str]) -> Path:
    """The shipped six lanes, both pools on every replica, short timeouts."""
    data = yaml.safe_load(default_config_path().read_text())
    for pool in data["pools"]:
        pool["replicas"] = replicas
    for lane in data["lanes"]:
        lane["timeouts"] = dict(TIMEOUTS)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@dataclass
class Run:
    """What one soak run starts, watches and keeps."""

    args: argparse.Namespace
    t0: float
    work: Path
    replicas: list[VllmServer]
    receiver: OtlpReceiver
    sidecar: SidecarProcess
    injector: Injector
    names: dict[int, str] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)

    @property
    def records(self) -> Path:
        return self.work / "records.jsonl"

    @property
    def events(self) -> Path:
        return self.work / "events.jsonl"

    def sample(self) -> Sample:
        s = sample(self.sidecar.pid, self.t0, self.records, self.events, self.names)
        self.samples.append(s)
        return s


def load_command(args: argparse.Namespace, url: str, records: Path, mix: Path | None) -> list[str]:
    """``vllm-obs load``: the soak's open-loop mix for ``--minutes``."""
    cmd = [sys.executable, "-m", "obs.cli", "load", "--url", url, "--model", "tiny"]
    cmd += ["--rate", str(args.rate), "--duration", str(args.minutes * 60)]
    cmd += ["--seed", str(args.seed), "--run-id", f"soak-{args.seed}", "--out", str(records)]
    cmd += ["--timeout", "120", "--no-progress", *(["--mix", str(mix)] if mix else [])]
    return cmd


def start(args: argparse.Namespace, t0: float) -> Run:
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="vllm-obs-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    log(t0, f"workdir {work}; starting 2 vLLM replicas")
    replicas = start_replicas(2, work, t0)
    receiver = OtlpReceiver().start()
    sidecar = SidecarProcess(
        config=lanes_config(work / "lanes.yaml", [r.url for r in replicas]),
        events=work / "events.jsonl",
        args=("--pool-poll-interval", "1", "--shutdown-grace", "30"),
        env={
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url,
            "OTEL_BSP_SCHEDULE_DELAY": "500",
        },
        log_path=work / "sidecar.log",
    )
    until_s = args.minutes * 60 - args.stop_s
    injector = Injector(replicas, args.fault_every, args.stop_s, until_s, t0)
    return Run(args, t0, work, replicas, receiver, sidecar, injector)


def drive(run: Run) -> subprocess.Popen[bytes]:
    """The load and the faults together, sampling the sidecar until the load ends."""
    mix = write_mix(run.work / "mix.yaml", full_mix=False)
    with open(run.work / "load.out", "wb") as out:
        cmd = load_command(run.args, run.sidecar.url, run.records, mix)
        load = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    run.injector.start = time.monotonic()
    thread = threading.Thread(target=run.injector.run, daemon=True)
    thread.start()
    while load.poll() is None:
        time.sleep(run.args.sample_s)
        s = run.sample()
        socks = ", ".join(f"{k} {v}" for k, v in sorted(s.sockets.items()) if " " in k)
        log(run.t0, f"sent {s.sent} events {s.events} rss {s.rss_mib} MiB fds {s.fds} ({socks})")
    run.injector.stopped.set()
    thread.join(timeout=STARTUP_TIMEOUT_S)  # a restart in progress finishes
    return load


def recover(run: Run) -> tuple[bool, list[int]]:
    """Every replica up again (once more, idle, if a restart failed under load); requests
    through the sidecar answered again. Returns (healthy, the recovery statuses)."""
    for r in run.replicas:
        if not running(r):
            log(run.t0, f"restarting {r.url} again: {restart(r) or 'up'}")
    healthy = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not healthy:
        pools = get_json(run.sidecar.url + "/health")["pools"]
        healthy = all(all(reps.values()) for reps in pools.values())
        time.sleep(0.5)
    recovery = [post_chat(run.sidecar.url) for _ in range(4)]
    log(run.t0, f"after the faults: replicas healthy {healthy}, requests {recovery}")
    return healthy, recovery


def run(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.monotonic()
    r = start(args, t0)
    load: subprocess.Popen[bytes] | None = None
    try:
        r.sidecar.start()
        r.names = {rep.port: f"replica-{i}" for i, rep in enumerate(r.replicas)}
        r.names |= {r.receiver.port: "otlp", r.sidecar.port: "client"}
        time.sleep(2.5)  # a pool poll or two: the idle baseline
        baseline = r.sample()
        log(t0, f"sidecar up: rss {baseline.rss_mib} MiB, fds {baseline.fds}; load starts")
        load = drive(r)
        log(t0, f"load done (exit {load.returncode}); waiting for every replica to be healthy")
        healthy, recovery = recover(r)
        time.sleep(args.settle_s)  # idle keep-alive connections close (vLLM: 5 s)
        r.sample()
        metrics_requests = metric_sum(r.sidecar.url, "vllm_obs_requests_total")
        exit_code = r.sidecar.stop()
        log(t0, f"sidecar stopped (exit {exit_code}); checking")
        return result(r, healthy, recovery, metrics_requests, exit_code)
    finally:
        r.injector.stopped.set()
        if load is not None and load.poll() is None:
            load.send_signal(signal.SIGINT)
            try:
                load.wait(30)
            except subprocess.TimeoutExpired:
                load.kill()
        r.sidecar.stop()
        r.receiver.stop()
        for rep in r.replicas:
            rep.stop()
        if not args.keep and not args.workdir:
            shutil.rmtree(r.work, ignore_errors=True)


def result(
    r: Run, healthy: bool, recovery: list[int], metrics_requests: float, exit_code: int | None
) -> dict[str, Any]:
    """The run's figures and checks (see the module docstring)."""
    report = check_files(r.records, r.events, wait_s=2)
    all_events = list(read_jsonl(r.events))
    outcomes = Counter(
        f"{e['status']}/{e['error_class']}" if e["error_class"] else e["status"] for e in all_events
    )
    client = Counter(rec["status"] for rec in read_jsonl(r.records))
    roots = sum(1 for s in r.receiver.spans if s.kind == 2)  # SERVER: one per request
    samples, baseline, end = r.samples, r.samples[0], r.samples[-1]
    checks = {
        "one_event_per_request": report.ok and not report.duplicate_events,
        "metrics_count_every_event": metrics_requests == len(all_events),
        # Idle upstream connections stay pooled (bounded by the peak); nothing else grows.
        "no_fd_leak": end.other_fds <= baseline.other_fds + FD_SLACK
        and end.count("client") == 0
        and end.count("replica") <= max(x.count("replica") for x in samples),
        "no_close_wait": end.sockets.get("CLOSE_WAIT", 0) == 0,
        "recovered": healthy and all(code == 200 for code in recovery),
        "sidecar_exit_clean": exit_code in (0, -signal.SIGTERM),
        "faults_injected": {f.kind for f in r.injector.faults} == {"sigstop", "sigkill"},
    }
    peak = max(samples, key=lambda s: s.rss_mib)
    return {
        "command": " ".join(sys.argv),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "minutes": r.args.minutes,
        "rate_per_s": r.args.rate,
        "seed": r.args.seed,
        "requests_sent": report.records,
        "events_for_them": report.events,
        "events_total": len(all_events),
        "other_events": report.other_events,
        "missing_events": list(report.missing_in_events),
        "events_without_request": list(report.missing_in_records),
        "duplicate_events": list(report.duplicate_events),
        "metrics_requests_total": metrics_requests,
        "spans_received": len(r.receiver.spans),
        "root_spans": roots,
        "client_outcomes": dict(client),
        "event_outcomes": dict(outcomes),
        "recovery_statuses": recovery,
        "replicas_healthy_after": healthy,
        "faults": [asdict(f) for f in r.injector.faults],
        "sidecar": {
            "rss_mib": {"start": baseline.rss_mib, "max": peak.rss_mib, "end": end.rss_mib},
            "fds": {
                "start": baseline.fds,
                "max": max(s.fds for s in samples),
                "end": end.fds,
                "other_start": baseline.other_fds,
                "other_end": end.other_fds,
                "upstream_max": max(s.count("replica") for s in samples),
                "upstream_end": end.count("replica"),
            },
            "sockets_end": end.sockets,
            "exit_code": exit_code,
        },
        "samples": [asdict(s) for s in samples],
        "checks": checks,
        "ok": all(checks.values()),
        "workdir": str(r.work),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=(
            "Soak the sidecar: mixed load (vllm-obs load) through it to two real vLLM "
            "replicas while they are frozen (SIGSTOP) and killed (SIGKILL + restart); "
            "report RSS, open fds, and events against requests."
        ),
    )
    p.add_argument("--minutes", type=float, default=10.0, help="load duration (default 10)")
    p.add_argument("--rate", type=float, default=2.0, help="arrivals per second (default 2)")
    p.add_argument("--seed", type=int, default=0, help="load plan seed (default 0)")
    p.add_argument(
        "--fault-every", type=float, default=60.0, metavar="S", help="seconds between faults"
    )
    p.add_argument("--stop-s", type=float, default=10.0, metavar="S", help="how long SIGSTOP lasts")
    p.add_argument("--sample-s", type=float, default=5.0, metavar="S", help="sampling interval")
    p.add_argument(
        "--settle-s",
        type=float,
        default=8.0,
        metavar="S",
        help="idle time after the load before the final sample (default 8)",
    )
    p.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"result JSON (default {DEFAULT_OUT})"
    )
    p.add_argument("--workdir", help="keep logs, events and records here (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the temp workdir")
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.rate <= 0 or args.fault_every <= args.stop_s:
        p.error("--minutes and --rate must be positive, --fault-every longer than --stop-s")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    sc = result["sidecar"]
    print(
        f"requests {result['requests_sent']}, events {result['events_for_them']} "
        f"(missing {len(result['missing_events'])}, duplicated "
        f"{len(result['duplicate_events'])}); metrics {result['metrics_requests_total']:g}\n"
        f"sidecar rss MiB start {sc['rss_mib']['start']} max {sc['rss_mib']['max']} "
        f"end {sc['rss_mib']['end']}; fds start {sc['fds']['start']} max {sc['fds']['max']} "
        f"end {sc['fds']['end']}\n"
        f"faults {[(f['kind'], f['at_s']) for f in result['faults']]}\n"
        f"outcomes {result['event_outcomes']}\n"
        f"checks {result['checks']} -> {'OK' if result['ok'] else 'FAILED'}; {args.out}"
    )
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
