"""promtool test groups for the health rules: each alert of each pool and lane fires, and not.

Every case is a pair of groups: the condition holds (pending before ``for``,
firing after it) and a near miss (silent). Conditions on gauges hold from
t=0; conditions on rates from the second sample (t=1m).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from obs import conventions as c

from . import series as s
from . import timeline as tl
from .model import HEALTH_POLICY, AlertModel, LaneHealth, PoolHealth
from .rules import RuleIndex

Group = dict[str, Any]
Inputs = Callable[[int], list[s.Series]]  # steps -> input series

N = 1000  # requests or tokens per step
GAUGE_S = 0
RATE_S = 60


def health_tests(model: AlertModel, index: RuleIndex) -> list[Group]:
    """Every health test group, pools first, then lanes, then the sidecar's exporters."""
    out: list[Group] = []
    for p in model.pools:
        out += _pool_cases(model, p, index)
    for lane in model.lanes:
        out += _lane_cases(model, lane, index)
    out += _sidecar_cases(model, index)
    return out


def _pair(
    alert: str,
    what: str,
    active_s: int,
    firing: Inputs,
    expected: list[dict[str, Any]],
    silent: Inputs,
    near_miss: str,
    for_: str | None = None,
) -> list[Group]:
    """A firing group (pending, then firing) and a silent group for one alert rule."""
    for_ = for_ or HEALTH_POLICY[alert].for_
    pending = tl.pending_time(active_s, for_)
    fire = tl.firing_time(active_s, for_)
    steps = fire // tl.STEP_S + 1
    checks = [tl.alert_test(alert, pending, [])] if pending is not None else []
    checks.append(tl.alert_test(alert, fire, expected))
    return [
        tl.group(f"{alert} {what}: fires after {for_}", firing(steps), checks),
        tl.group(
            f"{alert} {what}: silent when {near_miss}",
            silent(steps),
            [tl.alert_test(alert, fire, [])],
        ),
    ]


def _pool_series(name: str, p: PoolHealth, values: list[str]) -> list[s.Series]:
    return [
        s.series(name, {c.POOL: p.pool, c.REPLICA: r}, v)
        for r, v in zip(p.replicas, values, strict=True)
    ]


def _never(p: PoolHealth, alert: str, all_up: Inputs) -> list[Group]:
    """A pool whose engine does not report what ``alert`` judges: up for hours, it never fires."""
    for_ = HEALTH_POLICY[alert].for_
    at = tl.firing_time(RATE_S, for_) * 4
    steps = at // tl.STEP_S + 1
    return [
        tl.group(
            f"{alert} pool {p.pool} ({p.engine} does not report it): never fires",
            all_up(steps),
            [tl.alert_test(alert, at, [])],
        )
    ]


def _pool_cases(model: AlertModel, p: PoolHealth, index: RuleIndex) -> list[Group]:
    return _PoolCases(model, p, index).groups()


