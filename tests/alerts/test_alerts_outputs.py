"""`vllm-obs alerts` writes rules, tests and routing side by side, and its runbook links open."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from obs.alerts.routing import alertmanager_config
from obs.cli import main

ROOT = Path(__file__).resolve().parents[2]
BASE = """\
pools: [{name: p, replicas: ["http://127.0.0.1:8001"]}]
lanes:
  - name: a
    pool: p
    slo: {ttft: {threshold_ms: 500, objective: 0.95}}
default_lane: a
alerts: {runbook_base_url: "https://wiki.example/runbook.md"}
"""


def test_rules_and_tests_in_one_directory_are_both_kept(tmp_path: Path) -> None:
    """--out D --tests D leaves every rule file and every test file in D, and a second run
    still removes a stale generated rule file of its own kind."""
    d = tmp_path / "d"
    assert main(["alerts", "--out", str(d), "--tests", str(d)]) == 0
    rules = sorted(p.name for p in d.glob("*.rules.yml"))
    tests = sorted(p.name for p in d.glob("*.test.yml"))
    assert "health.rules.yml" in rules and "slo-chat.rules.yml" in rules
    evidence = [r.replace(".rules.yml", ".evidence.test.yml") for r in rules if r[:4] == "slo-"]
    assert tests == sorted([r.replace(".rules.yml", ".test.yml") for r in rules] + evidence)
    doc = yaml.safe_load((d / "slo-chat.test.yml").read_text(encoding="utf-8"))
    assert doc["rule_files"] == ["./slo-chat.rules.yml"]
    stale = d / "slo-gone.rules.yml"
    stale.write_text((d / "slo-chat.rules.yml").read_text(encoding="utf-8"), encoding="utf-8")
    assert main(["alerts", "--out", str(d), "--tests", str(d)]) == 0
    assert not stale.exists()
    assert sorted(p.name for p in d.glob("*.yml")) == sorted(rules + tests)


def test_runbook_links_from_the_config_and_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The config's alerts.runbook_base_url makes absolute links, --runbook-url overrides
    it, and with neither the command warns that the links are relative."""
    config = tmp_path / "lanes.yaml"
    config.write_text(BASE, encoding="utf-8")
    out = tmp_path / "r"
    assert main(["alerts", "--config", str(config), "--out", str(out)]) == 0
    text = (out / "slo-a.rules.yml").read_text(encoding="utf-8")
    assert "runbook_url: https://wiki.example/runbook.md#vllmobsttftbudgetburn" in text
    assert "warning" not in capsys.readouterr().err
    flag = ["--runbook-url", "https://other.example/rb.md"]
    assert main(["alerts", "--config", str(config), "--out", str(out), *flag]) == 0
    text = (out / "slo-a.rules.yml").read_text(encoding="utf-8")
    assert "runbook_url: https://other.example/rb.md#vllmobsttftbudgetburn" in text
    config.write_text(BASE.replace("alerts: {", "# ").replace('md"}', 'md"'), encoding="utf-8")
    assert main(["alerts", "--config", str(config), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning: no runbook URL" in err and "alerts.runbook_base_url" in err
    text = (out / "slo-a.rules.yml").read_text(encoding="utf-8")
    assert "runbook_url: docs/runbook.md#vllmobsttftbudgetburn" in text


def test_a_relative_runbook_base_in_the_config_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """alerts.runbook_base_url must be an http(s) URL: anything else exits 2 naming it."""
    config = tmp_path / "lanes.yaml"
    config.write_text(BASE.replace("https://wiki.example/", "docs/"), encoding="utf-8")
    assert main(["alerts", "--config", str(config), "--out", str(tmp_path / "r")]) == 2
    assert "alerts.runbook_base_url" in capsys.readouterr().err


def test_shipped_alertmanager_config_is_the_generated_one(tmp_path: Path) -> None:
    """deploy/alertmanager/alertmanager.yml is what `vllm-obs alerts --alertmanager` writes."""
    path = tmp_path / "am.yml"
    assert main(["alerts", "--out", str(tmp_path / "r"), "--alertmanager", str(path)]) == 0
    shipped = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
    assert path.read_text(encoding="utf-8") == shipped.read_text(encoding="utf-8")
    doc = yaml.safe_load(shipped.read_text(encoding="utf-8"))
    assert doc == alertmanager_config()
    page = next(r for r in doc["route"]["routes"] if r["receiver"] == "page")
    assert page["group_by"] == ["pool"]
