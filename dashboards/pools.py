"""Pools and KV: engine state per pool (and per lane through its pool), engine timings."""

from __future__ import annotations

from grafanalib.core import Dashboard

from obs import conventions as c
from obs.config import Config
from obs.engines.adapters import reports

from . import expr as e
from . import links
from . import variables as v
from .cold_starts import cold_start_row
from .models import gpus_row, models_row
from .occupancy import outlier_row
from .panels import Grid, Query, Steps, dashboard, stat, timeseries

UID = links.POOLS_UID
P = (e.POOL_VAR,)


def _lines(color_below: str, color_above: str, values: list[float]) -> Steps:
    """Threshold steps that draw one line at each value."""
    return ((color_below, None), *((color_above, x) for x in sorted(set(values))))


NOT_REPORTED = "not reported by this engine"


def _not_reported(config: Config, field: str) -> str:
    """A description sentence naming the pools whose engine does not report ``field``."""
    pools = [f"{p.name} ({p.engine})" for p in config.pools if field not in reports(p.engine)]
    if not pools:
        return ""
    return f" Not reported by the engine of pool {', '.join(pools)}: no series, never 0."


def _hit_ratio(*by: str) -> str:
    return e.ratio(
        e.sum_by(e.rate(e.selector(e.total(c.POOL_PREFIX_HITS), *P)), *by),
        e.sum_by(e.rate(e.selector(e.total(c.POOL_PREFIX_QUERIES), *P)), *by),
    )


def _engine_state(grid: Grid, config: Config) -> None:
    grid.row("Engine state")
    kv_max = [p.kv_cache_usage_max for p in config.pools]
    grid.add(
        timeseries(
            "KV cache usage",
            [
                Query(
                    e.agg("max", e.selector(c.POOL_KV_CACHE_USAGE.name, *P), c.POOL, c.REPLICA),
                    "{{pool}} {{replica}}",
                )
            ],
            unit="percentunit",
            description=(
                "KV cache usage of each replica. Lines: each pool's kv_cache_usage_max alert "
                "threshold from the config." + _not_reported(config, "kv_cache_usage")
            ),
            thresholds=_lines("green", "red", kv_max),
            max_=1,
            no_value=NOT_REPORTED,
        ),
        12,
        8,
    )
    grid.add(
        timeseries(
            "Running and waiting",
            [
                Query(e.sum_by(e.selector(c.POOL_RUNNING.name, *P), c.POOL), "{{pool}} running"),
                Query(e.sum_by(e.selector(c.POOL_WAITING.name, *P), c.POOL), "{{pool}} waiting"),
            ],
            unit="short",
            description="Requests running in and waiting for the pool's engines.",
        ),
        12,
        8,
    )
    grid.add(
        timeseries(
            "Preemptions",
            [
                Query(
                    e.sum_by(e.rate(e.selector(e.total(c.POOL_PREEMPTIONS), *P)), c.POOL),
                    "{{pool}}",
                )
            ],
            unit="ops",
            description="Requests preempted per second (KV cache exhausted mid-generation)."
            + _not_reported(config, "preemptions"),
            no_value=NOT_REPORTED,
        ),
        8,
        8,
    )
    _cache_and_replicas(grid, config)


def _cache_and_replicas(grid: Grid, config: Config) -> None:
    floors = [
        lane.slo.cache_hit_ratio_min
        for lane in config.lanes
        if lane.slo.cache_hit_ratio_min is not None
    ]
    grid.add(
        timeseries(
            "Prefix-cache hit ratio by pool",
            [Query(_hit_ratio(c.POOL), "{{pool}}")],
            unit="percentunit",
            description=(
                "Prompt tokens found in the prefix cache / looked up. Lines: the lanes' "
                "cache_hit_ratio_min floors from the config." + _not_reported(config, "prefix_hits")
            ),
            thresholds=_lines("red", "green", floors) if floors else (),
            max_=1,
            no_value=NOT_REPORTED,
        ),
        8,
        8,
    )
    grid.add(
        stat(
            "Replicas up",
            [Query(e.selector(c.POOL_UP.name, *P), "{{pool}} {{replica}}")],
            unit="none",
            description="1 if the replica's /metrics answered the sidecar's last scrape.",
            thresholds=(("red", None), ("green", 1.0)),
        ),
        8,
        8,
    )


