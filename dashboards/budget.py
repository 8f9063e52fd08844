"""The "error budget" row of each lane on the SLO dashboard: where its budget goes.

Budget left per SLO, the burn rate split by phase and by cause (the recording rules
``burn_by_phase_rule`` and ``burn_by_cause_rule`` over the long window of the lane's fastest
alert), the misses of the dashboard's range by phase and cause
(``vllm_obs_slo_misses_total``, attributed by ``obs.attribution``), and those misses over
time with their exemplars: the trace ids of missed requests, points that open the trace.
The same split is in the burn-rate alerts' annotations and in ``vllm-obs query budget``.
"""

from __future__ import annotations

from obs import conventions as c
from obs.config import Lane

from . import expr as e
from . import sli
from .overview import BUDGET_STEPS
from .panels import WIDTH, Grid, Query, stat, timeseries


def fastest_window(lane: Lane) -> str:
    """The long window of the lane's fastest-burning alert (highest factor)."""
    return max(lane.slo.burn_windows, key=lambda w: w.factor).long


def lane_row(grid: Grid, lane: Lane) -> None:
    """Add the lane's error budget row (nothing for a lane without SLOs)."""
    if not sli.objectives(lane):
        return
    name = lane.name
    w = fastest_window(lane)
    only = e.eq(c.LANE, name)
    grid.row(f"{name}: error budget")
    grid.add(
        stat(
            f"{name}: budget left",
            [Query(e.selector(c.ERROR_BUDGET_REMAINING_RULE, only), "{{slo}}")],
            unit="percentunit",
            description=f"Share of each SLO's {c.SLO_PERIOD} error budget left.",
            thresholds=BUDGET_STEPS,
        ),
        4,
        8,
    )
    for title, rule, legend, what in (
        ("burn by phase", c.burn_by_phase_rule(w), "{{slo}} {{phase}}", "phase"),
        (
            "burn by cause",
            c.burn_by_cause_rule(w),
            "{{slo}} {{phase}}/{{cause}}",
            "phase and cause",
        ),
    ):
        grid.add(
            timeseries(
                f"{name}: {title} ({w})",
                [Query(e.selector(rule, only), legend)],
                unit="x",
                stack=True,
                description=(
                    f"Each SLO's burn rate over {w} (the window of the lane's fastest alert), "
                    f"split by the {what} its misses are charged to (docs/query.md, Where the "
                    "error budget went). The stack of one SLO is its burn rate."
                ),
                no_value="no misses",
            ),
            7,
            8,
        )
    _misses(grid, name, only)


def _misses(grid: Grid, name: str, only: str) -> None:
    """The lane's misses by phase and cause: a count over the range, and per interval with
    their exemplars."""
    (misses,) = c.SLO_MISSES.series
    by_cause = (c.SLO_LABEL, c.PHASE, c.CAUSE)
    legend = "{{slo}} {{phase}}/{{cause}}"
    grid.add(
        stat(
            f"{name}: misses in range by phase and cause",
            [
                Query(
                    e.agg("sum", e.increase(e.selector(misses, only), "$__range"), *by_cause),
                    legend,
                )
            ],
            unit="short",
            description=(
                "Requests that missed each SLO over the dashboard's time range, by the phase "
                "and cause they are charged to. `vllm-obs query budget --lane "
                f"{name}` lists the worst of them."
            ),
            thresholds=(("blue", None),),
            decimals=0,
        ),
        6,
        8,
    )
    grid.add(
        timeseries(
            f"{name}: misses by phase and cause, with their traces",
            [Query(e.agg("sum", e.increase(e.selector(misses, only), e.RATE), *by_cause), legend)],
            unit="short",
            stack=True,
            description=(
                "Misses per interval by the phase and cause they are charged to. Each point "
                "drawn over the bars is an exemplar: the trace id of a request that missed "
                "(where the sidecar's exemplars are on and Prometheus stores them); click it "
                "to open that trace."
            ),
            no_value="no misses",
            exemplars=True,
        ),
        WIDTH,
        8,
    )
