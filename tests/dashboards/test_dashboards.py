"""The generated Grafana dashboards: valid for import, and every name they use is defined."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
import yaml

from obs import conventions as c
from obs.alerts.gpu_rules import GPU
from obs.config import Config
from obs.dashboards import render
from obs.dashboards.build import iter_panels
from obs.dashboards.models import HOST
from obs.dashboards.variables import referenced
from tests.support import strings
from tests.support.dashboards_support import CONFIGS, UIDS, board_exprs, board_variables
from tests.support.promql_names import metric_names

ROOT = Path(__file__).resolve().parents[2]
# vLLM 0.32's real /metrics output, captured into the repository (tests/data/README.md).
VLLM_REFERENCE = ROOT / "tests" / "data" / "vllm-0.32-cpu-metrics.txt"
# Spec decoding and LoRA series, written from vLLM 0.32's source (tests/data/README.md).
DCGM_PAGE = ROOT / "tests" / "data" / "dcgm-exporter-metrics.txt"  # from its default counters
VLLM_FEATURES = ROOT / "tests" / "data" / "vllm-0.32-spec-lora-metrics.txt"
RULES_DIR = ROOT / "deploy" / "prometheus" / "rules"
WIDTH = 24
# -- names ---------------------------------------------------------------------------------


def variable_query_names(query: str) -> set[str]:
    """Metric names of a Grafana ``label_values(selector, label)`` variable query."""
    m = re.fullmatch(r"label_values\((.*),\s*\w+\)", query)
    assert m, f"unexpected variable query {query!r}"
    return metric_names(m.group(1))


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(params=sorted(CONFIGS), scope="module")
def config(request: pytest.FixtureRequest) -> Config:
    """Each config the dashboards are checked against."""
    return CONFIGS[request.param]


@pytest.fixture(scope="module")
def boards(config: Config) -> dict[str, dict[str, Any]]:
    """The rendered dashboards of that config."""
    return render(config)


# -- valid for import --------------------------------------------------------------------------


def test_every_dashboard_is_built_with_its_uid(boards: dict[str, dict[str, Any]]) -> None:
    """The five dashboards come out, keyed by their stable uid, tagged vllm-obs."""
    assert set(boards) == UIDS
    for uid, board in boards.items():
        assert board["uid"] == uid
        assert "vllm-obs" in board["tags"]
        assert board["title"].startswith("vllm-obs / ")


def test_panel_ids_are_unique(boards: dict[str, dict[str, Any]]) -> None:
    """Every panel (rows included) has an id, unique within its dashboard."""
    for uid, board in boards.items():
        ids = [p["id"] for p in iter_panels(board)]
        assert all(isinstance(i, int) and i > 0 for i in ids), uid
        assert len(ids) == len(set(ids)), uid


def test_panel_titles_are_unique(boards: dict[str, dict[str, Any]]) -> None:
    """Panel titles are unique within a dashboard (all_queries names panels by title)."""
    for uid, board in boards.items():
        titles = [p["title"] for p in iter_panels(board) if p["type"] != "row"]
        assert len(titles) == len(set(titles)), uid


def test_grid_positions_fit_and_do_not_overlap(boards: dict[str, dict[str, Any]]) -> None:
    """Every panel lies within the 24 columns and no two panels overlap."""
    for uid, board in boards.items():
        boxes = []
        for p in board["panels"]:
            g = p["gridPos"]
            assert g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["y"] >= 0, (uid, p["title"])
            assert g["x"] + g["w"] <= WIDTH, (uid, p["title"])
            boxes.append((p["title"], g["x"], g["y"], g["x"] + g["w"], g["y"] + g["h"]))
        for i, (t1, x1, y1, x2, y2) in enumerate(boxes):
            for t2, a1, b1, a2, b2 in boxes[i + 1 :]:
                overlap = x1 < a2 and a1 < x2 and y1 < b2 and b1 < y2
                assert not overlap, f"{uid}: {t1!r} overlaps {t2!r}"


def test_datasource_references_are_defined(boards: dict[str, dict[str, Any]]) -> None:
    """Every querying panel and target uses a datasource variable the dashboard defines."""
    for uid, board in boards.items():
        variables = board_variables(board)
        refs: list[dict[str, Any]] = []
        for panel in iter_panels(board):
            if panel.get("targets"):
                refs.append(panel["datasource"])
                refs.extend(t["datasource"] for t in panel["targets"])
        refs.extend(v["datasource"] for v in variables.values() if v["type"] == "query")
        for ref in refs:
            m = re.fullmatch(r"\$\{(\w+)\}", ref["uid"])
            assert m, f"{uid}: datasource {ref} is not a variable"
            var = variables.get(m.group(1))
            assert var is not None, f"{uid}: datasource variable {m.group(1)} is not defined"
            assert var["type"] == "datasource" and var["query"] == ref["type"], (uid, ref)


def test_template_variables_used_are_defined_and_used(boards: dict[str, dict[str, Any]]) -> None:
    """Every $variable a dashboard refers to is defined there, and every one defined is used."""
    for uid, board in boards.items():
        defined = set(board_variables(board))
        body = {k: v for k, v in board.items() if k != "templating"}
        used_in_body = {n for s in strings(body) for n in referenced(s)}
        used_in_vars = {
            n for v in board_variables(board).values() for n in referenced(str(v["query"]))
        }
        used = {n for n in used_in_body | used_in_vars if not n.startswith("__")}
        assert used <= defined, f"{uid}: undefined variables {sorted(used - defined)}"
        assert defined <= used, f"{uid}: unused variables {sorted(defined - used)}"


def test_trace_links_open_tempo_explore_with_traceql(boards: dict[str, dict[str, Any]]) -> None:
    """Latency panels link to Explore on the $traces datasource with a TraceQL query."""
    found = 0
    for board in boards.values():
        for panel in iter_panels(board):
            for link in panel.get("fieldConfig", {}).get("defaults", {}).get("links", []):
                url = urlsplit(link["url"])
                if url.path != "/explore":
                    continue
                panes = json.loads(unquote(parse_qs(url.query)["panes"][0]))
                (pane,) = panes.values()
                assert pane["datasource"] == "${traces}"
                (query,) = pane["queries"]
                assert query["datasource"] == {"type": "tempo", "uid": "${traces}"}
                assert query["queryType"] == "traceql"
                assert "span.vllm_obs.lane" in query["query"]
                assert panel["fieldConfig"]["defaults"]["unit"] == "s"
                found += 1
    assert found >= 5


# -- names -------------------------------------------------------------------------------------


def _vllm_reference_series() -> set[str]:
    names = set()
    text = VLLM_REFERENCE.read_text(encoding="utf-8") + VLLM_FEATURES.read_text(encoding="utf-8")
    for line in text.splitlines():
        if line and not line.startswith("#"):
            names.add(re.match(r"[A-Za-z_:][\w:]*", line).group(0))  # type: ignore[union-attr]
    return names


def _allowed_names(config: Config) -> set[str]:
    ours = {s for m in c.ALL_METRICS for s in m.series}
    windows = {w for lane in config.lanes for b in lane.slo.burn_windows for w in (b.long, b.short)}
    rules = {c.sli_error_rule(w) for w in windows} | {c.burn_rate_rule(w) for w in windows}
    rules |= {c.burn_by_cause_rule(w) for w in windows} | {c.burn_by_phase_rule(w) for w in windows}
    rules |= {
        c.SLO_OBJECTIVE_RULE,
        c.ERROR_BUDGET_REMAINING_RULE,
        c.POOL_PREFIX_HIT_RATIO_RULE,
        c.LANE_REJECTION_RATIO_RULE,
    }
    vllm = {
        s
        for name in c.VLLM_METRICS
        for s in (name, f"{name}_bucket", f"{name}_sum", f"{name}_count")
    }
    return ours | rules | (vllm & _vllm_reference_series()) | (set(c.DCGM_METRICS) & _dcgm_page())


def _dcgm_page() -> set[str]:
    """The metric names of the dcgm-exporter page written from its default counters."""
    text = DCGM_PAGE.read_text(encoding="utf-8")
    return {line.split("{")[0] for line in text.splitlines() if line and line[0] != "#"}


def test_gpu_panels_read_dcgm_counters_by_pod() -> None:
    """The pools dashboard's GPU panels name dcgm-exporter's counters, keyed by pod and host
    under either spelling of its host label (the GPU rules' two), the legend naming the one
    set."""
    board = render(CONFIGS["default"])["vllm-obs-pools"]
    gpu = [x for x in board_exprs(board) if "DCGM_" in x]
    assert {n for x in gpu for n in metric_names(x)} == set(c.DCGM_METRICS) == _dcgm_page()
    assert set(HOST) == set(GPU) - {"gpu"} == {"Hostname", "hostname"}
    assert gpu and all("Hostname, hostname, pod" in x for x in gpu)
    legends = {
        t["legendFormat"]
        for p in iter_panels(board)
        for t in p.get("targets", [])
        if "DCGM_" in t["expr"]
    }
    assert legends == {"{{Hostname}}{{hostname}} {{pod}}"}


def test_every_metric_is_in_conventions_or_vllm_reference(
    config: Config, boards: dict[str, dict[str, Any]]
) -> None:
    """Panels and variable queries name only conventions metrics, rules, or vLLM's real names."""
    allowed = _allowed_names(config)
    for uid, board in boards.items():
        names: set[str] = set()
        for expr in board_exprs(board):
            assert metric_names(expr), f"{uid}: no metric in {expr!r}"
            names |= metric_names(expr)
        for var in board_variables(board).values():
            if var["type"] == "query":
                names |= variable_query_names(var["query"])
        assert names <= allowed, f"{uid}: unknown names {sorted(names - allowed)}"


def test_vllm_names_the_dashboards_use_are_real() -> None:
    """Every vLLM metric the dashboards query appears in vLLM 0.32's /metrics output."""
    reference = _vllm_reference_series()
    used = {
        n
        for board in render(CONFIGS["default"]).values()
        for expr in board_exprs(board)
        for n in metric_names(expr)
        if n.startswith("vllm:")
    }
    assert used, "the pools dashboard queries vLLM's own histograms"
    assert used <= reference, sorted(used - reference)


def test_latency_slo_thresholds_are_exporter_buckets(config: Config) -> None:
    """Every le="..." a panel selects is a bucket bound the exporter writes for that config."""
    bounds = {
        c.bucket_le(b)
        for b in c.merged_buckets(c.LATENCY_BUCKETS, config.slo_thresholds_s("ttft"))
        + c.merged_buckets(c.TOKEN_LATENCY_BUCKETS, config.slo_thresholds_s("tpot"))
    }
    les = {
        le
        for board in render(config).values()
        for e in board_exprs(board)
        for le in re.findall(r'le="([^"]+)"', e)
    }
    assert les <= bounds, sorted(les - bounds)
    if config is CONFIGS["custom"]:
        assert "0.333" in les


def test_recording_rules_used_are_generated() -> None:
    """Each recording rule the default dashboards read is recorded by the committed rule files."""
    files = sorted(RULES_DIR.glob("*.y*ml")) if RULES_DIR.is_dir() else []
    if not files:
        pytest.skip("deploy/prometheus/rules/ not generated yet (obs.alerts)")
    recorded = {
        rule["record"]
        for f in files
        for group in (yaml.safe_load(f.read_text(encoding="utf-8")) or {}).get("groups", [])
        for rule in group.get("rules", [])
        if "record" in rule
    }
    used = {
        n
        for board in render(CONFIGS["default"]).values()
        for expr in board_exprs(board)
        for n in metric_names(expr)
        if n.startswith(f"{c.RULE_PREFIX}:")
    }
    assert used <= recorded, sorted(used - recorded)


# -- what the dashboards show ------------------------------------------------------------------
