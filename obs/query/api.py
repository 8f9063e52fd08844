"""The Python API: every query as a function over paths, returning pandas DataFrames.

``paths`` is a file, glob or directory, or a list of them. ``config`` is a
:class:`obs.config.Config`, a path to a lanes YAML file, or None for the
shipped default. ``filters`` is a :class:`Filters`, a dict of
:meth:`Filters.parse` keywords (``{"since": "2h", "lane": ["chat"]}``), or
None. What the scan skipped (malformed or truncated lines) is in
``df.attrs["scan"]`` and logged on the ``obs.query`` logger.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from obs.config import Config, default_config_path, load_config
from obs.errors import InputError
from obs.query.filters import Filters
from obs.query.inputs import is_clickhouse
from obs.query.scan import SRC, Scan, Source, connect
from obs.query.table import Table

if TYPE_CHECKING:
    import duckdb
    import pandas as pd


Paths = str | os.PathLike[str] | list[str] | list[os.PathLike[str]] | tuple[str, ...]
PathLike = str | os.PathLike[str]
log = logging.getLogger("obs.query")


def as_config(config: Config | str | os.PathLike[str] | None) -> Config:
    """A Config from a Config, a YAML path, or None (the shipped default)."""
    if isinstance(config, Config):
        return config
    return load_config(Path(config) if config is not None else default_config_path())


def as_filters(filters: Filters | dict[str, Any] | None) -> Filters:
    """Filters from a Filters, a dict of :meth:`Filters.parse` keywords, or None."""
    if filters is None:
        return Filters()
    if isinstance(filters, Filters):
        return filters
    return Filters.parse(**filters)


def _paths(paths: Paths) -> list[str]:
    if isinstance(paths, str | os.PathLike):
        return [os.fspath(paths)]
    return [os.fspath(p) for p in paths]


def open_any(
    paths: Paths,
    filters: Filters,
    progress: bool | None = None,
    con: duckdb.DuckDBPyConnection | None = None,
) -> Source:
    """A scan over local logs (on ``con``, if given), or over ClickHouse for one
    ``clickhouse://HOST/DB.TABLE``."""
    items = _paths(paths)
    if is_clickhouse(items):
        from obs.query.clickhouse import ClickHouseScan

        if len(items) != 1:
            raise InputError("give one clickhouse:// URL, without local logs beside it")
        return ClickHouseScan(items[0], filters, progress)
    return Scan(items, filters, con=con, progress=progress)


def open_scan(paths: Paths, filters: Filters | dict[str, Any] | None = None) -> Source:
    """A :class:`Scan` (no progress line) for building your own queries."""
    return open_any(paths, as_filters(filters), progress=False)


def _frame(table: Table, *scans: Source) -> pd.DataFrame:
    df = table.to_pandas()
    reports = [s.report.to_dict() for s in scans]
    df.attrs["scan"] = reports[0] if len(reports) == 1 else reports
    for s in scans:
        for msg in s.report.messages():
            log.warning("%s", msg)
    return df


def summary(
    paths: Paths,
    config: Config | str | os.PathLike[str] | None = None,
    filters: Filters | dict[str, Any] | None = None,
    by: str = "lane",
) -> pd.DataFrame:
    """Per lane (or pool, model, tenant): rates, percentiles, SLO attainment, goodput."""
    from obs.query.aggregate import summary as run

    scan = open_scan(paths, filters)
    return _frame(run(scan, as_config(config), by), scan)


def slowest(
    paths: Paths,
    by: str = "e2e",
    n: int = 10,
    filters: Filters | dict[str, Any] | None = None,
) -> pd.DataFrame:
    """The ``n`` requests with the largest ``by`` timing, with their phases."""
    from obs.query.requests import slowest as run

    scan = open_scan(paths, filters)
    return _frame(run(scan, by, n), scan)


def show(
    paths: Paths, request_id: str, filters: Filters | dict[str, Any] | None = None
) -> dict[str, Any]:
    """One request's full event (by request id, trace id or unique id prefix)."""
    from obs.query.requests import find

    scan = open_scan(paths, filters)
    event = find(scan, request_id)
    for msg in scan.report.messages():
        log.warning("%s", msg)
    return event


def timeline(
    paths: Paths,
    config: Config | str | os.PathLike[str] | None = None,
    filters: Filters | dict[str, Any] | None = None,
    interval: str | None = None,
    by: str | None = None,
) -> pd.DataFrame:
    """Per-interval rates and percentiles (``interval`` like ``5m``; automatic if None)."""
    from obs.query.intervals import timeline as run

    scan = open_scan(paths, filters)
    return _frame(run(scan, as_config(config), interval, by), scan)


def budget(
    paths: Paths,
    config: Config | str | os.PathLike[str] | None = None,
    filters: Filters | dict[str, Any] | None = None,
    window: str | None = None,
) -> dict[str, Any]:
    """Per lane and SLO: the error budget spent, by phase and cause, who is behind the
    misses and the worst of them (the ``vllm-obs query budget --format json`` document);
    ``window`` (``1h``) keeps the window that ends with the newest selected event."""
    from obs.query.error_budget import budget as run
    from obs.query.error_budget import window_filters

    scan = open_scan(paths, filters)
    windowed = window_filters(scan, window)
    if windowed is not scan.filters:
        scan = open_scan(paths, windowed)
    doc = run(scan, as_config(config), _paths(paths))
    for msg in scan.report.messages():
        log.warning("%s", msg)
    return doc


def compare(
    before: Paths,
    after: Paths | None = None,
    config: Config | str | os.PathLike[str] | None = None,
    before_filters: Filters | dict[str, Any] | None = None,
    after_filters: Filters | dict[str, Any] | None = None,
    alpha: float = 0.01,
) -> pd.DataFrame:
    """Before vs after per lane and metric. ``after`` None: the same logs, other filters."""
    from obs.query.comparison import compare as run

    con = connect()
    a = open_any(before, as_filters(before_filters), False, con)
    b = open_any(after if after is not None else before, as_filters(after_filters), False, con)
    return _frame(run(a, b, as_config(config), alpha), a, b)


def report(
    paths: Paths,
    out: str | os.PathLike[str],
    config: Config | str | os.PathLike[str] | None = None,
    filters: Filters | dict[str, Any] | None = None,
    title: str | None = None,
) -> Path:
    """Write an HTML report with embedded plots to ``out/report.html``; return its path."""
    from obs.query.html_report import report as run

    scan = open_scan(paths, filters)
    path = run(scan, as_config(config), Path(out), title)
    for msg in scan.report.messages():
        log.warning("%s", msg)
    return path


def export(
    paths: Paths,
    out: str | os.PathLike[str],
    filters: Filters | dict[str, Any] | None = None,
    append: bool = False,
) -> dict[str, Any]:
    """Write events as Parquet partitioned by date and lane; return counts."""
    from obs.query.parquet import export as run

    scan = open_scan(paths, filters)
    if not isinstance(scan, Scan):
        raise InputError("export reads local logs; a clickhouse:// table is exported by ClickHouse")
    result = run(scan, Path(out), append)
    result["scan"] = scan.report.to_dict()
    return result


def events(
    paths: Paths,
    filters: Filters | dict[str, Any] | None = None,
    columns: list[str] | None = None,
) -> pd.DataFrame:
    """The matching events themselves (all fields, or ``columns``), for your own analysis."""
    from obs.query.schema import COLUMNS

    cols = columns or list(COLUMNS)
    unknown = [c for c in cols if c not in COLUMNS]
    if unknown:
        raise InputError(f"unknown event field(s): {', '.join(unknown)}")
    scan = open_scan(paths, filters)
    scan.materialize(cols)
    table = scan.run(f"SELECT {', '.join(cols)} FROM {SRC} WHERE request_id IS NOT NULL")
    return _frame(table, scan)