class _PoolCases:
    """The cases of one pool: KV cache and preemption (where its engine reports them),
    a replica down, the whole pool down, and the pool's series absent."""

    def __init__(self, model: AlertModel, p: PoolHealth, index: RuleIndex) -> None:
        self.model, self.p, self.index = model, p, index
        self.rest = len(p.replicas) - 1
        self.where = f"pool {p.pool}"
        self.replica = {c.POOL: p.pool, c.REPLICA: p.replicas[0]}
        self.all_up = self.up(*[1] * len(p.replicas))
        self.one_down = self.up(0, *[1] * self.rest)

    def rule(self, alert: str) -> dict[str, Any]:
        return self.index.find(alert, pool=self.p.pool)

    def up(self, *values: float) -> Inputs:
        return lambda n: _pool_series(c.POOL_UP.name, self.p, [s.gauge(v, n) for v in values])

    def kv(self, high: float, low: float) -> Inputs:
        values = lambda n: [s.gauge(high, n)] + [s.gauge(low, n)] * self.rest  # noqa: E731
        return lambda n: (
            self.all_up(n) + _pool_series(c.POOL_KV_CACHE_USAGE.name, self.p, values(n))
        )

    def preempt(self, per_step: float) -> Inputs:
        rest = self.rest
        return lambda n: _pool_series(
            c.POOL_PREEMPTIONS.series[0],
            self.p,
            [s.counter(per_step, n, start=2)] + [s.counter(0, n, start=2)] * rest,
        )

    def others(self, n: int) -> list[s.Series]:
        """Every other pool's series (or the lanes' info series): the pool itself is absent."""
        series = [
            x
            for q in self.model.pools
            if q.pool != self.p.pool
            for x in _pool_series(c.POOL_UP.name, q, [s.gauge(1, n)] * len(q.replicas))
        ]
        return series or [
            s.series(c.LANE_INFO.name, {c.LANE: lane.lane, c.POOL: lane.pool}, s.gauge(1, n))
            for lane in self.model.lanes
        ]

    def kv_cases(self) -> list[Group]:
        """Built only for a pool whose engine reports the value (only then is there a rule)."""
        if "kv_cache_usage" not in self.p.reports:
            return _never(self.p, c.ALERT_KV_CACHE_USAGE_HIGH, self.all_up)
        high = round((self.p.kv_cache_usage_max + 1) / 2, 4)
        low = round(self.p.kv_cache_usage_max * 0.95, 4)
        return _pair(
            c.ALERT_KV_CACHE_USAGE_HIGH,
            f"{self.where} replica at {high:g}",
            GAUGE_S,
            self.kv(high, low),
            [s.expected(self.rule(c.ALERT_KV_CACHE_USAGE_HIGH), self.replica, high)],
            self.kv(low, low),
            f"usage is {low:g}",
            self.p.kv_cache_usage_for,
        )

    def preempt_cases(self) -> list[Group]:
        if "preemptions" not in self.p.reports:
            return _never(self.p, c.ALERT_POOL_PREEMPTING, self.all_up)
        rate = 3 / tl.STEP_S
        return _pair(
            c.ALERT_POOL_PREEMPTING,
            f"{self.where} replica preempting {rate:g}/s",
            RATE_S,
            self.preempt(3),
            [s.expected(self.rule(c.ALERT_POOL_PREEMPTING), self.replica, rate)],
            self.preempt(0),
            "the counter is flat",
        )

    def groups(self) -> list[Group]:
        p, where, all_up, one_down = self.p, self.where, self.all_up, self.one_down
        return [
            *self.kv_cases(),
            *self.preempt_cases(),
            *_pair(
                c.ALERT_POOL_REPLICA_DOWN,
                f"{where} first replica down",
                GAUGE_S,
                one_down,
                [s.expected(self.rule(c.ALERT_POOL_REPLICA_DOWN), self.replica, 0)],
                all_up,
                "every replica is up",
            ),
            *_pair(
                c.ALERT_POOL_DOWN,
                f"{where} every replica down",
                GAUGE_S,
                self.up(*[0] * len(p.replicas)),
                [s.expected(self.rule(c.ALERT_POOL_DOWN), {c.POOL: p.pool}, 0)],
                one_down if self.rest else all_up,
                "a replica is up",
            ),
            *_pair(
                c.ALERT_POOL_ABSENT,
                f"{where} without series",
                GAUGE_S,
                self.others,
                [s.expected(self.rule(c.ALERT_POOL_ABSENT), {c.POOL: p.pool}, 1)],
                lambda n: all_up(n) + self.others(n),
                "its series are there",
            ),
        ]


