"""promtool cases for ``gpu_rules`` and ``change_rules``: each alert fires past its bound and
is silent inside it (GPU memory, GPU utilisation high and low, speculative-decoding
acceptance, a regression after a settings change)."""

from __future__ import annotations

import math
from typing import Any

from obs import conventions as c
from obs.durations import seconds

from . import series as s
from . import timeline as tl
from .canary_rules import LATENCY
from .model import HEALTH_POLICY, AlertModel, LaneHealth, PoolHealth
from .promtool_health import GAUGE_S, RATE_S, N, _pair
from .rules import RuleIndex

Group = dict[str, Any]
# One GPU as dcgm-exporter labels it (tests/data/dcgm-exporter-metrics.txt).
GPU_LABELS = {
    "gpu": "0",
    "UUID": "GPU-0",
    "modelName": "NVIDIA H100 80GB HBM3",
    "Hostname": "node-a",
}
GPU_KEY = {"Hostname": "node-a", "gpu": "0"}
FB_MIB = 81_000
CHANGE_STEP = 120  # the settings change, in minutes from the start
DRAFTS = 30  # draft tokens proposed a minute
# What the settings-changed gauge says besides its pool (one replica's last change).
CHANGED = {c.REPLICA: "http://replica:8000", "changed": "max_num_seqs", "old": "64", "new": "256"}


def gpu_tests(model: AlertModel, index: RuleIndex) -> list[Group]:
    """Every GPU, speculative-decoding and settings-change case."""
    out = _memory_cases(model, index) + _util_cases(model, index)
    for p in model.pools:
        if p.engine in ("vllm", "auto"):
            out += _spec_cases(model, p, index)
    for lane in model.lanes:
        for kind in ("ttft", "tpot"):
            out += _change_cases(model, lane, kind, index)
    return out


def _gpu(name: str, value: float, steps: int) -> s.Series:
    return s.series(name, GPU_LABELS, s.gauge(value, steps))


def _memory_cases(model: AlertModel, index: RuleIndex) -> list[Group]:
    limit = model.thresholds.gpu_memory_used_max
    high = round(FB_MIB * (limit + 1) / 2)  # halfway from the bound to full
    low = round(FB_MIB * (limit - 0.05))

    def used(mib: int) -> Any:
        return lambda n: [_gpu(c.DCGM_FB_USED, mib, n), _gpu(c.DCGM_FB_FREE, FB_MIB - mib, n)]

    rule = index.find(c.ALERT_GPU_MEMORY_HIGH)
    return _pair(
        c.ALERT_GPU_MEMORY_HIGH,
        f"GPU with {high} of {FB_MIB} MiB used",
        GAUGE_S,
        used(high),
        [s.expected(rule, GPU_KEY, high / FB_MIB)],
        used(low),
        f"{low} MiB are used",
    )


def _util_cases(model: AlertModel, index: RuleIndex) -> list[Group]:
    th = model.thresholds
    high = round((th.gpu_util_high + 1) / 2 * 100)
    inside = round((th.gpu_util_low + th.gpu_util_high) / 2 * 100)
    low = round(th.gpu_util_low / 2 * 100)
    serving = {c.LANE: "any", c.POOL: "any", c.OUTCOME: c.OK}

    def util(percent: int, requests: bool) -> Any:
        def inputs(n: int) -> list[s.Series]:
            out = [_gpu(c.DCGM_GPU_UTIL, percent, n)]
            if requests:
                out.append(s.series(c.REQUESTS.series[0], serving, s.counter(N, n)))
            return out

        return inputs

    alert = c.ALERT_GPU_UTILISATION_OUT_OF_BAND
    return _pair(
        alert,
        f"GPU {high}% busy",
        GAUGE_S,
        util(high, True),
        [s.expected(index.find(alert, band="high"), GPU_KEY, high / 100)],
        util(inside, True),
        f"it is {inside}% busy",
    ) + _pair(
        alert,
        f"GPU {low}% busy while requests flow",
        RATE_S,
        util(low, True),
        [s.expected(index.find(alert, band="low"), GPU_KEY, low / 100)],
        util(low, False),
        "no request flows",
    )


