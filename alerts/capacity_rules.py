"""The alerts the production guides name beside the SLOs: an engine queue too deep, a p99
end-to-end latency too high (every lane, batch included), generated tokens/s dropping, and
a replica running other flags than its pool declares.

Thresholds are per pool (``alerts:`` of a pool in the lanes config) and per lane (``alerts:``
of a lane), the guides' numbers by default: 100 waiting, 30 s, half the rate of an hour ago.
"""

from __future__ import annotations

from obs import conventions as c

from . import expr as e
from .health_rules import DURATION, PCT, REPLICA, _alert
from .model import HEALTH_POLICY, AlertModel, LaneHealth, PoolHealth
from .slo_rules import Group, Rule

E2E_QUANTILE = 0.99
SETTING = "{{ $labels.setting }}"


def capacity_groups(model: AlertModel) -> list[Group]:
    """One group: each pool's queue, throughput and drift alerts, then each lane's p99."""
    rules = [r for p in model.pools for r in _pool_alerts(model, p)]
    rules += [_e2e_alert(model, lane) for lane in model.lanes]
    # Only lanes whose requests ask for JSON have answers to judge.
    rules += [_json_alert(model, lane) for lane in model.lanes if lane.asks_json]
    return [{"name": "vllm-obs-capacity", "rules": rules}]


def throughput(pool: str, window: str, offset: str | None = None) -> str:
    """Generated tokens/s of ``pool`` over ``window`` (``offset`` back in time)."""
    return _pool_rate(c.COMPLETION_TOKENS.series[0], pool, window, offset)


def offered(pool: str, window: str, offset: str | None = None) -> str:
    """Requests/s the sidecar finished for ``pool`` (every outcome: what was asked of it)."""
    return _pool_rate(c.REQUESTS.series[0], pool, window, offset)


def per_request(pool: str, window: str, offset: str | None = None) -> str:
    """Generated tokens per request asked of ``pool``: demand cancels out."""
    tokens, requests = throughput(pool, window, offset), offered(pool, window, offset)
    return f"(\n  {tokens}\n  /\n  {e.positive(requests)}\n)"


def _pool_rate(name: str, pool: str, window: str, offset: str | None) -> str:
    sel = e.selector(name, e.eq(c.POOL, pool))
    rate = f"rate({sel}[{window}]{f' offset {offset}' if offset else ''})"
    return e.agg("sum", rate, c.POOL)


def e2e_p99(lane: str, window: str) -> str:
    """The lane's p99 end-to-end latency over ``window``."""
    sel = e.selector(c.REQUEST_DURATION.series[0], e.eq(c.LANE, lane))
    by_le = e.agg("sum", e.rate(sel, window), c.LANE, "le")
    return f"histogram_quantile({e.num(E2E_QUANTILE)}, {by_le})"


def invalid_json_ratio(lane: str, window: str) -> str:
    """Per model, the share of the lane's answers asked to be JSON that did not parse."""
    sel = e.selector(c.JSON_ANSWERS.series[0], e.eq(c.LANE, lane))
    bad = e.selector(c.JSON_ANSWERS.series[0], e.eq(c.LANE, lane), e.eq(c.RESULT, c.JSON_INVALID))
    num = e.agg("sum", e.rate(bad, window), c.LANE, c.MODEL)
    den = e.agg("sum", e.rate(sel, window), c.LANE, c.MODEL)
    return f"{num}\n/\n{e.positive(den)}"


