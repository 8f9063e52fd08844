"""Backfill: archived event logs (JSONL, rotated, compressed, Parquet) into ClickHouse.

The files are read by the query tool's own scanner (``obs.query.scan``), so a
line it would skip (bad JSON, a truncated write, not an event) is skipped and
counted here the same way. Rows go in ``JSONEachRow`` batches. Loading the same
files twice adds no duplicate: the table is a ``ReplacingMergeTree`` keyed on
``(lane, ts, request_id)`` and every query reads it with ``FINAL``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from obs.clickhouse.client import INSERT_SETTINGS, Client
from obs.clickhouse.rows import row
from obs.clickhouse.schema import TableSpec, check
from obs.query.scan import SRC, Scan
from obs.query.schema import COLUMNS


@dataclass(slots=True)
class LoadResult:
    inserted: int = 0
    skipped_bad_ts: int = 0
    scan: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def load(
    client: Client,
    spec: TableSpec,
    paths: list[str],
    *,
    batch_rows: int = 50_000,
    progress: Callable[[str], None] | None = None,
) -> LoadResult:
    """Insert every event of ``paths`` into ``spec``; return counts and what was skipped."""
    check(client, spec)
    started = time.monotonic()
    scan = Scan(paths, progress=False)
    scan.run(f"SELECT count(*) AS n, {scan.extra} FROM {SRC}")  # counts the bad lines
    names = list(COLUMNS)
    cur = scan.con.execute(
        f"SELECT {', '.join(names)} FROM {scan.source} WHERE request_id IS NOT NULL"
    )
    result = LoadResult()
    while batch := cur.fetchmany(batch_rows):
        lines = []
        for values in batch:
            line = row(dict(zip(names, values, strict=True)))
            if line is None:
                result.skipped_bad_ts += 1
            else:
                lines.append(line)
        client.insert(spec.name, b"".join(lines), INSERT_SETTINGS)
        result.inserted += len(lines)
        if progress is not None:
            progress(f"{result.inserted:,} events inserted")
    result.scan = scan.report.to_dict()
    result.seconds = time.monotonic() - started
    return result
