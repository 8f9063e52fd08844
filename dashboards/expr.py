"""PromQL for the dashboards: template variables, quantiles, joins (on ``obs.prom.expr``).

Metric names come from ``obs.conventions`` only. Template variables are
written as Grafana expects them (``$lane``) and always matched with ``=~``,
so that a multi-value or "All" selection (Grafana sends a regex) works.
"""

from __future__ import annotations

from obs import conventions as c
from obs.prom import expr as p

# Re-exported: the dashboards build on the shared blocks through this one module.
from obs.prom.expr import agg as agg
from obs.prom.expr import eq as eq
from obs.prom.expr import increase as increase
from obs.prom.expr import like as like
from obs.prom.expr import selector as selector
from obs.prom.expr import unlike as unlike

RATE = "$__rate_interval"
QUANTILES = (0.5, 0.95, 0.99)


# Matchers for the dashboards' template variables.
LANE_VAR = like(c.LANE, "$lane")
POOL_VAR = like(c.POOL, "$pool")
MODEL_VAR = like(c.MODEL, "$model")
VLLM_MODEL_VAR = like("model_name", "$model")  # vLLM labels its metrics model_name
LP_VARS = (LANE_VAR, POOL_VAR)


def total(metric: c.Metric) -> str:
    """The stored sample name of a counter (``..._total``)."""
    if metric.kind != "counter":
        raise ValueError(f"{metric.name} is a {metric.kind}, not a counter")
    return metric.series[0]


def bucket(metric: c.Metric) -> str:
    """The ``_bucket`` series of a histogram."""
    return _hist(metric, 0)


def hsum(metric: c.Metric) -> str:
    """The ``_sum`` series of a histogram."""
    return _hist(metric, 1)


def hcount(metric: c.Metric) -> str:
    """The ``_count`` series of a histogram."""
    return _hist(metric, 2)


def _hist(metric: c.Metric, i: int) -> str:
    if metric.kind != "histogram":
        raise ValueError(f"{metric.name} is a {metric.kind}, not a histogram")
    return metric.series[i]


def rate(sel: str, window: str = RATE) -> str:
    """Per-second rate of a counter selector over ``window`` (Grafana's by default)."""
    return p.rate(sel, window)


def sum_by(expr: str, *by: str) -> str:
    """``sum by (labels) (expr)``."""
    return agg("sum", expr, *by)


def quantile(q: float, bucket_sel: str, *by: str) -> str:
    """The q-quantile of a classic histogram, per ``by`` labels."""
    return f"histogram_quantile({q}, {sum_by(rate(bucket_sel), *by, 'le')})"


def ratio(num: str, den: str) -> str:
    """``num / den``, each side parenthesised."""
    return f"({num}) / ({den})"


def mean(metric: c.Metric, matchers: tuple[str, ...], *by: str) -> str:
    """Mean of a histogram's observations per ``by`` labels (sum rate / count rate)."""
    return ratio(
        sum_by(rate(selector(hsum(metric), *matchers)), *by),
        sum_by(rate(selector(hcount(metric), *matchers)), *by),
    )


def per_lane(pool_expr: str) -> str:
    """Spread a per-pool series to every selected lane routed to that pool.

    ``pool_expr`` must carry exactly one series per ``pool``; the result has
    the labels ``lane`` and ``pool`` (``vllm_obs_lane_info`` is always 1).
    """
    info = selector(c.LANE_INFO.name, LANE_VAR)
    return f"{info} * on ({c.POOL}) group_left () ({pool_expr})"


def tagged(expr: str, label: str, value: str) -> str:
    """``expr`` with a constant label added (to tell series apart before ``or``)."""
    return f'label_replace({expr}, "{label}", "{value}", "", "")'
