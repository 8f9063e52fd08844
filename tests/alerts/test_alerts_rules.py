"""The generated rules: names from conventions, SLI semantics, annotations, runbook links."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from obs import conventions as c
from obs.alerts.model import build_model
from obs.alerts.rules import alerts, rule_files
from obs.config import default_config_path, load_config, parse_config
from tests.support.promql_names import metric_names

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "docs" / "runbook.md"


@pytest.fixture(scope="module")
def files() -> dict[str, Any]:
    """Rule files for the shipped default config."""
    return rule_files(build_model(load_config(default_config_path())))


def _rules(files: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for f in files.values() for g in f["groups"] for r in g["rules"]]


def _conventions_rule_names(files: dict[str, Any]) -> set[str]:
    windows = {
        m.group(1)
        for r in _rules(files)
        for m in [re.search(r"ratio_rate(\w+)$", r.get("record", ""))]
        if m
    }
    return {
        c.SLO_OBJECTIVE_RULE,
        c.ERROR_BUDGET_REMAINING_RULE,
        c.POOL_PREFIX_HIT_RATIO_RULE,
        c.LANE_REJECTION_RATIO_RULE,
        *(c.sli_error_rule(w) for w in windows),
        *(c.burn_rate_rule(w) for w in windows),
        *(c.burn_by_cause_rule(w) for w in windows),
        *(c.burn_by_phase_rule(w) for w in windows),
    }


def test_every_promql_name_is_defined_in_conventions(files: dict[str, Any]) -> None:
    """Each metric an expression reads is a conventions series or a conventions rule name."""
    series = {name for m in c.ALL_METRICS for name in m.series}
    known = series | set(c.VLLM_METRICS) | set(c.DCGM_METRICS) | _conventions_rule_names(files)
    known |= set(c.DCGM_FAULT_METRICS)  # obs.alerts.gpu_fault_rules
    known |= {f"{n}_{part}" for n in c.VLLM_METRICS for part in ("sum", "count")}  # histograms
    for rule in _rules(files):
        unknown = metric_names(rule["expr"]) - known
        assert not unknown, f"{rule.get('record') or rule.get('alert')}: {unknown}"


def test_every_recorded_name_comes_from_conventions(files: dict[str, Any]) -> None:
    """The generator records only names that conventions builds (dashboards read them)."""
    records = {r["record"] for r in _rules(files) if "record" in r}
    assert records <= _conventions_rule_names(files)
    assert c.sli_error_rule(c.SLO_PERIOD) in records
    assert c.burn_rate_rule("5m") in records and c.burn_rate_rule("3d") in records


def test_slo_series_carry_lane_and_slo_labels(files: dict[str, Any]) -> None:
    """Every SLO recording rule labels its series with lane and slo (a lane's burn by phase
    and cause keeps them from the series it sums, by lane and slo)."""
    split = re.compile(r"burn_rate_by_(cause|phase):")
    for name, f in files.items():
        if not name.startswith("slo-"):
            continue
        for rule in _rules({name: f}):
            if "record" in rule and split.search(rule["record"]):
                assert "labels" not in rule
                assert f"sum by ({c.LANE}, {c.SLO_LABEL}, {c.PHASE}" in rule["expr"]
            elif "record" in rule:
                assert set(rule["labels"]) == {c.LANE, c.SLO_LABEL}
                assert rule["labels"][c.SLO_LABEL] in c.SLO_KINDS


def test_latency_sli_reads_the_bucket_at_the_threshold(files: dict[str, Any]) -> None:
    """The TTFT SLI of chat reads le="0.5", a bound the sidecar's histogram has exactly."""
    config = load_config(default_config_path())
    bounds = c.merged_buckets(c.LATENCY_BUCKETS, config.slo_thresholds_s("ttft"))
    rule = next(
        r
        for r in _rules(files)
        if r.get("record") == c.sli_error_rule("5m")
        and r["labels"] == {"lane": "chat", "slo": "ttft"}
    )
    assert 'vllm_obs_ttft_seconds_bucket{lane="chat",le="0.5"}[5m]' in rule["expr"]
    assert 0.5 in bounds and c.bucket_le(0.5) == "0.5"
    long_prefill = next(
        r
        for r in _rules(files)
        if r.get("record") == c.sli_error_rule("5m")
        and r["labels"] == {"lane": "long-prefill", "slo": "ttft"}
    )
    assert 'le="3.0"' in long_prefill["expr"]


