"""SLO: error budget remaining and burn rates per lane and SLO, alert thresholds drawn.

Reads the recording rules ``obs.alerts`` generates (names from
``obs.conventions``; labels ``lane`` and ``slo``). Each burn-rate panel plots
the long window of every burn-rate alert of the lane and draws each alert's
factor as a threshold line, so a line crossing a threshold is an alert firing
(once its short window agrees).
"""

from __future__ import annotations

from grafanalib.core import Dashboard

from obs import conventions as c
from obs.config import Config, Lane

from . import budget as budget_rows
from . import expr as e
from . import links, sli
from . import variables as v
from .overview import BUDGET_STEPS
from .panels import Grid, Query, dashboard, note, stat, timeseries

UID = links.SLO_UID
SEVERITY_COLORS = {"page": "red", "ticket": "orange"}


def _burn_steps(lane: Lane) -> tuple[tuple[str, float | None], ...]:
    factors: dict[float, str] = {}
    for w in sorted(lane.slo.burn_windows, key=lambda w: w.factor):
        factors[w.factor] = SEVERITY_COLORS[w.severity]
    return (("green", None), *((color, f) for f, color in factors.items()))


def _lane_row(grid: Grid, lane: Lane) -> None:
    objectives = sli.objectives(lane)
    if not objectives:
        return
    grid.row(f"{lane.name}: {lane.description or 'lane'}")
    windows = sli.long_windows(lane.slo)
    alerts = "; ".join(
        f"{w.severity} when {w.long} and {w.short} burn > {w.factor:g}x"
        for w in lane.slo.burn_windows
    )
    for o in objectives:
        grid.add(
            stat(
                f"{lane.name} {o.kind}: budget left",
                [Query(sli.rule(o, c.ERROR_BUDGET_REMAINING_RULE), "remaining")],
                unit="percentunit",
                description=f"{o.title}: share of the {c.SLO_PERIOD} error budget left.",
                thresholds=BUDGET_STEPS,
            ),
            3,
            7,
        )
        grid.add(
            timeseries(
                f"{lane.name} {o.kind}: burn rate",
                [Query(sli.rule(o, c.burn_rate_rule(w)), w) for w in windows],
                unit="x",
                description=(
                    f"{o.title}. Burn rate over each alert's long window; lines at the alert "
                    f"factors ({alerts})."
                ),
                thresholds=_burn_steps(lane),
            ),
            5,
            7,
        )


def build(config: Config) -> Dashboard:
    """The SLO dashboard for ``config``: one row per lane with SLOs."""
    grid = Grid()
    grid.row("All SLOs")
    budget = e.selector(c.ERROR_BUDGET_REMAINING_RULE, e.LANE_VAR)
    grid.add(
        stat(
            "Error budget remaining",
            [Query(budget, "{{lane}} {{slo}}")],
            unit="percentunit",
            description=f"Share of each SLO's {c.SLO_PERIOD} error budget left; spent below 0.",
            thresholds=BUDGET_STEPS,
        ),
        16,
        6,
    )
    grid.add(
        stat(
            "SLO objectives",
            [Query(e.selector(c.SLO_OBJECTIVE_RULE, e.LANE_VAR), "{{lane}} {{slo}}")],
            unit="percentunit",
            description="The objective of each SLO, as the recording rules carry it.",
            thresholds=(("blue", None),),
            decimals=1,
        ),
        8,
        6,
    )
    with_slos = [lane for lane in config.lanes if sli.objectives(lane)]
    for lane in with_slos:
        _lane_row(grid, lane)
        budget_rows.lane_row(grid, lane)
    if not with_slos:
        grid.add(note("No SLOs", "No lane of this config declares an SLO."), 24, 3)
    return dashboard(
        UID,
        "vllm-obs / SLOs",
        "Error budget remaining and multi-window burn rates per lane and SLO.",
        grid,
        [v.datasource(), v.lane(config)],
    )
