"""bench.thread_cpu: per-thread CPU of real sidecars under short requests, and its bad input."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.thread_cpu import thread_cpu_s

ROOT = Path(__file__).resolve().parents[2]


def test_a_process_threads_are_read_with_the_main_thread_as_loop() -> None:
    """This process's own threads: the main one is ``loop``, and CPU seconds never go back."""
    first = thread_cpu_s(os.getpid())
    sum(i * i for i in range(200_000))  # some CPU on the main thread
    again = thread_cpu_s(os.getpid())
    assert "loop" in first and again["loop"] >= first["loop"]


@pytest.mark.process
def test_a_run_prints_each_round_with_the_span_thread_and_its_posts() -> None:
    """A real fake pool, OTLP receiver and sidecar with spans on: a line a round with the loop's
    CPU and the span POSTs, full ones (300 requests and the 64 that open the streams: 4 of 85)."""
    cmd = [sys.executable, "-m", "bench.thread_cpu", "on=.:spans"]
    cmd += ["--rounds", "2", "--requests", "300", "--settle-s", "0.2"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rounds = [ln for ln in proc.stdout.splitlines() if ln.startswith("round ")]
    assert len(rounds) == 2, proc.stdout
    for ln in rounds:
        assert "(loop " in ln, ln  # /proc's 10 ms ticks may leave a thread's share at 0
        found = re.search(r"; (\d+) span POSTs, (\d+) requests each", ln)
        assert found is not None and int(found.group(1)) >= 3, ln
    assert "on: median" in proc.stdout


@pytest.mark.process
def test_a_path_without_obs_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    """NAME=PATH naming a folder with no ``obs`` package: usage error, no traceback."""
    cmd = [sys.executable, "-m", "bench.thread_cpu", f"x={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "holds no importable obs package" in proc.stderr and "Traceback" not in proc.stderr
