"""A dashboard's panels evaluated over a time range against Prometheus: plain data.

What Grafana would show, without Grafana: each panel target's PromQL, with the
template variables filled in as Grafana fills them (``$lane`` at the dashboard's
default, ``$__range`` the time range, ``$__rate_interval`` as given), runs as a
range query; the panel keeps its grid position, unit, stacking and threshold
lines. ``obs.dashboards.plot`` draws a snapshot; this module only fetches.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from obs.config import Config
from obs.prom.api import PrometheusAPI, QueryError

from . import links
from .build import iter_panels
from .variables import ALL, LANE, substitute

# Panel kinds drawn with data; rows and text panels are layout.
DATA_PANELS = frozenset({"timeseries", "stat", "heatmap"})
_LEGEND_VAR = re.compile(r"\{\{\s*(\w+)\s*\}\}")


@dataclass(frozen=True, slots=True)
class Series:
    """One series of one panel target, named as the panel's legend names it."""

    label: str
    labels: dict[str, str]
    times: tuple[float, ...]  # unix seconds
    values: tuple[float, ...]  # NaN where Prometheus returned NaN

    @property
    def finite(self) -> tuple[float, ...]:
        return tuple(v for v in self.values if math.isfinite(v))


@dataclass(frozen=True, slots=True)
class PanelSnapshot:
    """One panel: where it sits (Grafana's 24-column grid), how it draws, and its data."""

    title: str
    kind: str  # timeseries, stat, heatmap, row, text
    grid: tuple[int, int, int, int]  # x, y, w, h
    unit: str
    stacked: bool
    thresholds: tuple[float, ...]  # drawn as dashed lines (timeseries)
    steps: tuple[tuple[str, float | None], ...]  # (colour, from value): stat colours
    ymax: float | None
    text: str  # a text panel's markdown
    series: tuple[Series, ...]
    errors: tuple[str, ...]  # one per target Prometheus refused
    queries: int  # targets run

    @property
    def has_data(self) -> bool:
        """True when at least one target returned a sample."""
        return any(s.values for s in self.series)


@dataclass(frozen=True, slots=True)
class DashboardSnapshot:
    """Every panel of one dashboard over ``start``..``end`` (unix seconds)."""

    uid: str
    title: str
    start: float
    end: float
    step: float
    variables: dict[str, str]
    panels: tuple[PanelSnapshot, ...]

    @property
    def data_panels(self) -> tuple[PanelSnapshot, ...]:
        return tuple(p for p in self.panels if p.kind in DATA_PANELS)

    @property
    def empty(self) -> list[str]:
        """Titles of the data panels that returned nothing."""
        return [p.title for p in self.data_panels if not p.has_data and not p.errors]

    @property
    def failed(self) -> list[str]:
        """``title: error`` for every target Prometheus refused."""
        return [f"{p.title}: {e}" for p in self.panels for e in p.errors]


def default_variables(config: Config, uid: str) -> dict[str, str]:
    """The variables as Grafana opens the dashboard: every lane, pool and model, except the
    lane drill-down, which opens on the config's default lane."""
    if uid == links.LANE_UID:
        return {LANE: config.default_lane}
    return {LANE: ALL}


def take(
    api: PrometheusAPI,
    board: Mapping[str, Any],
    *,
    start: float,
    end: float,
    step: float,
    variables: Mapping[str, str],
) -> DashboardSnapshot:
    """Run every target of ``board`` (rendered dashboard JSON) as a range query."""
    values = {
        "__range": f"{max(1, round(end - start))}s",
        "__interval": f"{step:g}s",
        **variables,
    }
    panels = []
    for panel in iter_panels(board):
        series: list[Series] = []
        errors = []
        targets = panel.get("targets", [])
        for target in targets:
            expr = substitute(target["expr"], values)
            try:
                result = api.query_range(expr, start, end, step)
            except QueryError as e:
                errors.append(str(e))
                continue
            series += [_series(r, target.get("legendFormat", "")) for r in result]
        panels.append(_panel(panel, tuple(series), tuple(errors), len(targets)))
    return DashboardSnapshot(
        uid=str(board["uid"]),
        title=str(board["title"]),
        start=start,
        end=end,
        step=step,
        variables=dict(values),
        panels=tuple(panels),
    )


def legend(fmt: str, labels: Mapping[str, str]) -> str:
    """A series name as Grafana writes it: ``{{lane}} p95`` -> ``chat p95``; with no format,
    the labels (``{lane="chat"}``)."""
    if fmt:
        return _LEGEND_VAR.sub(lambda m: labels.get(m.group(1), ""), fmt).strip()
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return "{" + inner + "}"


def _series(result: Mapping[str, Any], fmt: str) -> Series:
    labels = {str(k): str(v) for k, v in result.get("metric", {}).items()}
    points = result.get("values") or ([result["value"]] if "value" in result else [])
    return Series(
        label=legend(fmt, labels),
        labels=labels,
        times=tuple(float(t) for t, _ in points),
        values=tuple(float(v) for _, v in points),
    )


def _panel(
    panel: Mapping[str, Any], series: tuple[Series, ...], errors: tuple[str, ...], queries: int
) -> PanelSnapshot:
    pos = panel.get("gridPos", {})
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    custom = defaults.get("custom", {})
    dashed = custom.get("thresholdsStyle", {}).get("mode") == "dashed"
    steps = defaults.get("thresholds", {}).get("steps", [])
    return PanelSnapshot(
        title=str(panel.get("title", "")),
        kind=str(panel.get("type", "")),
        grid=(
            int(pos.get("x", 0)),
            int(pos.get("y", 0)),
            int(pos.get("w", 24)),
            int(pos.get("h", 8)),
        ),
        unit=str(defaults.get("unit") or ""),
        stacked=custom.get("stacking", {}).get("mode") == "normal",
        thresholds=tuple(float(s["value"]) for s in steps if dashed and s.get("value") is not None),
        steps=tuple(
            (str(s["color"]), None if s.get("value") is None else float(s["value"])) for s in steps
        ),
        ymax=None if defaults.get("max") is None else float(defaults["max"]),
        text=str(panel.get("options", {}).get("content", "")),
        series=series,
        errors=errors,
        queries=queries,
    )
