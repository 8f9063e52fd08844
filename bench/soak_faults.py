"""The soak's faults: replicas frozen (SIGSTOP/SIGCONT) and killed (SIGKILL, restart)."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from obs.engines.server import ServerError, VllmServer
from obs.engines.setup import ensure_engine

# A restart competes with the load for the CPU: on 2 cores it has taken over 3 minutes.
STARTUP_TIMEOUT_S = 600.0


def log(t0: float, msg: str) -> None:
    print(f"[soak {time.monotonic() - t0:6.1f} s] {msg}", file=sys.stderr, flush=True)


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
            others_up = all(running(r) for r in self.replicas if r is not server)
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


def running(server: VllmServer) -> bool:
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


def start_replicas(n: int, work: Path, t0: float) -> list[VllmServer]:
    paths = ensure_engine(progress=lambda m: log(t0, f"[engine] {m}"))
    servers = [
        VllmServer(
            paths.model_dir,
            log_path=work / f"vllm-{i}.log",
            python=paths.python,
            launcher=paths.launcher,
            startup_timeout_s=STARTUP_TIMEOUT_S,
            in_process_model=True,  # its restart under load is ready sooner
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
