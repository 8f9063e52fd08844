"""Freeze a real vLLM's engine core while its API server keeps serving.

``VllmServer.pause`` stops the whole process group: nothing answers. Stopping only the
``VLLM::EngineCore`` process stops generation at a step boundary while the API server
still relays every token made before, and still sees a client leave and aborts the
request: a cancel with no token made after the client's last read, which no timing
can give on a loaded machine. ``engine_core_throttled`` runs the engine in short slices
first, in step with its reader, so the reader stays ahead of it until the test freezes it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from obs.engines.server import VllmServer

ENGINE_CORE = "VLLM::EngineCor"  # the process title, as /proc's 15-character comm shows it

# The slicer, a process of its own: a thread of the test process waits for the GIL, which
# C code in the test's client (the openai SDK building its models on a first call) held for
# 2.5 s on a loaded machine while the engine ran free (stop 38's CI: 2,000 tokens made
# before the client had read 10). Each byte on its stdin is a read by the reader; "f" ends it.
SLICER = """
import os, select, signal, sys, time
pid, run_s, quiet_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
fd = sys.stdin.fileno()
try:  # as root (CI): wake on time however busy the machine, or a slice runs on for 100s of ms
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
except OSError:
    pass
while True:
    os.kill(pid, signal.SIGCONT)
    time.sleep(run_s)
    os.kill(pid, signal.SIGSTOP)
    # The next slice once the reader has read since this one began, or quiet_s with no read
    # (the slice made nothing to read yet).
    if select.select([fd], [], [], quiet_s)[0]:
        got = os.read(fd, 4096)
        if not got or b"f" in got:
            break
"""


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


class Throttle:
    """The engine core runs ``run_s`` at a time; the next slice only once the reader has read
    something since the last one began (``read``), or ``quiet_s`` went by with no read. A slow
    reader holds the engine back with it."""

    def __init__(self, pid: int, run_s: float, quiet_s: float) -> None:
        self.pid = pid
        os.kill(pid, signal.SIGSTOP)
        args = [str(pid), str(run_s), str(quiet_s)]
        self._slicer = subprocess.Popen(
            [sys.executable, "-c", SLICER, *args], stdin=subprocess.PIPE
        )

    def read(self) -> None:
        """The reader read a piece of the answer: the engine may run one more slice."""
        self._tell(b"r")

    def freeze(self) -> None:
        """Stop the engine core for the rest of the block (no slice after this returns)."""
        self._tell(b"f")
        self._slicer.wait(10)
        with contextlib.suppress(ProcessLookupError):  # the test killed the engine
            os.kill(self.pid, signal.SIGSTOP)

    def _tell(self, what: bytes) -> None:
        stdin = self._slicer.stdin
        if stdin is not None and self._slicer.poll() is None:
            with contextlib.suppress(BrokenPipeError):
                stdin.write(what)
                stdin.flush()

    def close(self) -> None:
        self.freeze()
        if self._slicer.stdin is not None:
            # A read told after the slicer ended (a reader on its own thread) left bytes
            # that the close flushes into the closed pipe: nobody needs them.
            with contextlib.suppress(BrokenPipeError):
                self._slicer.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)


@contextlib.contextmanager
def engine_core_throttled(
    server: VllmServer, run_s: float = 0.004, quiet_s: float = 0.1
) -> Iterator[Throttle]:
    """Run ``server``'s engine core in slices in step with a reader (see ``Throttle``) until
    the block calls ``freeze``, which stops it for the rest of the block; SIGCONT after.

    A tiny model on a fast machine makes thousands of tokens a second: without the slices,
    the engine can finish a long answer before the test process runs again to freeze it."""
    throttle = Throttle(engine_core_pid(server), run_s, quiet_s)
    try:
        yield throttle
    finally:
        throttle.close()
