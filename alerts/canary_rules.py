"""The canary alert: a split lane's canary arm is worse than its baseline by the margins.

One ``VllmObsCanaryRollback`` rule per canary arm and signal (``slo`` label: ttft, tpot,
availability), on the same conditions as ``vllm-obs query canary``'s roll back, over the
lane's ``canary.window``:

* p95 TTFT (TPOT) of the requests the canary pool served above (1 + margin) times the
  baseline pool's, from the sidecar's histograms (``histogram_quantile``: the bucket
  bounds limit its resolution);
* the canary arm's share of failed requests (``vllm_obs_lane_arm_requests_total``,
  rejected and disconnected left out, as the availability SLO does) above the lane's error
  budget (1 - availability objective).

Each holds only while both arms saw ``min_requests`` requests in the window. Prometheus
cannot run ``query canary``'s significance tests; the request floor is the alert's guard
against noise, so confirm a firing alert with ``query canary`` before rolling back.
"""

from __future__ import annotations

from obs import conventions as c

from . import expr as e
from .model import HEALTH_POLICY, AlertModel, CanaryArm
from .slo_rules import Group, Rule

LATENCY = {"ttft": c.TTFT, "tpot": c.TPOT}
QUANTILE = 0.95


def canary_groups(model: AlertModel) -> list[Group]:
    """One group with every canary arm's rules (empty config: no group)."""
    rules = [r for arm in model.canaries for r in canary_rules(model, arm)]
    return [{"name": "vllm-obs-canary", "rules": rules}] if rules else []


def p95(kind: str, arm: CanaryArm, pool: str) -> str:
    """p95 of a latency histogram over the lane's requests a pool served, in the window."""
    bucket = LATENCY[kind].series[0]
    sel = e.selector(bucket, e.eq(c.LANE, arm.lane), e.eq(c.POOL, pool))
    return f"histogram_quantile({QUANTILE}, {e.agg('sum', e.rate(sel, arm.window), 'le')})"


def arm_requests(arm: CanaryArm, pool: str, *matchers: str) -> str:
    """The arm's requests over the window (all outcomes, or those ``matchers`` select)."""
    sel = e.selector(
        c.LANE_ARM_REQUESTS.series[0], e.eq(c.LANE, arm.lane), e.eq(c.ARM, pool), *matchers
    )
    return sel


def enough(arm: CanaryArm) -> str:
    """Both arms saw ``min_requests`` requests in the window."""
    return "\nand on ()\n".join(
        f"{e.agg('sum', e.increase(arm_requests(arm, pool), arm.window))} >= {arm.min_requests}"
        for pool in (arm.canary, arm.baseline)
    )


def error_ratio(arm: CanaryArm) -> str:
    """The canary arm's share of counted requests that failed server-side."""
    bad = arm_requests(arm, arm.canary, e.one_of(c.OUTCOME, c.BAD_OUTCOMES))
    counted = arm_requests(
        arm, arm.canary, e.one_of(c.OUTCOME, c.AVAILABILITY_EXCLUDED_OUTCOMES, negate=True)
    )
    total = e.agg("sum", e.rate(counted, arm.window))
    return f"{e.agg('sum', e.rate(bad, arm.window))}\n/\n{e.positive(total)}"


def canary_rules(model: AlertModel, arm: CanaryArm) -> list[Rule]:
    """The arm's alerting rules: p95 TTFT, p95 TPOT, and availability if the lane has one."""
    guard = enough(arm)
    out = []
    for kind, margin in (("ttft", arm.ttft_p95_margin), ("tpot", arm.tpot_p95_margin)):
        factor = e.num(round(1 + margin, 6))
        cond = f"{p95(kind, arm, arm.canary)}\n> {factor} * {p95(kind, arm, arm.baseline)}"
        what = f"p95 {kind.upper()}"
        out.append(
            _rule(
                model,
                arm,
                kind,
                f"{cond}\nand on ()\n{guard}",
                f"{what} of canary {arm.canary} in lane {arm.lane} is {{{{ $value | "
                f"humanizeDuration }}}}, over {factor}x the baseline's",
                f"Over the last {arm.window}, the p95 {kind.upper()} of lane {arm.lane}'s "
                f"requests served by canary pool {arm.canary} ({{{{ $value | humanizeDuration "
                f"}}}}) is more than {margin * 100:g}% above baseline pool {arm.baseline}'s, "
                f"with at least {arm.min_requests} requests on each arm.",
            )
        )
    if arm.availability_objective is not None:
        budget = round(1 - arm.availability_objective, 12)
        out.append(
            _rule(
                model,
                arm,
                "availability",
                f"{error_ratio(arm)}\n> {e.num(budget)}\nand on ()\n{guard}",
                f"Canary {arm.canary} in lane {arm.lane} fails {{{{ $value | "
                "humanizePercentage }} of its requests",
                f"Over the last {arm.window}, {{{{ $value | humanizePercentage }}}} of lane "
                f"{arm.lane}'s requests on canary arm {arm.canary} failed server-side, above "
                f"the lane's error budget of {e.num(budget * 100)}% (availability objective "
                f"{e.num(arm.availability_objective * 100)}%).",
            )
        )
    return out


def _rule(
    model: AlertModel, arm: CanaryArm, kind: str, expr: str, summary: str, description: str
) -> Rule:
    policy = HEALTH_POLICY[c.ALERT_CANARY_ROLLBACK]
    return {
        "alert": c.ALERT_CANARY_ROLLBACK,
        "expr": expr,
        "for": policy.for_,
        "labels": {
            c.SEVERITY: policy.severity,
            c.LANE: arm.lane,
            c.POOL: arm.canary,
            c.BASELINE_LABEL: arm.baseline,
            c.SLO_LABEL: kind,
        },
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": model.runbook(c.ALERT_CANARY_ROLLBACK),
        },
    }
