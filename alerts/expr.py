"""PromQL for the rules: the SLI error ratios, on the building blocks of ``obs.prom.expr``.

Metric and rule names come from ``obs.conventions`` only.
"""

from __future__ import annotations

from obs import conventions as c
from obs.prom import expr as p

# Re-exported: the rule generators build on the shared blocks through this one module.
from obs.prom.expr import agg as agg
from obs.prom.expr import eq as eq
from obs.prom.expr import increase as increase
from obs.prom.expr import num as num
from obs.prom.expr import one_of as one_of
from obs.prom.expr import positive as positive
from obs.prom.expr import rate as rate
from obs.slo import LATENCY_HISTOGRAMS

from .model import SLI


def selector(name: str, *matchers: str) -> str:
    """``name{m1,m2}`` as the rule files write it (compact), or the bare name."""
    return p.selector(name, *matchers, sep=p.COMPACT)


def sli_error(sli: SLI, window: str) -> str:
    """Share of the lane's requests over ``window`` that broke the SLO (no sample if idle)."""
    if sli.kind == "availability":
        return _availability_error(sli, window)
    return _latency_error(sli, window)


def _latency_error(sli: SLI, window: str) -> str:
    metric = LATENCY_HISTOGRAMS[sli.kind]
    bucket, _, count = metric.series
    lane = eq(c.LANE, sli.lane)
    good = agg("sum", rate(selector(bucket, lane, eq("le", sli.le)), window), c.LANE)
    total = agg("sum", rate(selector(count, lane), window), c.LANE)
    return f"1 - (\n  {good}\n  /\n  {positive(total)}\n)"


def _availability_error(sli: SLI, window: str) -> str:
    (requests,) = c.REQUESTS.series
    lane = eq(c.LANE, sli.lane)
    counted = one_of(c.OUTCOME, c.AVAILABILITY_EXCLUDED_OUTCOMES, negate=True)
    bad = agg(
        "sum", rate(selector(requests, lane, one_of(c.OUTCOME, c.BAD_OUTCOMES)), window), c.LANE
    )
    total = agg("sum", rate(selector(requests, lane, counted), window), c.LANE)
    # A lane with no failures yet has no error series: count it as zero, not as no data.
    return f"(\n  {bad}\n  or\n  0 * {total}\n)\n/\n{positive(total)}"


def requests_in(sli: SLI, window: str) -> str:
    """How many of the lane's requests the SLI counted over ``window`` (its denominator)."""
    lane = eq(c.LANE, sli.lane)
    if sli.kind == "availability":
        (requests,) = c.REQUESTS.series
        counted = one_of(c.OUTCOME, c.AVAILABILITY_EXCLUDED_OUTCOMES, negate=True)
        return agg("sum", increase(selector(requests, lane, counted), window), c.LANE)
    count = LATENCY_HISTOGRAMS[sli.kind].series[2]
    return agg("sum", increase(selector(count, lane), window), c.LANE)


def lane_requests(lane: str, window: str) -> str:
    """Every request of the lane over ``window``, whatever its outcome."""
    sel = selector(c.REQUESTS.series[0], eq(c.LANE, lane))
    return agg("sum", increase(sel, window), c.LANE)


def enough(by: str, count: str, floor: int) -> str:
    """``and on (by)`` the request count ``count`` is at least ``floor``: an alert's evidence."""
    return f"and on ({by})\n{count} >= {floor}"
