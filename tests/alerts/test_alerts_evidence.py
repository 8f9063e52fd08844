"""The burn-rate alerts' evidence floor on promtool: the generated cases pass on the rules,
and the two-requests case catches rules without the floor (issue 60's bars)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from obs.alerts.model import build_model
from obs.alerts.promtool_tests import promtool_files
from obs.alerts.rules import rule_files
from obs.alerts.writer import write
from obs.config import parse_config
from tests.conftest import require_binary

pytestmark = pytest.mark.stack

CONFIG = {
    "pools": [{"name": "p", "replicas": ["http://127.0.0.1:1"]}],
    "lanes": [
        {"name": "quiet", "pool": "p", "slo": {"ttft": {"threshold_ms": 500, "objective": 0.95}}}
    ],
    "default_lane": "quiet",
}
FLOOR = re.compile(r"\nand on \(lane\)\nsum by \(lane\) \(increase\([^\n]*\)\) >= \d+")


def _promtool(promtool: str, test_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=600
    )


def test_floor_cases_pass_and_fail_without_the_floor(tmp_path: Path) -> None:
    """2 requests in 7 hours (one slow) and a slow trickle page nobody and 600 a minute at
    90% slow pages, on the generated rules; with the floor removed the quiet cases page."""
    promtool = require_binary("promtool")
    model = build_model(parse_config(CONFIG))
    files = rule_files(model)
    tests = promtool_files(model, files, tmp_path, tmp_path)
    write(tmp_path, files, "quiet.yaml", "*.rules.yml")
    write(tmp_path, tests, "quiet.yaml", "*.test.yml")
    test_file = tmp_path / "slo-quiet.evidence.test.yml"
    ok = _promtool(promtool, test_file)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    name = "slo-quiet.rules.yml"
    stripped = 0
    for group in files[name]["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["expr"], n = FLOOR.subn("", rule["expr"])
                stripped += n
    assert stripped == 2 * 4  # both windows of each of the four burn windows
    write(tmp_path, {name: files[name]}, "quiet.yaml", name)
    bad = _promtool(promtool, test_file)
    assert bad.returncode != 0
    assert "2 requests in 7 hours" in bad.stdout + bad.stderr
    assert "600 requests a minute" not in bad.stdout + bad.stderr
