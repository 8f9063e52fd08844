"""The canary alert of split lanes: generated per canary arm and signal, and its promtool
cases (beyond the margin, inside it, too few requests) pass on Prometheus' own promtool."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from obs import conventions as c
from obs.alerts.model import build_model
from obs.alerts.promtool_canary import quantile, split_for
from obs.alerts.promtool_tests import promtool_files
from obs.alerts.rules import CANARY_FILE, alerts, rule_files
from obs.alerts.writer import write
from obs.config import default_config_path, load_config, parse_config
from tests.conftest import require_binary

POOLS = [{"name": n, "replicas": [f"http://127.0.0.1:{i + 1}"]} for i, n in enumerate("abc")]
SPLIT = {
    "pools": POOLS,
    "lanes": [
        {
            "name": "chat",
            "split": {"a": 90, "b": 5, "c": 5},
            "canary": {"ttft_p95_margin": 0.1, "tpot_p95_margin": 0.3, "window": "30m"},
            "slo": {"availability": {"objective": 0.99}},
        },
        {"name": "other", "split": {"a": 1, "b": 3}},
    ],
    "default_lane": "chat",
}


def _rules() -> tuple[Any, dict[str, Any]]:
    model = build_model(parse_config(SPLIT))
    return model, rule_files(model)


def test_each_canary_arm_gets_one_rule_per_signal_against_its_baseline() -> None:
    """Two canaries of chat (TTFT, TPOT, availability) and one of a lane without an
    availability SLO (TTFT, TPOT); each names its baseline, margin and window."""
    _, files = _rules()
    found = [a for a in alerts(files) if a["alert"] == c.ALERT_CANARY_ROLLBACK]
    keys = {(a["labels"]["lane"], a["labels"]["pool"], a["labels"]["slo"]) for a in found}
    kinds = ("ttft", "tpot", "availability")
    assert keys == {("chat", p, k) for p in "bc" for k in kinds} | {
        ("other", "a", "ttft"),
        ("other", "a", "tpot"),
    }
    for a in found:
        want = {"chat": "a", "other": "b"}[a["labels"]["lane"]]
        assert a["labels"][c.BASELINE_LABEL] == want
    (ttft,) = [a for a in found if a["labels"]["pool"] == "b" and a["labels"]["slo"] == "ttft"]
    assert "> 1.1 * histogram_quantile(0.95" in ttft["expr"] and "[30m]" in ttft["expr"]
    assert 'pool="a"' in ttft["expr"] and ">= 100" in ttft["expr"]


def test_the_default_config_has_no_split_and_no_canary_rules() -> None:
    """No split lane, no canary file: the committed rules stay as they are."""
    assert CANARY_FILE not in rule_files(build_model(load_config(default_config_path())))


def test_split_for_puts_the_p95_where_a_case_wants_it() -> None:
    """The promtool cases' histograms: Prometheus' interpolation lands within 1% of target."""
    for target in (0.03, 0.26, 0.9, 3.3):
        got = quantile(0.95, split_for(c.LATENCY_BUCKETS, target, 1000))
        assert abs(got - target) / target < 0.01, (target, got)


@pytest.mark.stack
def test_canary_rules_pass_promtool_and_a_moved_margin_fails_them(tmp_path: Path) -> None:
    """promtool accepts the canary rules and passes every case on both sides of each margin;
    rules whose TTFT margin drifted from the config fail them."""
    promtool = require_binary("promtool")
    model, files = _rules()
    rules_dir, tests_dir = tmp_path / "rules", tmp_path / "tests"
    write(rules_dir, files, "split.yaml")
    write(tests_dir, promtool_files(model, files, rules_dir, tests_dir), "split.yaml")
    rule_file, test_file = rules_dir / CANARY_FILE, tests_dir / "canary.test.yml"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=300)

    check = run("check", "rules", str(rule_file))
    assert check.returncode == 0, check.stdout + check.stderr
    passed = run("test", "rules", str(test_file))
    assert passed.returncode == 0, passed.stdout + passed.stderr
    text = rule_file.read_text(encoding="utf-8")
    rule_file.write_text(text.replace("> 1.1 *", "> 1.6 *"), encoding="utf-8")
    broken = run("test", "rules", str(test_file))
    out = broken.stdout + broken.stderr
    assert broken.returncode != 0 and "p95 TTFT" in out, out
