"""``vllm-obs engine sim`` in a subprocess on 127.0.0.1 (the sweep's and the tests' pools)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from obs.procs import ManagedProcess, free_port, wait_http


class SimServer:
    """One simulated replica, started with ``start()`` and stopped by PID with ``stop()``."""

    def __init__(
        self,
        args: Sequence[str] = (),
        *,
        port: int | None = None,
        log_path: Path | None = None,
        startup_timeout_s: float = 30.0,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "obs.cli", "engine", "sim", "--port", str(self.port)]
        self.startup_timeout_s = startup_timeout_s
        self.process = ManagedProcess("engine-sim", [*cmd, *args], log_path=log_path)

    @property
    def pid(self) -> int:
        return self.process.pid

    def start(self) -> SimServer:
        """Launch and wait for ``/health``; raises with the log tail if it never answers."""
        self.process.start()
        try:
            wait_http(self.url + "/health", self.startup_timeout_s, self.process.popen)
        except Exception as e:
            self.stop()
            raise RuntimeError(f"engine sim did not start: {e}; {self.process.log_tail()}") from e
        return self

    def stop(self, timeout_s: float = 15.0) -> int | None:
        return self.process.stop(timeout_s)

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
