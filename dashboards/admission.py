"""Admission: rejections by lane and reason, queue depth and queue wait."""

from __future__ import annotations

from grafanalib.core import Dashboard

from obs import conventions as c
from obs.config import Config

from . import expr as e
from . import flow, links
from . import variables as v
from .panels import Grid, Query, dashboard, note, stat, timeseries

UID = links.ADMISSION_UID


def _limits(config: Config) -> str:
    rows = ["| lane | concurrency | queue | queue timeout | max prompt tokens | token budget |"]
    rows.append("|---|---|---|---|---|---|")
    for lane in config.lanes:
        a = lane.admission
        rows.append(
            f"| {lane.name} | {a.max_concurrency or '-'} | {a.max_queue} | {a.queue_timeout_s:g} s "
            f"| {a.max_prompt_tokens or '-'} | {a.token_budget or '-'} |"
        )
    return "\n".join(rows)


def build(config: Config) -> Dashboard:
    """The admission dashboard for ``config``."""
    rejections = e.selector(e.total(c.ADMISSION_REJECTIONS), e.LANE_VAR)
    grid = Grid()
    grid.row("Rejections")
    grid.add(
        timeseries(
            "Rejections by lane and reason",
            [Query(e.sum_by(e.rate(rejections), c.LANE, c.REASON), "{{lane}} {{reason}}")],
            unit="reqps",
            description="Requests per second the lane's admission policy refused, by reason.",
            stack=True,
        ),
        12,
        8,
    )
    grid.add(
        timeseries(
            "Rejection ratio by lane",
            [
                Query(
                    e.ratio(
                        e.sum_by(e.rate(rejections), c.LANE),
                        e.sum_by(e.rate(e.selector(e.total(c.REQUESTS), e.LANE_VAR)), c.LANE),
                    ),
                    "{{lane}}",
                )
            ],
            unit="percentunit",
            description="Share of the lane's requests refused at admission.",
        ),
        12,
        8,
    )
    grid.add(
        stat(
            "Rejections in the time range",
            [
                Query(
                    e.sum_by(e.increase(rejections, "$__range"), c.LANE, c.REASON),
                    "{{lane}} {{reason}}",
                    instant=True,
                )
            ],
            unit="short",
            description="Requests refused over the dashboard's time range, by lane and reason.",
            thresholds=(("green", None), ("orange", 1.0)),
            decimals=0,
        ),
        24,
        5,
    )
    grid.row("Queue")
    grid.add(
        timeseries(
            "Queue depth by lane",
            [Query(e.sum_by(e.selector(c.QUEUED.name, e.LANE_VAR), c.LANE), "{{lane}}")],
            unit="short",
            description="Requests waiting for admission (bounded by the lane's max_queue).",
        ),
        8,
        8,
    )
    grid.add(
        timeseries(
            "In flight by lane",
            [Query(e.sum_by(e.selector(c.IN_FLIGHT.name, e.LANE_VAR), c.LANE), "{{lane}}")],
            unit="short",
            description="Requests dispatched to the pool (bounded by the lane's max_concurrency).",
        ),
        8,
        8,
    )
    queue = e.selector(e.bucket(c.PHASE_DURATION), *e.LP_VARS, e.eq(c.PHASE, "queue"))
    grid.add(
        timeseries(
            "Queue wait p50 / p95 / p99 by lane",
            [
                Query(e.quantile(q, queue, c.LANE), f"{{{{lane}}}} p{q * 100:g}")
                for q in e.QUANTILES
            ],
            unit="s",
            description=(
                "The queue phase: received to dispatched (admission wait, routing, connect; the "
                "engine's own queue time when its span was joined)."
            ),
            links=[links.slower_lane_traces("${__field.labels.lane}")],
        ),
        8,
        8,
    )
    grid.add(note("Admission limits (from the config)", _limits(config)), 24, 3 + len(config.lanes))
    flow.add_row(config, grid)
    return dashboard(
        UID,
        "vllm-obs / Admission",
        "Admission control per lane: rejections by reason, queue depth, queue wait.",
        grid,
        [v.datasource(), v.traces(), v.lane(config), v.pool(config)],
    )
