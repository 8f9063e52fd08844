"""bench/canary_walkthrough.py's config: the shipped lanes with chat split across the demo's
pools, sticky per load session (the heavy run itself starts two engines: docs/runbook.md)."""

from __future__ import annotations

from pathlib import Path

from bench.canary_walkthrough import split_config
from obs.config import load_config


def test_the_walkthrough_splits_chat_between_the_demo_pools(tmp_path: Path) -> None:
    """chat becomes interactive (baseline) / bulk (canary), sticky by the session tenant; the
    other lanes keep their pools."""
    urls = {"interactive": ["http://127.0.0.1:1"], "bulk": ["http://127.0.0.1:2"]}
    path = tmp_path / "split.yaml"
    split_config(path, urls, (80, 20))
    config = load_config(path)
    chat = config.lane("chat")
    assert chat.arms == (("interactive", 80), ("bulk", 20)) and chat.pool == "interactive"
    assert chat.canaries == ("bulk",) and chat.canary_policy.sticky == "tenant"
    assert config.auth.tenant_header == "x-vllm-obs-session"
    assert all(lane.split is None for lane in config.lanes if lane.name != "chat")
