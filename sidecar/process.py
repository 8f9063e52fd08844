"""``vllm-obs sidecar`` as a process of yours: the demo, the sweep, the benchmarks and the
tests run it this way.

``SidecarProcess`` runs the sidecar as a real subprocess on a free loopback port (an
``obs.procs.ManagedProcess``), waits for its ``/health``, reads its JSONL events, and stops
it by PID, reaping its process group (the workers of ``--workers``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from obs.procs import ManagedProcess, free_port, read_tail, wait_http


class SidecarProcess:
    """``vllm-obs sidecar`` in a subprocess on 127.0.0.1; ``stop()`` by PID."""

    def __init__(
        self,
        *,
        upstream: str | None = None,
        config: Path | None = None,
        events: Path | None = None,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.events_path = events
        cmd = [sys.executable, "-m", "obs.cli", "sidecar", "--port", str(self.port)]
        cmd += ["--upstream", upstream] if upstream else ["--config", str(config)]
        cmd += ["--events", str(events) if events else "none", *args]
        self.cmd = cmd
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path
        self._process = ManagedProcess(
            "sidecar", cmd, log_path=log_path, env=self.env, append_log=True
        )

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        """The sidecar's process once started (None before)."""
        return self._process.popen

    @property
    def pid(self) -> int:
        return self._process.pid

    def start(self, timeout_s: float = 30.0) -> SidecarProcess:
        """Launch and wait for ``/health``; RuntimeError with the log tail if it never answers."""
        self._process.start()
        try:
            # Up in ~0.4 s: looked for every 20 ms, not the 0.1 s of slower servers' waits.
            wait_http(self.url + "/health", timeout_s, self.proc, interval_s=0.02)
        except Exception:
            self.stop()
            raise RuntimeError(f"sidecar did not start; log: {self.log_tail()}") from None
        return self

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait, then SIGKILL; reaps its process group; returns the exit code."""
        return self._process.stop(timeout_s)

    def kill(self) -> None:
        """SIGKILL its process group and reap it."""
        self._process.kill()

    def events(self) -> list[dict[str, Any]]:
        """Every whole event line written so far."""
        if self.events_path is None or not self.events_path.exists():
            return []
        data = self.events_path.read_bytes()
        whole = data[: data.rfind(b"\n") + 1]  # a line still being written is left for later
        return [orjson.loads(line) for line in whole.splitlines() if line.strip()]

    def wait_events(self, n: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """Wait until at least ``n`` events are on disk (the writer flushes within ~0.2 s)."""
        deadline = time.monotonic() + timeout_s
        while True:
            evs = self.events()
            if len(evs) >= n or time.monotonic() > deadline:
                return evs
            time.sleep(0.05)

    def events_of(self, request_id: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """The events of ``request_id`` once one is on disk; empty after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = [e for e in self.events() if e.get("request_id") == request_id]
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def log_tail(self, n: int = 4000) -> str:
        """The last ``n`` characters of the sidecar's log."""
        return read_tail(self.log_path, n) or "(no log)"

    def __enter__(self) -> SidecarProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
