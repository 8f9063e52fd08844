"""Input series for the promtool tests, shaped like the sidecar's ``/metrics``.

Names, label sets and ``le`` values are the ones ``obs.exporters.prom`` writes
(with the ``job``/``instance`` labels a scrape adds); values use promtool's
expanding notation, one sample per minute from t=0.
"""

from __future__ import annotations

from typing import Any

from obs import conventions as c
from obs.slo import LATENCY_HISTOGRAMS

from .gotemplate import RANGE, render
from .model import SLI

# What a scrape of the sidecar adds to every series.
SCRAPE = {"job": "vllm-obs", "instance": "sidecar:8000"}
MODEL = "served-model"

Series = dict[str, str]


def number(x: float) -> str:
    """A sample value promtool reads back exactly (no exponent)."""
    return str(int(x)) if x == int(x) else repr(round(x, 6))


def series(name: str, labels: dict[str, str], values: str) -> Series:
    """One ``input_series`` entry."""
    body = ",".join(f'{k}="{v}"' for k, v in {**labels, **SCRAPE}.items())
    return {"series": f"{name}{{{body}}}", "values": values}


def counter(per_step: float, steps: int, start: float = 0) -> str:
    """A counter growing by ``per_step`` every minute."""
    return f"{number(start)}+{number(per_step)}x{steps}"


def gauge(value: float, steps: int) -> str:
    """A constant gauge."""
    return f"{number(value)}+0x{steps}"


def latency_histogram(
    metric: c.Metric,
    labels: dict[str, str],
    buckets: tuple[float, ...],
    fast: float,
    slow: float,
    total: int,
    bad: int,
    steps: int,
) -> list[Series]:
    """A histogram with ``total - bad`` observations at ``fast`` and ``bad`` at ``slow``
    seconds per minute. Written: the buckets around both values, +Inf, _sum, _count."""
    bucket, hsum, hcount = metric.series
    bounds = sorted({*_around(buckets, fast), *_around(buckets, slow)})
    out = []
    for b in bounds:
        n = (total - bad if b >= fast else 0) + (bad if b >= slow else 0)
        out.append(series(bucket, {**labels, "le": c.bucket_le(b)}, counter(n, steps)))
    out.append(series(bucket, {**labels, "le": "+Inf"}, counter(total, steps)))
    out.append(series(hsum, labels, counter(round((total - bad) * fast + bad * slow, 3), steps)))
    out.append(series(hcount, labels, counter(total, steps)))
    return out


def _around(buckets: tuple[float, ...], x: float) -> list[float]:
    """The bound of the bucket ``x`` falls in, and the bound before it (if any)."""
    i = next(i for i, b in enumerate(buckets) if x <= b)
    return list(buckets[max(i - 1, 0) : i + 1])


def sli_buckets(sli: SLI) -> tuple[float, ...]:
    """The bucket bounds the sidecar gives the SLI's histogram (threshold included)."""
    assert sli.threshold_s is not None
    base = c.LATENCY_BUCKETS if sli.kind == "ttft" else c.TOKEN_LATENCY_BUCKETS
    return c.merged_buckets(base, [sli.threshold_s])


# The misses of each SLO's tests, by (phase, cause): TOP_SHARE of them the first, the rest
# the second; so the alerts' top phase and cause, and its part of the burn, are known.
MISS_SPLIT = {
    "ttft": (("queue", "admission_queue"), ("prefill", "long_prefill")),
    "tpot": (("decode", "slow_client"), ("decode", "other")),
    "itl": (("decode", "slow_client"), ("decode", "other")),
    "availability": (("queue", "upstream_error"), ("prefill", "other")),
}
TOP_SHARE = 0.75


def misses(sli: SLI, steps: int) -> list[Series]:
    """``vllm_obs_slo_misses_total`` of the SLI: 3 misses a minute to its first phase and
    cause of ``MISS_SPLIT``, 1 to the second (only the split matters to the rules)."""
    out = []
    for (phase, cause), n in zip(MISS_SPLIT[sli.kind], (3, 1), strict=True):
        labels = {c.LANE: sli.lane, c.SLO_LABEL: sli.kind, c.PHASE: phase, c.CAUSE: cause}
        out.append(series(c.SLO_MISSES.series[0], labels, counter(n, steps)))
    return out


def sli_inputs(sli: SLI, total: int, bad: int, steps: int) -> list[Series]:
    """Series from which the SLI's error ratio is ``bad / total`` (and its misses' split)."""
    return _sli_inputs(sli, total, bad, steps) + (misses(sli, steps) if bad else [])


def _sli_inputs(sli: SLI, total: int, bad: int, steps: int) -> list[Series]:
    labels = {c.LANE: sli.lane, c.POOL: sli.pool}
    if sli.kind == "availability":
        return requests(sli.lane, sli.pool, total, bad, steps)
    assert sli.threshold_s is not None
    buckets = sli_buckets(sli)
    le = float(sli.le)
    i = buckets.index(le)
    fast = buckets[i - 1] if i > 0 else le / 2  # within the threshold
    slow = buckets[i + 1] if i + 1 < len(buckets) else le * 2  # beyond it
    metric = LATENCY_HISTOGRAMS[sli.kind]
    return latency_histogram(metric, labels, buckets, fast, slow, total, bad, steps)


def requests(lane: str, pool: str, total: int, bad: int, steps: int) -> list[Series]:
    """``vllm_obs_requests_total`` by outcome: of ``total`` counted requests ``bad``
    failed server-side; rejected and disconnected requests come on top (not counted)."""
    client = (total - bad) // 10

    def by(outcome: str, finish: str, n: int) -> Series:
        labels = {
            c.LANE: lane,
            c.POOL: pool,
            c.MODEL: MODEL,
            c.OUTCOME: outcome,
            c.FINISH_REASON: finish,
        }
        return series(c.REQUESTS.series[0], labels, counter(n, steps))

    out = [by(c.OK, "stop", total - bad - client), by(c.CLIENT_ERROR, "none", client)]
    if bad:
        out.append(by(c.ERROR, "none", bad))
    out += [by(c.REJECTED, "none", total), by(c.DISCONNECTED, "none", total // 2)]
    return out


BY_CAUSE = c.burn_by_cause_rule("")  # the burn-by-cause rules' names start so


def expected(rule: dict[str, Any], labels: dict[str, str], value: float) -> dict[str, Any]:
    """One expected firing alert: the rule's labels plus the series', rendered annotations."""
    all_labels = {**rule["labels"], **labels}
    top = None
    if c.SLO_LABEL in all_labels:  # a burn-rate alert: its top phase and cause are known
        phase, cause = MISS_SPLIT[all_labels[c.SLO_LABEL]][0]
        top = ({c.PHASE: phase, c.CAUSE: cause}, value * TOP_SHARE)
    return {
        "exp_labels": all_labels,
        "exp_annotations": {
            # The cases feed the burn by cause; no other query (who holds the pool) has data.
            k: render(
                v, value, all_labels, {q: top if BY_CAUSE in q else None for q in range_queries(v)}
            )
            for k, v in rule["annotations"].items()
        },
    }


def range_queries(text: str) -> list[str]:
    return [m.group("q") for m in RANGE.finditer(text)]
