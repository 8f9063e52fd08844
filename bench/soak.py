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

    .venv/bin/python bench/soak.py --minutes 10
    .venv/bin/python bench/soak.py --minutes 0.75 --fault-every 12 --stop-s 6   # short
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
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from obs.config import default_config_path
from obs.demo.workload import write_mix
from obs.engine import ServerError, VllmServer, ensure_engine
from obs.loadgen.check import check_files
from obs.loadgen.records import read_jsonl
from obs.sidecar.testing import OtlpReceiver, SidecarProcess

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results" / "soak.json"
_TCP_STATES = {"01": "ESTABLISHED", "06": "TIME_WAIT", "08": "CLOSE_WAIT", "0A": "LISTEN"}
FD_SLACK = 4  # descriptors the run may leave open beyond the idle baseline
TIMEOUTS = {"connect_s": 5, "first_token_s": 15, "idle_s": 5}
# A restart competes with the load for the CPU: on 2 cores it has taken over 3 minutes.
STARTUP_TIMEOUT_S = 600.0


def log(t0: float, msg: str) -> None:
    print(f"[soak {time.monotonic() - t0:6.1f} s] {msg}", file=sys.stderr, flush=True)


# ---- what /proc and /metrics say about the sidecar ---------------------------------------


@dataclass
class Sample:
    t_s: float
    rss_mib: float
    fds: int
    sockets: dict[str, int]
    sent: int
    events: int

    def count(self, peer: str) -> int:
        """Sockets to (or from) ``peer``: ``replica`` (any), ``client``, ``otlp``."""
        return sum(n for k, n in self.sockets.items() if k.startswith(peer) and " " in k)

    @property
    def other_fds(self) -> int:
        """Descriptors besides upstream and client connections: files, pipes, listeners."""
        return self.fds - self.count("replica") - self.count("client")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def socket_states(pid: int, names: dict[int, str] | None = None) -> dict[str, int]:
    """TCP sockets the process holds, by state, and by peer where ``names`` names a port.

    ``names`` maps a port to a name: a socket whose remote (or, for accepted
    connections, local) port is named counts under ``NAME STATE`` too.
    """
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    states: Counter[str] = Counter()
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if path.exists():
            for line in path.read_text().splitlines()[1:]:
                cols = line.split()
                if cols[9] not in inodes:
                    continue
                state = _TCP_STATES.get(cols[3], cols[3])
                states[state] += 1
                local, remote = (int(cols[i].rsplit(":", 1)[1], 16) for i in (1, 2))
                name = (names or {}).get(remote) or (names or {}).get(local)
                if name and state != "LISTEN":
                    states[f"{name} {state}"] += 1
    return dict(states)


def count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    with path.open("rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def sample(
    pid: int, t0: float, records: Path, events: Path, names: dict[int, str] | None = None
) -> Sample:
    return Sample(
        t_s=round(time.monotonic() - t0, 1),
        rss_mib=round(rss_mib(pid), 1),
        fds=len(list(Path(f"/proc/{pid}/fd").iterdir())),
        sockets=socket_states(pid, names),
        sent=count_lines(records),
        events=count_lines(events),
    )


