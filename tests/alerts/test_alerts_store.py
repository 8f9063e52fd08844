"""VllmObsRateLimitStoreDown (docs/flow.md's promise): generated only with a shared store,
a ticket when the store fails open and a page when it fails closed, firing on promtool after
5 minutes of store errors and silent without them."""

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
from obs.config import parse_config
from tests.conftest import require_binary

ALERT = c.ALERT_RATE_LIMIT_STORE_DOWN


def _config(**rate_limits: str) -> dict[str, Any]:
    return {
        "pools": [{"name": "gpu", "replicas": ["http://127.0.0.1:1"]}],
        "lanes": [{"name": "chat", "pool": "gpu"}],
        "default_lane": "chat",
        "tenants": {"acme": {"requests_per_minute": 60}},
        "rate_limits": rate_limits,
    }


def _files(**rate_limits: str) -> dict[str, Any]:
    return rule_files(build_model(parse_config(_config(**rate_limits))))


def test_store_alert_only_with_a_shared_store() -> None:
    """No store: no rule; a store failing open: a ticket; failing closed: a page."""
    assert not [a for a in alerts(_files()) if a["alert"] == ALERT]
    (open_,) = [a for a in alerts(_files(store="redis://r:6379/0")) if a["alert"] == ALERT]
    closed = _files(store="redis://r:6379/0", on_store_error="closed")
    (shut,) = [a for a in alerts(closed) if a["alert"] == ALERT]
    assert open_["labels"] == {"severity": "ticket"} and shut["labels"] == {"severity": "page"}
    assert open_["expr"] == f"sum(rate({c.RATE_LIMIT_STORE_ERRORS.series[0]}[5m])) > 0"
    assert "admitted uncounted" in open_["annotations"]["description"]
    assert "refused 503" in shut["annotations"]["description"]


@pytest.mark.stack
def test_store_alert_fires_on_promtool(tmp_path: Path) -> None:
    """Store errors every minute: pending at 4 minutes, firing at 7; none: silent."""
    promtool = require_binary("promtool")
    files = _files(store="redis://r:6379/0", on_store_error="closed")
    write(tmp_path, files, "store.yaml")
    (rule,) = [a for a in alerts(files) if a["alert"] == ALERT]
    value = "0.05/s"  # 3 a minute
    notes = {
        k: v.replace('{{ printf "%.3g" $value }}/s', value) for k, v in rule["annotations"].items()
    }
    errors = c.RATE_LIMIT_STORE_ERRORS.series[0]
    case = {
        "rule_files": [HEALTH_FILE],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": f'{errors}{{instance="a"}}', "values": "0+3x20"},
                ],
                "alert_rule_test": [
                    {"eval_time": "4m", "alertname": ALERT, "exp_alerts": []},
                    {
                        "eval_time": "9m",
                        "alertname": ALERT,
                        "exp_alerts": [
                            {"exp_labels": {"severity": "page"}, "exp_annotations": notes}
                        ],
                    },
                ],
            },
            {
                "interval": "1m",
                "input_series": [{"series": f'{errors}{{instance="a"}}', "values": "0+0x20"}],
                "alert_rule_test": [{"eval_time": "15m", "alertname": ALERT, "exp_alerts": []}],
            },
        ],
    }
    test_file = tmp_path / "store.test.yml"
    test_file.write_text(yaml.safe_dump(case), encoding="utf-8")
    result = subprocess.run(
        [promtool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
