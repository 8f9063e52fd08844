"""Config -> dashboards -> JSON files, and every panel query for checking elsewhere."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from grafanalib._gen import DashboardEncoder

from obs.config import Config

from . import admission, lane, overview, pools, slo
from .annotations import change_annotations
from .variables import substitute

BUILDERS = (overview.build, lane.build, pools.build, admission.build, slo.build)


class PanelQuery(NamedTuple):
    """One PromQL expression of one panel."""

    uid: str
    panel: str
    expr: str


def render(config: Config) -> dict[str, dict[str, Any]]:
    """Every dashboard for ``config`` as Grafana JSON (plain data), by uid, in build order."""
    out: dict[str, dict[str, Any]] = {}
    for build in BUILDERS:
        board = build(config)
        data = json.loads(json.dumps(board.to_json_data(), cls=DashboardEncoder))
        data.setdefault("annotations", {}).setdefault("list", []).extend(change_annotations())
        out[board.uid] = data
    return out


def dumps(data: Mapping[str, Any]) -> str:
    """The file text of one dashboard: sorted keys, two-space indent, final newline."""
    return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def files(config: Config) -> dict[str, str]:
    """File name (``<uid>.json``) -> text, for every dashboard of ``config``."""
    return {f"{uid}.json": dumps(data) for uid, data in render(config).items()}


def write(config: Config, out_dir: Path) -> list[Path]:
    """Write every dashboard to ``out_dir`` (created if missing); returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in files(config).items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def stale(config: Config, out_dir: Path) -> list[str]:
    """Names of the files in ``out_dir`` that differ from what ``config`` generates."""
    return [
        name
        for name, text in files(config).items()
        if not (out_dir / name).is_file() or (out_dir / name).read_text(encoding="utf-8") != text
    ]


def iter_panels(data: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel of a rendered dashboard, rows and panels nested in rows included."""
    for panel in data.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def all_queries(
    config: Config, *, values: Mapping[str, str] | None = None, raw: bool = False
) -> list[PanelQuery]:
    """(dashboard uid, panel title, PromQL) for every panel target of every dashboard.

    Template variables are replaced by ``substitute`` (by default every lane,
    pool and model, ``$__rate_interval`` 5m, ``$__range`` 1h; ``values``
    overrides any of them), so each expression runs as is against
    Prometheus. ``raw=True`` returns the expressions as the panels hold them.
    """
    out = []
    for uid, data in render(config).items():
        for panel in iter_panels(data):
            for target in panel.get("targets", []):
                expr = target["expr"]
                out.append(
                    PanelQuery(uid, panel["title"], expr if raw else substitute(expr, values))
                )
    return out
