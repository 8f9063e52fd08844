"""How the plan judges a replayed lane: the query layer's rules, latencies padded by the
simulator's calibration error, refusals counted as misses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from obs.config import Lane
from obs.plan.judge import DEFAULT_MARGIN, Outcome, calibration_margin, judge

ROOT = Path(__file__).resolve().parents[2]
LANE = Lane.model_validate(
    {
        "name": "chat",
        "pool": "main",
        "slo": {
            "ttft": {"threshold_ms": 500, "objective": 0.9},
            "tpot": {"threshold_ms": 50, "objective": 0.9},
            "availability": {"objective": 0.99},
        },
    }
)


def test_the_margin_pads_every_latency_before_the_threshold() -> None:
    """With a 25% margin, a TTFT of 400 ms meets a 500 ms SLO and one of 401 ms does not."""
    fine = [Outcome(ok=True, ttft_s=0.4, tpot_s=0.01)]
    late = [Outcome(ok=True, ttft_s=0.401, tpot_s=0.01)]
    assert judge(LANE, fine, 0.25).attainment["ttft"] == 1.0
    assert judge(LANE, late, 0.25).attainment["ttft"] == 0.0
    assert judge(LANE, late, 0.0).attainment["ttft"] == 1.0


def test_a_refused_request_misses_every_slo_of_its_lane() -> None:
    """Nine served in time and one refused: 90% on TTFT and TPOT (met at 0.9), 90%
    available (missed at 0.99), and the refusal is not good."""
    outs = [Outcome(ok=True, ttft_s=0.1, tpot_s=0.01, tokens=10)] * 9 + [
        Outcome(ok=False, rejected=True)
    ]
    v = judge(LANE, outs, 0.0)
    assert v.attainment == {"ttft": 0.9, "tpot": 0.9, "availability": 0.9}
    assert v.missed == ["availability"] and not v.met
    assert (v.offered, v.ok, v.rejected, v.good, v.tokens) == (10, 9, 1, 9, 90)
    assert v.expected == 0.9 and v.slack == pytest.approx(0.9 - 0.99)


def test_a_request_without_a_value_is_not_judged_on_it() -> None:
    """A one-token answer (no TPOT) counts for TTFT only, as in the query layer."""
    v = judge(LANE, [Outcome(ok=True, ttft_s=0.1, tpot_s=None)], 0.0)
    assert v.attainment["tpot"] == 1.0 and v.good == 1 and v.met


def test_a_lane_without_traffic_meets_its_slos() -> None:
    """No request offered: nothing missed (its attainment reads 1)."""
    v = judge(LANE, [], 0.3)
    assert v.met and v.offered == 0


def test_the_margin_is_the_repos_calibration_error() -> None:
    """The shipped bench/results/sim_calibration.json gives its largest held-out error inside
    the model's domain as the margin (whatever the latest round's is) and says where it came
    from."""
    path = ROOT / "bench" / "results" / "sim_calibration.json"
    margin, source = calibration_margin(path)
    held = json.loads(path.read_text(encoding="utf-8"))["summary"]["held_out_in_domain"]
    assert margin == held["max_error"] > 0
    assert "held-out" in source and "domain" in source and "sim_calibration.json" in source


def test_the_held_out_error_comes_before_the_fit_error(tmp_path: Path) -> None:
    """A calibration with held-out points is judged by the largest error of those inside the
    model's domain, else of all of them; without them by the fitted points'; without the
    file, the default margin."""
    path = tmp_path / "cal.json"
    held = {"max_error": 0.12, "median_error": 0.05, "points": 9}
    inside = {"max_error": 0.1, "points": 8}
    summary = {"fit": {"max_error": 0.3}, "held_out": held, "held_out_in_domain": inside}
    path.write_text(json.dumps({"summary": summary}))
    assert calibration_margin(path)[0] == 0.1
    path.write_text(json.dumps({"summary": {"fit": {"max_error": 0.3}, "held_out": held}}))
    assert calibration_margin(path)[0] == 0.12
    path.write_text(json.dumps({"summary": {"fit": {"max_error": 0.3, "points": 13}}}))
    margin, source = calibration_margin(path)
    assert margin == 0.3 and "fit" in source
    assert calibration_margin(tmp_path / "missing.json")[0] == DEFAULT_MARGIN
