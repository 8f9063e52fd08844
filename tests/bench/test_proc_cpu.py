"""The benchmarks' CPU reading of another process: nanoseconds, not clock ticks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.procs import ProcStat, process_cpu_s, stat_cpu_s

pytestmark = pytest.mark.process


def test_process_cpu_reads_a_child_finer_than_ticks_and_agrees_with_proc() -> None:
    """A child's CPU read by its CPU-time clock is within two ticks of /proc's utime+stime,
    and not a whole number of 10 ms ticks (the clock counts nanoseconds)."""
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.15: pass\n"
    child = subprocess.Popen(
        [sys.executable, "-c", busy + "import sys\nsys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        stat = ProcStat(child.pid)
        cpu = 0.0
        while cpu < 0.15:  # until the busy loop is done (it then waits on stdin)
            cpu = stat.cpu_s()
        ticks = stat_cpu_s(Path(f"/proc/{child.pid}/stat"))
        fine = process_cpu_s(child.pid)
        assert abs(fine - ticks) <= 0.02 + 1e-9
        assert round(fine * 1e9) % 10_000_000 != 0
    finally:
        child.communicate(b"")
