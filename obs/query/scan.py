"""One scan over event logs: DuckDB reads JSONL and Parquet through one column list.

JSONL is read with ``read_json`` and an explicit column schema taken from
``obs.events.Event`` (no sniffing), ``ignore_errors`` on. A line that is not a
JSON object with a ``request_id`` (bad JSON, a truncated write, an array)
comes out as a row whose ``request_id`` is null; the filters keep those rows
(``request_id IS NULL OR <filters>``) so every query counts them per file in
the same pass (``EXTRA_COLUMNS``) and then ignores them. A field of the wrong
type reads as null. Blank lines are skipped.

Queries name the logs ``SRC`` (``f"SELECT ... FROM {SRC}"``); ``Scan.run``
puts the source there. It yields the canonical columns plus ``filename``,
filtered.
"""

from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from obs.errors import InputError
from obs.events import SCHEMA_VERSION
from obs.query.dialect import DUCKDB, Dialect
from obs.query.filters import Filters, sql_str
from obs.query.inputs import Inputs, resolve, truncated_tail
from obs.query.progress import Progress
from obs.query.schema import COLUMNS, TS
from obs.query.table import Table

if TYPE_CHECKING:
    import duckdb

# Appended to the select list of an aggregate query so the scan can account for bad lines.
EXTRA_COLUMNS = (
    "histogram(filename) FILTER (WHERE request_id IS NULL) AS _malformed_files, "
    "max(schema_version) AS _max_schema"
)
# Parquet holds typed rows only: no per-file histogram to pay for.
_EXTRA_PARQUET = "NULL AS _malformed_files, max(schema_version) AS _max_schema"
_EXTRA = ("_malformed_files", "_max_schema")
# Stands for the scan's source in a query passed to ``Scan.run``. It holds NUL
# characters, which no command-line argument can, so a user-supplied value
# quoted into the query can never be mistaken for it.
SRC = "\0src\0"
# Dates no sidecar writes: a line dated before EARLIEST or more than AHEAD past the reader's
# clock (a hand-made log of 9999-12-31) is skipped as not an event and counted with the
# malformed lines; its date sent ``timeline`` past what a datetime holds and ``plan`` into a
# replay over millennia.
EARLIEST = datetime(2000, 1, 1)
AHEAD = timedelta(days=1)  # a sidecar's clock may run a little ahead of the reader's


@dataclass(slots=True)
class ScanReport:
    """What the scan met besides events: malformed and truncated lines, newer schemas."""

    files: tuple[str, ...] = ()
    malformed: dict[str, int] = field(default_factory=dict)
    truncated: tuple[str, ...] = ()
    max_schema_version: int | None = None

    @property
    def malformed_total(self) -> int:
        return sum(self.malformed.values())

    def messages(self) -> list[str]:
        """Human-readable notes, one per problem (empty when the logs were clean)."""
        out = []
        for f, n in sorted(self.malformed.items()):
            if n:
                out.append(
                    f"{f}: skipped {n} malformed line{'s' * (n != 1)} (not an event: "
                    f"unreadable, or dated before {EARLIEST:%Y} or after tomorrow)"
                )
        for f in self.truncated:
            out.append(f"{f}: skipped a truncated last line (a write cut short)")
        if self.max_schema_version and self.max_schema_version > SCHEMA_VERSION:
            out.append(
                f"events use schema_version {self.max_schema_version}, newer than this "
                f"vllm-obs ({SCHEMA_VERSION}): upgrade vllm-obs if fields look wrong"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": list(self.files),
            "malformed": dict(self.malformed),
            "malformed_total": self.malformed_total,
            "truncated": list(self.truncated),
            "max_schema_version": self.max_schema_version,
        }


