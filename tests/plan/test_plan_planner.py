"""The planner on a traffic of known shape: one busy lane, one quiet lane, one pool."""

from __future__ import annotations

from pathlib import Path

import pytest

from obs.plan.command import load, pool_models
from obs.plan.planner import PoolPlanner
from obs.plan.report import lanes_yaml
from obs.plan.traffic import LaneTraffic, Shape, Traffic

PROFILE = Path(__file__).resolve().parents[2] / "obs" / "data" / "profile-single-balanced.yaml"
CHAT = [Shape(400 + 40 * i, 100 + 10 * i, 512, True) for i in range(12)]


@pytest.fixture(scope="module")
def planned() -> tuple[PoolPlanner, dict]:
    config, data, gpus = load(PROFILE)
    models = pool_models(config, gpus, [], [])
    lanes = {ln.name: LaneTraffic(ln.name, ln.pool, [0] * 6) for ln in config.lanes}
    lanes["chat"] = LaneTraffic("chat", "main", [40, 80, 120, 80, 40, 20], list(CHAT), 380)
    traffic = Traffic(bin_s=10.0, span_s=60.0, lanes=lanes, events=380)
    planner = PoolPlanner(config, models["main"], traffic, 4.0, 0.3, seed=1)
    planner.run()
    return planner, data


def test_the_plan_is_the_fewest_replicas_meeting_every_slo(
    planned: tuple[PoolPlanner, dict],
) -> None:
    """Every lane meets its SLOs at the plan; one replica fewer (with the limits) a lane
    misses; the unlimited curve meets at the plan's size plus one."""
    planner, _ = planned
    plan = planner.plan
    assert plan.replicas is not None and plan.at_plan is not None and plan.at_plan.met
    if plan.replicas > 1:
        assert plan.one_fewer is not None and plan.one_fewer.missing
        assert plan.one_fewer.replicas == plan.replicas - 1
    assert plan.curve[plan.replicas + 1].met


def test_a_lane_without_traffic_keeps_its_configured_limits(
    planned: tuple[PoolPlanner, dict],
) -> None:
    """Limits are planned for the lanes with traffic only; the written config leaves a quiet
    lane's admission as it was (no limit of 1 from a rate of 0)."""
    planner, data = planned
    assert set(planner.plan.limits) == {"chat"}
    written = lanes_yaml(data, [planner.plan])
    by_name = {ln["name"]: ln for ln in written["lanes"]}
    original = {ln["name"]: ln for ln in load(PROFILE)[1]["lanes"]}
    assert by_name["batch"].get("admission") == original["batch"].get("admission")
    assert (
        by_name["chat"]["admission"]["max_concurrency"]
        == planner.plan.limits["chat"].max_concurrency
    )


def test_the_peak_rate_is_the_busiest_interval_grown(planned: tuple[PoolPlanner, dict]) -> None:
    """The limits come from the busiest interval: 120 requests in 10 s at growth 4 = 48/s."""
    planner, _ = planned
    assert planner.plan.peak_rate["chat"] == pytest.approx(48.0)
    assert planner.plan.limits["chat"].in_flight == pytest.approx(
        48.0 * planner.plan.service_s["chat"], abs=1e-3
    )