def _pool_alerts(model: AlertModel, p: PoolHealth) -> list[Rule]:
    pool = e.eq(c.POOL, p.pool)
    labels = {c.POOL: p.pool}
    w = model.thresholds.rate_window
    rules: list[Rule] = []
    if "waiting" in p.reports:
        waiting = e.agg("max", e.selector(c.POOL_WAITING.name, pool), c.POOL, c.REPLICA)
        rules.append(
            _alert(
                model,
                c.ALERT_ENGINE_QUEUE_DEEP,
                f"{waiting} > {e.num(p.engine_waiting_max)}",
                labels,
                f"Pool {p.pool} replica {REPLICA} has {{{{ $value }}}} requests waiting",
                f"The engine of replica {REPLICA} in pool {p.pool} holds {{{{ $value }}}} "
                f"requests waiting (above {e.num(p.engine_waiting_max)}) for "
                f"{HEALTH_POLICY[c.ALERT_ENGINE_QUEUE_DEEP].for_}: it admits more than it "
                "runs, so each waits longer for its first token.",
            )
        )
    # Tokens per request asked, not tokens/s: fewer requests (an evening, a drained pool)
    # cut both alike and stay silent; a pool that serves each request less (errors,
    # timeouts, cut answers) does not.
    now, before = per_request(p.pool, w), per_request(p.pool, w, p.throughput_baseline)
    ratio = e.num(p.throughput_drop_ratio)
    served = e.agg("sum", e.increase(e.selector(c.REQUESTS.series[0], pool), w), c.POOL)
    per = '{{ printf "%.3g" $value }}'
    rules.append(
        _alert(
            model,
            c.ALERT_THROUGHPUT_DROP,
            f"{now}\n< {ratio} * {before}\n{e.enough(c.POOL, served, p.min_requests)}",
            labels,
            f"Pool {p.pool} generates {per} tokens per request, under {ratio} of "
            f"{p.throughput_baseline} ago",
            f"Pool {p.pool} generated {per} output tokens per request asked of it over the last "
            f"{w} (at least {p.min_requests} requests), less than "
            f"{e.num(p.throughput_drop_ratio * 100)}% of its tokens per request "
            f"{p.throughput_baseline} before, for {HEALTH_POLICY[c.ALERT_THROUGHPUT_DROP].for_}: "
            "requests fail, time out or end early, not fewer requests.",
        )
    )
    drift = e.selector(c.POOL_SETTINGS_DRIFT.name, pool)
    rules.append(
        _alert(
            model,
            c.ALERT_ENGINE_SETTINGS_DRIFT,
            f"{e.agg('max', drift, c.POOL, c.REPLICA, c.SETTING)} == 1",
            labels,
            f"Pool {p.pool} replica {REPLICA} runs another {SETTING} than declared "
            "(drift {{ $value }})",
            f"Replica {REPLICA} of pool {p.pool} reports a value of {SETTING} other than "
            "the pool's engine block declares (vllm_obs_pool_settings_drift = {{ $value }}), for "
            f"{HEALTH_POLICY[c.ALERT_ENGINE_SETTINGS_DRIFT].for_}: it was started with other "
            "flags, or the declaration is stale.",
        )
    )
    return rules


def _e2e_alert(model: AlertModel, lane: LaneHealth) -> Rule:
    w = model.thresholds.rate_window
    limit = e.num(lane.e2e_p99_max_s)
    return _alert(
        model,
        c.ALERT_E2E_LATENCY_HIGH,
        f"{e2e_p99(lane.lane, w)} > {limit}",
        {c.LANE: lane.lane, c.POOL: lane.pool},
        f"Lane {lane.lane} p99 end-to-end latency is {DURATION}",
        f"Requests of lane {lane.lane} (pool {lane.pool}) took {DURATION} end to end (p99 "
        f"over the last {w}), above {limit}s, for {HEALTH_POLICY[c.ALERT_E2E_LATENCY_HIGH].for_}.",
    )


def _json_alert(model: AlertModel, lane: LaneHealth) -> Rule:
    w = model.thresholds.rate_window
    limit = e.num(lane.invalid_json_ratio_max)
    sel = e.selector(c.JSON_ANSWERS.series[0], e.eq(c.LANE, lane.lane))
    answers = e.agg("sum", e.increase(sel, w), c.LANE, c.MODEL)
    return _alert(
        model,
        c.ALERT_INVALID_JSON_HIGH,
        f"{invalid_json_ratio(lane.lane, w)}\n> {limit}\n"
        + e.enough(f"{c.LANE}, {c.MODEL}", answers, lane.alert_min_requests),
        {c.LANE: lane.lane, c.POOL: lane.pool},
        f"Lane {lane.lane} model {{{{ $labels.model }}}}: {PCT} of JSON answers do not parse",
        f"Of the answers of lane {lane.lane} (pool {lane.pool}) that asked for JSON "
        "(response_format json_object/json_schema, or tools), "
        f"{PCT} did not parse over the last {w} (above "
        f"{e.num(lane.invalid_json_ratio_max * 100)}%), for "
        f"{HEALTH_POLICY[c.ALERT_INVALID_JSON_HIGH].for_}.",
    )
