"""promtool cases for ``capacity_rules``: each alert fires past its threshold, and is silent
just inside it (engine queue, p99 end to end, throughput drop, settings drift)."""

from __future__ import annotations

import itertools
from typing import Any

from obs import conventions as c
from obs.durations import seconds

from . import series as s
from . import timeline as tl
from .capacity_rules import E2E_QUANTILE
from .model import HEALTH_POLICY, AlertModel, LaneHealth, PoolHealth
from .promtool_health import (
    GAUGE_S,
    RATE_S,
    N,
    _few_requests,
    _pair,
    _phase_buckets,
    _pool_series,
)
from .rules import RuleIndex

Group = dict[str, Any]
TOKENS_PER_STEP = 1000
REQUESTS_PER_STEP = 100


def capacity_tests(model: AlertModel, index: RuleIndex) -> list[Group]:
    """Every capacity case: pools first, then lanes."""
    out: list[Group] = []
    for p in model.pools:
        out += _queue_cases(p, index) + _throughput_cases(p, index) + _drift_cases(p, index)
    for lane in model.lanes:
        out += _e2e_cases(model, lane, index)
        out += _json_cases(lane, index) if lane.asks_json else []
    return out


def _queue_cases(p: PoolHealth, index: RuleIndex) -> list[Group]:
    if "waiting" not in p.reports:
        return []
    rest = len(p.replicas) - 1
    high, low = p.engine_waiting_max + 50, max(p.engine_waiting_max - 20, 0)

    def waiting(first: float) -> Any:
        return lambda n: _pool_series(
            c.POOL_WAITING.name, p, [s.gauge(first, n)] + [s.gauge(0, n)] * rest
        )

    rule = index.find(c.ALERT_ENGINE_QUEUE_DEEP, pool=p.pool)
    return _pair(
        c.ALERT_ENGINE_QUEUE_DEEP,
        f"pool {p.pool} replica with {high:g} waiting",
        GAUGE_S,
        waiting(high),
        [s.expected(rule, {c.POOL: p.pool, c.REPLICA: p.replicas[0]}, high)],
        waiting(low),
        f"{low:g} wait",
    )


def _drift_cases(p: PoolHealth, index: RuleIndex) -> list[Group]:
    labels = {c.POOL: p.pool, c.REPLICA: p.replicas[0], c.SETTING: "max_num_seqs"}

    def drift(value: float) -> Any:
        return lambda n: [s.series(c.POOL_SETTINGS_DRIFT.name, labels, s.gauge(value, n))]

    rule = index.find(c.ALERT_ENGINE_SETTINGS_DRIFT, pool=p.pool)
    return _pair(
        c.ALERT_ENGINE_SETTINGS_DRIFT,
        f"pool {p.pool} replica running another max_num_seqs",
        GAUGE_S,
        drift(1),
        [s.expected(rule, labels, 1)],
        drift(0),
        "it runs what is declared",
    )


