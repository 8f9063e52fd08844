"""``timeline``: per-interval rates, percentiles and goodput, to find the incident window.

Intervals are aligned to the Unix epoch (a 15m interval starts at :00, :15,
...), labelled by their start (UTC) and cover ``[start, start + interval)``.
Intervals without requests inside the covered span appear with zero
requests. ``rps`` is requests / interval length, so the first and last
intervals read low when the log starts or ends inside them.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from obs.config import Config
from obs.durations import parse_duration
from obs.errors import InputError
from obs.query import slo
from obs.query.aggregate import aggregates, derive, latency_condition, pct_label
from obs.query.scan import SRC, Source
from obs.query.schema import GROUP_BY
from obs.query.table import Table

QUANTILES = (0.5, 0.95, 0.99)
# Nice interval lengths (seconds); the automatic choice is the shortest giving <= MAX_BUCKETS.
NICE_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
MAX_BUCKETS = 100
MAX_INTERVALS = 100_000  # rows of one timeline: past it, a longer --interval is asked for
_COLUMNS = (
    "requests",
    "rps",
    "error_rate",
    "rejection_rate",
    *(f"ttft_{pct_label(q)}_ms" for q in QUANTILES),
    "tpot_p95_ms",
    "itl_p95_ms",
    "e2e_p95_ms",
    "queue_p95_ms",
    "ttft_attainment",
    "goodput_ratio",
)


def auto_interval(span: timedelta) -> int:
    """Seconds: the shortest nice interval that cuts ``span`` into at most MAX_BUCKETS."""
    s = span.total_seconds()
    for nice in NICE_S:
        if s / nice <= MAX_BUCKETS:
            return nice
    return int(-(-s // (MAX_BUCKETS * 86400)) * 86400)


def _interval_s(scan: Source, interval: str | None) -> int:
    if interval:
        secs = parse_duration(interval).total_seconds()
        if secs < 1 or secs != int(secs):
            raise InputError(f"--interval {interval}: use whole seconds, at least 1s")
        return int(secs)
    f = scan.filters
    if f.since and f.until:
        return auto_interval(f.until - f.since)
    lo, hi = scan.run(f"SELECT min(ts), max(ts) FROM {SRC} WHERE request_id IS NOT NULL").rows[0]
    return auto_interval((hi - lo) if lo and hi else timedelta(0))


def timeline(
    scan: Source, config: Config, interval: str | None = None, by: str | None = None
) -> Table:
    """One row per interval (per ``by`` value when given), oldest first."""
    if by is not None and by not in GROUP_BY:
        raise InputError(f"--by {by!r}: choose one of {', '.join(GROUP_BY)}")
    secs = _interval_s(scan, interval)
    items = ",\n  ".join(aggregates(latency_condition(scan, by), QUANTILES, scan.dialect))
    key = f"{by}" if by else "NULL"
    source = slo.judged_rows(config, SRC, scan.dialect)
    raw = scan.run(
        f"SELECT {scan.dialect.bucket(secs)} AS _t, {key} AS _key,\n  {items},\n  {scan.extra}\n"
        f"FROM {source} GROUP BY _t, _key"
    )
    cells: dict[tuple[datetime, Any], dict[str, Any]] = {}
    for rec in raw.records():
        if rec["requests"] and rec["_t"] is not None:
            d = derive(rec, QUANTILES, means=False)
            d["rps"] = rec["requests"] / secs
            cells[(rec["_t"], rec["_key"])] = d
    if not cells:
        return Table(["start", *([by] if by else []), *_COLUMNS], [])
    starts = [t for t, _ in cells]
    keys = sorted({k for _, k in cells}, key=lambda k: (k is None, str(k)))
    step = timedelta(seconds=secs)
    t, end = min(starts), max(starts)
    count = (end - t) // step + 1
    if count > MAX_INTERVALS:
        raise InputError(
            f"the events from {t} to {end} are {count:,} intervals of {secs} s (at most "
            f"{MAX_INTERVALS:,}): give a longer --interval, or --since/--until"
        )
    rows = []
    while t <= end:
        for k in keys:
            cell = cells.get((t, k))
            empty = [0, 0.0, *[None] * (len(_COLUMNS) - 2)]
            values = [cell.get(c) for c in _COLUMNS] if cell else empty
            rows.append((t, *([k] if by else []), *values))
        t += step
    return Table(["start", *([by] if by else []), *_COLUMNS], rows)
