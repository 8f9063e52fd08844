"""tests/support/promql_names.py: the metric names a PromQL expression reads."""

from __future__ import annotations

import pytest

from tests.support.promql_names import metric_names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        ('rate(http_requests_total{job="a", path=~"/x|/y"}[5m])', {"http_requests_total"}),
        (
            "sum by (lane, le) (rate(a_bucket[1h30m])) / on (lane) group_left (pool) b_info",
            {"a_bucket", "b_info"},
        ),
        ("histogram_quantile(0.95, sum(rate(x_bucket[5m])) by (le)) > 1e3", {"x_bucket"}),
        (
            "vllm_obs:burn_rate:ratio_rate1h > 14.4 and vllm_obs:burn_rate:ratio_rate5m > 14.4",
            {"vllm_obs:burn_rate:ratio_rate1h", "vllm_obs:burn_rate:ratio_rate5m"},
        ),
        (
            '{__name__="vllm:num_requests_waiting", model_name="m"} offset 5m',
            {"vllm:num_requests_waiting"},
        ),
        ('absent(up{job="x"}) or vector(0) * Inf + NaN', {"up"}),
        ('label_replace(a, "dst", "$1", "src", "(.*)") # trailing "comment" b', {"a"}),
        ("count_over_time(a[5m:1m]) @ start() + 0x1F + .5 unless bool_thing", {"a", "bool_thing"}),
    ],
)
def test_metric_names(expr: str, names: set[str]) -> None:
    """Selectors count; functions, keywords, labels, strings, numbers and durations do not."""
    assert metric_names(expr) == names
