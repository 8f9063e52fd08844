"""promtool test groups for the canary alert: each signal of each canary arm fires beyond
its margin, and stays silent inside it or while an arm has too few requests.

Histograms are built so that ``histogram_quantile`` lands where a case wants it: the
baseline's observations all in one bucket, the canary's split between the two bounds of
the bucket that holds its target p95 (``split_for``). ``quantile`` computes what
Prometheus will (linear interpolation within the bucket), and each case checks that its
p95 ratio sits well clear of the margin.
"""

from __future__ import annotations

import math
from typing import Any

from obs import conventions as c

from . import series as s
from .canary_rules import LATENCY, QUANTILE
from .model import AlertModel, CanaryArm
from .promtool_health import RATE_S, _pair
from .rules import RuleIndex

N = 1000  # requests per arm per step
FEW = 1  # requests per step that stay under any min_requests over the test
BUCKETS = {"ttft": c.LATENCY_BUCKETS, "tpot": c.TOKEN_LATENCY_BUCKETS}
Hist = list[tuple[float, int]]  # (upper bound, cumulative count per step), +Inf last


def canary_tests(model: AlertModel, index: RuleIndex) -> list[dict[str, Any]]:
    """Every canary test group, arm by arm."""
    out: list[dict[str, Any]] = []
    for arm in model.canaries:
        for kind, margin in (("ttft", arm.ttft_p95_margin), ("tpot", arm.tpot_p95_margin)):
            out += _latency_cases(arm, index, kind, margin)
        if arm.availability_objective is not None:
            out += _availability_cases(arm, index, 1 - arm.availability_objective)
    return out


def quantile(q: float, hist: Hist) -> float:
    """Prometheus' ``histogram_quantile`` of one histogram (lowest bucket starts at 0)."""
    total = hist[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0
    for bound, count in hist:
        if count >= rank:
            if math.isinf(bound):
                return prev_bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


def split_for(buckets: tuple[float, ...], target: float, n: int) -> Hist:
    """``n`` observations per step whose p95 is close to ``target`` seconds."""
    i = next(i for i, b in enumerate(buckets) if target <= b)
    lo, hi = (buckets[i - 1], buckets[i]) if i > 0 else (0.0, buckets[0])
    f = (target - lo) / (hi - lo)
    below = max(0, math.ceil((QUANTILE - f) / (1 - f) * n)) if f < QUANTILE else 0
    hist = [(lo, below)] if lo > 0 else []
    return [*hist, (hi, n), (math.inf, n)]


def _hist_series(kind: str, arm: CanaryArm, pool: str, hist: Hist, steps: int) -> list[s.Series]:
    bucket = LATENCY[kind].series[0]
    labels = {c.LANE: arm.lane, c.POOL: pool}
    return [
        s.series(bucket, {**labels, "le": c.bucket_le(b) if not math.isinf(b) else "+Inf"},
                 s.counter(n, steps))
        for b, n in hist
    ]  # fmt: skip


def _arm_requests(arm: CanaryArm, pool: str, n: int, bad: int, steps: int) -> list[s.Series]:
    """The arm's requests by outcome: ``bad`` of ``n`` failed, plus rejections (not counted)."""
    name = c.LANE_ARM_REQUESTS.series[0]
    counts = {c.OK: n - bad, c.ERROR: bad, c.REJECTED: n}
    return [
        s.series(name, {c.LANE: arm.lane, c.ARM: pool, c.OUTCOME: o}, s.counter(k, steps))
        for o, k in counts.items()
    ]


def _latency_cases(arm: CanaryArm, index: RuleIndex, kind: str, margin: float) -> list[Any]:
    buckets = BUCKETS[kind]
    base = [(buckets[9], N), (math.inf, N)]  # every observation in one bucket
    base_p95 = quantile(QUANTILE, base)
    over = split_for(buckets, base_p95 * (1 + margin) * 1.25, N)
    inside = split_for(buckets, base_p95 * (1 + margin / 3), N)
    for hist, beyond in ((over, True), (inside, False)):
        ratio = quantile(QUANTILE, hist) / base_p95
        if (ratio > 1 + margin) != beyond or abs(ratio - (1 + margin)) < 0.02:
            raise ValueError(f"{kind} test histogram of {arm} is too close to its margin")
    other = "tpot" if kind == "ttft" else "ttft"
    other_hist = [(BUCKETS[other][9], N), (math.inf, N)]

    def inputs(canary: Hist, n_canary: int) -> Any:
        def make(steps: int) -> list[s.Series]:
            out = _hist_series(kind, arm, arm.baseline, base, steps)
            out += _hist_series(kind, arm, arm.canary, canary, steps)
            for pool in (arm.baseline, arm.canary):  # the other signal: equal on both arms
                out += _hist_series(other, arm, pool, other_hist, steps)
            out += _arm_requests(arm, arm.baseline, N, 0, steps)
            return out + _arm_requests(arm, arm.canary, n_canary, 0, steps)

        return make

    rule = index.find(c.ALERT_CANARY_ROLLBACK, lane=arm.lane, pool=arm.canary, slo=kind)
    value = quantile(QUANTILE, over)
    pct = f"{(quantile(QUANTILE, inside) / base_p95 - 1) * 100:.0f}%"
    what = f"{arm.lane} canary {arm.canary} p95 {kind.upper()}"
    over_by = f"{(value / base_p95 - 1) * 100:.0f}%"

    def pair(silent: Any, near_miss: str) -> list[Any]:
        firing, expected = inputs(over, N), [s.expected(rule, {}, value)]
        title = f"{what} {over_by} over the baseline"
        return _pair(c.ALERT_CANARY_ROLLBACK, title, RATE_S, firing, expected, silent, near_miss)

    fires, inside_margin = pair(inputs(inside, N), f"only {pct} over (margin {margin * 100:g}%)")
    few = f"the canary has {FEW} request a minute (under min_requests {arm.min_requests})"
    return [fires, inside_margin, pair(inputs(over, FEW), few)[1]]


def _availability_cases(arm: CanaryArm, index: RuleIndex, budget: float) -> list[Any]:
    rule = index.find(c.ALERT_CANARY_ROLLBACK, lane=arm.lane, pool=arm.canary, slo="availability")
    bad_over, bad_inside = math.ceil(budget * N * 2), math.floor(budget * N / 2)

    def inputs(bad: int) -> Any:
        def make(steps: int) -> list[s.Series]:
            out = _arm_requests(arm, arm.baseline, N, 0, steps)
            return out + _arm_requests(arm, arm.canary, N, bad, steps)

        return make

    return _pair(
        c.ALERT_CANARY_ROLLBACK,
        f"{arm.lane} canary {arm.canary} fails {bad_over} of {N} requests",
        RATE_S,
        inputs(bad_over),
        [s.expected(rule, {}, bad_over / N)],
        inputs(bad_inside),
        f"it fails {bad_inside} of {N} (budget {budget:g})",
    )
