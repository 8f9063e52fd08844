"""A real Prometheus for the demo and the live-stack tests: its config, the process on
loopback (``obs.demo.service``), its alerts and rules.

The process runs (``obs.procs``) in its own session, so a Ctrl-C in the
terminal reaches the demo (which still reads the alerts) and not Prometheus directly.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import yaml

from obs.demo.service import ServiceProcess
from obs.prom.api import PrometheusAPI
from obs.prom.api import PrometheusError as PrometheusError

# Exemplars kept in memory (a ring shared by all series): the sidecar's TTFT, TPOT and
# end-to-end histograms carry each request's trace id. Prometheus 2.x and 3.x also need the
# ``exemplar-storage`` feature flag (``EXEMPLAR_FLAG``) to store them.
EXEMPLAR_STORAGE: Final = {"exemplars": {"max_exemplars": 100_000}}
EXEMPLAR_FLAG: Final = "--enable-feature=exemplar-storage"


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
    alertmanager_url: str | None = None,
) -> Path:
    """A Prometheus config scraping the sidecar (job ``vllm-obs-sidecar``) and every pool
    replica (job ``vllm``, label ``pool``), as the compose stack does, and loading the
    generated rules; alerts go to ``alertmanager_url`` when given. Exemplar storage is on
    (with ``PrometheusProcess``' feature flag) so latency panels link to traces."""
    config: dict[str, Any] = {
        "global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"},
        "storage": EXEMPLAR_STORAGE,
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
    if alertmanager_url is not None:
        targets = [host_port(alertmanager_url)]
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": targets}]}]}
    header = "# Written by vllm-obs demo: scrapes the sidecar and the pools, loads rules/.\n"
    path.write_text(header + yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


@dataclass(frozen=True, slots=True)
class Alert:
    name: str
    state: str  # pending or firing
    labels: dict[str, str]
    active_at: str


class PrometheusProcess(ServiceProcess):
    """``prometheus`` on 127.0.0.1:``port`` with its data under ``data_dir``."""

    name = "prometheus"

    def command(self) -> list[str]:
        return [
            self.binary,
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=7d",
            EXEMPLAR_FLAG,
        ]

    @property
    def client(self) -> PrometheusAPI:
        """Its HTTP API: instant and range queries."""
        return PrometheusAPI(self.url)

    # --- the HTTP API ------------------------------------------------------------

    def api(self, path: str) -> Any:
        """``data`` of a ``GET /api/v1/...`` answer; raises :class:`PrometheusError`."""
        return self.client.get(path)

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

    def state(self) -> tuple[list[Alert] | None, list[str]]:
        """The alerts now, and notes on the rules' and targets' health (or why it could
        not be read)."""
        try:
            alerts = self.alerts()
            rules, failing = self.rule_health()
            up, targets = self.targets_up()
        except PrometheusError as e:
            return None, [f"could not read Prometheus: {e}"]
        notes = [
            f"{rules} rules loaded, {len(failing)} failing evaluation; "
            f"scrape targets up: {up}/{targets}"
        ]
        return alerts, notes + [f"rule error: {f}" for f in failing[:5]]
