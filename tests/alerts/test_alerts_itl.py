"""ITL as an SLO kind: a lane's ``slo: {itl: ...}`` passes ``config check``, yields burn-rate
rules on the per-request ITL p95 histogram that ``promtool check rules`` accepts, and their
generated promtool unit tests (each burn window firing, pending and silent) pass."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from obs import conventions as c
from obs.alerts.model import build_model
from obs.alerts.rules import alerts, rule_files, slo_file
from obs.cli import main
from obs.config import load_config
from tests.conftest import require_binary

pytestmark = pytest.mark.stack

LANES = """\
pools:
  - {name: gpu, replicas: ["http://127.0.0.1:8001"], engine: {kind: vllm, max_num_seqs: 64}}
lanes:
  - name: chat
    pool: gpu
    slo:
      ttft: {threshold_ms: 500, objective: 0.95}
      itl: {threshold_ms: 50, objective: 0.95}
default_lane: chat
"""


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "lanes.yaml"
    path.write_text(LANES, encoding="utf-8")
    return path


def test_an_itl_slo_passes_config_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`config check` accepts the lane and says what it judges."""
    assert main(["config", "check", str(_config(tmp_path))]) == 0
    assert "ITL p95 <= 50 ms for 95.0% of requests" in capsys.readouterr().out


def test_itl_burn_rules_read_the_threshold_bucket_of_the_request_p95_histogram(
    tmp_path: Path,
) -> None:
    """The ITL SLI reads the bucket at 50 ms of vllm_obs_itl_request_p95_seconds; its burn
    alert is VllmObsITLBudgetBurn, one per burn window."""
    files = rule_files(build_model(load_config(_config(tmp_path))))
    rules = [r for g in files[slo_file("chat")]["groups"] for r in g["rules"]]
    itl = [r for r in rules if r.get("labels", {}).get(c.SLO_LABEL) == "itl"]
    bucket = c.ITL_REQUEST_P95.series[0]
    assert any(f'{bucket}{{lane="chat",le="0.05"}}' in r["expr"] for r in itl)
    burns = [a for a in alerts(files) if a["alert"] == c.ALERT_ITL_BUDGET_BURN]
    assert len(burns) == 4 and all(a["labels"][c.SLO_LABEL] == "itl" for a in burns)


def test_itl_rules_pass_promtool_check_and_their_unit_tests(tmp_path: Path) -> None:
    """promtool accepts the generated rules and passes their generated unit tests."""
    promtool = require_binary("promtool")
    rules, tests = tmp_path / "rules", tmp_path / "tests"
    args = ["alerts", "--config", str(_config(tmp_path)), "--out", str(rules)]
    assert main([*args, "--tests", str(tests)]) == 0
    files = sorted(str(p) for p in rules.glob("*.rules.yml"))
    check = subprocess.run(
        [promtool, "check", "rules", *files], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    for test in sorted(tests.glob("*.test.yml")):
        run = subprocess.run(
            [promtool, "test", "rules", test.name],
            cwd=tests,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert run.returncode == 0, run.stdout + run.stderr