def test_availability_sli_counts_only_server_errors_among_judged_requests(
    files: dict[str, Any],
) -> None:
    """Only outcome=error is bad; rejections and disconnects are outside the SLI."""
    rule = next(
        r
        for r in _rules(files)
        if r.get("record") == c.sli_error_rule("1h")
        and r["labels"] == {"lane": "chat", "slo": "availability"}
    )
    expr = rule["expr"]
    assert 'outcome="error"' in expr
    assert 'outcome!~"rejected|client_disconnect"' in expr
    assert "client_error" not in expr
    assert " or\n  0 * " in expr  # no error series yet means 0, not no data


def test_burn_alerts_follow_the_lane_windows(files: dict[str, Any]) -> None:
    """One alert per SLO and burn window, both windows compared with the window's factor,
    each with its evidence floor: 20 requests in the long window, the same rate in the short."""
    chat_ttft = [
        a
        for a in alerts(files)
        if a["alert"] == c.ALERT_TTFT_BUDGET_BURN and a["labels"]["lane"] == "chat"
    ]
    assert [(a["labels"]["long_window"], a["for"], a["labels"]["severity"]) for a in chat_ttft] == [
        ("1h", "2m", "page"),
        ("6h", "15m", "page"),
        ("1d", "1h", "ticket"),
        ("3d", "3h", "ticket"),
    ]
    assert chat_ttft[0]["expr"] == (
        'vllm_obs:burn_rate:ratio_rate1h{lane="chat",slo="ttft"} > 14.4\n'
        "and\n"
        'vllm_obs:burn_rate:ratio_rate5m{lane="chat",slo="ttft"} > 14.4\n'
        "and on (lane)\n"
        'sum by (lane) (increase(vllm_obs_ttft_seconds_count{lane="chat"}[1h])) >= 20\n'
        "and on (lane)\n"
        'sum by (lane) (increase(vllm_obs_ttft_seconds_count{lane="chat"}[5m])) >= 2'
    )


def test_overridden_windows_change_recordings_and_alerts() -> None:
    """A lane with its own burn windows records exactly those windows plus the SLO period."""
    config = parse_config(
        {
            "pools": [{"name": "p", "replicas": ["http://127.0.0.1:8001"]}],
            "lanes": [
                {
                    "name": "a",
                    "pool": "p",
                    "slo": {
                        "availability": {"objective": 0.99},
                        "burn_windows": [
                            {"severity": "page", "long": "2h", "short": "10m", "factor": 8}
                        ],
                    },
                }
            ],
            "default_lane": "a",
        }
    )
    files = rule_files(build_model(config))
    records = {r["record"] for r in _rules(files) if "record" in r}
    assert c.sli_error_rule("10m") in records and c.sli_error_rule("2h") in records
    assert c.sli_error_rule("1h") not in records
    (burn,) = [a for a in alerts(files) if a["alert"] == c.ALERT_AVAILABILITY_BUDGET_BURN]
    assert burn["for"] == "0m" and "> 8\n" in burn["expr"]


def test_every_alert_is_named_in_conventions_and_generated(files: dict[str, Any]) -> None:
    """The default config yields every alert in ALL_ALERTS but those of split lanes, of flow
    control and of ITL SLOs (it has none; tests/alerts/test_alerts_canary.py,
    tests/alerts/test_alerts_flow.py, tests/alerts/test_alerts_itl.py), and no other."""
    optional = {*c.SPLIT_ALERTS, *c.FLOW_ALERTS, c.ALERT_ITL_BUDGET_BURN}
    assert {a["alert"] for a in alerts(files)} == set(c.ALL_ALERTS) - optional


def test_burn_alerts_name_the_top_phase_cause_and_budget_command(files: dict[str, Any]) -> None:
    """Each burn-rate alert asks its long window's burn by cause for the top phase and cause,
    and names the `vllm-obs query budget` command for its lane and window."""
    burn = [a for a in alerts(files) if a["alert"] in c.BUDGET_BURN_ALERTS.values()]
    assert burn
    for a in burn:
        lane, slo, window = (a["labels"][k] for k in ("lane", "slo", c.LONG_WINDOW))
        rule = c.burn_by_cause_rule(window)
        query = f'topk(1, {rule}{{lane="{lane}",slo="{slo}"}})'
        assert f"{{{{ range query `{query}` }}}}" in a["annotations"]["top_cause"]
        assert a["annotations"]["budget_query"].startswith(
            f"vllm-obs query budget --lane {lane} --window {window} "
        )


