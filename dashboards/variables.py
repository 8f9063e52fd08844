"""Template variables of the dashboards, and how to fill them in outside Grafana.

``datasource`` (Prometheus) and ``traces`` (Tempo) are datasource variables,
so the dashboards import into any Grafana whatever its datasources are named.
``lane`` and ``pool`` list the config's lanes and pools; ``model`` is read
from the sidecar's request counter. ``substitute`` replaces the variables of
a panel's PromQL with fixed values so the query can run against Prometheus
directly (``DEFAULT_VALUES``: every lane, pool and model; 5m rate window).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from grafanalib.core import Template

from obs import conventions as c
from obs.config import Config

from . import expr as e

DATASOURCE: Final = "datasource"
TRACES: Final = "traces"
LANE: Final = c.LANE
POOL: Final = c.POOL
MODEL: Final = c.MODEL

PROMETHEUS: Final = {"type": "prometheus", "uid": f"${{{DATASOURCE}}}"}
TEMPO: Final = {"type": "tempo", "uid": f"${{{TRACES}}}"}

ALL: Final = ".*"
# What ``substitute`` puts in place of each variable unless told otherwise.
DEFAULT_VALUES: Final[Mapping[str, str]] = {
    LANE: ALL,
    POOL: ALL,
    MODEL: ALL,
    "__rate_interval": "5m",
    "__interval": "1m",
    "__range": "1h",
}

# $name, ${name}, ${name:format}, ${name.field}, [[name]]
VARIABLE_RE: Final = re.compile(r"\$\{(\w+)[^}]*\}|\$(\w+)|\[\[(\w+)[^\]]*\]\]")


def referenced(text: str) -> set[str]:
    """Names of the template variables ``text`` refers to (built-ins included)."""
    return {next(g for g in m.groups() if g) for m in VARIABLE_RE.finditer(text)}


def substitute(expr: str, values: Mapping[str, str] | None = None) -> str:
    """``expr`` with every template variable replaced (``DEFAULT_VALUES`` unless given).

    Raises ``KeyError`` naming a variable that has no value.
    """
    table = {**DEFAULT_VALUES, **(values or {})}

    def fill(m: re.Match[str]) -> str:
        name = next(g for g in m.groups() if g)
        if name not in table:
            raise KeyError(f"no value for template variable ${name} in {expr!r}")
        return table[name]

    return VARIABLE_RE.sub(fill, expr)


def datasource() -> Template:
    """The Prometheus datasource the panels query."""
    return Template(
        name=DATASOURCE, label="Prometheus", query="prometheus", type="datasource", refresh=1
    )


def traces() -> Template:
    """The Tempo datasource the latency panels link to."""
    return Template(name=TRACES, label="Traces", query="tempo", type="datasource", refresh=1)


def _custom(name: str, label: str, values: list[str], *, multi: bool, default: str) -> Template:
    """A variable listing ``values``: "All" by default when multi, else ``default``."""
    t = Template(
        name=name,
        label=label,
        query=",".join(values),
        type="custom",
        includeAll=multi,
        multi=multi,
        allValue=ALL if multi else None,
        default=None if multi else default,
    )
    if multi:
        t._current = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return t


def lane(config: Config, *, multi: bool = True) -> Template:
    """The config's lanes; single-valued (the default lane first) for the drill-down."""
    return _custom(LANE, "Lane", config.lane_names, multi=multi, default=config.default_lane)


def pool(config: Config) -> Template:
    """The config's pools."""
    names = [p.name for p in config.pools]
    return _custom(POOL, "Pool", names, multi=True, default=names[0])


def model() -> Template:
    """Models the sidecar has seen (the ``model`` label of its request counter)."""
    t = Template(
        name=MODEL,
        label="Model",
        query=f"label_values({e.selector(e.total(c.REQUESTS), e.LANE_VAR)}, {c.MODEL})",
        dataSource=PROMETHEUS,
        type="query",
        includeAll=True,
        multi=True,
        allValue=ALL,
        refresh=2,
    )
    t._current = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return t
