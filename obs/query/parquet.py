"""``export``: write events as a Parquet dataset partitioned by date and lane.

Layout (Hive style, what DuckDB, pandas and Spark read back)::

    OUT/date=2025-06-02/lane=chat/events_<uuid>.parquet

``date`` is the UTC date of ``ts``. Columns are the event fields with their
canonical types (``ts`` as a UTC TIMESTAMP); ``lane`` and ``date`` live in
the directory names. Queries given ``OUT`` read the whole dataset and skip
the partitions a ``--lane``/``--since``/``--until`` filter excludes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from obs.errors import InputError
from obs.query.filters import sql_str
from obs.query.scan import SRC, Scan
from obs.query.schema import COLUMNS, TS

if TYPE_CHECKING:
    import duckdb

PARTITION_BY = ("date", "lane")


def _canonical(relation: str) -> str:
    cols = []
    for name, typ in COLUMNS.items():
        t = "TIMESTAMP" if name == TS else typ
        cols.append(f"CAST({name} AS {t}) AS {name}")
    return f"SELECT {', '.join(cols)}, CAST(ts AS DATE) AS date FROM {relation}"


def copy_dataset(
    con: duckdb.DuckDBPyConnection, relation: str, out: str | Path, append: bool = False
) -> None:
    """Write ``relation`` (a FROM item with the event columns) under ``out``."""
    options = [
        "FORMAT parquet",
        f"PARTITION_BY ({', '.join(PARTITION_BY)})",
        "COMPRESSION zstd",
        "FILENAME_PATTERN 'events_{uuid}'",
    ]
    if append:
        options.append("APPEND true")
    con.execute(f"COPY ({_canonical(relation)}) TO {sql_str(str(out))} ({', '.join(options)})")


def export(scan: Scan, out: str | Path, append: bool = False) -> dict[str, Any]:
    """Write the scan's events to ``out``; return counts (events written, files)."""
    if scan.dialect.name != "duckdb":
        raise InputError(
            "export reads local logs only; to copy a ClickHouse table to Parquet use "
            "ClickHouse's own SELECT ... FORMAT Parquet"
        )
    out = Path(out)
    nonempty = out.exists() and (not out.is_dir() or any(out.iterdir()))
    if nonempty and not append:
        raise InputError(f"{out}: exists and is not empty (pass --append to add to the dataset)")
    counted = scan.run(f"SELECT count(request_id) AS n, {scan.extra} FROM {SRC}")
    n = int(counted.rows[0][0]) if counted.rows else 0
    relation = f"(SELECT * FROM {scan.source} WHERE request_id IS NOT NULL)"
    copy_dataset(scan.con, relation, out, append=nonempty)
    files = sorted(str(p) for p in out.rglob("*.parquet")) if out.exists() else []
    return {"events": n, "files": len(files), "out": os.fspath(out)}
