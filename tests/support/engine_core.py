"""Freeze a real vLLM's engine core while its API server keeps serving.

``VllmServer.pause`` stops the whole process group: nothing answers. Stopping only the
``VLLM::EngineCore`` process stops generation at a step boundary while the API server
still relays every token made before, and still sees a client leave and aborts the
request: a cancel with no token made after the client's last read, which no timing
can give on a loaded machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from obs.engine import VllmServer

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
def engine_core_frozen(server: VllmServer) -> Iterator[None]:
    """SIGSTOP the engine core for the block; SIGCONT it after, whatever happened."""
    pid = engine_core_pid(server)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
