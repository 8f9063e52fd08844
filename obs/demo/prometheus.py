"""A real Prometheus for the demo: its config, the process on loopback, and its alerts.

Stdlib only. The process runs in its own session, so a Ctrl-C in the terminal
reaches the demo (which still reads the alerts) and not Prometheus directly.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import yaml

from obs.engine.server import group_alive
from obs.errors import ObsError

STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


class PrometheusError(ObsError):
    """Prometheus could not be started or queried."""


def find_prometheus() -> str | None:
    """Path of the ``prometheus`` binary, or None (``scripts/setup`` installs it)."""
    return shutil.which("prometheus")


def prometheus_version(binary: str) -> str:
    """``2.42.0`` or similar; '' if the binary does not say."""
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    words = (out.stdout or out.stderr).split()
    return words[2] if len(words) > 2 and words[1] == "version" else ""


def host_port(url: str) -> str:
    """``127.0.0.1:8001`` from ``http://127.0.0.1:8001``."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def write_config(
    path: Path,
    *,
    sidecar_url: str,
    pools: Mapping[str, Sequence[str]],
    rules_dir: Path,
    interval_s: int,
) -> Path:
    """A Prometheus config scraping the sidecar (job ``vllm-obs-sidecar``) and every pool
    replica (job ``vllm``, label ``pool``), as the compose stack does, and loading the
    generated rules."""
    config = {
        "global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"},
        "rule_files": [str(rules_dir.resolve() / "*.yml")],
        "scrape_configs": [
            {
                "job_name": "vllm-obs-sidecar",
                "static_configs": [{"targets": [host_port(sidecar_url)]}],
            },
            {
                "job_name": "vllm",
                "static_configs": [
                    {"targets": [host_port(u) for u in urls], "labels": {"pool": name}}
                    for name, urls in pools.items()
                ],
            },
        ],
    }
    header = "# Written by vllm-obs demo: scrapes the sidecar and the pools, loads rules/.\n"
    path.write_text(header + yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


@dataclass(frozen=True, slots=True)
class Alert:
    name: str
    state: str  # pending or firing
    labels: dict[str, str]
    active_at: str


class PrometheusProcess:
    """``prometheus`` on 127.0.0.1:``port`` with its data under ``data_dir``."""

    def __init__(
        self, binary: str, config: Path, data_dir: Path, log_path: Path, port: int
    ) -> None:
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
        return [
            self.binary,
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=7d",
        ]

    def start(self) -> PrometheusProcess:
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
                    f"prometheus exited with status {self._proc.returncode} at start; "
                    f"log ({self.log_path}):\n{self.log_tail()}"
                )
            if _status(f"{self.url}/-/ready") == 200:
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise PrometheusError(
                    f"prometheus was not ready within {STARTUP_TIMEOUT_S:.0f} s; "
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

    # --- the HTTP API ------------------------------------------------------------

    def api(self, path: str) -> Any:
        """``data`` of a ``GET /api/v1/...`` answer; raises :class:`PrometheusError`."""
        url = f"{self.url}/api/v1/{path}"
        try:
            with _opener().open(url, timeout=10) as r:
                body = json.loads(r.read())
        except (OSError, ValueError) as e:
            raise PrometheusError(f"GET {url}: {e}") from e
        if body.get("status") != "success":
            raise PrometheusError(f"GET {url}: {body.get('error', body)}")
        return body["data"]

    def alerts(self) -> list[Alert]:
        """Alerts pending or firing now."""
        out = []
        for a in self.api("alerts")["alerts"]:
            labels = {str(k): str(v) for k, v in a.get("labels", {}).items()}
            out.append(
                Alert(labels.get("alertname", "?"), a["state"], labels, a.get("activeAt", ""))
            )
        return sorted(out, key=lambda a: (a.state != "firing", a.name, sorted(a.labels.items())))

    def rule_health(self) -> tuple[int, list[str]]:
        """(rules loaded, 'group/rule: error' for each rule whose last evaluation failed)."""
        count, errors = 0, []
        for group in self.api("rules")["groups"]:
            for rule in group["rules"]:
                count += 1
                if rule.get("health") not in ("ok", "unknown"):
                    errors.append(
                        f"{group['name']}/{rule.get('name')}: {rule.get('lastError', '?')}"
                    )
        return count, errors

    def targets_up(self) -> tuple[int, int]:
        """(targets up, targets in total)."""
        active = self.api("targets")["activeTargets"]
        return sum(1 for t in active if t.get("health") == "up"), len(active)


def _opener() -> urllib.request.OpenerDirector:
    # Loopback only: never through a configured HTTP proxy.
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _status(url: str) -> int | None:
    try:
        with _opener().open(url, timeout=2) as r:
            status: int = r.status
            return status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