def _spec_cases(model: AlertModel, p: PoolHealth, index: RuleIndex) -> list[Group]:
    """Acceptance at 2/3 for two hours, then a fifth of its share (fires) or 0.9 of it (not)."""
    th = model.thresholds
    before = DRAFTS * 2 // 3
    window = int(seconds(th.spec_window)) // tl.STEP_S
    fire_at = (CHANGE_STEP + window) * tl.STEP_S + int(seconds("1h")) // 2
    steps = fire_at // tl.STEP_S + 1
    labels = {c.POOL: p.pool, "model_name": s.MODEL, "engine": "0"}

    def inputs(after: int) -> list[s.Series]:
        accepted = (
            f"{s.counter(before, CHANGE_STEP)} "
            f"{s.counter(after, steps - CHANGE_STEP - 1, start=before * CHANGE_STEP + after)}"
        )
        return [
            s.series(c.VLLM_SPEC_DRAFT_TOKENS, labels, s.counter(DRAFTS, steps)),
            s.series(c.VLLM_SPEC_ACCEPTED, labels, accepted),
        ]

    low = max(1, round(before * th.spec_acceptance_drop_ratio / 5))
    near = math.ceil(before * (1 + th.spec_acceptance_drop_ratio) / 2)
    rule = index.find(c.ALERT_SPEC_DECODE_ACCEPTANCE_DROP, pool=p.pool)
    alert = c.ALERT_SPEC_DECODE_ACCEPTANCE_DROP
    name = f"{alert} pool {p.pool}"
    return [
        tl.group(
            f"{name}: acceptance falls to {low}/{DRAFTS}, fires",
            inputs(low),
            [
                tl.alert_test(alert, (CHANGE_STEP + window // 2 + 2) * tl.STEP_S, []),
                tl.alert_test(alert, fire_at, [s.expected(rule, {c.POOL: p.pool}, low / DRAFTS)]),
            ],
        ),
        tl.group(
            f"{name}: silent at {near}/{DRAFTS}",
            inputs(near),
            [tl.alert_test(alert, fire_at, [])],
        ),
    ]


def _change_cases(model: AlertModel, lane: LaneHealth, kind: str, index: RuleIndex) -> list[Group]:
    """The lane's requests in one bucket for two hours, then in the next one up; the pool's
    settings changed at two hours (fires), or never (silent)."""
    th = model.thresholds
    buckets = c.LATENCY_BUCKETS if kind == "ttft" else c.TOKEN_LATENCY_BUCKETS
    low, high = buckets[3], buckets[5]
    after_min = int(seconds(th.change_after)) // tl.STEP_S
    per_step = max(10, math.ceil(2 * lane.min_requests / after_min))
    for_ = HEALTH_POLICY[c.ALERT_SETTINGS_CHANGE_REGRESSION].for_
    pending = (CHANGE_STEP + 1) * tl.STEP_S + int(seconds(for_)) - 2 * tl.STEP_S
    fire_at = (CHANGE_STEP + after_min + 1) * tl.STEP_S + int(seconds(for_))
    steps = fire_at // tl.STEP_S + 1
    lp = {c.LANE: lane.lane, c.POOL: lane.pool}
    bucket, _, count = LATENCY[kind].series

    def shifted(bound: float, after: bool) -> str:
        top = per_step * CHANGE_STEP
        if bound < high and after:
            return f"{s.counter(per_step, CHANGE_STEP)} {s.gauge(top, steps - CHANGE_STEP - 1)}"
        return s.counter(per_step, steps)

    def inputs(changed: bool) -> list[s.Series]:
        out = [
            s.series(bucket, {**lp, "le": c.bucket_le(b)}, shifted(b, True)) for b in (low, high)
        ]
        out.append(s.series(bucket, {**lp, "le": "+Inf"}, s.counter(per_step, steps)))
        out.append(s.series(count, lp, s.counter(per_step, steps)))
        if changed:
            at = CHANGE_STEP * tl.STEP_S
            values = f"_x{CHANGE_STEP} {s.gauge(at, steps - CHANGE_STEP - 1)}"
            out.append(
                s.series(c.POOL_SETTINGS_CHANGED.name, {c.POOL: lane.pool, **CHANGED}, values)
            )
        return out

    alert = c.ALERT_SETTINGS_CHANGE_REGRESSION
    rule = index.find(alert, lane=lane.lane, slo=kind)
    p95 = low + (high - low) * 0.95
    name = f"{alert} lane {lane.lane} {kind}"
    return [
        tl.group(
            f"{name}: p95 moves up a bucket after a settings change, fires after {for_}",
            inputs(True),
            [
                tl.alert_test(alert, pending, []),
                tl.alert_test(alert, fire_at, [s.expected(rule, lp, p95)]),
            ],
        ),
        tl.group(
            f"{name}: silent when the same shift follows no settings change",
            inputs(False),
            [tl.alert_test(alert, fire_at, [])],
        ),
    ]