def _lane_cases(model: AlertModel, lane: LaneHealth, index: RuleIndex) -> list[Group]:
    th = model.thresholds
    where = f"lane {lane.lane}"
    lp = {c.LANE: lane.lane, c.POOL: lane.pool}

    def rule(alert: str) -> dict[str, Any]:
        return index.find(alert, lane=lane.lane)

    def rejections(rejected: int) -> Inputs:
        def make(n: int) -> list[s.Series]:
            by_reason = {"queue_full": rejected, "prompt_too_long": 1}
            out = _requests(lane, N - sum(by_reason.values()), sum(by_reason.values()), n)
            for reason, k in by_reason.items():
                labels = {c.LANE: lane.lane, c.REASON: reason}
                out.append(s.series(c.ADMISSION_REJECTIONS.series[0], labels, s.counter(k, n)))
            return out

        return make

    hi = round(2 * th.rejection_ratio_max * N)
    lo = round(th.rejection_ratio_max / 2 * N)
    buckets = _phase_buckets(model)
    slow = next(b for a, b in itertools.pairwise(buckets) if a >= lane.queue_wait_max_s)
    fast = max((b for b in buckets if b < lane.queue_wait_max_s), default=buckets[0] / 2)

    def queue(at: float, prefill_at: float) -> Inputs:
        def make(n: int) -> list[s.Series]:
            out = []
            for phase, v in (("queue", at), ("prefill", prefill_at)):
                out += s.latency_histogram(
                    c.PHASE_DURATION, {**lp, c.PHASE: phase}, buckets, v, v, N, 0, n
                )
            return out

        return make

    i = buckets.index(slow)
    wait = buckets[i - 1] + (slow - buckets[i - 1]) * th.queue_wait_quantile
    cases = [
        *_pair(
            c.ALERT_ADMISSION_REJECTIONS_HIGH,
            f"{where} rejecting {hi / N:g} for queue_full",
            RATE_S,
            rejections(hi),
            [
                s.expected(
                    rule(c.ALERT_ADMISSION_REJECTIONS_HIGH), {**lp, c.REASON: "queue_full"}, hi / N
                )
            ],
            rejections(lo),
            f"{lo / N:g} are rejected",
        ),
        *_pair(
            c.ALERT_QUEUE_WAIT_HIGH,
            f"{where} queueing {slow:g}s",
            RATE_S,
            queue(slow, fast),
            [s.expected(rule(c.ALERT_QUEUE_WAIT_HIGH), lp, wait)],
            queue(fast, slow),
            f"requests queue {fast:g}s (and prefill is slow)",
        ),
    ]
    cases += _few_requests(
        c.ALERT_ADMISSION_REJECTIONS_HIGH, where, lane, rejections(hi), lane.alert_min_requests
    )
    if lane.cache_hit_ratio_min is not None:
        cases += _cache_cases(model, lane, index)
    return cases


def _few_requests(
    alert: str, where: str, lane: LaneHealth, firing: Inputs, floor: int
) -> list[Group]:
    """The firing case's ratio from half the floor's requests over the rate window (5
    minutes): silent. The counters are scaled down alike."""
    fire = tl.firing_time(RATE_S, HEALTH_POLICY[alert].for_)
    steps = fire // tl.STEP_S + 1
    few = floor // 2
    scale = few / 5 / N
    series = [_scaled(x, scale) for x in firing(steps)]
    return [
        tl.group(
            f"{alert} {where}: silent with {few} requests in 5m (the floor is {floor})",
            series,
            [tl.alert_test(alert, fire, [])],
        )
    ]


def _scaled(x: s.Series, scale: float) -> s.Series:
    """A counter series ``a+bxn`` with ``b`` times ``scale``."""
    start, rest = x["values"].split("+", 1)
    step, n = rest.split("x", 1)
    return {**x, "values": f"{start}+{s.number(round(float(step) * scale, 6))}x{n}"}


def _cache_cases(model: AlertModel, lane: LaneHealth, index: RuleIndex) -> list[Group]:
    """The lane's own cached prompt tokens below its floor fire; above it they do not, even
    while its pool's ratio (other lanes') is low; an idle lane never fires."""
    floor = lane.cache_hit_ratio_min
    assert floor is not None
    low, high = floor / 2, (floor + 1) / 2
    where = f"lane {lane.lane}"
    alert = c.ALERT_PREFIX_CACHE_HIT_RATIO_LOW
    lp = {c.LANE: lane.lane, c.POOL: lane.pool}

    def tokens(ratio: float, requests: int = N) -> Inputs:
        def make(n: int) -> list[s.Series]:
            pool_low = _prefix(model, lane.pool, low)(n)  # the pool's own ratio: ignored
            return [
                *pool_low,
                *_requests(lane, requests, 0, n),
                s.series(c.PROMPT_TOKENS.series[0], lp, s.counter(100 * requests, n)),
                s.series(
                    c.CACHED_TOKENS.series[0], lp, s.counter(round(100 * requests * ratio), n)
                ),
            ]

        return make

    value = round(100 * N * low) / (100 * N)
    rule = index.find(alert, lane=lane.lane)
    fire = tl.firing_time(RATE_S, HEALTH_POLICY[alert].for_)
    steps = fire // tl.STEP_S + 1
    return [
        *_pair(
            alert,
            f"{where} finding {low:g} of its prompt tokens cached",
            RATE_S,
            tokens(low),
            [s.expected(rule, {}, value)],
            tokens(high),
            f"the lane finds {high:g} cached while its pool finds {low:g}",
        ),
        tl.group(
            f"{alert} {where}: silent with no requests (the pool hits {low:g})",
            _prefix(model, lane.pool, low)(steps),
            [tl.alert_test(alert, fire, [])],
        ),
    ]


