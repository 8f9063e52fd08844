"""`vllm-obs alerts`: the command line around the generators."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from obs.cli import main

BAD_FACTOR = """\
pools: [{name: p, replicas: ["http://127.0.0.1:8001"]}]
lanes:
  - name: a
    pool: p
    slo: {ttft: {threshold_ms: 500, objective: 0.9}}
default_lane: a
"""


def test_writes_rules_and_tests_for_the_default_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --config the shipped lanes are used; every written path is printed."""
    rules, tests = tmp_path / "rules", tmp_path / "t"
    code = main(
        ["alerts", "--out", str(rules), "--tests", str(tests), "--runbook-url", "https://r/x.md"]
    )
    assert code == 0
    printed = capsys.readouterr().out.split()
    names = sorted(p.name for p in rules.iterdir())
    assert "health.rules.yml" in names and "slo-chat.rules.yml" in names
    slo = [n for n in names if n.startswith("slo-")]  # each also has its evidence-floor file
    assert len(printed) == 2 * len(names) + len(slo)
    doc = yaml.safe_load((tests / "slo-chat.test.yml").read_text(encoding="utf-8"))
    assert doc["rule_files"] == ["../rules/slo-chat.rules.yml"]
    text = (rules / "health.rules.yml").read_text(encoding="utf-8")
    assert "runbook_url: https://r/x.md#vllmobspooldown" in text


def test_a_config_no_alert_could_fire_on_fails_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An SLO whose burn factor needs over 100% errors is reported, naming lane and SLO."""
    config = tmp_path / "lanes.yaml"
    config.write_text(BAD_FACTOR, encoding="utf-8")
    code = main(["alerts", "--config", str(config), "--out", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert "vllm-obs alerts: error: lanes[a].slo.ttft" in err
    assert not (tmp_path / "out").exists()


def test_a_missing_config_file_fails_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config path that does not exist is an error naming the file."""
    code = main(["alerts", "--config", str(tmp_path / "nope.yaml"), "--out", str(tmp_path)])
    assert code == 2
    assert "nope.yaml: cannot read config" in capsys.readouterr().err
