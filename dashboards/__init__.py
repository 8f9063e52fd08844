"""Grafana dashboards generated from the lanes/SLO config (grafanalib).

Spec -> model (``obs.config``) -> generators (one module per dashboard) ->
writer (``build.write``). The public API is loaded lazily so that importing
``obs.dashboards.cli`` for the command line does not import grafanalib:

- ``render(config)``: uid -> dashboard JSON (plain data);
- ``write(config, out_dir)``: one ``<uid>.json`` per dashboard;
- ``all_queries(config)``: (uid, panel title, PromQL) for every panel target,
  template variables filled in by ``substitute`` (``DEFAULT_VALUES``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .build import PanelQuery, all_queries, render, write
    from .variables import DEFAULT_VALUES, substitute

__all__ = ["DEFAULT_VALUES", "PanelQuery", "all_queries", "render", "substitute", "write"]

_HOME = {
    "PanelQuery": "build",
    "all_queries": "build",
    "render": "build",
    "write": "build",
    "DEFAULT_VALUES": "variables",
    "substitute": "variables",
}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
