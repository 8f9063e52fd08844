"""The alerting model derived from the lanes/SLO config."""

from __future__ import annotations

from typing import Any

import pytest

from obs import conventions as c
from obs.alerts.model import HEALTH_POLICY, build_model
from obs.config import Config, default_config_path, load_config, parse_config
from obs.durations import seconds
from obs.errors import ConfigError


def _config(slo: dict[str, Any], **lane: Any) -> Config:
    return parse_config(
        {
            "pools": [{"name": "p", "replicas": ["http://127.0.0.1:8001"]}],
            "lanes": [{"name": "a", "pool": "p", "slo": slo, **lane}],
            "default_lane": "a",
        }
    )


def test_default_config_declares_every_slo_with_default_windows() -> None:
    """Each declared SLO of the shipped lanes becomes one SLI with the SRE-workbook windows."""
    model = build_model(load_config(default_config_path()))
    kinds = {(s.lane, s.kind) for s in model.slis}
    assert ("chat", "ttft") in kinds and ("batch", "availability") in kinds
    assert ("batch", "ttft") not in kinds
    chat = model.lane_slis("chat")
    assert [s.kind for s in chat] == ["ttft", "tpot", "availability"]
    assert [(w.long, w.short, w.factor, w.severity) for w in chat[0].windows] == [
        ("1h", "5m", 14.4, "page"),
        ("6h", "30m", 6.0, "page"),
        ("1d", "2h", 3.0, "ticket"),
        ("3d", "6h", 1.0, "ticket"),
    ]
    assert chat[0].rule_windows == ("5m", "30m", "1h", "2h", "6h", "1d", "3d")


def test_budget_and_threshold_are_rounded_like_the_buckets() -> None:
    """The budget is 1 - objective without float noise; the threshold matches the bucket bound."""
    model = build_model(_config({"ttft": {"threshold_ms": 333.3333333, "objective": 0.995}}))
    (sli,) = model.slis
    assert sli.budget == 0.005
    assert sli.threshold_s == c.merged_buckets((), [333.3333333 / 1000])[0]


def test_per_lane_burn_windows_override_the_defaults() -> None:
    """A lane's own burn_windows replace the default four."""
    windows = [{"severity": "page", "long": "2h", "short": "10m", "factor": 10, "for": "5m"}]
    model = build_model(_config({"availability": {}, "burn_windows": windows}))
    (sli,) = model.slis
    assert [(w.long, w.short, w.for_) for w in sli.windows] == [("2h", "10m", "5m")]
    assert sli.rule_windows == ("10m", "2h")


def test_unreachable_burn_factor_fails_naming_the_lane_and_slo() -> None:
    """A factor that needs more than 100% errors to fire is a config error, not a dead alert."""
    with pytest.raises(ConfigError, match=r"lanes\[a\]\.slo\.ttft: objective 0\.9 .*14\.4x"):
        build_model(_config({"ttft": {"threshold_ms": 500, "objective": 0.9}}))


def test_short_window_must_be_shorter_than_long() -> None:
    """A burn window whose short window is not shorter than its long one is rejected."""
    windows = [{"severity": "page", "long": "5m", "short": "1h", "factor": 2}]
    with pytest.raises(ConfigError, match=r"burn_windows\[0\]: short window 1h"):
        build_model(_config({"availability": {}, "burn_windows": windows}))


def test_queue_wait_threshold_is_half_the_tighter_of_ttft_and_queue_timeout() -> None:
    """Queue wait alerts at half the lane's TTFT threshold, or half its queue timeout if smaller."""
    lanes = {lane.lane: lane for lane in build_model(load_config(default_config_path())).lanes}
    assert lanes["chat"].queue_wait_max_s == 0.25  # TTFT 500 ms, timeout 2 s
    assert lanes["batch"].queue_wait_max_s == 30  # no TTFT SLO, timeout 60 s
    assert lanes["rag"].cache_hit_ratio_min == 0.3
    assert lanes["chat"].cache_hit_ratio_min is None


def test_runbook_links_use_github_anchors() -> None:
    """Runbook URLs end with the lower-cased alert name as the section anchor."""
    model = build_model(load_config(default_config_path()), runbook_url="https://x/runbook.md")
    assert model.runbook("VllmObsPoolDown") == "https://x/runbook.md#vllmobspooldown"


def test_every_health_alert_has_a_policy() -> None:
    """Severity and hold time are declared for every alert that is not a burn-rate alert."""
    burn = set(c.BUDGET_BURN_ALERTS.values())
    assert set(HEALTH_POLICY) == set(c.ALL_ALERTS) - burn
    assert all(
        p.severity in ("page", "ticket") and seconds(p.for_) > 0 for p in HEALTH_POLICY.values()
    )


def test_durations_parse_to_seconds() -> None:
    """Prometheus durations convert to seconds; anything else raises."""
    assert [seconds(d) for d in ("500ms", "30s", "5m", "1h", "3d", "1w")] == [
        0.5,
        30,
        300,
        3600,
        259200,
        604800,
    ]
    with pytest.raises(ValueError, match="not a Prometheus duration"):
        seconds("1h30m")


def test_queue_wait_threshold_stays_within_the_histogram_range() -> None:
    """A long queue timeout is capped so histogram_quantile can still exceed the threshold."""
    model = build_model(_config({}, admission={"queue_timeout_s": 600}))
    assert model.lanes[0].queue_wait_max_s == c.LATENCY_BUCKETS[-2]


def test_the_engine_queue_bound_follows_a_declared_max_num_seqs() -> None:
    """Unset, the queue alert's bound is the pool's declared max_num_seqs (else the guide's
    100); a pool's own alerts.engine_waiting_max wins over both."""
    from obs.config import parse_config

    def bound(**pool: object) -> float:
        config = parse_config(
            {
                "pools": [{"name": "gpu", "replicas": ["http://127.0.0.1:1"], **pool}],
                "lanes": [{"name": "chat", "pool": "gpu"}],
                "default_lane": "chat",
            }
        )
        return build_model(config).pools[0].engine_waiting_max

    assert bound() == 100
    assert bound(engine={"kind": "vllm", "max_num_seqs": 48}) == 48
    declared = {"kind": "vllm", "max_num_seqs": 48}
    assert bound(engine=declared, alerts={"engine_waiting_max": 200}) == 200
