"""``slowest`` (the top N requests by a timing) and ``show`` (one request, with a waterfall).

Both are single-pass aggregates: DuckDB keeps the top N rows while scanning
(``max_by(row, value, N)``) instead of sorting the log.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from obs.conventions import PHASES
from obs.errors import InputError
from obs.query.filters import sql_str
from obs.query.scan import SRC, Source
from obs.query.schema import COLUMNS, PHASE_COLUMNS, timing_column
from obs.query.table import Table, printable

SLOWEST_COLUMNS = (
    "request_id",
    "ts",
    "lane",
    "pool",
    "model",
    "tenant",
    "status",
    "stream",
    "e2e_ms",
    *PHASE_COLUMNS,
    "ttft_ms",
    "tpot_ms",
    "prompt_tokens",
    "completion_tokens",
)
_MAX_MATCHES = 20


def _struct(columns: tuple[str, ...] | list[str]) -> str:
    return "struct_pack(" + ", ".join(f"{c} := {c}" for c in columns) + ")"


def slowest(scan: Source, by: str = "e2e", n: int = 10) -> Table:
    """The ``n`` requests with the largest ``by`` timing (any status), largest first.

    Equal timings are ordered by time, earlier first.
    """
    if n < 1:
        raise InputError(f"-n {n}: must be at least 1")
    col = timing_column(by)
    columns = list(SLOWEST_COLUMNS)
    if col not in columns:
        columns.insert(columns.index("e2e_ms"), col)
    top = _top_rows(scan, columns, f"{col} IS NOT NULL", int(n), col)
    return Table(columns, [tuple(item[c] for c in columns) for item in top])


def _top_rows(
    scan: Source, columns: list[str], cond: str, n: int, by: str | None = None
) -> list[dict[str, Any]]:
    """Events where ``cond`` holds: the ``n`` with the largest ``by`` or, without ``by``,
    the ``n`` earliest. Ties go to the earlier request, so the answer does not depend on
    scan order.

    DuckDB keeps the top rows while it scans (``max_by``/``arg_min`` over a struct, so the
    same pass counts bad lines); ClickHouse sorts on the server (``ORDER BY ... LIMIT``),
    its ``ts`` taken from ``ts_ms`` for millisecond precision.
    """
    if scan.dialect.name == "clickhouse":
        cols = ", ".join("ts_ms AS ts" if c == "ts" else c for c in columns)
        order = f"{by} DESC, ts_ms ASC" if by else "ts_ms ASC"
        raw = scan.run(f"SELECT {cols} FROM {SRC} WHERE {cond} ORDER BY {order} LIMIT {n}")
        return raw.records()
    if by is None:
        first = "coalesce(ts, TIMESTAMP 'epoch')"
        agg = f"arg_min({_struct(columns)}, {first}, {n})"
    else:
        order = f"struct_pack(v := {by}, t := -epoch_us(coalesce(ts, TIMESTAMP 'epoch')))"
        agg = f"max_by({_struct(columns)}, {order}, {n})"
    raw = scan.run(
        f"SELECT {agg} FILTER (WHERE request_id IS NOT NULL AND ({cond})) AS top, "
        f"{scan.extra} FROM {SRC}"
    )
    return list((raw.rows[0][0] if raw.rows else None) or [])


def find(scan: Source, request_id: str) -> dict[str, Any]:
    """The event whose request id (or trace id) is ``request_id``, or a unique prefix of one."""
    key = request_id.strip()
    if not key:
        raise InputError("give a request id")
    lit = sql_str(key)
    prefix = f"substring(request_id, 1, {len(key.encode())}) = {lit}"
    match = f"request_id = {lit} OR trace_id = {lit} OR {prefix}"
    hits = _top_rows(scan, list(COLUMNS), match, _MAX_MATCHES)
    exact = [h for h in hits if key in (h["request_id"], h["trace_id"])]
    chosen = exact or hits
    if not chosen:
        raise InputError(f"no request {key!r} in the logs (with the given filters)")
    if len(chosen) > 1:
        ids = ", ".join(str(h["request_id"]) for h in chosen[:10])
        what = "events share that id" if exact else "request ids start with it"
        raise InputError(f"{key!r} is ambiguous: {len(chosen)} {what} ({ids})")
    return chosen[0]


def phase_spans(event: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(phase, start ms, duration ms) of the five consecutive phases."""
    out, start = [], 0.0
    for phase, col in zip(PHASES, PHASE_COLUMNS, strict=True):
        d = float(event.get(col) or 0.0)
        out.append((phase, start, d))
        start += d
    return out


def waterfall(event: dict[str, Any], width: int = 48) -> str:
    """A text waterfall of the request's phases, to scale."""
    spans = phase_spans(event)
    total = sum(d for _, _, d in spans) or 1.0
    lines = [f"{'phase':<12} {'start ms':>10} {'duration ms':>12}  |{'':<{width}}|"]
    for phase, start, d in spans:
        a = round(start / total * width)
        b = round((start + d) / total * width)
        if b <= a:  # shorter than one cell: a thin mark, kept inside the frame
            a = min(a, width - 1)
        bar = "\u2588" * (b - a) if b > a else ("\u258f" if d > 0 else "")
        lines.append(f"{phase:<12} {start:>10,.1f} {d:>12,.1f}  |{' ' * a}{bar:<{width - a}}|")
    e2e = event.get("e2e_ms")
    ttft = event.get("ttft_ms")
    tail = [f"e2e {e2e:,.1f} ms" if e2e is not None else "e2e -"]
    if ttft is not None:
        tail.append(f"ttft {ttft:,.1f} ms")
    if event.get("tpot_ms") is not None:
        tail.append(f"tpot {event['tpot_ms']:,.2f} ms")
    lines.append("  ".join(tail))
    return "\n".join(lines) + "\n"


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.isoformat(timespec="milliseconds") + "Z"
    return printable(str(value))


def describe(event: dict[str, Any]) -> str:
    """Every field of the event, one per line, then the phase waterfall."""
    width = max(len(k) for k in event)
    fields = "\n".join(f"{k:<{width}}  {_fmt(v)}" for k, v in event.items())
    return f"{fields}\n\n{waterfall(event)}"


def as_json(event: dict[str, Any]) -> dict[str, Any]:
    """The event and its phase spans, JSON-ready."""
    ev = {k: (_fmt(v) if isinstance(v, datetime) else v) for k, v in event.items()}
    spans = [{"phase": p, "start_ms": s, "duration_ms": d} for p, s, d in phase_spans(event)]
    return {"event": ev, "phases": spans}
