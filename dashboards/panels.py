"""Panel builders on top of grafanalib, and a grid that places them.

Every panel and target queries ``$datasource``. Builders take plain
``Query`` values (PromQL + legend) and return grafanalib objects; ``Grid``
gives them non-overlapping positions, left to right in 24 columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import attr
from grafanalib.core import (
    Dashboard,
    DashboardLink,
    GridPos,
    Heatmap,
    Panel,
    RowPanel,
    Stat,
    Target,
    Templating,
    Text,
    Time,
    TimeSeries,
)

from .variables import PROMETHEUS

WIDTH: Final = 24
SCHEMA_VERSION: Final = 39  # Grafana 10.4+: timeseries, stat and heatmap as written here
TAG: Final = "vllm-obs"

Steps = Sequence[tuple[str, float | None]]  # (color, from value); the first has None


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL expression and how its series are named in the legend."""

    expr: str
    legend: str = ""
    instant: bool = False


class ExemplarTarget(Target):
    """A Prometheus target that can also ask for the series' exemplars (grafanalib has no
    field for it): set ``exemplar`` after building it."""

    exemplar = False

    def to_json_data(self) -> dict[str, Any]:
        data: dict[str, Any] = super().to_json_data()
        if self.exemplar:
            data["exemplar"] = True
        return data


def _targets(
    queries: Sequence[Query], fmt: str = "time_series", *, exemplars: bool = False
) -> list[Target]:
    """One target per query; with ``exemplars``, the first one also fetches the exemplars
    (trace ids) of the histogram it reads, drawn as points that open the trace."""
    targets = [
        ExemplarTarget(
            expr=q.expr,
            legendFormat=q.legend,
            refId=chr(ord("A") + i),
            datasource=PROMETHEUS,
            instant=q.instant,
            format=fmt,
            intervalFactor=1,
        )
        for i, q in enumerate(queries)
    ]
    if exemplars and targets:
        targets[0].exemplar = True
    return targets


def _steps(steps: Steps) -> list[dict[str, Any]]:
    return [{"color": color, "value": value} for color, value in steps]


def timeseries(
    title: str,
    queries: Sequence[Query],
    *,
    unit: str,
    description: str,
    stack: bool = False,
    thresholds: Steps = (),
    links: Sequence[dict[str, Any]] = (),
    max_: int | None = None,
    no_value: str | None = None,
    exemplars: bool = False,
) -> TimeSeries:
    """A time series panel; ``thresholds`` are drawn as dashed lines.

    ``no_value`` is the text the panel shows when its query returns no series; ``exemplars``
    shows the trace-id exemplars of the histogram the first query reads.
    """
    defaults: dict[str, Any] = {}
    if links:
        defaults["links"] = list(links)
    if no_value is not None:
        defaults["noValue"] = no_value
    return TimeSeries(
        title=title,
        description=description,
        dataSource=PROMETHEUS,
        targets=_targets(queries, exemplars=exemplars),
        unit=unit,
        fillOpacity=60 if stack else 10,
        stacking={"mode": "normal", "group": "A"} if stack else {},
        thresholds=_steps(thresholds or (("transparent", None),)),
        thresholdsStyleMode="dashed" if thresholds else "off",
        legendDisplayMode="table",
        legendCalcs=["mean", "max", "lastNotNull"],
        tooltipMode="multi",
        tooltipSort="desc",
        valueMin=0,
        valueMax=max_,
        maxDataPoints=None,
        extraJson={"fieldConfig": {"defaults": defaults}} if defaults else None,
    )


def stat(
    title: str,
    queries: Sequence[Query],
    *,
    unit: str,
    description: str,
    thresholds: Steps,
    decimals: int | None = None,
) -> Stat:
    """A stat panel showing the last value of each series, coloured by ``thresholds``."""
    return Stat(
        title=title,
        description=description,
        dataSource=PROMETHEUS,
        targets=_targets(queries),
        format=unit,
        decimals=decimals,
        reduceCalc="lastNotNull",
        colorMode="background",
        graphMode="area",
        textMode="value_and_name",
        noValue="no data",
        thresholds=_steps(thresholds),
        maxDataPoints=None,
    )


def heatmap(title: str, query: Query, *, unit: str, description: str) -> Heatmap:
    """A heatmap of a classic histogram's buckets (``sum by (le) (rate(..._bucket))``)."""
    return Heatmap(
        title=title,
        description=description,
        dataSource=PROMETHEUS,
        targets=_targets([query], fmt="heatmap"),
        dataFormat="tsbuckets",
        maxDataPoints=None,
        options={
            "calculate": False,
            "cellGap": 1,
            "color": {
                "mode": "scheme",
                "scheme": "Oranges",
                "fill": "dark",
                "scale": "exponential",
                "exponent": 0.5,
                "steps": 64,
                "reverse": False,
            },
            "filterValues": {"le": 1e-9},
            "rowsFrame": {"layout": "auto"},
            "yAxis": {"axisPlacement": "left", "unit": unit, "reverse": False},
            "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": False},
            "legend": {"show": True},
            "cellValues": {"unit": "reqps"},
        },
    )


def note(title: str, content: str) -> Text:
    """A markdown text panel."""
    return Text(title=title, content=content, mode="markdown")


class Grid:
    """Places panels left to right in rows of 24 columns; rows start a new line."""

    def __init__(self) -> None:
        self.panels: list[Panel] = []
        self._x = 0
        self._y = 0
        self._line_h = 0

    def row(self, title: str) -> None:
        """A full-width row header on a line of its own."""
        self._newline()
        self.panels.append(RowPanel(title=title, gridPos=GridPos(h=1, w=WIDTH, x=0, y=self._y)))
        self._y += 1

    def add(self, panel: Panel, w: int, h: int) -> None:
        """Place ``panel`` (w columns by h units) after the previous one, wrapping when full."""
        if not 0 < w <= WIDTH:
            raise ValueError(f"panel {panel.title!r}: width {w} is not in 1..{WIDTH}")
        if self._x + w > WIDTH:
            self._newline()
        self.panels.append(attr.evolve(panel, gridPos=GridPos(h=h, w=w, x=self._x, y=self._y)))
        self._x += w
        self._line_h = max(self._line_h, h)

    def _newline(self) -> None:
        self._y += self._line_h
        self._x = 0
        self._line_h = 0


def dashboard(
    uid: str, title: str, description: str, grid: Grid, variables: Sequence[Any]
) -> Dashboard:
    """A dashboard of the project's family: tagged, cross-linked, ids assigned."""
    return Dashboard(
        uid=uid,
        title=title,
        description=description,
        panels=grid.panels,
        templating=Templating(list=list(variables)),
        tags=[TAG],
        links=[
            DashboardLink(
                asDropdown=True,
                includeVars=True,
                keepTime=True,
                tags=[TAG],
                title="vllm-obs dashboards",
                type="dashboards",
            )
        ],
        schemaVersion=SCHEMA_VERSION,
        refresh="30s",
        time=Time("now-1h", "now"),
        timezone="browser",
        graphTooltip=1,
    ).auto_panel_ids()
