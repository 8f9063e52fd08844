"""A monitoring server (Prometheus, Alertmanager) run as a child process on loopback.

Stdlib only. The process runs in its own session, so a Ctrl-C in the terminal
reaches the caller and not the server directly; it is stopped by its PID, then
its process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Self

from obs.engine.server import group_alive
from obs.promapi import PrometheusError

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
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> Self:
        """Launch and wait for ``/-/ready``; raises :class:`PrometheusError` with the log tail."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        try:
            self._proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            raise PrometheusError(f"cannot run {self.binary}: {e}") from e
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if self._proc.poll() is not None:
                raise PrometheusError(
                    f"{self.name} exited with status {self._proc.returncode} at start; "
                    f"log ({self.log_path}):\n{self.log_tail()}"
                )
            if http_status(f"{self.url}/-/ready") == 200:
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise PrometheusError(
                    f"{self.name} was not ready within {STARTUP_TIMEOUT_S:.0f} s; "
                    f"log ({self.log_path}):\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def stop(self) -> int | None:
        """SIGTERM, wait, then SIGKILL its session; returns the exit status. Safe twice."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _killpg(proc.pid)
                proc.wait()
        if group_alive(proc.pid):  # anything it left in its session
            _killpg(proc.pid)
        if self._log is not None:
            self._log.close()
            self._log = None
        return proc.returncode

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"


def http_status(url: str) -> int | None:
    """Status of ``GET url`` (never through a proxy); None when nothing answers."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=2) as r:
            status: int = r.status
            return status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
