"""Freeze a real vLLM's engine core while its API server keeps serving.

``VllmServer.pause`` stops the whole process group: nothing answers. Stopping only the
``VLLM::EngineCore`` process stops generation at a step boundary while the API server
still relays every token made before, and still sees a client leave and aborts the
request: a cancel with no token made after the client's last read, which no timing
can give on a loaded machine. ``engine_core_throttled`` runs the engine in short slices
first, so a client reading a long answer stays ahead of it until the test freezes it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from obs.engines.server import VllmServer

ENGINE_CORE = "VLLM::EngineCor"  # the process title, as /proc's 15-character comm shows it


def engine_core_pid(server: VllmServer) -> int:
    """The PID of ``server``'s engine-core process (in its process group)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        pgid = int(stat[stat.rindex(")") + 2 :].split()[2])
        if pgid == server.pid and comm == ENGINE_CORE:
            return int(entry.name)
    raise LookupError(f"no {ENGINE_CORE} process in vllm serve's group {server.pid}")


@contextlib.contextmanager
def engine_core_throttled(
    server: VllmServer, run_s: float = 0.004, stop_s: float = 0.04
) -> Iterator[Callable[[], None]]:
    """Run the engine core ``run_s`` in every ``run_s + stop_s`` until the block calls the
    function it is given, which freezes the core for the rest of the block; SIGCONT after.

    A tiny model on a fast machine makes thousands of tokens a second: without the slices,
    the engine can finish a long answer before the test process runs again to freeze it."""
    pid = engine_core_pid(server)
    frozen = threading.Event()

    def slices() -> None:
        while not frozen.is_set():
            os.kill(pid, signal.SIGCONT)
            frozen.wait(run_s)
            os.kill(pid, signal.SIGSTOP)
            frozen.wait(stop_s)

    def freeze() -> None:
        frozen.set()
        thread.join()
        os.kill(pid, signal.SIGSTOP)

    os.kill(pid, signal.SIGSTOP)
    thread = threading.Thread(target=slices, name="engine-core-slices", daemon=True)
    thread.start()
    try:
        yield freeze
    finally:
        frozen.set()
        thread.join()
        os.kill(pid, signal.SIGCONT)
