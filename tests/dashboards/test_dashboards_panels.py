"""The generated dashboards follow the lanes config: SLO and pool panels, the lane
drill-down, goodput, variable substitution, and every panel query parses in promtool."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from obs import conventions as c
from obs.dashboards import all_queries, render, substitute
from obs.dashboards.build import iter_panels
from obs.dashboards.variables import DEFAULT_VALUES
from tests.conftest import require_binary
from tests.support.dashboards_support import CONFIGS, UIDS, board_exprs, board_variables

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "deploy" / "prometheus" / "rules"
WIDTH = 24


# -- names ---------------------------------------------------------------------------------


def _panel(board: dict[str, Any], title: str) -> dict[str, Any]:
    return next(p for p in iter_panels(board) if p["title"] == title)


def test_slo_panels_follow_the_config() -> None:
    """The SLO dashboard plots each burn window and draws every factor as a threshold line."""
    board = render(CONFIGS["custom"])["vllm-obs-slo"]
    burn = _panel(board, "solo ttft: burn rate")
    assert [t["expr"] for t in burn["targets"]] == [
        f'{c.burn_rate_rule(w)}{{lane="solo", slo="ttft"}}' for w in ("2h", "4d")
    ]
    steps = burn["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, 1.5, 9.0]
    assert burn["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] != "off"
    budget = _panel(board, "solo ttft: budget left")
    assert budget["targets"][0]["expr"] == (
        f'{c.ERROR_BUDGET_REMAINING_RULE}{{lane="solo", slo="ttft"}}'
    )
    titles = {p["title"] for p in iter_panels(board)}
    assert not any(t.startswith("solo tpot") or t.startswith("solo availability") for t in titles)


def test_default_slo_dashboard_has_a_row_per_lane_with_slos() -> None:
    """Each default lane with an SLO gets a row with budget and burn panels per declared SLO."""
    config = CONFIGS["default"]
    board = render(config)["vllm-obs-slo"]
    titles = {p["title"] for p in iter_panels(board)}
    for lane in config.lanes:
        for kind in c.SLO_KINDS:
            declared = getattr(lane.slo, kind) is not None
            assert (f"{lane.name} {kind}: burn rate" in titles) is declared, (lane.name, kind)
    steps = _panel(board, "chat ttft: burn rate")["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, 1.0, 3.0, 6.0, 14.4]


def test_pool_thresholds_come_from_the_config() -> None:
    """KV usage and cache-hit panels draw the pools' and lanes' limits from the config."""
    board = render(CONFIGS["custom"])["vllm-obs-pools"]
    kv = _panel(board, "KV cache usage")["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in kv] == [None, 0.8]
    hit = _panel(board, "Prefix-cache hit ratio by pool")
    assert [s["value"] for s in hit["fieldConfig"]["defaults"]["thresholds"]["steps"]] == [
        None,
        0.4,
    ]


def test_lane_drilldown_stacks_the_five_phases() -> None:
    """The drill-down's stacked panel is the mean of each phase, per phase label."""
    board = render(CONFIGS["default"])["vllm-obs-lane"]
    panel = _panel(board, "Mean time per phase (stacked)")
    assert panel["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    (target,) = panel["targets"]
    assert f"sum by ({c.PHASE})" in target["expr"]
    assert c.PHASE_DURATION.name + "_sum" in target["expr"]
    lane_var = board_variables(board)["lane"]
    assert lane_var["multi"] is False
    assert lane_var["current"]["value"] == CONFIGS["default"].default_lane
    heat = _panel(board, "TTFT heatmap")
    assert heat["type"] == "heatmap" and heat["targets"][0]["format"] == "heatmap"


def test_goodput_takes_the_smallest_of_ok_and_each_latency_sli() -> None:
    """Goodput per lane is min(ok rate, rate within each latency threshold) of that lane."""
    board = render(CONFIGS["default"])["vllm-obs-overview"]
    targets = {t["legendFormat"]: t["expr"] for t in _panel(board, "Goodput by lane")["targets"]}
    assert set(targets) == set(CONFIGS["default"].lane_names)
    chat = targets["chat"]
    assert chat.startswith("min(")
    assert 'outcome="ok"' in chat and 'le="0.5"' in chat and 'le="0.05"' in chat
    assert "le=" not in targets["batch"]  # availability only


# -- all_queries -------------------------------------------------------------------------------


def test_all_queries_fill_in_every_variable() -> None:
    """all_queries returns runnable PromQL: no template variables are left."""
    queries = all_queries(CONFIGS["default"])
    assert {q.uid for q in queries} == UIDS
    assert len(queries) == sum(
        1 for b in render(CONFIGS["default"]).values() for _ in board_exprs(b)
    )
    for uid, title, expr in queries:
        assert "$" not in expr, (uid, title, expr)
    assert any('lane=~".*"' in q.expr and "[5m]" in q.expr for q in queries)


def test_all_queries_raw_and_overrides() -> None:
    """raw=True keeps the panels' variables; values= overrides the defaults per variable."""
    raw = all_queries(CONFIGS["default"], raw=True)
    assert any("$lane" in q.expr for q in raw)
    chat = all_queries(CONFIGS["default"], values={"lane": "chat", "__rate_interval": "1m"})
    assert any('lane=~"chat"' in q.expr and "[1m]" in q.expr for q in chat)


def test_substitute_forms_and_unknownvariables() -> None:
    """substitute fills $x, ${x} and ${x:fmt} and names a variable it has no value for."""
    assert substitute('a{l=~"$lane",p=~"${pool}",m=~"${model:regex}"}[$__rate_interval]') == (
        'a{l=~".*",p=~".*",m=~".*"}[5m]'
    )
    assert DEFAULT_VALUES["lane"] == ".*"
    with pytest.raises(KeyError, match=r"\$tenant"):
        substitute('x{t="$tenant"}')


@pytest.mark.stack
def test_every_panel_query_parses_in_promtool(tmp_path: Path) -> None:
    """Each query all_queries returns is valid PromQL to Prometheus's own parser."""
    promtool = require_binary("promtool")
    queries = all_queries(CONFIGS["default"]) + all_queries(CONFIGS["custom"])
    rules = [{"record": f"dashboard_check:q{i}", "expr": q.expr} for i, q in enumerate(queries)]
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.process
def test_cli_module_does_not_import_grafanalib() -> None:
    """Building the vllm-obs parser does not load grafanalib (it loads in the handler)."""
    code = "import sys, obs.dashboards.cli; print('grafanalib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
