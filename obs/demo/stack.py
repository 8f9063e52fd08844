"""The processes the demo and the sweep start, stopped in reverse order, and proof that
none survive.

Stdlib plus the project's own engine and sidecar process helpers. Each process is
registered as soon as it exists, so an interrupt at any point stops exactly what was
started. ``start_servers`` starts the vLLM pools at once, ``start_sidecar`` the sidecar
in front of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from obs.demo.options import LOCAL_MAX_MODEL_LEN, LOCAL_POOLS, SIM_POOLS
from obs.engines.server import ServerError, VllmServer
from obs.engines.setup import EnginePaths
from obs.procs import group_alive

if TYPE_CHECKING:
    from obs.engines.sim.process import SimServer
    from obs.sidecar.process import SidecarProcess

WAIT_POLL_S = 0.2
ABORT_WAIT_S = 30.0
SIDECAR_START_TIMEOUT_S = 60.0
SIDECAR = "sidecar"


@dataclass(frozen=True, slots=True)
class Tracked:
    """One process the demo started; ``pgid`` when it leads its own process group."""

    name: str
    pid: int
    pgid: int | None


class Stack:
    """Stop callbacks (last started, first stopped) and the PIDs behind them."""

    def __init__(self, notice: Callable[[str], None]) -> None:
        self._notice = notice
        self._stops: list[tuple[str, Callable[[], object]]] = []
        self.tracked: list[Tracked] = []
        self.stopped: list[str] = []

    def push(self, name: str, stop: Callable[[], object]) -> None:
        self._stops.append((name, stop))

    def track(self, name: str, pid: int, *, group: bool) -> None:
        self.tracked.append(Tracked(name, pid, pid if group else None))

    def stop_all(self) -> list[str]:
        """Stop everything still registered; returns one message per stop that failed."""
        failures = []
        while self._stops:
            name, stop = self._stops.pop()
            try:
                stop()
            except Exception as e:  # keep stopping the rest
                failures.append(f"stopping {name}: {type(e).__name__}: {e}")
            else:
                self.stopped.append(name)
        return failures

    def survivors(self) -> list[str]:
        """Tracked processes, their process groups and this process's descendants still alive."""
        alive = []
        for t in self.tracked:
            if pid_alive(t.pid):
                alive.append(f"{t.name} (pid {t.pid})")
            elif t.pgid is not None and group_alive(t.pgid):
                alive.append(f"{t.name}'s process group {t.pgid}")
        alive += [f"child process {pid}" for pid in descendants(os.getpid())]
        return alive

    def write_pids(self, path: Path) -> None:
        """The tracked PIDs as JSON, so a test (or you) can check that none survive."""
        path.write_text(json.dumps([asdict(t) for t in self.tracked], indent=2) + "\n")


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def descendants(root: int) -> list[int]:
    """Live (non-zombie) descendants of ``root``, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] in ("Z", "X"):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return sorted(out)


def start_servers(
    servers: Sequence[VllmServer], stack: Stack, names: Sequence[str]
) -> list[ServerError]:
    """Start ``servers`` at once (each waits for /health in its own thread).

    Every server is on the stack before it starts. If this thread is interrupted
    (Ctrl-C, SIGTERM), servers still starting are sent SIGTERM, which makes their
    start fail and clean up, and this waits for that before the interrupt goes on.
    Returns the start errors (empty when all are healthy).

    Completion is signalled with events, not ``Thread.is_alive``: a ``join`` cut
    short by an exception from a signal handler can leave ``is_alive`` False for a
    thread that still runs.
    """
    errors: list[ServerError] = []
    lock = threading.Lock()
    done = [threading.Event() for _ in servers]

    def start(server: VllmServer, name: str, finished: threading.Event) -> None:
        try:
            server.start()
        except ServerError as e:
            with lock:
                errors.append(e)
        finally:
            with contextlib.suppress(ServerError):  # never launched: nothing to track
                stack.track(f"vLLM pool {name}", server.pid, group=True)
            finished.set()

    for server, name, finished in zip(servers, names, done, strict=True):
        stack.push(f"vLLM pool {name}", server.stop)
        threading.Thread(target=start, args=(server, name, finished), name=f"start-{name}").start()
    try:
        for finished in done:
            while not finished.wait(WAIT_POLL_S):
                pass
    except BaseException:
        for server, finished in zip(servers, done, strict=True):
            _abort_start(server, finished)
        raise
    return errors


def _abort_start(server: VllmServer, finished: threading.Event) -> None:
    """SIGTERM a server whose start() is still waiting, then wait for start() to give up."""
    deadline = time.monotonic() + ABORT_WAIT_S
    while not finished.is_set() and time.monotonic() < deadline:
        try:
            pid = server.pid
        except ServerError:  # not launched yet
            finished.wait(0.05)
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        finished.wait(max(0.0, deadline - time.monotonic()))


def start_sidecar(
    stack: Stack,
    config: Path,
    events: Path,
    log_path: Path,
    env: dict[str, str] | None = None,
    port: int | None = None,
) -> SidecarProcess:
    """The sidecar on the lanes file ``config``, polling its pools every second: on the
    stack before it starts, tracked once it runs. Raises ``RuntimeError`` or
    ``TimeoutError`` when it does not start."""
    from obs.sidecar.process import SidecarProcess

    sidecar = SidecarProcess(
        config=config,
        events=events,
        args=["--pool-poll-interval", "1"],
        env=env,
        log_path=log_path,
        port=port,
    )
    stack.push(SIDECAR, sidecar.stop)
    try:
        sidecar.start(timeout_s=SIDECAR_START_TIMEOUT_S)
    finally:
        if sidecar.proc is not None:
            stack.track(SIDECAR, sidecar.pid, group=False)
    return sidecar


def local_pools(
    paths: EnginePaths, log_dir: Path, traces_to: str | None = None
) -> list[VllmServer]:
    """The demo's local vLLM pools (``LOCAL_POOLS``, in order), not started yet; sending
    their request spans to ``traces_to`` (the sidecar's ``/v1/traces``) when given."""
    return [
        VllmServer(
            paths.model_dir,
            max_model_len=LOCAL_MAX_MODEL_LEN,
            kv_cache_bytes=spec.kv_cache_bytes,
            otlp_traces_endpoint=traces_to,
            extra_args=spec.vllm_args,
            log_path=log_dir / f"vllm-{spec.name}.log",
            python=paths.python,
            launcher=paths.launcher,
        )
        for spec in LOCAL_POOLS
    ]


def sim_pools(log_dir: Path, traces_to: str | None = None) -> list[SimServer]:
    """The same pools simulated (``SIM_POOLS``, in ``LOCAL_POOLS`` order), not started yet."""
    from obs.engines.sim.process import SimServer

    traced = ("--otlp-traces-endpoint", traces_to) if traces_to else ()
    return [
        SimServer((*SIM_POOLS[spec.name], *traced), log_path=log_dir / f"sim-{spec.name}.log")
        for spec in LOCAL_POOLS
    ]


def start_sims(
    servers: Sequence[SimServer], stack: Stack, names: Sequence[str], say: Callable[[str], None]
) -> list[str]:
    """Start the simulated pools one by one (each is ready in about a second), saying each;
    the start errors (empty when all answer /health)."""
    errors = []
    for server, name in zip(servers, names, strict=True):
        stack.push(f"sim pool {name}", server.stop)
        try:
            server.start()
            args = " ".join(SIM_POOLS[name])
            say(f"[pools] {name:<11} {server.url}  engine sim {args}")
        except RuntimeError as e:
            errors.append(f"{name}: {e}")
        finally:
            with contextlib.suppress(RuntimeError):  # never launched: nothing to track
                stack.track(f"sim pool {name}", server.pid, group=True)
    return errors
