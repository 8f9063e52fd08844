"""``vllm-obs alerts --max-for/--max-interval``: staging holds, everything else unchanged."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from obs.alerts.holds import HoldCaps, cap
from obs.alerts.model import build_model
from obs.alerts.rules import RuleFile, rule_files
from obs.cli import main
from obs.config import default_config_path, load_config
from obs.durations import seconds
from tests.conftest import require_binary


def _files() -> dict[str, RuleFile]:
    return rule_files(build_model(load_config(default_config_path())))


def _rules(files: dict[str, RuleFile]) -> list[dict[str, Any]]:
    return [r for f in files.values() for g in f["groups"] for r in g["rules"]]


def test_cap_shortens_long_holds_and_intervals_only() -> None:
    """Holds and group intervals above the caps become the caps; shorter ones stay."""
    files = _files()
    capped = cap(files, HoldCaps(max_for="5m", max_interval="1m"))
    for before, after in zip(_rules(files), _rules(capped), strict=True):
        if "for" in before:
            assert seconds(after["for"]) == min(seconds(before["for"]), 300)
        assert {k: v for k, v in after.items() if k != "for"} == {
            k: v for k, v in before.items() if k != "for"
        }
    intervals = [g.get("interval") for f in capped.values() for g in f["groups"]]
    assert {i for i in intervals if i is not None} == {"1m"}
    assert any(r.get("for") == "2m" for r in _rules(capped))  # shorter than the cap: kept
    assert _files() == files  # the input is not modified


def test_zero_hold_fires_at_first_evaluation() -> None:
    """``--max-for 0s`` sets every alert's hold to 0s (fire when the condition first holds)."""
    capped = cap(_files(), HoldCaps(max_for="0s"))
    holds = {r["for"] for r in _rules(capped) if "alert" in r}
    assert holds == {"0s"}


def test_caps_refuse_bad_durations() -> None:
    """A duration Prometheus cannot read, or a zero group interval, is refused by name."""
    with pytest.raises(ValueError, match="5 minutes"):
        HoldCaps(max_for="5 minutes")
    with pytest.raises(ValueError, match="longer than 0"):
        HoldCaps(max_interval="0s")


@pytest.mark.stack
def test_cli_writes_capped_rules_that_promtool_accepts(tmp_path: Path) -> None:
    """The CLI writes capped rules, says so in each file's header, and promtool accepts them."""
    promtool = require_binary("promtool")
    out = tmp_path / "rules"
    assert main(["alerts", "--out", str(out), "--max-for", "1s", "--max-interval", "2s"]) == 0
    for path in sorted(out.glob("*.yml")):
        text = path.read_text(encoding="utf-8")
        assert "with --max-for 1s --max-interval 2s (staging holds)" in text.splitlines()[0]
        rules = [r for g in yaml.safe_load(text)["groups"] for r in g["rules"]]
        assert all(r["for"] == "1s" for r in rules if "alert" in r)
    check = subprocess.run(
        [promtool, "check", "rules", *map(str, sorted(out.glob("*.yml")))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_cli_refuses_promtool_tests_with_caps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The promtool tests check production holds, so --tests with a cap is an error (exit 2)."""
    args = ["alerts", "--out", str(tmp_path / "r"), "--tests", str(tmp_path / "t")]
    assert main([*args, "--max-for", "0s"]) == 2
    assert "--tests" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    with pytest.raises(SystemExit) as bad:
        main(["alerts", "--out", str(tmp_path / "r"), "--max-for", "soon"])
    assert bad.value.code == 2
