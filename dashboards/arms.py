"""The lane dashboard's split row: a split lane's arms side by side, and its fallbacks.

Filtered by the lane only (not by ``$pool``), so every arm of the lane shows: the p95 TTFT
and TPOT of the requests each pool served, the requests each arm's clients sent by outcome
(``vllm_obs_lane_arm_requests_total``), and the requests the lane's fallback answered, by
the pool that failed them and why. A lane without a split or fallback shows its one pool
and no arm or fallback series.
"""

from __future__ import annotations

from obs import conventions as c

from . import expr as e
from .panels import Grid, Query, timeseries


def add_arms(grid: Grid) -> None:
    """The row: latency per arm, then requests per arm and fallbacks."""
    grid.row("Arms and fallbacks (split lanes)")
    latency = [
        Query(e.quantile(0.95, e.selector(e.bucket(m), e.LANE_VAR), c.POOL), f"{name} {{{{pool}}}}")
        for m, name in ((c.TTFT, "TTFT p95"), (c.TPOT, "TPOT p95"))
    ]
    grid.add(
        timeseries(
            "p95 TTFT and TPOT per arm",
            latency,
            unit="s",
            description=(
                "The lane's p95 time to first token and time per output token, per pool that "
                "served it: a split's canary beside its baseline (vllm-obs query canary judges "
                "them; VllmObsCanaryRollback alerts on a canary beyond its margin)."
            ),
        ),
        12,
        8,
    )
    arms = e.selector(e.total(c.LANE_ARM_REQUESTS), e.LANE_VAR)
    fallbacks = e.selector(e.total(c.FALLBACKS), e.LANE_VAR)
    grid.add(
        timeseries(
            "Requests per arm, and fallbacks",
            [
                Query(e.sum_by(e.rate(arms), c.ARM, c.OUTCOME), "arm {{arm}} {{outcome}}"),
                Query(
                    e.sum_by(e.rate(fallbacks), c.POOL, c.REASON),
                    "fallback from {{pool}}: {{reason}}",
                ),
            ],
            unit="reqps",
            description=(
                "Requests per second by the arm their client's identity chose and outcome, "
                "and requests the lane's fallback pool answered, by the pool that refused, "
                "failed or timed out and why."
            ),
        ),
        12,
        8,
    )
