"""A real Alertmanager on loopback delivers to the webhook receiver (tests.support.alertmanager)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from obs.procs import free_port
from tests.conftest import require_binary
from tests.support.alertmanager import AlertmanagerProcess, WebhookReceiver, write_config

pytestmark = pytest.mark.stack


@pytest.fixture
def webhook() -> Iterator[WebhookReceiver]:
    """A webhook receiver on a free loopback port."""
    with WebhookReceiver() as receiver:
        yield receiver


def test_config_passes_amtool(tmp_path: Path, webhook: WebhookReceiver) -> None:
    """The written config (one webhook receiver, short group wait) is valid for amtool."""
    amtool = require_binary("amtool")
    path = write_config(tmp_path / "am.yml", webhook_url=webhook.url, group_wait="1s")
    check = subprocess.run(
        [amtool, "check-config", str(path)], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_alert_posted_to_alertmanager_reaches_the_webhook(
    tmp_path: Path, webhook: WebhookReceiver
) -> None:
    """An alert posted to Alertmanager's API arrives at the webhook with its labels."""
    binary = require_binary("prometheus-alertmanager")
    config = write_config(tmp_path / "am.yml", webhook_url=webhook.url, group_wait="1s")
    am = AlertmanagerProcess(binary, config, tmp_path / "data", tmp_path / "am.log", free_port())
    am.start()
    try:
        alert = [{"labels": {"alertname": "Probe", "lane": "chat", "pool": "interactive"}}]
        request = urllib.request.Request(
            f"{am.url}/api/v2/alerts",
            data=json.dumps(alert).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            assert r.status == 200
        deadline = time.monotonic() + 20
        while not webhook.notifications() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        assert am.stop() == 0
    (sent,) = webhook.notifications()
    assert (sent.name, sent.status, sent.receiver) == ("Probe", "firing", "webhook")
    assert sent.labels == alert[0]["labels"]
