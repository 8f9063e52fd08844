"""The ClickHouse event table as code, derived from ``obs.events.Event``.

One column per event field (``Event`` is the one source: a test fails when
they drift), plus ``ts_ms`` (the receive time in epoch milliseconds: ``ts`` is
a second-precision ``DateTime``, the finest 18.16 has). The table is a
``ReplacingMergeTree`` partitioned by day and ordered by ``(lane, ts,
request_id)``: queries filter and group by lane and time, and a row inserted
twice (a retried batch, a re-run backfill) collapses into one; queries read it
with ``FINAL`` so duplicates not yet merged are never counted.

For a sharded cluster each server holds ``TABLE_local`` and ``TABLE`` is a
``Distributed`` table over them, sharded by ``sipHash64(request_id)`` so both
copies of a duplicate land on the same shard. Adding an event field is an
``ALTER TABLE ... ADD COLUMN`` that ``init`` applies; old rows read it as null.
SQL here runs on ClickHouse 18.16 and current releases alike (no
``IF NOT EXISTS`` on columns, no ``DateTime64``, no ``Bool``); ``TTL`` needs
19.6 or later.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Final

from obs.clickhouse.client import ClickHouseError, Client
from obs.errors import ConfigError
from obs.events import Event

TS_MS: Final = "ts_ms"
_TYPES: Final = {"str": "String", "int": "Int64", "float": "Float64", "bool": "UInt8"}


def _type(name: str, annotation: object) -> str:
    if name == "ts":
        return "DateTime('UTC')"
    parts = [p.strip() for p in str(annotation).split("|")]
    base = _TYPES.get(parts[0], "String")
    return f"Nullable({base})" if "None" in parts else base


# Every column and its ClickHouse type, in order.
COLUMNS: Final[dict[str, str]] = {
    **{f.name: _type(f.name, f.type) for f in fields(Event)},
    TS_MS: "Int64",
}


@dataclass(frozen=True, slots=True)
class TableSpec:
    """Where the events live: ``db.table``; with ``cluster``, a Distributed table."""

    db: str
    table: str
    cluster: str | None = None
    ttl_days: int | None = None

    @property
    def name(self) -> str:
        return f"{self.db}.{self.table}"

    @property
    def local(self) -> str:
        """The MergeTree table: the table itself, or ``TABLE_local`` on each shard."""
        return f"{self.db}.{self.table}_local" if self.cluster else self.name


def _columns_sql() -> str:
    return ",\n  ".join(f"{name} {typ}" for name, typ in COLUMNS.items())


def ddl(spec: TableSpec) -> list[str]:
    """The statements that create the database and table(s), each idempotent."""
    ttl = f"\nTTL ts + INTERVAL {int(spec.ttl_days)} DAY" if spec.ttl_days else ""
    out = [
        f"CREATE DATABASE IF NOT EXISTS {spec.db}",
        f"CREATE TABLE IF NOT EXISTS {spec.local} (\n  {_columns_sql()}\n)\n"
        "ENGINE = ReplacingMergeTree()\nPARTITION BY toYYYYMMDD(ts)\n"
        f"ORDER BY (lane, ts, request_id){ttl}",
    ]
    if spec.cluster:
        out.append(
            f"CREATE TABLE IF NOT EXISTS {spec.name} AS {spec.local}\n"
            f"ENGINE = Distributed({spec.cluster}, {spec.db}, {spec.table}_local, "
            "sipHash64(request_id))"
        )
    return out


def existing_columns(client: Client, db: str, table: str) -> dict[str, str]:
    """The table's columns and types (empty when it does not exist)."""
    rows = client.rows(
        f"SELECT name, type FROM system.columns WHERE database = '{db}' AND table = '{table}'"
    )
    return {str(r["name"]): str(r["type"]) for r in rows}


def _norm(typ: str) -> str:
    return typ.replace('"', "'").replace(" ", "")


def diff(have: dict[str, str]) -> tuple[list[str], list[str]]:
    """(columns to add, problems: columns of the wrong type) for an existing table."""
    missing = [c for c in COLUMNS if c not in have]
    wrong = [
        f"column {c} is {have[c]}, expected {t}"
        for c, t in COLUMNS.items()
        if c in have and _norm(have[c]) != _norm(t)
    ]
    return missing, wrong


def check(client: Client, spec: TableSpec) -> list[str]:
    """Raise a one-line ConfigError unless ``spec.name`` exists with the event columns.

    Returns the columns it lacks that a newer vllm-obs added (run ``init`` to
    add them); inserts simply leave them out until then.
    """
    have = existing_columns(client, spec.db, spec.table)
    if not have:
        raise ConfigError(
            f"ClickHouse table {spec.name} does not exist at {client.url}; create it with "
            f"`vllm-obs clickhouse init {client.url} --table {spec.name}`"
        )
    missing, wrong = diff(have)
    if wrong:
        raise ConfigError(
            f"ClickHouse table {spec.name} has the wrong schema: {wrong[0]}"
            + (f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else "")
        )
    return missing


def init(client: Client, spec: TableSpec) -> list[str]:
    """Create what is missing and add new event columns; return what it changed."""
    changed = []
    for stmt in ddl(spec):
        client.execute(stmt)
    tables = [spec.local, spec.name] if spec.cluster else [spec.name]
    for full in tables:
        db, table = full.split(".")
        have = existing_columns(client, db, table)
        missing, wrong = diff(have)
        if wrong:
            raise ConfigError(f"ClickHouse table {full} has the wrong schema: {wrong[0]}")
        for col in missing:
            try:
                client.execute(f"ALTER TABLE {full} ADD COLUMN {col} {COLUMNS[col]}")
            except ClickHouseError as e:
                raise ConfigError(f"cannot add column {col} to {full}: {e}") from e
            changed.append(f"{full}: added column {col} {COLUMNS[col]}")
    return changed
