"""Alerts and dashboards of a mixed-engine config: nothing is judged on a value an engine lacks."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from obs import conventions as c
from obs.alerts.model import build_model
from obs.alerts.promtool_tests import promtool_files
from obs.alerts.rules import rule_files
from obs.alerts.writer import write
from obs.config import Config, parse_config
from obs.dashboards.build import files as dashboard_files
from obs.dashboards.pools import NOT_REPORTED
from tests.conftest import require_binary

MIXED = {
    "pools": [
        {"name": "gpu", "replicas": ["http://10.0.0.1:8000"], "engine": "vllm"},
        {"name": "cpu", "replicas": ["http://10.0.0.2:8080"], "engine": "llamacpp"},
        {"name": "tgi", "replicas": ["http://10.0.0.3:80"], "engine": "tgi"},
    ],
    "lanes": [
        {"name": "chat", "pool": "gpu", "slo": {"cache_hit_ratio_min": 0.5}},
        {"name": "local", "pool": "cpu", "slo": {"cache_hit_ratio_min": 0.5}},
        {"name": "hf", "pool": "tgi", "slo": {"cache_hit_ratio_min": 0.5}},
    ],
    "default_lane": "chat",
}


def _config() -> Config:
    return parse_config(MIXED)


def _alerts(config: Config) -> list[dict]:
    return [
        r
        for data in rule_files(build_model(config)).values()
        for g in data["groups"]
        for r in g["rules"]
        if "alert" in r
    ]


def test_kv_and_preemption_alerts_only_for_engines_that_report_them() -> None:
    """vLLM's pool gets the KV and preemption alerts; llama.cpp's and TGI's do not."""
    alerts = _alerts(_config())
    pools = {
        name: sorted(r["labels"]["pool"] for r in alerts if r["alert"] == name)
        for name in (c.ALERT_KV_CACHE_USAGE_HIGH, c.ALERT_POOL_PREEMPTING, c.ALERT_POOL_DOWN)
    }
    assert pools[c.ALERT_KV_CACHE_USAGE_HIGH] == ["gpu"]
    assert pools[c.ALERT_POOL_PREEMPTING] == ["gpu"]
    assert pools[c.ALERT_POOL_DOWN] == ["cpu", "gpu", "tgi"]


def test_cache_floor_alert_skips_a_pool_without_prefix_counters() -> None:
    """A lane floor on a TGI pool (no prefix-cache counters) makes no alert; llama.cpp's does."""
    lanes = sorted(
        r["labels"]["lane"]
        for r in _alerts(_config())
        if r["alert"] == c.ALERT_PREFIX_CACHE_HIT_RATIO_LOW
    )
    assert lanes == ["chat", "local"]


def test_engine_panels_say_not_reported_and_name_the_pools() -> None:
    """KV/preemption/cache panels show "not reported by this engine" and name those pools."""
    pools = json.loads(dashboard_files(_config())["vllm-obs-pools.json"])
    panels = {p["title"]: p for p in pools["panels"] if "fieldConfig" in p}
    kv = panels["KV cache usage"]
    assert kv["fieldConfig"]["defaults"]["noValue"] == NOT_REPORTED
    assert "cpu (llamacpp), tgi (tgi)" in kv["description"]
    assert "gpu" not in kv["description"].split("Not reported")[1]
    assert "tgi (tgi)" in panels["Prefix-cache hit ratio by pool"]["description"]


@pytest.mark.stack
def test_mixed_config_rules_pass_promtool(tmp_path: Path) -> None:
    """promtool: the mixed rules check, and a pool without KV usage never fires the KV alert."""
    promtool = require_binary("promtool")
    model = build_model(_config())
    rules = rule_files(model)
    rules_dir, tests_dir = tmp_path / "rules", tmp_path / "tests"
    write(rules_dir, rules, "mixed.yaml")
    tests = promtool_files(model, rules, rules_dir, tests_dir)
    write(tests_dir, tests, "mixed.yaml")
    health = json.dumps([t for name, t in tests.items() if "health" in name])
    assert f"{c.ALERT_KV_CACHE_USAGE_HIGH} pool cpu (llamacpp does not report it)" in health
    for path in [*sorted(rules_dir.glob("*.yml"))]:
        check = subprocess.run(
            [promtool, "check", "rules", str(path)], capture_output=True, text=True
        )
        assert check.returncode == 0, check.stdout + check.stderr
    for path in sorted(tests_dir.glob("*.yml")):
        result = subprocess.run(
            [promtool, "test", "rules", str(path)], capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout + result.stderr
