"""A real Alertmanager on loopback, its config, and a webhook receiver that keeps what it gets
(the live-stack and alert-delivery tests; the demo runs no Alertmanager).

Stdlib only (plus PyYAML). ``AlertmanagerProcess`` runs the Debian
``prometheus-alertmanager`` (or upstream ``alertmanager``) binary with clustering
off; ``WebhookReceiver`` is the other end of a ``webhook_configs`` receiver, in a
thread, so a test (or you) can see exactly which notifications were sent.
"""

from __future__ import annotations

import json
import shutil
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from obs.demo.service import ServiceProcess

BINARIES = ("prometheus-alertmanager", "alertmanager")


def find_alertmanager() -> str | None:
    """Path of the Alertmanager binary (Debian names it ``prometheus-alertmanager``)."""
    for name in BINARIES:
        path = shutil.which(name)
        if path is not None:
            return path
    return None


def write_config(path: Path, *, webhook_url: str, group_wait: str = "30s") -> Path:
    """An Alertmanager config that sends every alert to one webhook.

    Alerts are grouped as the compose stack groups them (``alertname``, ``lane``, ``pool``,
    ``slo``); ``group_wait`` is how long a new group waits for more alerts before its first
    notification (Alertmanager's own default is 30s; a test wants ~1s).
    """
    config = {
        "route": {
            "receiver": "webhook",
            "group_by": ["alertname", "lane", "pool", "slo"],
            "group_wait": group_wait,
            "group_interval": group_wait,
            "repeat_interval": "1h",
        },
        "receivers": [
            {"name": "webhook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}
        ],
    }
    header = "# Written by vllm-obs: every alert to one webhook.\n"
    path.write_text(header + yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


class AlertmanagerProcess(ServiceProcess):
    """Alertmanager on 127.0.0.1:``port``, state under ``data_dir``, no cluster listener."""

    name = "alertmanager"

    def command(self) -> list[str]:
        return [
            self.binary,
            f"--config.file={self.config}",
            f"--storage.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",  # single instance: no gossip port on 0.0.0.0:9094
        ]


@dataclass(frozen=True, slots=True)
class Notification:
    """One alert of one webhook notification, as Alertmanager sent it."""

    status: str  # firing or resolved
    labels: dict[str, str]
    annotations: dict[str, str]
    receiver: str

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "?")


class WebhookReceiver:
    """An HTTP endpoint on 127.0.0.1 that records every Alertmanager webhook payload."""

    def __init__(self, port: int = 0) -> None:
        self._lock = threading.Lock()
        self._payloads: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    payload = json.loads(self.rfile.read(length))
                except ValueError:
                    self.send_response(400)
                    self.end_headers()
                    return
                with receiver._lock:
                    receiver._payloads.append(payload)
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = int(self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}/alerts"
        self._thread: threading.Thread | None = None

    def start(self) -> WebhookReceiver:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="webhook-receiver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def payloads(self) -> list[dict[str, Any]]:
        """Every payload received so far, in arrival order."""
        with self._lock:
            return list(self._payloads)

    def notifications(self) -> list[Notification]:
        """Every alert of every payload, flattened."""
        return [
            Notification(
                status=str(a.get("status")),
                labels={str(k): str(v) for k, v in a.get("labels", {}).items()},
                annotations={str(k): str(v) for k, v in a.get("annotations", {}).items()},
                receiver=str(p.get("receiver")),
            )
            for p in self.payloads()
            for a in p.get("alerts", [])
        ]

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