def connect(threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection set up for event queries (UTC, quiet progress)."""
    import duckdb

    config: dict[str, Any] = {"threads": threads} if threads else {}
    con = duckdb.connect(":memory:", config=config)
    con.execute(
        "SET TimeZone = 'UTC'; SET enable_progress_bar = true; "
        "SET enable_progress_bar_print = false"
    )
    return con


def dated(select: str, now: datetime | None = None) -> str:
    """``select`` (the canonical columns and ``filename``) with every column but
    ``filename`` null in a row dated outside ``EARLIEST`` to ``now + AHEAD``: a row read as
    a malformed line, skipped by every query and counted."""
    late = (now or datetime.now(UTC)).replace(tzinfo=None) + AHEAD
    inside = (
        f"{TS} IS NULL OR ({TS} >= {DUCKDB.ts_literal(EARLIEST)} AND {TS} < "
        f"{DUCKDB.ts_literal(late)})"
    )
    cols = ", ".join(f"CASE WHEN _dated THEN {name} END AS {name}" for name in COLUMNS)
    return f"SELECT {cols}, filename FROM (SELECT *, {inside} AS _dated FROM ({select}))"


def _list_sql(files: tuple[str, ...]) -> str:
    return "[" + ", ".join(sql_str(f) for f in files) + "]"


def _projection(available: dict[str, str] | None) -> str:
    """Canonical columns; ``available`` maps a Parquet file's column names to their types."""
    cols = []
    for name, typ in COLUMNS.items():
        if available is None:  # JSONL: read_json already produced the declared types
            expr = f"CAST({name} AS TIMESTAMP)" if name == TS else name
        elif name not in available:
            expr = f"NULL::{'TIMESTAMP' if name == TS else typ}"
        elif name == TS:
            expr = (
                name
                if available[name] == "TIMESTAMP"
                else f"CAST(CAST({name} AS TIMESTAMPTZ) AS TIMESTAMP)"
            )
        else:
            expr = name if available[name] == typ else f"TRY_CAST({name} AS {typ})"
        cols.append(f"{expr} AS {name}")
    return ", ".join(cols)


_TEMP_TABLES = itertools.count(1)  # names of materialized tables, unique per process


class Source(Protocol):
    """What every query needs of its events: local logs (``Scan``) or ClickHouse
    (``obs.query.clickhouse.ClickHouseScan``), one query model over both."""

    @property
    def dialect(self) -> Dialect: ...

    @property
    def filters(self) -> Filters: ...

    @property
    def inputs(self) -> Inputs:
        """What reports name as the source."""

    @property
    def report(self) -> ScanReport: ...

    @property
    def source(self) -> str:
        """The filtered events as SQL (what ``SRC`` stands for)."""

    @property
    def extra(self) -> str:
        """Select-list items the scan reads back (malformed files, schema version)."""

    @property
    def con(self) -> object:
        """The backend's connection or server: two scans compared must share it."""

    def run(self, sql: str) -> Table: ...

    def materialize(self, columns: list[str] | tuple[str, ...]) -> None: ...


class Scan:
    """Event logs plus filters, bound to a DuckDB connection."""

    dialect: Dialect = DUCKDB

    def __init__(
        self,
        paths: list[str] | tuple[str, ...] | str | Inputs,
        filters: Filters | None = None,
        con: duckdb.DuckDBPyConnection | None = None,
        progress: bool | None = None,
    ) -> None:
        self.inputs = paths if isinstance(paths, Inputs) else resolve(paths)
        self.filters = filters or Filters()
        self.con = con or connect()
        self.progress = progress
        self.report = ScanReport(files=self.inputs.files)
        self._tails: dict[str, bool] = {}
        self._materialized = False
        self._tail_thread = threading.Thread(target=self._check_tails, daemon=True)
        self._tail_thread.start()
        self.source = self._source_sql()
        # Select-list items every aggregate query adds (``scan.run`` strips them).
        self.extra = EXTRA_COLUMNS if self.inputs.jsonl else _EXTRA_PARQUET

    def _check_tails(self) -> None:
        for f in self.inputs.jsonl:
            self._tails[f] = truncated_tail(f)

    def _source_sql(self) -> str:
        where = self.filters.to_sql()
        parts = []
        if self.inputs.jsonl:
            columns = (
                "{" + ", ".join(f"{sql_str(k)}: {sql_str(v)}" for k, v in COLUMNS.items()) + "}"
            )
            read = (
                f"SELECT {_projection(None)}, filename FROM read_json("
                f"{_list_sql(self.inputs.jsonl)}, columns = {columns}, "
                "format = 'newline_delimited', ignore_errors = true, filename = true)"
            )
            parts.append(f"SELECT * FROM ({dated(read)}) WHERE request_id IS NULL OR ({where})")
        if self.inputs.parquet:
            reader = (
                f"read_parquet({_list_sql(self.inputs.parquet)}, union_by_name = true, "
                f"hive_partitioning = {str(self.inputs.parquet_hive).lower()})"
            )
            available = dict(
                (str(r[0]), str(r[1]))
                for r in self._execute(f"DESCRIBE SELECT * FROM {reader}").fetchall()
            )
            read = f"SELECT {_projection(available)}, NULL::VARCHAR AS filename FROM {reader}"
            parts.append(f"SELECT * FROM ({dated(read)}) WHERE {where}")
        return "(" + " UNION ALL ".join(parts) + ")"

    def _execute(self, sql: str) -> duckdb.DuckDBPyConnection:
        import duckdb

        try:
            return self.con.execute(sql)
        except duckdb.Error as e:
            first = str(e).splitlines()[0]
            raise InputError(f"cannot read the event logs: {first}") from e

    def _label(self) -> str:
        n = len(self.inputs.files)
        name = os.path.basename(self.inputs.files[0]) if n == 1 else f"{n} files"
        return f"scanning {name}"

    def run(self, sql: str) -> Table:
        """Run one query (``SRC`` in it stands for the source); account for bad lines."""
        sql = sql.replace(SRC, self.source)
        with Progress(self.con, self._label(), enabled=self.progress):
            cur = self._execute(sql)
            rows = cur.fetchall()
        columns = [d[0] for d in cur.description or ()]
        table = Table(columns, rows)
        if "_malformed_files" in columns:
            self._account(table)
            table = table.drop(*_EXTRA)
        return table

    def _account(self, table: Table) -> None:
        counts: dict[str, int] = {}
        top_schema = self.report.max_schema_version
        for hist, schema in table.column("_malformed_files", "_max_schema"):
            for f, n in (hist or {}).items():
                counts[f] = counts.get(f, 0) + int(n)
            if schema is not None:
                top_schema = max(top_schema or 0, int(schema))
        self._tail_thread.join()
        truncated = tuple(f for f, cut in self._tails.items() if cut and counts.get(f))
        for f in truncated:
            counts[f] -= 1
        # Several queries over one scan see the same bad lines: keep the largest count.
        for f, n in counts.items():
            self.report.malformed[f] = max(self.report.malformed.get(f, 0), n)
        self.report.truncated = tuple(dict.fromkeys(self.report.truncated + truncated))
        self.report.max_schema_version = top_schema

    def materialize(self, columns: list[str] | tuple[str, ...]) -> None:
        """Read JSONL once into a temporary table of ``columns``; later queries use it.

        For commands that query the logs several times. Parquet is left where
        it is: re-reading it is cheap and keeps partition pruning.
        """
        if not self.inputs.jsonl or self._materialized:
            return
        self._materialized = True
        # A counter, not id(self): a freed scan's address comes back, its table may not be gone.
        name = f"events_{next(_TEMP_TABLES)}"
        cols = ", ".join(dict.fromkeys([*columns, "request_id", "schema_version", "filename"]))
        with Progress(self.con, self._label(), enabled=self.progress):
            self._execute(f"CREATE TEMP TABLE {name} AS SELECT {cols} FROM {self.source}")
        self.run(f"SELECT {self.extra} FROM {name}")
        self.source = f"(SELECT * FROM {name} WHERE request_id IS NOT NULL)"
