"""The generated Alertmanager routing on real Alertmanager (Debian 0.25): amtool accepts it,
routes pages and tickets, and a running Alertmanager sends a pool's burn pages as one
notification while the pool's down page mutes its lanes' alerts."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from obs.alerts.routing import alertmanager_config
from obs.procs import free_port
from tests.conftest import require_binary
from tests.support.alertmanager import AlertmanagerProcess, WebhookReceiver

pytestmark = pytest.mark.stack

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"


def _amtool(*args: str) -> subprocess.CompletedProcess[str]:
    amtool = require_binary("amtool")
    return subprocess.run([amtool, *args], capture_output=True, text=True, timeout=60)


def test_shipped_config_passes_amtool() -> None:
    """amtool check-config accepts the shipped (generated) config."""
    check = _amtool("check-config", str(SHIPPED))
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["severity=page", "pool=interactive", "lane=chat", "slo=ttft"], "page"),
        (["severity=page", "pool=interactive", "alertname=VllmObsPoolDown"], "page"),
        (["severity=ticket", "pool=bulk", "lane=batch"], "ticket"),
        (["alertname=Watchdog"], "default"),
    ],
)
def test_routes_pages_and_tickets(labels: list[str], receiver: str) -> None:
    """amtool config routes test sends pages to `page`, tickets to `ticket`, the rest to
    `default`."""
    out = _amtool("config", "routes", "test", f"--config.file={SHIPPED}", *labels)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split() == [receiver]


@pytest.fixture
def webhook() -> Iterator[WebhookReceiver]:
    """A webhook receiver on a free loopback port."""
    with WebhookReceiver() as receiver:
        yield receiver


def _alert(name: str, **labels: str) -> dict[str, Any]:
    return {"labels": {"alertname": name, **labels}}


def test_one_page_per_pool_and_the_pool_down_mutes_its_lanes(
    tmp_path: Path, webhook: WebhookReceiver
) -> None:
    """Burn pages of two lanes of one pool arrive as one notification listing both lanes;
    their ticket is muted by the pages; another pool's lane alerts are muted by that pool's
    down page, which alone is sent."""
    binary = require_binary("prometheus-alertmanager")
    hook = {"webhook_configs": [{"url": webhook.url}]}
    config = alertmanager_config({"page": hook, "ticket": hook, "default": hook})
    config["route"].update(group_wait="1s", group_interval="1s")  # a test waits seconds
    path = tmp_path / "am.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    am = AlertmanagerProcess(binary, path, tmp_path / "data", tmp_path / "am.log", free_port())
    burn = "VllmObsTTFTBudgetBurn"
    alerts = [
        _alert(burn, severity="page", pool="interactive", lane="chat", slo="ttft"),
        _alert(burn, severity="page", pool="interactive", lane="rag", slo="ttft"),
        _alert("VllmObsQueueWaitHigh", severity="ticket", pool="interactive", lane="chat"),
        _alert("VllmObsPoolDown", severity="page", pool="bulk"),
        _alert(burn, severity="page", pool="bulk", lane="long-prefill", slo="ttft"),
        _alert("VllmObsE2ELatencyHigh", severity="ticket", pool="bulk", lane="batch"),
    ]
    am.start()
    try:
        request = urllib.request.Request(
            f"{am.url}/api/v2/alerts",
            data=json.dumps(alerts).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            assert r.status == 200
        deadline = time.monotonic() + 30
        while len(webhook.payloads()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        # What Alertmanager says of each alert, rather than a guessed number of group intervals
        # to wait for a notification that should not come: the muted are suppressed by an
        # inhibition (so never sent), the rest active.
        muted = {
            ("VllmObsQueueWaitHigh", "chat"),
            (burn, "long-prefill"),
            ("VllmObsE2ELatencyHigh", "batch"),
        }
        states: dict[tuple[str, str], str] = {}
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"{am.url}/api/v2/alerts", timeout=10) as r:
                states = {
                    (a["labels"]["alertname"], a["labels"].get("lane", "-")): "inhibited"
                    if a["status"]["state"] == "suppressed" and a["status"]["inhibitedBy"]
                    else a["status"]["state"]
                    for a in json.loads(r.read())
                }
            if {k for k, v in states.items() if v == "inhibited"} == muted:
                break
            time.sleep(0.1)
    finally:
        assert am.stop() == 0
    sent = sorted(
        (
            p["receiver"],
            p["groupLabels"].get("pool"),
            sorted(a["labels"].get("lane", "-") for a in p["alerts"]),
        )
        for p in webhook.payloads()
    )
    assert sent == [("page", "bulk", ["-"]), ("page", "interactive", ["chat", "rag"])]
    assert {k for k, v in states.items() if v == "inhibited"} == muted, states
    assert all(v == "active" for k, v in states.items() if k not in muted), states