def metric_sum(base_url: str, name: str) -> float:
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def post_chat(base_url: str) -> int:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    req = urllib.request.Request(
        base_url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


# ---- faults ------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str  # sigstop | sigkill
    replica: str
    at_s: float
    duration_s: float = 0.0  # frozen for (sigstop) or down until healthy again (sigkill)
    error: str | None = None


# Fault n: its kind, on replica n % 2. Both kinds come early, on different replicas.
KINDS = ("sigstop", "sigkill", "sigkill", "sigstop")


@dataclass
class Injector:
    """Alternates SIGSTOP/SIGCONT and SIGKILL/restart over the replicas, on a timer.

    One replica at a time: a fault waits while another replica is down (a restart that
    failed), so the pool always has a replica to fail over to. Times are seconds since
    ``start`` (the load's start); ``t0`` is the log's clock.
    """

    replicas: list[VllmServer]
    every_s: float
    stop_s: float
    until_s: float
    t0: float
    start: float = 0.0
    faults: list[Fault] = field(default_factory=list)
    stopped: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        n = 0
        next_at = self.every_s / 2
        while not self.stopped.is_set():
            now = time.monotonic() - self.start
            if next_at > self.until_s:
                return
            server = self.replicas[n % len(self.replicas)]
            others_up = all(_running(r) for r in self.replicas if r is not server)
            if now < next_at or not others_up:  # never take the whole pool down
                self.stopped.wait(0.2)
                continue
            kind = KINDS[n % len(KINDS)]
            fault = Fault(kind, server.url, round(now, 1))
            self.faults.append(fault)
            if kind == "sigstop":
                log(self.t0, f"fault: SIGSTOP {server.url} for {self.stop_s:g} s")
                server.pause()
                self.stopped.wait(self.stop_s)
                server.resume()
                log(self.t0, f"fault: SIGCONT {server.url}")
            else:
                log(self.t0, f"fault: SIGKILL {server.url}, restarting it")
                server.kill()
                fault.error = restart(server)
                state = f"failed: {fault.error[:200]}" if fault.error else "back"
                log(self.t0, f"fault: {server.url} restart {state}")
            done = time.monotonic() - self.start
            fault.duration_s = round(done - now, 1)
            n += 1
            # A late schedule (a slow restart) never fires faults back to back.
            next_at = max(next_at + self.every_s, done + self.every_s / 2)


def _running(server: VllmServer) -> bool:
    try:
        return server.poll() is None
    except ServerError:
        return False


def restart(server: VllmServer) -> str | None:
    """Start ``server`` again; the error, if it does not come up."""
    try:
        server.start()
    except ServerError as e:
        return str(e)
    return None


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


def start_replicas(n: int, work: Path, t0: float) -> list[VllmServer]:
    paths = ensure_engine(progress=lambda m: log(t0, f"[engine] {m}"))
    servers = [
        VllmServer(
            paths.model_dir,
            log_path=work / f"vllm-{i}.log",
            python=paths.python,
            launcher=paths.launcher,
            startup_timeout_s=STARTUP_TIMEOUT_S,
        )
        for i in range(n)
    ]
    errors: list[BaseException] = []

    def start(s: VllmServer) -> None:
        try:
            s.start()
        except BaseException as e:  # reported below, on the main thread
            errors.append(e)

    threads = [threading.Thread(target=start, args=(s,)) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for s in servers:
            s.stop()
        raise errors[0]
    return servers


def run(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.monotonic()
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="vllm-obs-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    duration_s = args.minutes * 60
    records, events = work / "records.jsonl", work / "events.jsonl"
    log(t0, f"workdir {work}; starting 2 vLLM replicas")
    replicas = start_replicas(2, work, t0)
    receiver = OtlpReceiver().start()
    sidecar = SidecarProcess(
        config=lanes_config(work / "lanes.yaml", [r.url for r in replicas]),
        events=events,
        args=("--pool-poll-interval", "1", "--shutdown-grace", "30"),
        env={
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url,
            "OTEL_BSP_SCHEDULE_DELAY": "500",
        },
        log_path=work / "sidecar.log",
    )
    samples: list[Sample] = []
    injector = Injector(replicas, args.fault_every, args.stop_s, duration_s - args.stop_s, t0)
    load: subprocess.Popen[bytes] | None = None
    try:
        sidecar.start()
        names = {r.port: f"replica-{i}" for i, r in enumerate(replicas)}
        names |= {receiver.port: "otlp", sidecar.port: "client"}
        time.sleep(2.5)  # a pool poll or two: the idle baseline
        baseline = sample(sidecar.pid, t0, records, events, names)
        samples.append(baseline)
        log(t0, f"sidecar up: rss {baseline.rss_mib} MiB, fds {baseline.fds}; load starts")
        mix = write_mix(work / "mix.yaml", full_mix=False)
        load_cmd = [
            sys.executable,
            "-m",
            "obs.cli",
            "load",
            "--url",
            sidecar.url,
            "--model",
            "tiny",
            "--rate",
            str(args.rate),
            "--duration",
            str(duration_s),
            "--seed",
            str(args.seed),
            "--run-id",
            f"soak-{args.seed}",
            "--out",
            str(records),
            "--timeout",
            "120",
            "--no-progress",
            *(["--mix", str(mix)] if mix else []),
        ]
        with open(work / "load.out", "wb") as out:
            load = subprocess.Popen(load_cmd, stdout=out, stderr=subprocess.STDOUT)
        injector.start = time.monotonic()
        thread = threading.Thread(target=injector.run, daemon=True)
        thread.start()
        while load.poll() is None:
            time.sleep(args.sample_s)
            s = sample(sidecar.pid, t0, records, events, names)
            samples.append(s)
            socks = ", ".join(f"{k} {v}" for k, v in sorted(s.sockets.items()) if " " in k)
            log(
                t0,
                f"sent {s.sent} events {s.events} rss {s.rss_mib} MiB fds {s.fds} ({socks})",
            )
        injector.stopped.set()
        thread.join(timeout=STARTUP_TIMEOUT_S)  # a restart in progress finishes
        log(t0, f"load done (exit {load.returncode}); waiting for every replica to be healthy")
        for r in replicas:
            if not _running(r):  # a restart that failed under load: once more, idle
                log(t0, f"restarting {r.url} again: {restart(r) or 'up'}")
        healthy = False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not healthy:
            pools = get_json(sidecar.url + "/health")["pools"]
            healthy = all(all(reps.values()) for reps in pools.values())
            time.sleep(0.5)
        recovery = [post_chat(sidecar.url) for _ in range(4)]
        log(t0, f"after the faults: replicas healthy {healthy}, requests {recovery}")
        time.sleep(args.settle_s)  # idle keep-alive connections close (vLLM: 5 s)
        end = sample(sidecar.pid, t0, records, events, names)
        samples.append(end)
        metrics_requests = metric_sum(sidecar.url, "vllm_obs_requests_total")
        exit_code = sidecar.stop()
        log(t0, f"sidecar stopped (exit {exit_code}); checking")
        report = check_files(records, events, wait_s=2)
        all_events = list(read_jsonl(events))
        outcomes = Counter(
            f"{e['status']}/{e['error_class']}" if e["error_class"] else e["status"]
            for e in all_events
        )
        client = Counter(r["status"] for r in read_jsonl(records))
        roots = sum(1 for s in receiver.spans if s.kind == 2)  # SERVER: one per request
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
            "faults_injected": {f.kind for f in injector.faults} == {"sigstop", "sigkill"},
        }
        peak = max(samples, key=lambda s: s.rss_mib)
        return {
            "command": " ".join(sys.argv),
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "minutes": args.minutes,
            "rate_per_s": args.rate,
            "seed": args.seed,
            "requests_sent": report.records,
            "events_for_them": report.events,
            "events_total": len(all_events),
            "other_events": report.other_events,
            "missing_events": list(report.missing_in_events),
            "events_without_request": list(report.missing_in_records),
            "duplicate_events": list(report.duplicate_events),
            "metrics_requests_total": metrics_requests,
            "spans_received": len(receiver.spans),
            "root_spans": roots,
            "client_outcomes": dict(client),
            "event_outcomes": dict(outcomes),
            "recovery_statuses": recovery,
            "replicas_healthy_after": healthy,
            "faults": [asdict(f) for f in injector.faults],
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
            "workdir": str(work),
        }
    finally:
        injector.stopped.set()
        if load is not None and load.poll() is None:
            load.send_signal(signal.SIGINT)
            try:
                load.wait(30)
            except subprocess.TimeoutExpired:
                load.kill()
        sidecar.stop()
        receiver.stop()
        for r in replicas:
            r.stop()
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/soak.py",
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
