"""No rule for a lane that lacks what it measures: a settings-change regression only on the
latency SLOs a lane declares, invalid JSON only where requests ask for JSON, the lane's cache
ratio only where its engine reports cached tokens in its answers."""

from __future__ import annotations

from typing import Any

from obs import conventions as c
from obs.alerts.model import build_model
from obs.alerts.rules import alerts, rule_files
from obs.config import default_config_path, load_config, parse_config


def _lanes(files: dict[str, Any], alert: str) -> list[tuple[str, str]]:
    return sorted(
        (a["labels"]["lane"], a["labels"].get("slo", ""))
        for a in alerts(files)
        if a["alert"] == alert
    )


def test_default_config_judges_only_what_each_lane_measures() -> None:
    """batch (availability only) gets no settings-change regression; slow-stream (TTFT only)
    gets TTFT's alone; invalid JSON only for agent (tools) and batch (a JSON response_format)."""
    files = rule_files(build_model(load_config(default_config_path())))
    regressions = _lanes(files, c.ALERT_SETTINGS_CHANGE_REGRESSION)
    assert ("batch", "ttft") not in regressions and ("batch", "tpot") not in regressions
    assert [r for r in regressions if r[0] == "slow-stream"] == [("slow-stream", "ttft")]
    assert ("chat", "tpot") in regressions
    assert [lane for lane, _ in _lanes(files, c.ALERT_INVALID_JSON_HIGH)] == ["agent", "batch"]


def test_invalid_json_for_a_lane_that_sets_its_own_threshold() -> None:
    """A lane without JSON match rules that sets alerts.invalid_json_ratio_max is judged."""
    config = {
        "pools": [{"name": "p", "replicas": ["http://127.0.0.1:1"]}],
        "lanes": [
            {"name": "plain", "pool": "p"},
            {"name": "extract", "pool": "p", "alerts": {"invalid_json_ratio_max": 0.01}},
        ],
        "default_lane": "plain",
    }
    files = rule_files(build_model(parse_config(config)))
    assert _lanes(files, c.ALERT_INVALID_JSON_HIGH) == [("extract", "")]


def test_cache_floor_needs_cached_tokens_in_answers() -> None:
    """A simulated pool (its answers carry no cached-token count) gets no lane cache rule;
    the same lane on a vLLM pool does, on the lane's own tokens."""

    def config(engine: str) -> dict[str, Any]:
        return {
            "pools": [
                {"name": "p", "replicas": ["http://127.0.0.1:1"], "engine": {"kind": engine}}
            ],
            "lanes": [{"name": "rag", "pool": "p", "slo": {"cache_hit_ratio_min": 0.3}}],
            "default_lane": "rag",
        }

    sim = rule_files(build_model(parse_config(config("sim"))))
    assert _lanes(sim, c.ALERT_PREFIX_CACHE_HIT_RATIO_LOW) == []
    vllm = rule_files(build_model(parse_config(config("vllm"))))
    (rule,) = [a for a in alerts(vllm) if a["alert"] == c.ALERT_PREFIX_CACHE_HIT_RATIO_LOW]
    assert 'vllm_obs_cached_tokens_total{lane="rag"}' in rule["expr"]
