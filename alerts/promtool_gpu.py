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
from .model import HEALTH_POLICY, AlertModel, LaneHealth
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
    return (
        _memory_cases(model, index)
        + _util_cases(model, index)
        + _spec_cases(model, index)
        + _change_cases(model, index)
    )


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


def _spec_cases(model: AlertModel, index: RuleIndex) -> list[Group]:
    """Every vLLM pool at once (one long timeline is costly): acceptance at 2/3 for two
    hours, then a fifth of its share (fires) or 0.9 of it (silent)."""
    pools = [p for p in model.pools if p.engine in ("vllm", "auto")]
    if not pools:
        return []
    th = model.thresholds
    before = DRAFTS * 2 // 3
    window = int(seconds(th.spec_window)) // tl.STEP_S
    fire_at = (CHANGE_STEP + window) * tl.STEP_S + int(seconds("1h")) // 2
    steps = fire_at // tl.STEP_S + 1

    def inputs(after: int) -> list[s.Series]:
        accepted = (
            f"{s.counter(before, CHANGE_STEP)} "
            f"{s.counter(after, steps - CHANGE_STEP - 1, start=before * CHANGE_STEP + after)}"
        )
        out = []
        for p in pools:
            labels = {c.POOL: p.pool, "model_name": s.MODEL, "engine": "0"}
            out.append(s.series(c.VLLM_SPEC_DRAFT_TOKENS, labels, s.counter(DRAFTS, steps)))
            out.append(s.series(c.VLLM_SPEC_ACCEPTED, labels, accepted))
        return out

    low = max(1, round(before * th.spec_acceptance_drop_ratio / 5))
    near = math.ceil(before * (1 + th.spec_acceptance_drop_ratio) / 2)
    alert = c.ALERT_SPEC_DECODE_ACCEPTANCE_DROP
    fired = [
        s.expected(index.find(alert, pool=p.pool), {c.POOL: p.pool}, low / DRAFTS) for p in pools
    ]
    return [
        tl.group(
            f"{alert}: acceptance falls to {low}/{DRAFTS} on every pool, fires",
            inputs(low),
            [
                tl.alert_test(alert, (CHANGE_STEP + window // 2 + 2) * tl.STEP_S, []),
                tl.alert_test(alert, fire_at, fired),
            ],
        ),
        tl.group(
            f"{alert}: silent at {near}/{DRAFTS}", inputs(near), [tl.alert_test(alert, fire_at, [])]
        ),
    ]


def _change_cases(model: AlertModel, index: RuleIndex) -> list[Group]:
    """Every lane's TTFT and TPOT at once (one long timeline is costly): requests in one
    bucket for two hours, then in a bucket further up; the pools' settings changed at two
    hours (fires), or never (silent)."""
    th = model.thresholds
    after_min = int(seconds(th.change_after)) // tl.STEP_S
    for_ = HEALTH_POLICY[c.ALERT_SETTINGS_CHANGE_REGRESSION].for_
    pending = (CHANGE_STEP + 1) * tl.STEP_S + int(seconds(for_)) - 2 * tl.STEP_S
    fire_at = (CHANGE_STEP + after_min + 1) * tl.STEP_S + int(seconds(for_))
    steps = fire_at // tl.STEP_S + 1
    kinds = ("ttft", "tpot")

    def bounds(kind: str) -> tuple[float, float]:
        buckets = c.LATENCY_BUCKETS if kind == "ttft" else c.TOKEN_LATENCY_BUCKETS
        return buckets[3], buckets[5]

    def histogram(lane: LaneHealth, kind: str) -> list[s.Series]:
        low, high = bounds(kind)
        per_step = max(10, math.ceil(2 * lane.min_requests / after_min))
        lp = {c.LANE: lane.lane, c.POOL: lane.pool}
        bucket, _, count = LATENCY[kind].series
        top = per_step * CHANGE_STEP
        shifted = f"{s.counter(per_step, CHANGE_STEP)} {s.gauge(top, steps - CHANGE_STEP - 1)}"
        return [
            s.series(bucket, {**lp, "le": c.bucket_le(low)}, shifted),
            s.series(bucket, {**lp, "le": c.bucket_le(high)}, s.counter(per_step, steps)),
            s.series(bucket, {**lp, "le": "+Inf"}, s.counter(per_step, steps)),
            s.series(count, lp, s.counter(per_step, steps)),
        ]

    def inputs(changed: bool) -> list[s.Series]:
        out = [x for lane in model.lanes for kind in kinds for x in histogram(lane, kind)]
        if changed:
            values = f"_x{CHANGE_STEP} {s.gauge(CHANGE_STEP * tl.STEP_S, steps - CHANGE_STEP - 1)}"
            for pool in dict.fromkeys(lane.pool for lane in model.lanes):
                out.append(
                    s.series(c.POOL_SETTINGS_CHANGED.name, {c.POOL: pool, **CHANGED}, values)
                )
        return out

    alert = c.ALERT_SETTINGS_CHANGE_REGRESSION
    fired = []
    for lane in model.lanes:
        # A lane without that latency SLO has no rule: its shifted series stay silent.
        for kind in lane.latency_slos:
            low, high = bounds(kind)
            rule = index.find(alert, lane=lane.lane, slo=kind)
            lp = {c.LANE: lane.lane, c.POOL: lane.pool}
            fired.append(s.expected(rule, lp, low + (high - low) * 0.95))
    if not fired:
        return []
    return [
        tl.group(
            f"{alert}: p95 moves up a bucket after a settings change, fires after {for_}",
            inputs(True),
            [tl.alert_test(alert, pending, []), tl.alert_test(alert, fire_at, fired)],
        ),
        tl.group(
            f"{alert}: silent when the same shift follows no settings change",
            inputs(False),
            [tl.alert_test(alert, fire_at, [])],
        ),
    ]