def test_alert_rules_are_distinct_by_labels(files: dict[str, Any]) -> None:
    """No two alerting rules share a name and static labels (their alerts would merge)."""
    keys = [(a["alert"], tuple(sorted(a["labels"].items()))) for a in alerts(files)]
    assert len(keys) == len(set(keys))


def test_every_alert_has_severity_summary_description_and_runbook(files: dict[str, Any]) -> None:
    """Annotations name the lane, pool, exporter, sidecar (or GPU host) and the value, and link
    a runbook."""
    for a in alerts(files):
        labels, notes = a["labels"], a["annotations"]
        assert labels["severity"] in ("page", "ticket")
        budget = (
            {"top_cause", "budget_query"} if a["alert"] in c.BUDGET_BURN_ALERTS.values() else set()
        )
        assert set(notes) == {"summary", "description", "runbook_url", *budget}
        process = "{{ $labels.instance }}" if a["alert"] == c.ALERT_EVENT_LOOP_LAG_HIGH else None
        if a["alert"] in (
            c.ALERT_GPU_MEMORY_HIGH,
            c.ALERT_GPU_UTILISATION_OUT_OF_BAND,
            *c.GPU_FAULT_ALERTS,
        ):
            process = "{{ $labels.Hostname }}"  # dcgm-exporter's series have no pool
        subject = labels.get("lane") or labels.get("pool") or process or "{{ $labels.exporter }}"
        for text in (notes["summary"], notes["description"]):
            assert subject in text, (a["alert"], text)
            assert "$value" in text, (a["alert"], text)
        assert notes["runbook_url"] == f"docs/runbook.md#{a['alert'].lower()}"


def test_runbook_has_a_section_for_every_alert(files: dict[str, Any]) -> None:
    """docs/runbook.md has a heading per alert whose anchor the runbook_url points at."""
    text = RUNBOOK.read_text(encoding="utf-8")
    anchors = {h.strip().lower() for h in re.findall(r"^## (.+)$", text, flags=re.MULTILINE)}
    for name in c.ALL_ALERTS:
        assert name.lower() in anchors, name
    for a in alerts(files):
        assert a["annotations"]["runbook_url"].split("#")[1] in anchors
    for part in ("**Meaning.**", "**Look first.**", "**Likely causes and fixes.**"):
        assert text.count(part) == len(c.ALL_ALERTS), part


def test_prefix_cache_alert_reads_the_lanes_own_tokens(files: dict[str, Any]) -> None:
    """The cache floor of a lane judges its own cached over prompt tokens (the sidecar's
    per-lane counters), not its pool's ratio, and only with 20 requests in the window."""
    (rag,) = [
        a
        for a in alerts(files)
        if a["alert"] == c.ALERT_PREFIX_CACHE_HIT_RATIO_LOW and a["labels"]["lane"] == "rag"
    ]
    assert rag["expr"].startswith(
        'sum by (lane) (rate(vllm_obs_cached_tokens_total{lane="rag"}[5m]))\n/\n'
        '(sum by (lane) (rate(vllm_obs_prompt_tokens_total{lane="rag"}[5m])) > 0)\n< 0.3\n'
    )
    assert "lane_info" not in rag["expr"] and "pool_prefix" not in rag["expr"]
    assert rag["expr"].endswith(
        'sum by (lane) (increase(vllm_obs_requests_total{lane="rag"}[5m])) >= 20'
    )
    lanes = {
        a["labels"]["lane"]
        for a in alerts(files)
        if a["alert"] == c.ALERT_PREFIX_CACHE_HIT_RATIO_LOW
    }
    assert lanes == {"rag", "agent"}  # only lanes with cache_hit_ratio_min


def test_alerts_doc_names_every_alert_rule_and_bad_status() -> None:
    """docs/alerts.md lists every alert, every recording rule and the statuses counted as bad."""
    text = (ROOT / "docs" / "alerts.md").read_text(encoding="utf-8")
    for name in c.ALL_ALERTS:
        assert f"`{name}`" in text, name
    for name in (
        c.SLO_OBJECTIVE_RULE,
        c.ERROR_BUDGET_REMAINING_RULE,
        c.POOL_PREFIX_HIT_RATIO_RULE,
        c.LANE_REJECTION_RATIO_RULE,
        c.sli_error_rule("<W>"),
        c.burn_rate_rule("<W>"),
    ):
        assert f"`{name}`" in text, name
    for outcome in c.OUTCOMES:
        assert f"| `{outcome}` |" in text, outcome
    assert "**bad** (the only bad status)" in text and c.BAD_OUTCOMES == (c.ERROR,)