def _per_lane(grid: Grid, config: Config) -> None:
    grid.row("Per lane (through the lane's pool)")
    kv = e.agg("max", e.selector(c.POOL_KV_CACHE_USAGE.name, *P), c.POOL)
    grid.add(
        timeseries(
            "KV cache usage of each lane's pool",
            [Query(e.per_lane(kv), "{{lane}} ({{pool}})")],
            unit="percentunit",
            description="Highest KV cache usage of the replicas of the pool each lane uses."
            + _not_reported(config, "kv_cache_usage"),
            max_=1,
            no_value=NOT_REPORTED,
        ),
        12,
        8,
    )
    floors = {
        lane.name: lane.slo.cache_hit_ratio_min
        for lane in config.lanes
        if lane.slo.cache_hit_ratio_min is not None
    }
    grid.add(
        timeseries(
            "Prefix-cache hit ratio of each lane's pool",
            [Query(e.per_lane(_hit_ratio(c.POOL)), "{{lane}} ({{pool}})")],
            unit="percentunit",
            description=(
                "Prefix-cache hit ratio of the pool each lane routes to. Floors: "
                + (", ".join(f"{k} {x:g}" for k, x in floors.items()) or "none declared")
                + "."
                + _not_reported(config, "prefix_hits")
            ),
            thresholds=_lines("red", "green", list(floors.values())) if floors else (),
            max_=1,
            no_value=NOT_REPORTED,
        ),
        12,
        8,
    )


def _engine_timings(grid: Grid) -> None:
    grid.row("Engine timings (vLLM's own metrics)")
    scope = (e.POOL_VAR, e.VLLM_MODEL_VAR)
    for title, name, what in (
        ("Engine queue time", c.VLLM_QUEUE_TIME, "Time requests waited in the engine's queue."),
        ("Engine prefill time", c.VLLM_PREFILL_TIME, "Time the engine spent on prefill."),
        ("Engine decode time", c.VLLM_DECODE_TIME, "Time the engine spent decoding."),
    ):
        sel = e.selector(f"{name}_bucket", *scope)
        grid.add(
            timeseries(
                f"{title} p50 / p95",
                [
                    Query(e.quantile(q, sel, c.POOL), f"{{{{pool}}}} p{q * 100:g}")
                    for q in (0.5, 0.95)
                ],
                unit="s",
                description=f"{what} From {name}, per pool (scrape label pool).",
            ),
            8,
            8,
        )
    grid.add(
        timeseries(
            "TTFT p95: engine vs sidecar",
            [
                Query(
                    e.quantile(0.95, e.selector(f"{c.VLLM_TTFT}_bucket", *scope), c.POOL),
                    "{{pool}} engine",
                ),
                Query(
                    e.quantile(0.95, e.selector(e.bucket(c.TTFT), *P), c.POOL),
                    "{{pool}} sidecar",
                ),
            ],
            unit="s",
            description=(
                "vLLM's TTFT (from when the engine scheduled the request) against the sidecar's "
                "(from when the request arrived, including queueing and the relay)."
            ),
        ),
        12,
        8,
    )
    grid.add(
        timeseries(
            "Engine inter-token latency p50 / p95",
            [
                Query(
                    e.quantile(q, e.selector(f"{c.VLLM_ITL}_bucket", *scope), c.POOL),
                    f"{{{{pool}}}} p{q * 100:g}",
                )
                for q in (0.5, 0.95)
            ],
            unit="s",
            description="vLLM's inter-token latency per pool.",
        ),
        12,
        8,
    )


def _relay(grid: Grid) -> None:
    grid.row("The relay itself")
    lag = e.bucket(c.EVENT_LOOP_LAG)
    grid.add(
        timeseries(
            "Sidecar event loop lag p50 / p99",
            [
                Query(e.quantile(q, lag, "instance"), f"{{{{instance}}}} p{q * 100:g}")
                for q in (0.5, 0.99)
            ],
            unit="s",
            description=(
                "How late each sidecar's event loop runs (sampled every 100 ms). Requests that "
                "arrive meanwhile wait in the relay before they are read: that time is in the "
                "queue phase, not the pool's prefill. Sustained lag means the relay is the "
                "bottleneck (more --workers or CPU)."
            ),
            thresholds=_lines("green", "red", [c.EVENT_LOOP_LAG_MAX_S]),
        ),
        24,
        8,
    )


def build(config: Config) -> Dashboard:
    """The pools and KV dashboard for ``config``."""
    grid = Grid()
    _engine_state(grid, config)
    _per_lane(grid, config)
    _engine_timings(grid)
    outlier_row(grid)
    models_row(grid)
    gpus_row(grid)
    cold_start_row(grid)
    _relay(grid)
    return dashboard(
        UID,
        "vllm-obs / Pools and KV",
        "Engine state per pool and per lane, and the engines' own queue, prefill and decode times.",
        grid,
        [v.datasource(), v.lane(config), v.pool(config), v.model()],
    )
