"""Overview: per lane SLO status, traffic, goodput, latency, errors and rejections."""

from __future__ import annotations

from grafanalib.core import Dashboard

from obs import conventions as c
from obs.config import Config

from . import expr as e
from . import links, sli
from . import variables as v
from .occupancy import occupancy_row
from .panels import Grid, Query, dashboard, stat, timeseries

UID = links.OVERVIEW_UID

BUDGET_STEPS = (("red", None), ("orange", 0.0), ("yellow", 0.25), ("green", 0.5))
BURN_STEPS = (("green", None), ("yellow", 1.0), ("red", 2.0))


def _requests(*matchers: str) -> str:
    return e.selector(e.total(c.REQUESTS), *e.LP_VARS, e.MODEL_VAR, *matchers)


def _slo_status(grid: Grid, config: Config) -> None:
    grid.row("SLO status")
    budget = e.selector(c.ERROR_BUDGET_REMAINING_RULE, e.LANE_VAR)
    grid.add(
        stat(
            "Error budget remaining (worst SLO)",
            [Query(e.agg("min", budget, c.LANE), "{{lane}}")],
            unit="percentunit",
            description=(
                f"Share of each lane's {c.SLO_PERIOD} error budget left, for its SLO with the "
                "least left. Below 0: the SLO is broken over the period."
            ),
            thresholds=BUDGET_STEPS,
        ),
        12,
        5,
    )
    window = sli.status_window(config)
    if window is not None:
        burn = e.selector(c.burn_rate_rule(window), e.LANE_VAR)
        grid.add(
            stat(
                f"Burn rate over {window} (worst SLO)",
                [Query(e.agg("max", burn, c.LANE), "{{lane}}")],
                unit="x",
                description=(
                    f"How fast each lane spends its error budget over the last {window}, "
                    "for its fastest-burning SLO: 1 spends exactly the budget over the period."
                ),
                thresholds=BURN_STEPS,
                decimals=2,
            ),
            12,
            5,
        )


def _traffic(grid: Grid, config: Config) -> None:
    grid.row("Traffic")
    grid.add(
        timeseries(
            "Request rate by lane",
            [Query(e.sum_by(e.rate(_requests()), c.LANE), "{{lane}}")],
            unit="reqps",
            description="Requests finished by the sidecar per second, every outcome.",
            stack=True,
            links=[links.lane_drilldown()],
        ),
        8,
        8,
    )
    grid.add(
        timeseries(
            "Goodput by lane",
            [Query(sli.goodput(lane), lane.name) for lane in config.lanes],
            unit="reqps",
            description=(
                "Requests per second that met every SLO of their lane, estimated from the "
                "histograms as the smallest of: successful requests and requests within each "
                "latency threshold (an upper bound). `vllm-obs query` computes it exactly."
            ),
            stack=True,
        ),
        8,
        8,
    )
    grid.add(
        timeseries(
            "Requests by outcome",
            [Query(e.sum_by(e.rate(_requests()), c.OUTCOME), "{{outcome}}")],
            unit="reqps",
            description="ok, error (server-side), client_error (4xx), rejected, disconnected.",
            stack=True,
        ),
        8,
        8,
    )


def _latency(grid: Grid) -> None:
    grid.row("Latency")
    for title, metric, what in (
        ("TTFT", c.TTFT, "Time to first token: request received to first token handed over."),
        ("TPOT", c.TPOT, "Time per output token after the first."),
        ("End-to-end", c.REQUEST_DURATION, "Request received to last byte handed over."),
    ):
        grid.add(
            timeseries(
                f"{title} p50 / p95 / p99 by lane",
                [
                    Query(
                        e.quantile(q, e.selector(e.bucket(metric), *e.LP_VARS), c.LANE),
                        f"{{{{lane}}}} p{q * 100:g}",
                    )
                    for q in e.QUANTILES
                ],
                unit="s",
                description=what,
                links=[links.slower_lane_traces("${__field.labels.lane}"), links.lane_drilldown()],
                exemplars=True,
            ),
            12,
            8,
        )
    grid.add(
        timeseries(
            "In flight and queued by lane",
            [
                Query(
                    e.sum_by(e.selector(c.IN_FLIGHT.name, e.LANE_VAR), c.LANE), "{{lane}} in flight"
                ),
                Query(e.sum_by(e.selector(c.QUEUED.name, e.LANE_VAR), c.LANE), "{{lane}} queued"),
            ],
            unit="short",
            description="Requests dispatched to the pool and requests waiting for admission.",
        ),
        12,
        8,
    )


def _errors(grid: Grid) -> None:
    grid.row("Errors and rejections")
    bad = "|".join(c.BAD_OUTCOMES)
    excluded = "|".join(c.AVAILABILITY_EXCLUDED_OUTCOMES)
    grid.add(
        timeseries(
            "Server error ratio by lane",
            [
                Query(
                    e.ratio(
                        e.sum_by(e.rate(_requests(e.like(c.OUTCOME, bad))), c.LANE),
                        e.sum_by(e.rate(_requests(e.unlike(c.OUTCOME, excluded))), c.LANE),
                    ),
                    "{{lane}}",
                )
            ],
            unit="percentunit",
            description=(
                "Share of requests that failed for a server-side reason, as the availability "
                f"SLI counts them (rejections and client disconnects left out: {excluded})."
            ),
        ),
        8,
        8,
    )
    rejected = e.selector(e.total(c.ADMISSION_REJECTIONS), e.LANE_VAR)
    grid.add(
        timeseries(
            "Rejection ratio by lane",
            [
                Query(
                    e.ratio(
                        e.sum_by(e.rate(rejected), c.LANE),
                        e.sum_by(e.rate(e.selector(e.total(c.REQUESTS), e.LANE_VAR)), c.LANE),
                    ),
                    "{{lane}}",
                )
            ],
            unit="percentunit",
            description="Share of requests the lane's admission policy refused.",
        ),
        8,
        8,
    )
    grid.add(
        timeseries(
            "Upstream errors and client disconnects",
            [
                Query(
                    e.sum_by(
                        e.rate(e.selector(e.total(c.UPSTREAM_ERRORS), *e.LP_VARS)),
                        c.LANE,
                        c.ERROR_CLASS,
                    ),
                    "{{lane}} {{error_class}}",
                ),
                Query(
                    e.sum_by(e.rate(e.selector(e.total(c.CLIENT_DISCONNECTS), *e.LP_VARS)), c.LANE),
                    "{{lane}} disconnects",
                ),
            ],
            unit="reqps",
            description="Failures talking to the pool, by class; clients that went away early.",
        ),
        8,
        8,
    )


def build(config: Config) -> Dashboard:
    """The overview dashboard for ``config``."""
    grid = Grid()
    _slo_status(grid, config)
    _traffic(grid, config)
    _latency(grid)
    occupancy_row(grid, config)  # beside each pool's queue: who holds it
    _errors(grid)
    return dashboard(
        UID,
        "vllm-obs / Overview",
        "Per lane SLO status, traffic, goodput, latency, errors and rejections.",
        grid,
        [v.datasource(), v.traces(), v.lane(config), v.pool(config), v.model()],
    )
