"""Cold starts of the pools' replicas (the sidecar's pool monitor): how long a replica that
was down took to answer its health poll and to serve its first token, and how often one
came back."""

from __future__ import annotations

from obs import conventions as c

from . import expr as e
from .panels import Grid, Query, timeseries


def cold_start_row(grid: Grid) -> None:
    """A row of the pools dashboard: each replica's last cold start per stage, and restarts."""
    grid.row("Cold starts (replicas coming back)")
    took = e.selector(c.POOL_COLD_START.name, e.POOL_VAR)
    grid.add(
        timeseries(
            "Cold start: seconds to healthy and to first token",
            [Query(f"max by (pool, replica, stage) ({took})", "{{pool}} {{replica}} {{stage}}")],
            unit="s",
            description=(
                "Each replica's last cold start: from its first failure (a failed poll or a "
                "refused connection) to its first healthy poll (healthy) and to the first token "
                "it served after that (first_token): a restart's, a crash's or a new replica's "
                "start-up time (model load, CUDA graphs, warm-up). No series: no replica has "
                "come back since the sidecar started."
            ),
        ),
        12,
        8,
    )
    times = e.selector(c.POOL_COLD_STARTS.series[0], e.POOL_VAR)
    grid.add(
        timeseries(
            "Replicas coming back",
            [Query(f"sum by (pool, replica) (increase({times}[1h]))", "{{pool}} {{replica}}")],
            unit="short",
            description=(
                "Times each replica came back after being down, over the last hour "
                "(vllm_obs_pool_cold_starts_total): a replica that keeps restarting is crashing."
            ),
        ),
        12,
        8,
    )
