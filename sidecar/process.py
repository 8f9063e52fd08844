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

PORT_TRIES = 3  # starts on a free port taken meanwhile by another process


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
        self._port_given = port is not None
        self.events_path = events
        self._rest = ["--upstream", upstream] if upstream else ["--config", str(config)]
        self._rest += ["--events", str(events) if events else "none", *args]
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path
        self._on_port(port or free_port())

    def _on_port(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.cmd = [sys.executable, "-m", "obs.cli", "sidecar", "--port", str(port), *self._rest]
        self._process = ManagedProcess(
            "sidecar", self.cmd, log_path=self.log_path, env=self.env, append_log=True
        )

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        """The sidecar's process once started (None before)."""
        return self._process.popen

    @property
    def pid(self) -> int:
        return self._process.pid

    def start(self, timeout_s: float = 30.0) -> SidecarProcess:
        """Launch and wait for ``/health``; RuntimeError with the log tail if it never answers.

        A free port chosen here can be taken before the sidecar binds it (any process's
        outgoing connection may get it as its local port): then it starts again on another,
        up to ``PORT_TRIES`` times. A port the caller gave is never changed."""
        for attempt in range(PORT_TRIES):
            before = self.log_path.stat().st_size if self.log_path and self.log_path.exists() else 0
            self._process.start()
            try:
                # Up in ~0.4 s: looked for every 20 ms, not the 0.1 s of slower servers' waits.
                wait_http(self.url + "/health", timeout_s, self.proc, interval_s=0.02)
                return self
            except Exception:
                self.stop()
                if self._port_given or attempt + 1 == PORT_TRIES or not self._port_taken(before):
                    raise RuntimeError(f"sidecar did not start; log: {self.log_tail()}") from None
            self._on_port(free_port())
        raise AssertionError("unreachable")

    def _port_taken(self, since: int) -> bool:
        """The sidecar's log says, after byte ``since``, that its port was in use."""
        if self.log_path is None or not self.log_path.exists():
            return False
        with self.log_path.open("rb") as f:
            f.seek(since)
            return b"address already in use" in f.read()

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
