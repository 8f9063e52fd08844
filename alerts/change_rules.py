"""The alert on an in-place change: a pool's settings changed, and a lane it serves got
slower by the canary margins.

One ``VllmObsSettingsChangeRegression`` rule per lane and signal (``slo`` label: ttft, tpot),
on the same margins as ``vllm-obs query canary`` and ``query compare --around-changes``:

* the pool's last settings change (``vllm_obs_pool_settings_changed_timestamp_seconds``: a
  replica came back with another engine version or flags) is younger than ``change_recent``;
* the lane's p95 TTFT (TPOT) on that pool over the last ``change_after`` is more than
  (1 + margin) times its p95 over ``change_before`` ending ``change_recent`` ago (before the
  change), from the sidecar's histograms;
* the lane saw ``min_requests`` requests on the pool in the last ``change_after``.

Right after a change the short window still holds requests from before it; the alert's hold
(``for``) lets it fill. Prometheus cannot run the verdict's significance tests: confirm with
``vllm-obs query compare LOG --around-changes`` before rolling back.
"""

from __future__ import annotations

from obs import conventions as c
from obs.durations import seconds

from . import expr as e
from .canary_rules import LATENCY, QUANTILE
from .model import HEALTH_POLICY, AlertModel, LaneHealth
from .slo_rules import Group, Rule


def change_groups(model: AlertModel) -> list[Group]:
    """One group: each lane's TTFT and TPOT regression after its pool's settings change."""
    rules = [r for lane in model.lanes for r in change_rules(model, lane)]
    return [{"name": "vllm-obs-changes", "rules": rules}] if rules else []


def p95(kind: str, lane: LaneHealth, window: str, offset: str | None = None) -> str:
    """p95 of a latency histogram over the lane's requests on its pool in ``window``."""
    sel = e.selector(LATENCY[kind].series[0], e.eq(c.LANE, lane.lane), e.eq(c.POOL, lane.pool))
    rate = f"rate({sel}[{window}]{f' offset {offset}' if offset else ''})"
    return f"histogram_quantile({QUANTILE}, {e.agg('sum', rate, c.LANE, 'le')})"


def recent_change(model: AlertModel, pool: str) -> str:
    """The pool's last settings change is younger than ``change_recent``."""
    changed = e.selector(c.POOL_SETTINGS_CHANGED.name, e.eq(c.POOL, pool))
    limit = e.num(seconds(model.thresholds.change_recent))
    return f"time() - {e.agg('max', changed)} < {limit}"


def change_rules(model: AlertModel, lane: LaneHealth) -> list[Rule]:
    """The lane's rules: one per latency SLO it declares (TTFT, TPOT)."""
    th = model.thresholds
    policy = HEALTH_POLICY[c.ALERT_SETTINGS_CHANGE_REGRESSION]
    out: list[Rule] = []
    margins = {"ttft": lane.ttft_p95_margin, "tpot": lane.tpot_p95_margin}
    # Only the latency the lane has an SLO on: a lane without one (batch) has no regression.
    for kind, margin in ((k, margins[k]) for k in lane.latency_slos):
        count = e.selector(
            LATENCY[kind].series[2], e.eq(c.LANE, lane.lane), e.eq(c.POOL, lane.pool)
        )
        n = e.agg("sum", e.increase(count, th.change_after), c.LANE)
        enough = f"{n} >= {lane.min_requests}"
        factor = e.num(round(1 + margin, 6))
        now = p95(kind, lane, th.change_after)
        before = p95(kind, lane, th.change_before, th.change_recent)
        expr = (
            f"{now}\n> {factor} * {before}\nand on ()\n{recent_change(model, lane.pool)}"
            f"\nand on ({c.LANE})\n{enough}"
        )
        what = f"p95 {kind.upper()}"
        out.append(
            {
                "alert": c.ALERT_SETTINGS_CHANGE_REGRESSION,
                "expr": expr,
                "for": policy.for_,
                "labels": {
                    c.SEVERITY: policy.severity,
                    c.LANE: lane.lane,
                    c.POOL: lane.pool,
                    c.SLO_LABEL: kind,
                },
                "annotations": {
                    "summary": f"Lane {lane.lane} {what} is {{{{ $value | humanizeDuration }}}} "
                    f"after a settings change of pool {lane.pool}, over {factor}x before",
                    "description": f"Pool {lane.pool} came back with other settings less than "
                    f"{th.change_recent} ago, and since then lane {lane.lane}'s {what} over "
                    f"the last {th.change_after} ({{{{ $value | humanizeDuration }}}}) is more "
                    f"than {margin * 100:g}% above its p95 over the {th.change_before} before "
                    f"the change, with at least {lane.min_requests} requests: roll the change "
                    "back (confirm with `vllm-obs query compare EVENTS --around-changes`).",
                    "runbook_url": model.runbook(c.ALERT_SETTINGS_CHANGE_REGRESSION),
                },
            }
        )
    return out
