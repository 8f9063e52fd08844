"""Saturation and health rules: per pool, per lane, and for the sidecar's own exporters.

The ratio recording rules come first in the file so that, evaluated in file
order, the alerts read this evaluation's ratios.
"""

from __future__ import annotations

from obs import conventions as c

from . import expr as e
from .model import HEALTH_POLICY, AlertModel, LaneHealth, PoolHealth
from .slo_rules import Group, Rule

PCT = "{{ $value | humanizePercentage }}"
DURATION = "{{ $value | humanizeDuration }}"
PER_S = '{{ printf "%.3g" $value }}/s'
REPLICA = "{{ $labels.replica }}"
REASON = "{{ $labels.reason }}"
EXPORTER = "{{ $labels.exporter }}"
INSTANCE = "{{ $labels.instance }}"


def health_groups(model: AlertModel) -> list[Group]:
    """Ratio recordings, then pool, lane and sidecar alerts."""
    pools = [r for p in model.pools for r in _pool_alerts(model, p)]
    lanes = [r for lane in model.lanes for r in _lane_alerts(model, lane)]
    return [
        {"name": "vllm-obs-health-ratios", "rules": _ratios(model)},
        {"name": "vllm-obs-pools", "rules": pools},
        {"name": "vllm-obs-lanes", "rules": lanes},
        {"name": "vllm-obs-sidecar", "rules": _sidecar_alerts(model)},
    ]


def _ratios(model: AlertModel) -> list[Rule]:
    w = model.thresholds.rate_window
    hits = e.agg("sum", e.rate(c.POOL_PREFIX_HITS.series[0], w), c.POOL)
    queries = e.agg("sum", e.rate(c.POOL_PREFIX_QUERIES.series[0], w), c.POOL)
    rejected = e.agg("sum", e.rate(c.ADMISSION_REJECTIONS.series[0], w), c.LANE, c.REASON)
    requests = e.agg("sum", e.rate(c.REQUESTS.series[0], w), c.LANE)
    return [
        {"record": c.POOL_PREFIX_HIT_RATIO_RULE, "expr": f"{hits}\n/\n{e.positive(queries)}"},
        {
            "record": c.LANE_REJECTION_RATIO_RULE,
            "expr": f"{rejected}\n/ on ({c.LANE}) group_left ()\n{e.positive(requests)}",
        },
    ]


def _alert(
    model: AlertModel,
    name: str,
    expr: str,
    labels: dict[str, str],
    summary: str,
    description: str,
    for_: str | None = None,
) -> Rule:
    policy = HEALTH_POLICY[name]
    return {
        "alert": name,
        "expr": expr,
        "for": for_ or policy.for_,
        "labels": {c.SEVERITY: policy.severity, **labels},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": model.runbook(name),
        },
    }


# The pool-state field each saturation alert of _pool_alerts reads, in order.
_SATURATION_FIELDS = ("kv_cache_usage", "preemptions")


def _pool_alerts(model: AlertModel, p: PoolHealth) -> list[Rule]:
    pool = e.eq(c.POOL, p.pool)
    labels = {c.POOL: p.pool}
    by = (c.POOL, c.REPLICA)
    kv = e.agg("max", e.selector(c.POOL_KV_CACHE_USAGE.name, pool), *by)
    up = e.selector(c.POOL_UP.name, pool)
    preempt = e.agg(
        "max",
        e.rate(e.selector(c.POOL_PREEMPTIONS.series[0], pool), model.thresholds.rate_window),
        *by,
    )
    kv_max = e.num(p.kv_cache_usage_max)
    preempt_max = e.num(model.thresholds.preemptions_per_s_max)
    kv_pct = e.num(p.kv_cache_usage_max * 100)
    saturation = [
        _alert(
            model,
            c.ALERT_KV_CACHE_USAGE_HIGH,
            f"{kv} > {kv_max}",
            labels,
            f"KV cache of pool {p.pool} replica {REPLICA} is {PCT} full",
            f"Replica {REPLICA} of pool {p.pool} has used {PCT} of its KV cache (above "
            f"{kv_pct}%) for {p.kv_cache_usage_for}; new requests "
            "wait in the engine and running ones get preempted.",
            for_=p.kv_cache_usage_for,
        ),
        _alert(
            model,
            c.ALERT_POOL_PREEMPTING,
            f"{preempt} > {preempt_max}",
            labels,
            f"Pool {p.pool} replica {REPLICA} preempts {PER_S} requests",
            f"The engine of replica {REPLICA} in pool {p.pool} has been preempting running "
            f"requests ({PER_S} over the last {model.thresholds.rate_window}, above "
            f"{preempt_max}/s) for {HEALTH_POLICY[c.ALERT_POOL_PREEMPTING].for_}: its KV "
            "cache cannot hold the batch, and preempted requests are recomputed.",
        ),
    ]
    # An engine that does not report a value gets no alert judged on it (obs.engines.adapters).
    judged = [
        r for r, field in zip(saturation, _SATURATION_FIELDS, strict=True) if field in p.reports
    ]
    return [
        *judged,
        _alert(
            model,
            c.ALERT_POOL_REPLICA_DOWN,
            f"{e.agg('max', up, *by)} == 0",
            labels,
            f"Pool {p.pool} replica {REPLICA} is down (vllm_obs_pool_up = {{{{ $value }}}})",
            f"The sidecar could not read /metrics of replica {REPLICA} in pool {p.pool} "
            f"(vllm_obs_pool_up = {{{{ $value }}}}) for "
            f"{HEALTH_POLICY[c.ALERT_POOL_REPLICA_DOWN].for_}.",
        ),
        _alert(
            model,
            c.ALERT_POOL_DOWN,
            f"{e.agg('max', up, c.POOL)} == 0",
            labels,
            f"Every replica of pool {p.pool} is down (max vllm_obs_pool_up = {{{{ $value }}}})",
            f"None of the {len(p.replicas)} configured replica(s) of pool {p.pool} answered "
            f"the sidecar (vllm_obs_pool_up = {{{{ $value }}}}) for "
            f"{HEALTH_POLICY[c.ALERT_POOL_DOWN].for_}: every lane routed to it fails.",
        ),
        _alert(
            model,
            c.ALERT_POOL_ABSENT,
            f"absent({up})",
            labels,
            f"No health data for pool {p.pool} (absent(vllm_obs_pool_up) = {{{{ $value }}}})",
            f"Prometheus has no vllm_obs_pool_up series for pool {p.pool} (absent() = "
            f"{{{{ $value }}}}) for {HEALTH_POLICY[c.ALERT_POOL_ABSENT].for_}: the sidecar is "
            "not scraped, is down, or runs a config without this pool.",
        ),
    ]


NOT_POOL_DOWN = f'{c.REASON}!="{c.POOL_UNAVAILABLE}"'


def _lane_alerts(model: AlertModel, lane: LaneHealth) -> list[Rule]:
    th = model.thresholds
    labels = {c.LANE: lane.lane, c.POOL: lane.pool}
    sel = e.eq(c.LANE, lane.lane)
    queue = e.selector(c.PHASE_DURATION.series[0], sel, e.eq(c.PHASE, "queue"))
    q = e.num(th.queue_wait_quantile)
    p_q = f"p{e.num(th.queue_wait_quantile * 100)}"
    wait = f"histogram_quantile({q}, {e.agg('sum', e.rate(queue, th.rate_window), c.LANE, 'le')})"
    reject_max = e.num(th.rejection_ratio_max)
    reject_pct = e.num(th.rejection_ratio_max * 100)
    floor = lane.alert_min_requests
    rules = [
        _alert(
            model,
            c.ALERT_ADMISSION_REJECTIONS_HIGH,
            # pool_unavailable is the pool-down alert's to page on, not this one's.
            f"{e.selector(c.LANE_REJECTION_RATIO_RULE, sel, NOT_POOL_DOWN)} > {reject_max}\n"
            + e.enough(c.LANE, e.lane_requests(lane.lane, th.rate_window), floor),
            labels,
            f"Lane {lane.lane} rejects {PCT} of requests ({REASON})",
            f"The admission policy of lane {lane.lane} refused {PCT} of its requests for reason "
            f"{REASON} over the last {th.rate_window} (above {reject_pct}%) "
            f"for {HEALTH_POLICY[c.ALERT_ADMISSION_REJECTIONS_HIGH].for_}; clients got an error "
            "with Retry-After.",
        ),
        _alert(
            model,
            c.ALERT_QUEUE_WAIT_HIGH,
            f"{wait} > {e.num(lane.queue_wait_max_s)}",
            labels,
            f"Lane {lane.lane} queue wait {p_q} is {DURATION}",
            f"Requests of lane {lane.lane} (pool {lane.pool}) waited {DURATION} ({p_q} over "
            f"the last {th.rate_window}) before dispatch, above {e.num(lane.queue_wait_max_s)}s, "
            f"for {HEALTH_POLICY[c.ALERT_QUEUE_WAIT_HIGH].for_}: the lane is at its concurrency "
            "limit and eats its TTFT budget in the queue.",
        ),
    ]
    if lane.cache_hit_ratio_min is not None:
        # The lane's own requests: its prompt tokens the pool found cached (the sidecar's
        # cached_tokens per lane), not the pool's ratio, which other lanes move.
        cached = e.agg(
            "sum", e.rate(e.selector(c.CACHED_TOKENS.series[0], sel), th.rate_window), c.LANE
        )
        prompt = e.agg(
            "sum", e.rate(e.selector(c.PROMPT_TOKENS.series[0], sel), th.rate_window), c.LANE
        )
        ratio = f"{cached}\n/\n{e.positive(prompt)}"
        pct = e.num(lane.cache_hit_ratio_min * 100)
        rules.append(
            _alert(
                model,
                c.ALERT_PREFIX_CACHE_HIT_RATIO_LOW,
                f"{ratio}\n< {e.num(lane.cache_hit_ratio_min)}\n"
                + e.enough(c.LANE, e.lane_requests(lane.lane, th.rate_window), floor),
                labels,
                f"Lane {lane.lane} finds {PCT} of its prompt tokens in the prefix cache",
                f"Of the prompt tokens of lane {lane.lane} (pool {lane.pool}), the pool found "
                f"{PCT} in its prefix cache over the last {th.rate_window}, below the lane's "
                f"floor of {pct}% (at least {floor} requests), for "
                f"{HEALTH_POLICY[c.ALERT_PREFIX_CACHE_HIT_RATIO_LOW].for_}.",
            )
        )
    return rules


def _sidecar_alerts(model: AlertModel) -> list[Rule]:
    w = model.thresholds.rate_window
    dropped = e.agg("sum", e.rate(c.EVENTS_DROPPED.series[0], w), c.EXPORTER, c.REASON)
    failures = e.agg("sum", e.rate(c.EXPORTER_FAILURES.series[0], w), c.EXPORTER)
    th = model.thresholds
    # Per sidecar (scrape target): one lagging process among many must not average away.
    lag_rate = e.agg("sum", e.rate(c.EVENT_LOOP_LAG.series[0], w), "instance", "le")
    lag = f"histogram_quantile({e.num(th.loop_lag_quantile)}, {lag_rate})"
    p_lag = f"p{e.num(th.loop_lag_quantile * 100)}"
    return [
        _alert(
            model,
            c.ALERT_EVENTS_DROPPED,
            f"{dropped} > 0",
            {},
            f"Exporter {EXPORTER} drops {PER_S} request events ({REASON})",
            f"The {EXPORTER} exporter has been dropping request events ({PER_S} over the "
            f"last {w}, reason {REASON}) for {HEALTH_POLICY[c.ALERT_EVENTS_DROPPED].for_}: "
            "request logs and postmortem queries miss those requests.",
        ),
        _alert(
            model,
            c.ALERT_EXPORTER_FAILING,
            f"{failures} > 0",
            {},
            f"Exporter {EXPORTER} fails ({PER_S} errors)",
            f"The {EXPORTER} exporter has been raising errors ({PER_S} over the last {w}) for "
            f"{HEALTH_POLICY[c.ALERT_EXPORTER_FAILING].for_}; clients are unaffected, but its "
            "events, spans or metrics are incomplete.",
        ),
        _alert(
            model,
            c.ALERT_EVENT_LOOP_LAG_HIGH,
            f"{lag} > {e.num(th.loop_lag_max_s)}",
            {},
            f"Sidecar {INSTANCE} event loop lags {DURATION} ({p_lag})",
            f"The event loop of sidecar {INSTANCE} ran its timers {DURATION} late ({p_lag} "
            f"over the last {w}), above {e.num(th.loop_lag_max_s)}s, for "
            f"{HEALTH_POLICY[c.ALERT_EVENT_LOOP_LAG_HIGH].for_}: requests wait in the relay "
            "before they are read (their queue phase grows, not the pool's prefill). The "
            "sidecar is CPU-bound: run more --workers or give it more CPU.",
        ),
    ]
