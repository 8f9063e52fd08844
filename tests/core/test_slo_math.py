"""The SLO math, directly: error budgets, burn-rate windows and thresholds (unit + property)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from obs import conventions as c
from obs.alerts.model import build_model
from obs.alerts.series import sli_buckets
from obs.alerts.slo_rules import lane_groups
from obs.config import Config, parse_config
from obs.durations import seconds
from obs.errors import ConfigError
from obs.slo import objectives

_objective = st.floats(min_value=0.5, max_value=0.9999, allow_nan=False).map(lambda x: round(x, 4))
_factor = st.floats(min_value=1.0, max_value=2000.0, allow_nan=False).map(lambda x: round(x, 1))


def _config(slo: dict[str, Any]) -> Config:
    return parse_config(
        {
            "pools": [{"name": "p", "replicas": ["http://127.0.0.1:9"]}],
            "lanes": [{"name": "l", "pool": "p", "slo": slo}],
            "default_lane": "l",
        }
    )


def _window(factor: float, long: str = "1h", short: str = "5m") -> dict[str, Any]:
    return {"severity": "page", "long": long, "short": short, "factor": factor}


@given(_objective)
def test_error_budget_is_the_complement_of_the_objective(objective: float) -> None:
    """budget = 1 - objective (to 12 places), for the rules and the dashboards alike."""
    (o,) = objectives(_config({"availability": {"objective": objective}}).lanes[0])
    assert o.budget == pytest.approx(1 - objective, abs=1e-12)
    assert 0 < o.budget < 1


@given(_objective, _factor)
def test_a_burn_window_that_could_never_fire_is_refused(objective: float, factor: float) -> None:
    """factor x budget >= 1 needs over 100% of requests to fail: a ConfigError, else accepted."""
    config = _config({"availability": {"objective": objective}, "burn_windows": [_window(factor)]})
    budget = round(1 - objective, 12)
    if factor * budget >= 1:
        with pytest.raises(ConfigError, match="can never fire"):
            build_model(config)
    else:
        (sli,) = build_model(config).slis
        assert sli.windows[0].factor * sli.budget < 1


@pytest.mark.parametrize(("long", "short"), [("5m", "5m"), ("5m", "1h")])
def test_short_window_must_be_shorter_than_the_long_one(long: str, short: str) -> None:
    """A burn window whose short window is not shorter than its long one is refused."""
    config = _config({"availability": {}, "burn_windows": [_window(2, long, short)]})
    with pytest.raises(ConfigError, match="must be shorter"):
        build_model(config)


@given(st.floats(min_value=0.94, max_value=0.9999).map(lambda x: round(x, 4)))
def test_burn_rate_rules_divide_the_error_ratio_by_the_budget(objective: float) -> None:
    """Every burn-rate rule is its window's SLI error ratio over the budget; the period's
    budget remaining is 1 minus the period's burn rate."""
    model = build_model(_config({"availability": {"objective": objective}}))
    (sli,) = model.slis
    rules = {
        (r["record"]): r["expr"]
        for g in lane_groups(model, "l")
        for r in g["rules"]
        if "record" in r and r.get("labels", {}).get(c.SLO_LABEL) == sli.kind
    }
    for w in (*sli.rule_windows, c.SLO_PERIOD):
        assert rules[c.burn_rate_rule(w)].endswith(f" / {format(sli.budget, 'g')}")
        assert rules[c.burn_rate_rule(w)].startswith(c.sli_error_rule(w) + "{")
    assert rules[c.ERROR_BUDGET_REMAINING_RULE].startswith(f"1 - {c.burn_rate_rule(c.SLO_PERIOD)}")


@given(
    st.lists(st.sampled_from(["5m", "30m", "1h", "2h", "6h", "1d", "3d"]), min_size=2, max_size=8)
)
def test_rule_windows_are_unique_and_shortest_first(ws: list[str]) -> None:
    """rule_windows lists each window the alerts read once, ordered by duration."""
    pairs = [(a, b) for a, b in itertools.pairwise(ws) if seconds(b) < seconds(a)]
    if not pairs:
        return
    windows = [_window(1.5, long, short) for long, short in pairs]
    (sli,) = build_model(_config({"availability": {}, "burn_windows": windows})).slis
    got = sli.rule_windows
    assert len(set(got)) == len(got)
    assert [seconds(w) for w in got] == sorted(seconds(w) for w in got)
    assert set(got) == {w for p in pairs for w in p}


@given(st.floats(min_value=1, max_value=60_000, allow_nan=False).map(lambda x: round(x, 1)))
def test_latency_threshold_is_a_bucket_bound(threshold_ms: float) -> None:
    """The SLO's le label names a bucket the sidecar's histogram really has."""
    for kind in ("ttft", "tpot"):
        model = build_model(_config({kind: {"threshold_ms": threshold_ms}}))
        (sli,) = model.slis
        assert float(sli.le) in sli_buckets(sli)
        assert float(sli.le) == pytest.approx(threshold_ms / 1000, abs=1e-6)