def _phase_buckets(model: AlertModel) -> tuple[float, ...]:
    ttft = [sli.threshold_s for sli in model.slis if sli.kind == "ttft" and sli.threshold_s]
    return c.merged_buckets(c.LATENCY_BUCKETS, ttft)


def _requests(lane: LaneHealth, ok: int, rejected: int, n: int) -> list[s.Series]:
    labels = {c.LANE: lane.lane, c.POOL: lane.pool, c.MODEL: s.MODEL}
    return [
        s.series(
            c.REQUESTS.series[0],
            {**labels, c.OUTCOME: outcome, c.FINISH_REASON: finish},
            s.counter(k, n),
        )
        for outcome, finish, k in ((c.OK, "stop", ok), (c.REJECTED, "none", rejected))
    ]


def _prefix(model: AlertModel, pool: str, ratio: float) -> Inputs:
    p = next(q for q in model.pools if q.pool == pool)

    def make(n: int) -> list[s.Series]:
        out = [
            s.series(c.LANE_INFO.name, {c.LANE: lane.lane, c.POOL: lane.pool}, s.gauge(1, n))
            for lane in model.lanes
        ]
        out += _pool_series(c.POOL_PREFIX_QUERIES.series[0], p, [s.counter(N, n)] * len(p.replicas))
        hits = s.counter(round(ratio * N), n)
        out += _pool_series(c.POOL_PREFIX_HITS.series[0], p, [hits] * len(p.replicas))
        return out

    return make


def _sidecar_cases(model: AlertModel, index: RuleIndex) -> list[Group]:
    def counter(name: str, labels: dict[str, str], per_step: float) -> Inputs:
        return lambda n: [s.series(name, labels, s.counter(per_step, n, start=3))]

    dropped = {c.EXPORTER: "jsonl", c.REASON: "queue_full"}
    failing = {c.EXPORTER: "otel"}
    rate = 6 / tl.STEP_S
    th = model.thresholds
    buckets = c.EVENT_LOOP_LAG_BUCKETS
    slow = next(b for b in buckets if b > th.loop_lag_max_s)
    fast = buckets[0]
    i = buckets.index(slow)
    lag = buckets[i - 1] + (slow - buckets[i - 1]) * th.loop_lag_quantile

    def loop_lag(at: float) -> Inputs:
        return lambda n: s.latency_histogram(c.EVENT_LOOP_LAG, {}, buckets, at, at, N, 0, n)

    instance = {"instance": s.SCRAPE["instance"]}

    return [
        *_pair(
            c.ALERT_EVENTS_DROPPED,
            f"jsonl dropping {rate:g}/s",
            RATE_S,
            counter(c.EVENTS_DROPPED.series[0], dropped, 6),
            [s.expected(index.find(c.ALERT_EVENTS_DROPPED), dropped, rate)],
            counter(c.EVENTS_DROPPED.series[0], dropped, 0),
            "the counter is flat",
        ),
        *_pair(
            c.ALERT_EXPORTER_FAILING,
            f"otel failing {rate:g}/s",
            RATE_S,
            counter(c.EXPORTER_FAILURES.series[0], failing, 6),
            [s.expected(index.find(c.ALERT_EXPORTER_FAILING), failing, rate)],
            counter(c.EXPORTER_FAILURES.series[0], failing, 0),
            "the counter is flat",
        ),
        *_pair(
            c.ALERT_EVENT_LOOP_LAG_HIGH,
            f"event loop {slow:g}s late",
            RATE_S,
            loop_lag(slow),
            [s.expected(index.find(c.ALERT_EVENT_LOOP_LAG_HIGH), instance, lag)],
            loop_lag(fast),
            f"the loop is {fast:g}s late",
        ),
    ]
