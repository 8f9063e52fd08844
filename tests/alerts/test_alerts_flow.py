"""Flow control's alerts (docs/flow.md): generated only for a config with rate-limited
tenants or saturated pools, and firing on Prometheus' own promtool after 10 minutes at the
limit or held at the target, not before."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from obs import conventions as c
from obs.alerts.model import build_model
from obs.alerts.rules import HEALTH_FILE, alerts, rule_files
from obs.alerts.writer import write
from obs.config import default_config_path, load_config, parse_config
from tests.conftest import require_binary

FLOW = {
    "pools": [
        {
            "name": "gpu",
            "replicas": ["http://127.0.0.1:1"],
            "engine": {"kind": "vllm", "max_num_seqs": 16},
            "saturation": {"max_waiting": 2},
        },
        {"name": "cpu", "replicas": ["http://127.0.0.1:2"]},
    ],
    "lanes": [{"name": "chat", "pool": "gpu"}],
    "default_lane": "chat",
    "tenants": {"acme": {"tokens_per_minute": 1000}, "free": {"weight": 2}},
}


TENANT_ALERT, POOL_ALERT = c.ALERT_TENANT_AT_RATE_LIMIT, c.ALERT_POOL_HELD_AT_SATURATION


def _expected(name: str, labels: dict[str, str], value: str) -> dict[str, Any]:
    """The alert promtool should see: its labels and its annotations with ``$value`` filled
    in as the templates write it."""
    (rule,) = [a for a in alerts(_files()) if a["alert"] == name]
    notes = {
        k: v.replace('{{ printf "%.3g" $value }}/s', value).replace("{{ $value }}", value)
        for k, v in rule["annotations"].items()
    }
    return {"exp_labels": {"severity": "ticket", **labels}, "exp_annotations": notes}


def _files() -> dict[str, Any]:
    return rule_files(build_model(parse_config(FLOW)))


def test_flow_alerts_only_where_configured() -> None:
    """One tenant alert per rate-limited tenant and one pool alert per saturated pool; the
    default config (no tenants, no saturation) gets neither."""
    found = [(a["alert"], a["labels"]) for a in alerts(_files()) if a["alert"] in c.FLOW_ALERTS]
    assert found == [
        (c.ALERT_TENANT_AT_RATE_LIMIT, {"severity": "ticket", "tenant": "acme"}),
        (c.ALERT_POOL_HELD_AT_SATURATION, {"severity": "ticket", "pool": "gpu"}),
    ]
    default = rule_files(build_model(load_config(default_config_path())))
    assert not [a for a in alerts(default) if a["alert"] in c.FLOW_ALERTS]


@pytest.mark.stack
def test_flow_alerts_fire_after_ten_minutes_on_promtool(tmp_path: Path) -> None:
    """A tenant refused every minute and a pool held by one process fire at 10 minutes, not
    at 9; a tenant never refused and a pool never held stay silent."""
    promtool = require_binary("promtool")
    write(tmp_path, _files(), "flow.yaml")
    refused = f'{c.RATE_LIMITED.series[0]}{{tenant="acme", kind="tokens"}}'
    held = f'{c.FLOW_HELD.name}{{pool="gpu", instance="a"}}'
    tenant = _expected(c.ALERT_TENANT_AT_RATE_LIMIT, {"tenant": "acme"}, "0.1/s")
    pool = _expected(c.ALERT_POOL_HELD_AT_SATURATION, {"pool": "gpu"}, "1")
    case = {
        "rule_files": [HEALTH_FILE],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": refused, "values": "0+6x30"},
                    {"series": held, "values": "1x30"},
                ],
                "alert_rule_test": [
                    {"eval_time": "9m", "alertname": TENANT_ALERT, "exp_alerts": []},
                    {"eval_time": "9m", "alertname": POOL_ALERT, "exp_alerts": []},
                    {"eval_time": "16m", "alertname": TENANT_ALERT, "exp_alerts": [tenant]},
                    {"eval_time": "12m", "alertname": POOL_ALERT, "exp_alerts": [pool]},
                ],
            }
        ],
    }  # fmt: skip
    test_file = tmp_path / "flow.test.yml"
    test_file.write_text(yaml.safe_dump(case), encoding="utf-8")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=300)

    check = run("check", "rules", str(tmp_path / HEALTH_FILE))
    assert check.returncode == 0, check.stdout + check.stderr
    result = run("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr
