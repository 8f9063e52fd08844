"""A query scan over the ClickHouse event table: the same queries, run on the server.

``vllm-obs query summary clickhouse://HOST:8123/DB.TABLE`` builds a
``ClickHouseScan`` where a local log would build an ``obs.query.scan.Scan``.
It offers the same surface (``filters``, ``dialect``, ``extra``, ``run``,
``report``), so ``summary`` and ``timeline`` run unchanged: each is one
aggregate query that ClickHouse executes, and only the per-group rows come
back. The table is read with ``FINAL`` (a request inserted twice counts once).
A table holds typed rows only: there are no malformed lines to count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from datetime import datetime, timedelta
from typing import Any

from obs.clickhouse.client import Client, parse_query_url
from obs.clickhouse.schema import COLUMNS, TableSpec, check
from obs.events import Event
from obs.query.dialect import CLICKHOUSE
from obs.query.filters import Filters
from obs.query.inputs import Inputs, is_clickhouse
from obs.query.scan import SRC, ScanReport
from obs.query.table import Table

_EXTRA = ("_malformed_files", "_max_schema")
__all__ = ["ClickHouseScan", "is_clickhouse"]


_BOOLS = frozenset(f.name for f in fields(Event) if str(f.type).startswith("bool"))
_EPOCH = datetime(1970, 1, 1)


def _convert(name: str, typ: str) -> Callable[[Any], Any] | None:
    """How a column's JSON value becomes what DuckDB would have returned, if it differs."""
    base = typ.removeprefix("Nullable(")
    if base.startswith("DateTime"):
        return lambda v: datetime.fromisoformat(str(v))
    if name == "ts" and base.startswith("Int64"):  # ts_ms AS ts: millisecond precision
        return lambda v: _EPOCH + timedelta(milliseconds=int(v))
    if name in _BOOLS and base.startswith("UInt8"):
        return bool
    if base.startswith("Float"):  # JSON writes 2.0 as 2
        return float
    return None


class ClickHouseScan:
    """One ``clickhouse://HOST:PORT/DB.TABLE`` plus filters."""

    dialect = CLICKHOUSE
    extra = "CAST(NULL AS Nullable(String)) AS _malformed_files, max(schema_version) AS _max_schema"

    def __init__(self, url: str, filters: Filters | None = None, progress: bool | None = None):
        base, db, table = parse_query_url(url)
        self.url = url
        self.client = Client(base, timeout_s=3600.0)
        self.con = self.client.url  # compare: both sides must query the same server
        check(self.client, TableSpec(db, table))
        self.filters = filters or Filters()
        self.progress = progress
        self.report = ScanReport(files=(url,))
        self.inputs = Inputs(parquet=(url,))  # what reports name as the source
        cols = ", ".join(COLUMNS)
        where = self.filters.to_sql(CLICKHOUSE)
        self.source = f"(SELECT {cols} FROM {db}.{table} FINAL WHERE {where})"

    def run(self, sql: str) -> Table:
        """Run one query (``SRC`` in it stands for the table, filtered) on the server."""
        names, types, data = self.client.table(sql.replace(SRC, self.source))
        conv = [_convert(n, t) for n, t in zip(names, types, strict=True)]
        rows = [
            tuple(v if f is None or v is None else f(v) for f, v in zip(conv, row, strict=True))
            for row in data
        ]
        table = Table(names, rows)
        if "_max_schema" in names:
            for (schema,) in table.column("_max_schema"):
                if schema is not None:
                    top = self.report.max_schema_version or 0
                    self.report.max_schema_version = max(top, int(schema))
            table = table.drop(*_EXTRA)
        return table

    def materialize(self, columns: list[str] | tuple[str, ...]) -> None:
        """Nothing to do: the server reads only the columns a query names."""
