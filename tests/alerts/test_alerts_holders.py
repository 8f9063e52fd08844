"""The burn-rate alerts name the other lane holding their pool: Prometheus' own promtool runs
the generated chat rules, fed the generated burning case plus the sidecar's occupancy gauge of
another lane on chat's pool, and the alert's top_cause renders that lane and its tokens; with
no other lane holding the pool it says so."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from obs import conventions as c
from obs.alerts.model import build_model
from obs.alerts.promtool_slo import lane_tests
from obs.alerts.rules import RuleIndex, rule_files, slo_file
from obs.alerts.series import series
from obs.config import default_config_path, load_config
from tests.alerts.test_alerts_replica_gpu import promtool

pytestmark = pytest.mark.stack

MODEL = build_model(load_config(default_config_path()))
FILES = rule_files(MODEL)
NOBODY = "no other lane's prompts"


def _run(tmp_path: Path, group: dict[str, Any]) -> None:
    name = slo_file("chat")
    promtool(tmp_path, name, FILES[name], [group])


def _burning() -> dict[str, Any]:
    """The generated case where chat's TTFT budget burns and its alerts fire."""
    (group,) = [
        g
        for g in lane_tests(MODEL, "chat", RuleIndex(FILES))
        if any(t["exp_alerts"] for t in g["alert_rule_test"])
    ][:1]
    return copy.deepcopy(group)


def _steps(group: dict[str, Any]) -> int:
    """One sample a minute up to the group's last evaluation."""
    return max(int(t["eval_time"].removesuffix("m")) for t in group["alert_rule_test"]) + 1


def test_burn_alert_names_the_other_lane_holding_the_pool(tmp_path: Path) -> None:
    """rag holding 900 prompt tokens on chat's pool: every firing burn alert of chat says so."""
    group = _burning()
    pool = MODEL.lane_slis("chat")[0].pool
    steps = _steps(group)
    holder = {c.LANE: "rag", c.POOL: pool, c.REPLICA: "http://r1", c.TENANT: "-"}
    group["input_series"].append(series(c.OCCUPANCY_PREFILL_TOKENS.name, holder, f"900+0x{steps}"))
    said = (
        "lane rag with 900 prompt tokens waiting or prefilling (move it to its own pool: "
        "vllm-obs query incident names the trigger)"
    )
    checked = 0
    for test in group["alert_rule_test"]:
        for alert in test["exp_alerts"]:
            notes = alert["exp_annotations"]
            assert NOBODY in notes["top_cause"]
            notes["top_cause"] = notes["top_cause"].replace(NOBODY, said)
            checked += 1
    assert checked
    _run(tmp_path, group)


def test_burn_alert_says_no_other_lane_holds_the_pool(tmp_path: Path) -> None:
    """Only chat's own prompts on its pool: the note says no other lane's."""
    group = _burning()
    pool = MODEL.lane_slis("chat")[0].pool
    own = {c.LANE: "chat", c.POOL: pool, c.REPLICA: "http://r1", c.TENANT: "-"}
    held = f"300+0x{_steps(group)}"
    group["input_series"].append(series(c.OCCUPANCY_PREFILL_TOKENS.name, own, held))
    assert any(NOBODY in a["exp_annotations"]["top_cause"]
               for t in group["alert_rule_test"] for a in t["exp_alerts"])  # fmt: skip
    _run(tmp_path, group)
