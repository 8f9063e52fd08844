"""PromQL building blocks for the rules: selectors, rates, aggregations, SLI error ratios.

Metric and rule names come from ``obs.conventions`` only.
"""

from __future__ import annotations

from obs import conventions as c

from .model import SLI

_HISTOGRAMS = {"ttft": c.TTFT, "tpot": c.TPOT}


def eq(label: str, value: str) -> str:
    """``label="value"``."""
    return f'{label}="{value}"'


def one_of(label: str, values: tuple[str, ...], negate: bool = False) -> str:
    """Match any of ``values`` (``=``/``!=`` for one value, a regex for several)."""
    if len(values) == 1:
        return f'{label}{"!=" if negate else "="}"{values[0]}"'
    return f'{label}{"!~" if negate else "=~"}"{"|".join(values)}"'


def selector(name: str, *matchers: str) -> str:
    """``name{m1,m2}``, or the bare name when there are no matchers."""
    return f"{name}{{{','.join(matchers)}}}" if matchers else name


def rate(sel: str, window: str) -> str:
    """Per-second rate of a counter selector over ``window``."""
    return f"rate({sel}[{window}])"


def agg(op: str, expr: str, *by: str) -> str:
    """``op by (labels) (expr)``, or ``op(expr)`` when no labels are kept."""
    return f"{op} by ({', '.join(by)}) ({expr})" if by else f"{op}({expr})"


def positive(expr: str) -> str:
    """``expr`` where it is above zero: a denominator that yields no sample, not NaN."""
    return f"({expr} > 0)"


def num(x: float) -> str:
    """A number as PromQL and people read it: 14.4, 6, 0.005."""
    return format(x, "g")


def threshold_le(sli: SLI) -> str:
    """The ``le`` label of the bucket that ends exactly at the SLI's threshold."""
    assert sli.threshold_s is not None
    return c.bucket_le(sli.threshold_s)


def sli_error(sli: SLI, window: str) -> str:
    """Share of the lane's requests over ``window`` that broke the SLO (no sample if idle)."""
    if sli.kind == "availability":
        return _availability_error(sli, window)
    return _latency_error(sli, window)


def _latency_error(sli: SLI, window: str) -> str:
    metric = _HISTOGRAMS[sli.kind]
    bucket, _, count = metric.series
    lane = eq(c.LANE, sli.lane)
    good = agg("sum", rate(selector(bucket, lane, eq("le", threshold_le(sli))), window), c.LANE)
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
