"""The rules as Prometheus' own promtool sees them: valid, and every alert's unit tests pass."""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from obs.alerts.gotemplate import render
from obs.alerts.model import build_model
from obs.alerts.promtool_tests import promtool_files
from obs.alerts.rules import rule_files
from obs.alerts.writer import write
from obs.config import parse_config
from tests.conftest import require_binary

pytestmark = pytest.mark.stack

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "deploy" / "prometheus" / "rules"
TESTS_DIR = ROOT / "tests" / "promtool"


@pytest.fixture(scope="session")
def promtool() -> str:
    """Path of promtool; missing fails the test in CI (CI=true) and skips it elsewhere."""
    return require_binary("promtool")


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=cwd, check=False)


def _test_all(promtool: str, files: list[Path]) -> None:
    """Run ``promtool test rules`` on each file in parallel; fail with promtool's output."""
    workers = max(1, min(len(files), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda f: (f, _run(promtool, "test", "rules", str(f))), files))
    failed = [f"{f.name}:\n{r.stdout}{r.stderr}" for f, r in results if r.returncode != 0]
    assert not failed, "\n".join(failed)


def test_committed_rules_pass_promtool_check(promtool: str) -> None:
    """`promtool check rules` (including its lint) accepts every committed rule file."""
    files = sorted(RULES_DIR.glob("*.rules.yml"))
    assert files
    result = _run(promtool, "check", "rules", *map(str, files))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(files)


def test_committed_promtool_tests_pass(promtool: str) -> None:
    """Every committed promtool unit test (each alert firing, pending and silent) passes."""
    files = sorted(TESTS_DIR.glob("*.test.yml"))
    tested = {yaml.safe_load(f.read_text(encoding="utf-8"))["rule_files"][0] for f in files}
    assert {Path(r).name for r in tested} == {p.name for p in RULES_DIR.glob("*.rules.yml")}
    _test_all(promtool, files)


def test_another_config_generates_valid_and_passing_rules(promtool: str, tmp_path: Path) -> None:
    """Several replicas, own burn windows, odd and extreme thresholds: promtool passes too."""
    config = parse_config(
        {
            "pools": [
                {
                    "name": "gpu",
                    "replicas": ["http://10.0.0.1:8000", "http://10.0.0.2:8000"],
                    "kv_cache_usage_max": 0.8,
                }
            ],
            "lanes": [
                {
                    "name": "solo",
                    "pool": "gpu",
                    "admission": {"queue_timeout_s": 0.4},
                    "slo": {
                        "ttft": {"threshold_ms": 275, "objective": 0.99},
                        "tpot": {"threshold_ms": 33, "objective": 0.9},
                        "availability": {"objective": 0.999},
                        "cache_hit_ratio_min": 0.55,
                        "burn_windows": [
                            {
                                "severity": "page",
                                "long": "30m",
                                "short": "3m",
                                "factor": 9,
                                "for": "1m",
                            },
                            {
                                "severity": "ticket",
                                "long": "2h",
                                "short": "15m",
                                "factor": 2,
                                "for": "10m",
                            },
                            {"severity": "ticket", "long": "4h", "short": "20m", "factor": 1.5},
                        ],
                    },
                },
                {"name": "patient", "pool": "gpu", "admission": {"queue_timeout_s": 600}},
                {"name": "instant", "pool": "gpu", "slo": {"ttft": {"threshold_ms": 1}}},
            ],
            "default_lane": "solo",
        }
    )
    model = build_model(config, runbook_url="https://example.org/runbook.md")
    files = rule_files(model)
    rules_dir, tests_dir = tmp_path / "rules", tmp_path / "tests"
    write(rules_dir, files, "custom.yaml")
    write(tests_dir, promtool_files(model, files, rules_dir, tests_dir), "custom.yaml")
    check = _run(promtool, "check", "rules", *map(str, sorted(rules_dir.glob("*.yml"))))
    assert check.returncode == 0, check.stdout + check.stderr
    _test_all(promtool, sorted(tests_dir.glob("*.yml")))


def test_the_unit_tests_catch_a_broken_rule(promtool: str, tmp_path: Path) -> None:
    """A rule whose threshold drifts from the config fails its generated tests (the drifted
    alert's own test groups, as generated, against the drifted file; the unchanged file
    passes the same groups)."""
    rules_dir, tests_dir = tmp_path / "deploy/prometheus/rules", tmp_path / "tests/promtool"
    shutil.copytree(RULES_DIR, rules_dir)
    tests_dir.mkdir(parents=True)
    # The whole health file takes promtool ~9 s here: its KV cache alert's groups suffice.
    doc = yaml.safe_load((TESTS_DIR / "health.test.yml").read_text(encoding="utf-8"))
    doc["tests"] = [t for t in doc["tests"] if t["name"].startswith("VllmObsKVCacheUsageHigh ")]
    assert doc["tests"]
    (tests_dir / "kv.test.yml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    assert _run(promtool, "test", "rules", str(tests_dir / "kv.test.yml")).returncode == 0
    health = rules_dir / "health.rules.yml"
    text = health.read_text(encoding="utf-8")
    assert "> 0.9\n" in text
    health.write_text(text.replace("> 0.9\n", "> 0.99\n", 1), encoding="utf-8")
    result = _run(promtool, "test", "rules", str(tests_dir / "kv.test.yml"))
    assert result.returncode != 0
    assert "VllmObsKVCacheUsageHigh" in result.stdout + result.stderr


def test_template_renderer_agrees_with_prometheus(promtool: str, tmp_path: Path) -> None:
    """Annotations rendered in Python equal what promtool renders for the same values."""
    template = (
        "{{ $value }}|{{ $value | humanizePercentage }}|{{ $value | humanizeDuration }}|"
        '{{ printf "%.1f" $value }}|{{ printf "%.3g" $value }}'
    )
    values = [0, 0.05, 0.1975, 0.49, 0.86, 1.5, 17.2, 58.5, 90, 3725, 1234567, 1e-7]
    rules = [
        {"alert": f"A{i}", "expr": f"vector({v!r})", "annotations": {"t": template}}
        for i, v in enumerate(values)
    ]
    checks = [
        {
            "eval_time": "1m",
            "alertname": f"A{i}",
            "exp_alerts": [{"exp_labels": {}, "exp_annotations": {"t": render(template, v, {})}}],
        }
        for i, v in enumerate(values)
    ]
    (tmp_path / "r.yml").write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": rules}]}))
    tests = {"rule_files": ["r.yml"], "tests": [{"input_series": [], "alert_rule_test": checks}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(tests))
    result = _run(promtool, "test", "rules", str(tmp_path / "t.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
