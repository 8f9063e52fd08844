"""One replica against its pool: ``VllmObsReplicaOutlier``.

Per vLLM pool, each replica's mean time to first token and mean inter-token latency over
``WINDOW`` (vLLM's own histograms, ``vllm:time_to_first_token_seconds`` and
``vllm:inter_token_latency_seconds``, as Prometheus scrapes each replica: labels ``pool`` and
``instance``) over the fastest replica's of the same pool. A replica ``RATIO`` times slower
than its pool's fastest on either, for ``for:``, fires: the pool's replicas take the same
lanes (least-outstanding routing spreads them), so one far out is that replica's host or GPU
(a throttled or faulty GPU, a noisy neighbour), not the load. The runbook's lever: drain it.
``vllm-obs query incident`` names the same replica as the mechanism from the events.
"""

from __future__ import annotations

from obs import conventions as c

from . import expr as e
from .health_rules import _alert
from .model import AlertModel, PoolHealth
from .slo_rules import Group, Rule

WINDOW = "5m"
RATIO = 3.0  # a replica this many times its pool's fastest replica's TTFT or ITL
BY = (c.POOL, "instance")  # one replica as Prometheus scrapes it
VLLM_KINDS = ("vllm", "sim", "auto")  # the simulated vLLM serves vLLM's histograms too
INSTANCE = "{{ $labels.instance }}"


def replica_groups(model: AlertModel) -> list[Group]:
    """One group: each vLLM pool's outlier replica (none for a config without one)."""
    rules = [_outlier(model, p) for p in model.pools if p.engine in VLLM_KINDS]
    return [{"name": "vllm-obs-replicas", "rules": rules}] if rules else []


def replica_mean(histogram: str, pool: str, window: str = WINDOW) -> str:
    """Each replica's mean of ``histogram`` (a vLLM seconds histogram) over ``window``."""
    sel = e.eq(c.POOL, pool)
    total = e.agg("sum", e.rate(e.selector(f"{histogram}_sum", sel), window), *BY)
    count = e.agg("sum", e.rate(e.selector(f"{histogram}_count", sel), window), *BY)
    return f"{total}\n/\n{e.positive(count)}"


def outlier_ratio(histogram: str, pool: str, window: str = WINDOW) -> str:
    """Each replica's mean over the fastest replica's of its pool (1: it is the fastest)."""
    mean = replica_mean(histogram, pool, window)
    return f"(\n{mean}\n)\n/ on ({c.POOL}) group_left ()\nmin by ({c.POOL}) (\n{mean}\n)"


def _outlier(model: AlertModel, p: PoolHealth) -> Rule:
    ratio = e.num(RATIO)
    ttft, itl = outlier_ratio(c.VLLM_TTFT, p.pool), outlier_ratio(c.VLLM_ITL, p.pool)
    return _alert(
        model,
        c.ALERT_REPLICA_OUTLIER,
        f"(\n{ttft}\n) > {ratio}\nor\n(\n{itl}\n) > {ratio}",
        {c.POOL: p.pool},
        f'Replica {INSTANCE} of pool {p.pool} is {{{{ printf "%.1f" $value }}}}x slower '
        "than its pool's fastest",
        f'Replica {INSTANCE} of pool {p.pool} took {{{{ printf "%.1f" $value }}}} times the '
        f"time to first token or per output token of the pool's fastest replica over the last "
        f"{WINDOW} (vLLM's own histograms). The pool's replicas take the same lanes, so one far "
        "out is that replica's host or GPU: drain it (take it out of the pool's replicas), then "
        "check its GPU (VllmObsGPUThrottled, VllmObsGPUXidError) and co-located processes.",
    )
