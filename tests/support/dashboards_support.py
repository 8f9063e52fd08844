"""What the dashboard suites share: the dashboards' uids, the configs they are checked
against (the shipped one, a single upstream, and a custom one with odd burn windows), and
readers of a rendered dashboard."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from obs.config import Config, default_config_path, load_config, parse_config, single_upstream
from obs.dashboards.build import iter_panels

UIDS = {
    "vllm-obs-overview",
    "vllm-obs-lane",
    "vllm-obs-pools",
    "vllm-obs-admission",
    "vllm-obs-slo",
}


def custom_config() -> Config:
    """One lane with unusual burn windows and a latency SLO that is not a default bucket."""
    return parse_config(
        {
            "pools": [
                {"name": "gpu", "replicas": ["http://127.0.0.1:9"], "kv_cache_usage_max": 0.8}
            ],
            "lanes": [
                {
                    "name": "solo",
                    "pool": "gpu",
                    "slo": {
                        "ttft": {"threshold_ms": 333, "objective": 0.9},
                        "cache_hit_ratio_min": 0.4,
                        "burn_windows": [
                            {"severity": "page", "long": "2h", "short": "10m", "factor": 9},
                            {"severity": "ticket", "long": "4d", "short": "8h", "factor": 1.5},
                        ],
                    },
                }
            ],
            "default_lane": "solo",
        }
    )


CONFIGS = {
    "default": load_config(default_config_path()),
    "single-upstream": single_upstream("http://127.0.0.1:8001"),
    "custom": custom_config(),
}


def board_exprs(board: dict[str, Any]) -> Iterator[str]:
    for panel in iter_panels(board):
        for target in panel.get("targets", []):
            yield target["expr"]


def board_variables(board: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in board["templating"]["list"]}
