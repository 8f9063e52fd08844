"""A monitoring server (Prometheus, Alertmanager) run as a child process on loopback.

Through ``obs.procs.ManagedProcess``: the process runs in its own
session, so a Ctrl-C in the terminal reaches the caller and not the server
directly; it is stopped by its PID, then its process group is reaped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

from obs.procs import ManagedProcess, NotReady, http_status
from obs.prom.api import PrometheusError

STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


class ServiceProcess:
    """A server binary on 127.0.0.1:``port`` that reports ready on ``/-/ready``.

    Subclasses give :attr:`name` and :meth:`command`.
    """

    name = "service"

    def __init__(self, binary: str, config: Path, data_dir: Path, log_path: Path, port: int):
        self.binary = binary
        self.config = config
        self.data_dir = data_dir
        self.log_path = log_path
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._proc: ManagedProcess | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> Self:
        """Launch and wait for ``/-/ready``; raises :class:`PrometheusError` with the log tail."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._proc = ManagedProcess(self.name, self.command(), log_path=self.log_path)
        try:
            self._proc.start()
        except OSError as e:
            raise PrometheusError(f"cannot run {self.binary}: {e}") from e
        ready = f"{self.url}/-/ready"
        try:
            self._proc.wait_ready(lambda: http_status(ready) == 200, STARTUP_TIMEOUT_S, "ready")
        except NotReady as e:
            self.stop()
            raise PrometheusError(str(e)) from None
        return self

    def stop(self) -> int | None:
        """SIGTERM, wait, then SIGKILL its session; reaps the group; the exit status. Safe twice."""
        return None if self._proc is None else self._proc.stop(STOP_TIMEOUT_S)

    def log_tail(self, n: int = 3000) -> str:
        """The last ``n`` characters of the server's log."""
        return (self._proc.log_text(n) if self._proc else "") or "(no log)"
