"""Who holds each pool: its queue beside the lanes holding it (the sidecar's occupancy gauges)
and their prompt tokens per second, on the overview; one replica against its pool's fastest,
on the pools dashboard."""

from __future__ import annotations

from obs import conventions as c
from obs.config import Config

from . import expr as e
from .panels import Grid, Query, timeseries

BY_REPLICA = (c.POOL, "instance")  # a replica as Prometheus scrapes it


def occupancy_row(grid: Grid, config: Config) -> None:
    """Per pool: its engines' queue, the prompt tokens not yet prefilled and the sequences
    decoding by lane, and each lane's prompt tokens per second."""
    grid.row("Who holds each pool")
    for pool in config.pools:
        at = e.eq(c.POOL, pool.name)
        grid.add(
            timeseries(
                f"Pool {pool.name}: queue",
                [
                    Query(e.sum_by(e.selector(c.POOL_WAITING.name, at), c.POOL), "engine waiting"),
                    Query(e.sum_by(e.selector(c.POOL_RUNNING.name, at), c.POOL), "engine running"),
                ],
                unit="short",
                description="Requests waiting for and running in the pool's engines.",
            ),
            8,
            8,
        )
        grid.add(
            timeseries(
                f"Pool {pool.name}: who holds it",
                [
                    Query(
                        e.sum_by(
                            e.selector(c.OCCUPANCY_PREFILL_TOKENS.name, at, e.LANE_VAR), c.LANE
                        ),
                        "{{lane}} prompt tokens waiting or prefilling",
                    ),
                    Query(
                        e.sum_by(e.selector(c.OCCUPANCY_DECODING.name, at, e.LANE_VAR), c.LANE),
                        "{{lane}} sequences decoding",
                    ),
                ],
                unit="short",
                description=(
                    "The sidecar's requests in flight on the pool's replicas, by lane: estimated "
                    "prompt tokens (request bytes / 4) with no first token yet, and sequences "
                    "decoding. A lane whose prompt tokens fill the pool while another's queue "
                    "grows is the trigger of that lane's misses (vllm-obs query incident)."
                ),
            ),
            8,
            8,
        )
        grid.add(
            timeseries(
                f"Pool {pool.name}: prompt tokens/s by lane",
                [
                    Query(
                        e.sum_by(
                            e.rate(e.selector(e.total(c.PROMPT_TOKENS), at, e.LANE_VAR)), c.LANE
                        ),
                        "{{lane}}",
                    )
                ],
                unit="short",
                description="Prompt tokens each lane sent the pool per second (the pool's usage).",
            ),
            8,
            8,
        )


def replica_ratio(histogram: str) -> str:
    """Each replica's mean of vLLM's ``histogram`` over its pool's fastest replica's."""
    sel = (e.POOL_VAR,)
    mean = e.ratio(
        e.sum_by(e.rate(e.selector(f"{histogram}_sum", *sel)), *BY_REPLICA),
        e.sum_by(e.rate(e.selector(f"{histogram}_count", *sel)), *BY_REPLICA),
    )
    return f"({mean}) / on ({c.POOL}) group_left () min by ({c.POOL}) ({mean})"


def outlier_row(grid: Grid) -> None:
    """Each replica's TTFT and ITL over its pool's fastest (VllmObsReplicaOutlier above 3)."""
    grid.row("One replica against its pool")
    grid.add(
        timeseries(
            "Replica TTFT and ITL over its pool's fastest",
            [
                Query(replica_ratio(c.VLLM_TTFT), "{{pool}} {{instance}} TTFT"),
                Query(replica_ratio(c.VLLM_ITL), "{{pool}} {{instance}} ITL"),
            ],
            unit="short",
            description=(
                "Each replica's mean time to first token and inter-token latency (vLLM's own "
                "histograms) over the fastest replica's of its pool: 1 is the fastest. Above 3 "
                "for 5 minutes VllmObsReplicaOutlier fires: drain that replica."
            ),
        ),
        24,
        8,
    )