def _throughput_cases(p: PoolHealth, index: RuleIndex) -> list[Group]:
    """Tokens and requests at a steady rate for the baseline and 10 minutes more, then
    either tokens fall while requests hold (fires; silent when they fall only a little),
    or both fall alike: demand fell, the pool did not (silent)."""
    drop_at = int(seconds(p.throughput_baseline)) // tl.STEP_S + 10
    for_ = HEALTH_POLICY[c.ALERT_THROUGHPUT_DROP].for_
    fire_at = (drop_at + 5) * tl.STEP_S + int(seconds(for_)) + 2 * tl.STEP_S
    steps = fire_at // tl.STEP_S + 1
    labels = {c.LANE: "any", c.POOL: p.pool}
    rule = index.find(c.ALERT_THROUGHPUT_DROP, pool=p.pool)

    def step_down(name: str, extra: dict[str, str], before: int, after: int) -> s.Series:
        top = drop_at * before
        values = (
            f"{s.counter(before, drop_at)} "
            f"{s.counter(after, steps - drop_at - 1, start=top + after)}"
        )
        return s.series(name, {**labels, **extra}, values)

    def traffic(tokens_after: int, requests_after: int) -> list[s.Series]:
        ok = {c.MODEL: s.MODEL, c.OUTCOME: c.OK, c.FINISH_REASON: "stop"}
        return [
            step_down(c.COMPLETION_TOKENS.series[0], {}, TOKENS_PER_STEP, tokens_after),
            step_down(c.REQUESTS.series[0], ok, REQUESTS_PER_STEP, requests_after),
        ]

    low = round(TOKENS_PER_STEP * p.throughput_drop_ratio / 2)
    near = round(TOKENS_PER_STEP * (p.throughput_drop_ratio + 1) / 2)
    fewer = round(REQUESTS_PER_STEP * low / TOKENS_PER_STEP)
    name = f"{c.ALERT_THROUGHPUT_DROP} pool {p.pool}"
    return [
        tl.group(
            f"{name}: tokens/s falls to {low / TOKENS_PER_STEP:g} of the baseline while "
            "requests hold, fires",
            traffic(low, REQUESTS_PER_STEP),
            [
                tl.alert_test(c.ALERT_THROUGHPUT_DROP, drop_at * tl.STEP_S, []),
                tl.alert_test(
                    c.ALERT_THROUGHPUT_DROP,
                    fire_at,
                    [s.expected(rule, {c.POOL: p.pool}, low / REQUESTS_PER_STEP)],
                ),
            ],
        ),
        tl.group(
            f"{name}: silent at {near / TOKENS_PER_STEP:g} of the baseline",
            traffic(near, REQUESTS_PER_STEP),
            [tl.alert_test(c.ALERT_THROUGHPUT_DROP, fire_at, [])],
        ),
        tl.group(
            f"{name}: silent when tokens fall to {low / TOKENS_PER_STEP:g} because requests "
            "fell as much (demand, not the pool)",
            traffic(low, fewer),
            [tl.alert_test(c.ALERT_THROUGHPUT_DROP, fire_at, [])],
        ),
    ]


def _e2e_cases(model: AlertModel, lane: LaneHealth, index: RuleIndex) -> list[Group]:
    buckets = _phase_buckets(model)
    limit = lane.e2e_p99_max_s
    slow = next(b for a, b in itertools.pairwise(buckets) if a >= limit)
    fast = max(b for b in buckets if b < limit)
    i = buckets.index(slow)
    p99 = buckets[i - 1] + (slow - buckets[i - 1]) * E2E_QUANTILE
    lp = {c.LANE: lane.lane, c.POOL: lane.pool}

    def e2e(at: float) -> Any:
        return lambda n: s.latency_histogram(c.REQUEST_DURATION, lp, buckets, at, at, N, 0, n)

    return _pair(
        c.ALERT_E2E_LATENCY_HIGH,
        f"lane {lane.lane} requests taking {slow:g}s",
        RATE_S,
        e2e(slow),
        [s.expected(index.find(c.ALERT_E2E_LATENCY_HIGH, lane=lane.lane), lp, p99)],
        e2e(fast),
        f"requests take {fast:g}s",
    )


def _json_cases(lane: LaneHealth, index: RuleIndex) -> list[Group]:
    """Of N JSON answers a minute, twice the allowed share invalid fires; half of it does not."""
    labels = {c.LANE: lane.lane, c.POOL: lane.pool, c.MODEL: s.MODEL}
    high = round(2 * lane.invalid_json_ratio_max * N)
    low = round(lane.invalid_json_ratio_max / 2 * N)

    def answers(invalid: int) -> Any:
        return lambda n: [
            s.series(c.JSON_ANSWERS.series[0], {**labels, c.RESULT: result}, s.counter(k, n))
            for result, k in ((c.JSON_VALID, N - invalid), (c.JSON_INVALID, invalid))
        ]

    rule = index.find(c.ALERT_INVALID_JSON_HIGH, lane=lane.lane)
    where = f"lane {lane.lane}"
    few = _few_requests(
        c.ALERT_INVALID_JSON_HIGH, where, lane, answers(high), lane.alert_min_requests
    )
    return few + _pair(
        c.ALERT_INVALID_JSON_HIGH,
        f"lane {lane.lane} with {high / N:g} invalid",
        RATE_S,
        answers(high),
        [s.expected(rule, {c.LANE: lane.lane, c.MODEL: s.MODEL}, high / N)],
        answers(low),
        f"{low / N:g} are invalid",
    )
