"""Row filters shared by every query: a time window and dimension values.

Times are absolute (ISO 8601: ``2025-06-02``, ``2025-06-02T14:30``,
``2025-06-02T14:30:00+02:00``; no offset means UTC) or relative to now
(``30m``, ``2h``, ``1d``, ``90s``, ``1w``: that long ago). ``since`` is
inclusive, ``until`` exclusive. Filters render to a SQL condition; values are
quoted, never interpolated raw.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime

from obs.conventions import OUTCOMES
from obs.durations import parse_time
from obs.errors import InputError
from obs.query.dialect import DUCKDB, Dialect


def sql_str(value: str) -> str:
    """A SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def _values(items: Iterable[str] | None) -> tuple[str, ...]:
    """Flatten repeated and comma-separated flag values."""
    out: list[str] = []
    for item in items or ():
        out.extend(v.strip() for v in item.split(",") if v.strip())
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True, slots=True)
class Filters:
    """Which events a query sees. Empty tuples mean "any"."""

    since: datetime | None = None
    until: datetime | None = None
    lanes: tuple[str, ...] = ()
    pools: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    tenants: tuple[str, ...] = ()
    statuses: tuple[str, ...] = field(default=())
    arms: tuple[str, ...] = ()  # a split lane's arm (the event's ``arm``): query canary

    def __post_init__(self) -> None:
        unknown = [s for s in self.statuses if s not in OUTCOMES]
        if unknown:
            names = ", ".join(map(repr, unknown))
            raise InputError(f"unknown status {names}; statuses are: {', '.join(OUTCOMES)}")
        if self.since and self.until and self.since >= self.until:
            raise InputError(f"--since {self.since} is not before --until {self.until}")

    @classmethod
    def parse(
        cls,
        since: str | None = None,
        until: str | None = None,
        lane: Iterable[str] | None = None,
        pool: Iterable[str] | None = None,
        model: Iterable[str] | None = None,
        tenant: Iterable[str] | None = None,
        status: Iterable[str] | None = None,
        now: datetime | None = None,
    ) -> Filters:
        """Build filters from command-line style strings (repeatable, comma-separated)."""
        return cls(
            since=parse_time(since, now) if since else None,
            until=parse_time(until, now) if until else None,
            lanes=_values(lane),
            pools=_values(pool),
            models=_values(model),
            tenants=_values(tenant),
            statuses=_values(status),
        )

    def with_window(self, since: datetime | None, until: datetime | None) -> Filters:
        """The same filters over another time window."""
        return replace(self, since=since, until=until)

    def with_arm(self, lane: str, arm: str) -> Filters:
        """The same filters over one arm of a split lane."""
        return replace(self, lanes=(lane,), arms=(arm,))

    def to_sql(self, dialect: Dialect = DUCKDB) -> str:
        """A SQL condition over the event columns (true when nothing is filtered)."""
        parts = []
        ts = dialect.ts_column
        if self.since:
            parts.append(f"{ts} >= {dialect.ts_literal(self.since)}")
        if self.until:
            parts.append(f"{ts} < {dialect.ts_literal(self.until)}")
        for column, values in self._dimensions():
            if values:
                parts.append(f"{column} IN ({', '.join(map(sql_str, values))})")
        return " AND ".join(parts) or dialect.true

    def _dimensions(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Each filterable event column with the values asked for (empty: not filtered)."""
        return (
            ("lane", self.lanes),
            ("pool", self.pools),
            ("model", self.models),
            ("tenant", self.tenants),
            ("status", self.statuses),
            ("arm", self.arms),
        )

    def describe(self) -> str:
        """One line naming what is filtered, for report headers."""
        parts = []
        if self.since or self.until:
            parts.append(f"from {self.since or 'start'} to {self.until or 'end'} UTC")
        for label, values in self._dimensions():
            if values:
                parts.append(f"{label} {', '.join(values)}")
        return "; ".join(parts) or "all events"
