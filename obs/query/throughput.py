"""Tokens per second per group (prompt, generated, cached) and, for priced pools, the cost
per 1k tokens beside the API price it is compared with.

Rates are over the span of the whole scan (first to last event of every group), so lanes
and pools of one log compare on the same clock: a lane idle half the time shows half the
rate. A pool's cost over that span is its GPU-hour price x GPUs per replica x replicas x
hours; per 1k tokens (prompt + generated) it is that cost over the pool's tokens in the
scan, and a lane is charged its pool's rate.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from obs.config import Config
from obs.query.scan import SRC, Source

TOKEN_COLUMNS = ("prompt", "generated", "cached")
RATE_COLUMNS = tuple(f"{k}_tokens_per_s" for k in TOKEN_COLUMNS)
COST_COLUMNS = ("cost_per_1k_tokens", "api_cost_per_1k_tokens")


def epoch_seconds(value: Any) -> float | None:
    """A time column's value as epoch seconds (DuckDB: a naive UTC datetime, the session's
    time zone; ClickHouse: epoch ms)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    return float(value) / 1000


def span_s(scan: Source) -> float | None:
    """Seconds from the scan's first event to its last (None when under a second)."""
    ts = scan.dialect.ts_column
    rows = scan.run(f"SELECT min({ts}) AS t0, max({ts}) AS t1, {scan.extra} FROM {SRC}").rows
    return _span(rows[0][0], rows[0][1]) if rows else None


def _span(first: Any, last: Any) -> float | None:
    t0, t1 = epoch_seconds(first), epoch_seconds(last)
    if t0 is None or t1 is None or t1 - t0 < 1:
        return None
    return t1 - t0


def items(scan: Source) -> list[str]:
    """Select-list items a grouped query adds so :func:`rates_from` needs no pass of its own:
    the group's first and last event and its token sums."""
    ts = scan.dialect.ts_column
    return [
        f"min({ts}) AS _tok_t0",
        f"max({ts}) AS _tok_t1",
        "sum(prompt_tokens) AS _tok_p",
        "sum(completion_tokens) AS _tok_g",
        "sum(cached_tokens) AS _tok_c",
    ]


def rates_from(
    scan: Source, config: Config, by: str, records: list[dict[str, Any]]
) -> dict[Any, dict[str, float | None]]:
    """:func:`token_rates` from the rows of a query grouped by ``by`` (key ``_key``) that
    carried :func:`items`; only a priced per-lane summary reads the pools' sums again."""
    firsts = [r["_tok_t0"] for r in records if r["_tok_t0"] is not None]
    lasts = [r["_tok_t1"] for r in records if r["_tok_t1"] is not None]
    span = _span(min(firsts), max(lasts)) if firsts and lasts else None
    sums = {
        r["_key"]: (float(r["_tok_p"] or 0), float(r["_tok_g"] or 0), float(r["_tok_c"] or 0))
        for r in records
    }
    return _rates(scan, config, by, span, sums)


def _sums(scan: Source, by: str) -> dict[Any, tuple[float, float, float]]:
    sql = (
        f"SELECT {by} AS _key, sum(prompt_tokens) AS p, sum(completion_tokens) AS g, "
        f"sum(cached_tokens) AS c, {scan.extra} FROM {SRC} GROUP BY _key"
    )
    return {r[0]: tuple(float(v or 0) for v in r[1:4]) for r in scan.run(sql).rows}  # type: ignore[misc]


def token_rates(scan: Source, config: Config, by: str) -> dict[Any, dict[str, float | None]]:
    """Per ``by`` value: tokens/s of each kind and, by lane or pool, the cost columns."""
    return _rates(scan, config, by, span_s(scan), _sums(scan, by))


def _rates(
    scan: Source,
    config: Config,
    by: str,
    span: float | None,
    sums: dict[Any, tuple[float, float, float]],
) -> dict[Any, dict[str, float | None]]:
    priced = by in ("lane", "pool") and any(p.price for p in config.pools)
    pool_tokens = {}
    if priced:
        pool_tokens = sums if by == "pool" else _sums(scan, "pool")
    lane_pool = {lane.name: lane.pool for lane in config.lanes}
    out: dict[Any, dict[str, float | None]] = {}
    for key, values in sums.items():
        row: dict[str, float | None] = {
            col: None if span is None else round(v / span, 3)
            for col, v in zip(RATE_COLUMNS, values, strict=True)
        }
        pool = key if by == "pool" else lane_pool.get(key) if by == "lane" else None
        if priced:
            row.update(dict.fromkeys(COST_COLUMNS))
            row.update(_cost(config, pool, pool_tokens.get(pool), span))
        out[key] = row
    return out


def _cost(
    config: Config, pool: str | None, tokens: tuple[float, float, float] | None, span: float | None
) -> dict[str, float | None]:
    """The pool's cost per 1k tokens over ``span`` and the API price it is compared with."""
    known = {p.name: p for p in config.pools}
    price = known[pool].price if pool in known else None
    if price is None:
        return {}
    api = price.api_per_1k_tokens
    total = (tokens[0] + tokens[1]) if tokens else 0
    if span is None or not total or pool is None:
        return {COST_COLUMNS[0]: None, COST_COLUMNS[1]: api}
    replicas = len(known[pool].replicas)
    cost = price.gpu_hour * price.gpus_per_replica * replicas * span / 3600
    return {COST_COLUMNS[0]: round(cost / total * 1000, 6), COST_COLUMNS[1]: api}
