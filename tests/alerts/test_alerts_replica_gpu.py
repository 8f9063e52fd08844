"""One replica against its pool and the GPU faults DCGM reports, on rules generated from the
shipped config and Prometheus' own promtool: fed the series of the dcgm-exporter fault page
and of vLLM's captured /metrics (tests/data, their names and label sets as written there, the
``pool``/``instance`` labels as a scrape adds them), each alert fires past its bound and is
silent inside it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from obs import conventions as c
from obs.alerts.model import build_model
from obs.alerts.rules import HEALTH_FILE, RuleIndex, rule_files
from obs.alerts.series import expected
from obs.config import default_config_path, load_config
from tests.alerts.test_alerts_gpu_change import page_series
from tests.conftest import require_binary

pytestmark = pytest.mark.stack

DATA = Path(__file__).resolve().parents[2] / "tests" / "data"
STEPS = 60
GPU = {"Hostname": "node-a", "gpu": "0"}
XID_79 = {**GPU, "err_msg": "GPU has fallen off the bus"}  # the page's err_msg label
FILES = rule_files(build_model(load_config(default_config_path())))
INDEX = RuleIndex(FILES)


def promtool(tmp_path: Path, name: str, rules: dict[str, Any], tests: list[Any]) -> None:
    """``promtool test rules`` on ``rules`` (written as ``name``) with ``tests``: passes."""
    path = tmp_path / name
    path.write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    doc = {"rule_files": [str(path)], "evaluation_interval": "1m", "tests": tests}
    case = tmp_path / "case.test.yml"
    case.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    proc = subprocess.run(
        [require_binary("promtool"), "test", "rules", str(case)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _run(tmp_path: Path, series: list[dict[str, str]], tests: list[dict[str, Any]]) -> None:
    case = {"interval": "1m", "input_series": series, "alert_rule_test": tests}
    promtool(tmp_path, HEALTH_FILE, FILES[HEALTH_FILE], [case])


def _firing(
    alert: str, at: str, labels: dict[str, str] | None, value: float = 0.0, **static: str
) -> dict[str, Any]:
    """``alert`` fires at ``at`` with the series' ``labels`` (None: it does not)."""
    if labels is None:
        return {"eval_time": at, "alertname": alert, "exp_alerts": []}
    rule = INDEX.find(alert, **static)
    return {"eval_time": at, "alertname": alert, "exp_alerts": [expected(rule, labels, value)]}


def _fault_page(grow: dict[str, str] | None = None, host: str = "Hostname") -> list[dict[str, str]]:
    """Every series of the fault page as scraped, constant, or growing as ``grow`` says;
    ``host``: the name dcgm-exporter gives its host label (``hostname`` after 4.5.3-4.8.2)."""
    out = []
    for name, (page_labels, value) in page_series(DATA / "dcgm-exporter-faults.txt").items():
        labels = page_labels.replace('Hostname="', f'{host}="')
        values = (grow or {}).get(name) or f"{value:g}+0x{STEPS}"
        out.append(
            {"series": f'{name}{{{labels},job="dcgm",instance="node-a:9400"}}', "values": values}
        )
    return out


def test_the_fault_page_fires_its_xid_and_nothing_else(tmp_path: Path) -> None:
    """The page as it is (XID 79 with dcgm-exporter's err_msg, old ECC counts that no longer
    grow, a remap that did not fail, no throttling growth) fires the XID alert only, naming
    the XID in words."""
    _run(
        tmp_path,
        _fault_page(),
        [
            _firing(c.ALERT_GPU_XID, "5m", XID_79, 79),
            _firing(c.ALERT_GPU_ECC, "30m", None),
            _firing(c.ALERT_GPU_THROTTLED, "30m", None),
        ],
    )


def test_growing_ecc_and_throttle_counters_fire(tmp_path: Path) -> None:
    """A double-bit ECC error 20 minutes in fires the memory alert; 30 s of every minute held
    by the thermal limit (the counter counts nanoseconds) fires the throttle alert (reason
    thermal, 50%); power stays quiet."""
    grow = {
        c.DCGM_ECC_DBE_VOL: f"2+0x20 3+0x{STEPS - 21}",
        c.DCGM_THERMAL_VIOLATION: f"123456789000+30000000000x{STEPS}",
    }
    _run(
        tmp_path,
        _fault_page(grow),
        [
            _firing(c.ALERT_GPU_ECC, "15m", None),
            _firing(c.ALERT_GPU_ECC, "25m", GPU, 1),
            _firing(c.ALERT_GPU_THROTTLED, "20m", GPU, 0.5, reason="thermal"),
        ],
    )


def test_faults_fire_with_the_host_label_a_later_dcgm_exporter_writes(tmp_path: Path) -> None:
    """dcgm-exporter after 4.5.3-4.8.2 spells its host label ``hostname``: the same page fires
    the same XID and throttle alerts, labelled with it and naming the host. 60 ms of thermal
    throttling a minute (0.1% of the time; the nanoseconds read as microseconds: 100%) is
    quiet."""
    host = {"hostname": "node-a", "gpu": "0"}
    grow = {c.DCGM_THERMAL_VIOLATION: f"0+30000000000x{STEPS}"}
    _run(
        tmp_path,
        _fault_page(grow, host="hostname"),
        [
            _firing(c.ALERT_GPU_XID, "5m", {**host, "err_msg": XID_79["err_msg"]}, 79),
            _firing(c.ALERT_GPU_THROTTLED, "20m", host, 0.5, reason="thermal"),
        ],
    )
    quiet = {c.DCGM_THERMAL_VIOLATION: f"0+60000000x{STEPS}"}
    _run(tmp_path, _fault_page(quiet), [_firing(c.ALERT_GPU_THROTTLED, "30m", None)])


def _replicas(times: float) -> list[dict[str, str]]:
    """Two replicas of pool interactive with vLLM's captured TTFT and ITL label set, 60
    requests a minute each; the second's TTFT ``times`` the first's."""
    page = page_series(DATA / "vllm-0.32-cpu-metrics.txt")
    out = []
    for inst, slow in (("10.0.0.1:8000", 1.0), ("10.0.0.2:8000", times)):
        for hist, mean in ((c.VLLM_TTFT, 0.1 * slow), (c.VLLM_ITL, 0.02)):
            for part, per_min in (("sum", 60 * mean), ("count", 60)):
                labels, _ = page[f"{hist}_{part}"]
                scrape = f'{labels},pool="interactive",job="vllm",instance="{inst}"'
                out.append(
                    {"series": f"{hist}_{part}{{{scrape}}}", "values": f"0+{per_min:g}x{STEPS}"}
                )
    return out


def test_replica_outlier_fires_on_the_slow_replica_only(tmp_path: Path) -> None:
    """A replica at 10x its pool's fastest TTFT fires, pending first, with its instance; at 2x
    it is silent."""
    slow = {"instance": "10.0.0.2:8000"}
    _run(
        tmp_path,
        _replicas(10.0),
        [
            _firing(c.ALERT_REPLICA_OUTLIER, "4m", None),
            _firing(c.ALERT_REPLICA_OUTLIER, "10m", slow, 10.0, pool="interactive"),
        ],
    )
    _run(tmp_path, _replicas(2.0), [_firing(c.ALERT_REPLICA_OUTLIER, "10m", None)])
