"""The few SQL constructs that differ between the query engines, behind one interface.

Every query (``summary``, ``timeline``, ...) is written once, in SQL both
DuckDB and ClickHouse run, and asks its scan's ``dialect`` for the rest:
conditional aggregates, exact percentiles, time literals and interval
buckets. ``DUCKDB`` serves local files; ``CLICKHOUSE`` (18.16 through current
releases) the fleet's table, where each query runs as one aggregate on the
server and only per-group rows come back.

Percentiles are exact on both engines and interpolated the same way: linearly
between the two nearest ranks (DuckDB ``quantile_cont``, NumPy's default). On
ClickHouse that is computed from the group's sorted values
(``arraySort(groupArrayIf(...))``): exact, at the cost of holding one group's
values of each timing in server memory.
"""

from __future__ import annotations

import calendar
from datetime import UTC, datetime
from typing import Any


def _q(values: tuple[float, ...]) -> str:
    return "[" + ", ".join(repr(q) for q in values) + "]"


class DuckDB:
    name = "duckdb"
    true = "TRUE"
    null_double = "NULL::DOUBLE"
    ts_column = "ts"  # the column time filters compare

    def count_if(self, cond: str) -> str:
        return f"count_if({cond})"

    def agg_if(self, fn: str, expr: str, cond: str) -> str:
        """``fn(expr)`` over the rows where ``cond`` holds (fn: sum, avg, min, max)."""
        # A CASE, as in ``quantiles``: the same result (these aggregates skip NULLs), and
        # about 5% less CPU than FILTER clauses for a 600k-event summary.
        return f"{fn}(CASE WHEN {cond} THEN {expr} END)"

    def quantiles(self, column: str, qs: tuple[float, ...], cond: str) -> str:
        """A list: ``column``'s exact, interpolated quantiles ``qs`` over rows where ``cond``."""
        # A CASE, not a FILTER clause: the same values (NULLs are skipped), and DuckDB
        # evaluates it without a filtered aggregate's per-row selection (about 12% of a
        # summary's scan on 600k events, bench/query_vs_scan.py).
        return f"quantile_cont(CASE WHEN {cond} THEN {column} END, {_q(qs)})"

    def ts_literal(self, t: datetime) -> str:
        """A time filter bound (``t`` naive UTC)."""
        return f"TIMESTAMP '{t.isoformat(sep=' ')}'"

    def ts_value(self, v: Any) -> datetime:
        """A ``ts_column`` value read back, as a naive UTC datetime."""
        when: datetime = v  # DuckDB's TIMESTAMP reads as one
        return when

    def sample(self, column: str, share: float) -> str:
        """True for a deterministic ``share`` of the rows, by a hash of ``column``."""
        return f"(hash({column}) % 1000000) < {round(share * 1_000_000)}"

    def bucket(self, seconds: int) -> str:
        """The start of the epoch-aligned ``seconds`` interval holding the row's ``ts``."""
        us = seconds * 1_000_000
        return f"make_timestamp((epoch_us(ts) // {us}) * {us})"

    def first_per(self, source: str, key: str, order: str, n: int) -> str:
        """The rows of ``source`` whose ``key`` is null, and each key's first ``n`` by ``order``
        (every column of ``source``, and maybe a helper column)."""
        return (
            f"(SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY {key} ORDER BY {order}) "
            f"AS _first_n FROM {source}) WHERE {key} IS NULL OR _first_n <= {int(n)})"
        )

    def rank_sums(self, rows: str) -> str:
        """Per lane over ``rows`` (lane, side 0/1, value v): n1, n2, the rank sum of side 0
        (ties get their average rank) and the tie term sum(t^3 - t) of a Mann-Whitney U test.
        """
        return f"""
WITH x AS ({rows}),
r AS (
  SELECT lane, side, count(*) OVER (PARTITION BY lane, v) AS t,
         rank() OVER (PARTITION BY lane ORDER BY v) AS rk
  FROM x
)
SELECT lane, count_if(side = 0) AS n1, count_if(side = 1) AS n2,
       sum(rk + (t - 1) / 2.0) FILTER (WHERE side = 0) AS r1, sum(t * t - 1) AS ties
FROM r GROUP BY lane"""


class ClickHouse(DuckDB):
    name = "clickhouse"
    true = "1"
    null_double = "CAST(NULL AS Nullable(Float64))"
    ts_column = "ts_ms"  # epoch milliseconds: ``ts`` itself holds whole seconds

    def count_if(self, cond: str) -> str:
        return f"countIf({cond})"

    def agg_if(self, fn: str, expr: str, cond: str) -> str:
        return f"{fn}If({expr}, {cond})"

    def quantiles(self, column: str, qs: tuple[float, ...], cond: str) -> str:
        s = f"arraySort(groupArrayIf({column}, ({cond}) AND isNotNull({column})))"
        out = []
        for q in qs:
            rank = f"({q!r} * (length({s}) - 1))"
            lo = f"{s}[toUInt64(floor({rank})) + 1]"
            hi = f"{s}[toUInt64(ceil({rank})) + 1]"
            out.append(
                f"if(length({s}) = 0, NULL, {lo} + ({hi} - {lo}) * ({rank} - floor({rank})))"
            )
        return "[" + ", ".join(out) + "]"

    def first_per(self, source: str, key: str, order: str, n: int) -> str:
        # No window functions before 21.x: LIMIT BY keeps each key's first rows after ORDER BY.
        return (
            f"(SELECT * FROM {source} WHERE {key} IS NULL UNION ALL SELECT * FROM {source} "
            f"WHERE {key} IS NOT NULL ORDER BY {key}, {order} LIMIT {int(n)} BY {key})"
        )

    def rank_sums(self, rows: str) -> str:
        # No window functions before 21.x: per lane, the distinct values with their counts
        # on each side, sorted; a value's average rank is its cumulative count - (t - 1) / 2.
        t = "tupleElement(e, 3)"
        return f"""
SELECT lane, arraySum(arrayMap(e -> tupleElement(e, 2), g)) AS n1,
       arraySum(arrayMap(e -> {t} - tupleElement(e, 2), g)) AS n2,
       arraySum(arrayMap((e, c) -> tupleElement(e, 2) * (c - ({t} - 1) / 2), g,
                         arrayCumSum(arrayMap(e -> {t}, g)))) AS r1,
       arraySum(arrayMap(e -> {t} * ({t} * {t} - 1), g)) AS ties
FROM (
  SELECT lane, arraySort(groupArray(tuple(v, c0, t))) AS g
  FROM (SELECT lane, v, countIf(side = 0) AS c0, count() AS t FROM ({rows}) GROUP BY lane, v)
  GROUP BY lane
)"""

    def ts_literal(self, t: datetime) -> str:
        return str(calendar.timegm(t.timetuple()) * 1000 + t.microsecond // 1000)

    def ts_value(self, v: Any) -> datetime:
        return datetime.fromtimestamp(int(v) / 1000, tz=UTC).replace(tzinfo=None)

    def sample(self, column: str, share: float) -> str:
        return f"(cityHash64({column}) % 1000000) < {round(share * 1_000_000)}"

    def bucket(self, seconds: int) -> str:
        return f"toDateTime(intDiv(ts_ms, {seconds * 1000}) * {seconds}, 'UTC')"


Dialect = DuckDB
DUCKDB = DuckDB()
CLICKHOUSE = ClickHouse()
