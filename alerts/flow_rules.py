"""Flow control's alerts (docs/flow.md), only for a config that uses it:

* ``VllmObsTenantAtRateLimit``: a tenant's requests have been refused by its rate limit
  (``vllm_obs_rate_limited_requests_total``) without a break for 10 minutes: it is at its
  limit, not bursting past it;
* ``VllmObsPoolHeldAtSaturation``: some sidecar process has held a pool at its saturation
  target (``vllm_obs_flow_saturation_held``) for 10 minutes: the pool is short of capacity
  for what is offered, and requests wait or are refused in the sidecars instead of the
  engine;
* ``VllmObsRateLimitStoreDown``: the shared rate-limit store (Redis) did not answer
  (``vllm_obs_rate_limit_store_errors_total`` rises) for 5 minutes: every tenant limit is
  lifted (``on_store_error: open``, a ticket) or every limited request refused 503
  (``closed``, a page).
"""

from __future__ import annotations

from obs import conventions as c

from . import expr as e
from .model import HEALTH_POLICY, AlertModel
from .slo_rules import Group, Rule

TENANT = "{{ $labels.tenant }}"
PER_S = '{{ printf "%.3g" $value }}/s'


def flow_groups(model: AlertModel) -> list[Group]:
    """One group with the tenants' and the saturated pools' alerts (none: no group)."""
    rules = [_tenant(model, t) for t in model.limited_tenants]
    rules += [_pool(model, p) for p in model.saturated_pools]
    if model.rate_limit_store:
        rules.append(_store(model))
    return [{"name": "vllm-obs-flow", "rules": rules}] if rules else []


def _rule(model: AlertModel, name: str, expr: str, labels: dict[str, str], summary: str,
          description: str) -> Rule:  # fmt: skip
    policy = HEALTH_POLICY[name]
    return {
        "alert": name,
        "expr": expr,
        "for": policy.for_,
        "labels": {c.SEVERITY: policy.severity, **labels},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": model.runbook(name),
        },
    }


def _tenant(model: AlertModel, tenant: str) -> Rule:
    w = model.thresholds.rate_window
    refused = e.selector(c.RATE_LIMITED.series[0], e.eq(c.TENANT, tenant))
    expr = f"{e.agg('sum', e.rate(refused, w), c.TENANT)} > 0"
    return _rule(
        model,
        c.ALERT_TENANT_AT_RATE_LIMIT,
        expr,
        {c.TENANT: tenant},
        f"Tenant {tenant} is refused by its rate limit ({PER_S})",
        f"Requests of tenant {tenant} have been refused 429 by its rate limit ({PER_S} over "
        f"the last {w}) for {HEALTH_POLICY[c.ALERT_TENANT_AT_RATE_LIMIT].for_}: it is at its "
        "requests or tokens per minute.",
    )


def _pool(model: AlertModel, pool: str) -> Rule:
    held = e.selector(c.FLOW_HELD.name, e.eq(c.POOL, pool))
    expr = f"{e.agg('sum', held, c.POOL)} > 0"
    return _rule(
        model,
        c.ALERT_POOL_HELD_AT_SATURATION,
        expr,
        {c.POOL: pool},
        f"Pool {pool} is held at its saturation target ({{{{ $value }}}} processes)",
        f"{{{{ $value }}}} sidecar processes have held pool {pool} at its saturation target "
        f"for {HEALTH_POLICY[c.ALERT_POOL_HELD_AT_SATURATION].for_}: its engines' queues are "
        "full, and requests wait or are refused in the sidecars' pool queue.",
    )


def _store(model: AlertModel) -> Rule:
    w = model.thresholds.rate_window
    errors = e.agg("sum", e.rate(c.RATE_LIMIT_STORE_ERRORS.series[0], w))
    closed = model.store_fails_closed
    effect = (
        "every request of a rate-limited tenant is refused 503 (on_store_error: closed)"
        if closed
        else "requests are admitted uncounted: no tenant limit holds (on_store_error: open)"
    )
    rule = _rule(
        model,
        c.ALERT_RATE_LIMIT_STORE_DOWN,
        f"{errors} > 0",
        {},
        f"The rate-limit store does not answer ({PER_S} requests)",
        f"The sidecars could not reach the shared rate-limit store (Redis) for {PER_S} "
        f"requests over the last {w}, for {HEALTH_POLICY[c.ALERT_RATE_LIMIT_STORE_DOWN].for_}: "
        f"{effect}.",
    )
    if closed:
        rule["labels"][c.SEVERITY] = "page"
    return rule
