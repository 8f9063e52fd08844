"""Read the recorded traffic from events, through the query layer's readers.

JSONL, Parquet and ``clickhouse://`` sources all open with ``obs.query.api.open_any`` and
are read by two aggregate queries, so memory is bounded by the window's intervals and the
shape sample, never by the number of events:

1. offered and served requests per lane, pool and ``bin_s`` interval (client errors are not
   offered load: the pool never saw them);
2. the shapes of served requests, a deterministic hash sample of at most ``sample`` per lane
   (each lane's share is its served count over ``sample``; ``Traffic.sampled`` says so).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from obs.config import Config
from obs.conventions import CLIENT_ERROR, OK
from obs.errors import InputError
from obs.plan.traffic import LaneTraffic, Shape, Traffic
from obs.query.api import open_any
from obs.query.filters import Filters, sql_str
from obs.query.scan import SRC, Source
from obs.query.throughput import epoch_seconds

SAMPLE = 20_000  # shapes kept per lane
MAX_BINS = 2000  # intervals in a window, at most
MIN_BIN_S = 10


def bin_seconds(span_s: float) -> int:
    """The interval the arrival rate is kept at: 10 s, or longer so a window holds at most
    ``MAX_BINS`` of them."""
    return max(MIN_BIN_S, math.ceil(span_s / MAX_BINS))


_SERVED = f"status = '{OK}' AND prompt_tokens IS NOT NULL AND completion_tokens IS NOT NULL"


def _span(scan: Source) -> tuple[float, float, int]:
    ts = scan.dialect.ts_column
    rows = scan.run(
        f"SELECT min({ts}) AS t0, max({ts}) AS t1, count(request_id) AS n, {scan.extra} "
        f"FROM {SRC}"  # every line, so the scan counts those that are not events
    ).rows
    t0, t1 = (epoch_seconds(v) for v in rows[0][:2]) if rows else (None, None)
    if t0 is None or t1 is None:
        raise InputError("the event log holds no events (nothing to plan from)")
    return t0, t1, int(rows[0][2])


def read_traffic(
    paths: list[str],
    config: Config,
    window_s: float | None = None,
    sample: int = SAMPLE,
    progress: bool | None = None,
) -> Traffic:
    """The recorded traffic of ``config``'s lanes in the last ``window_s`` of the events."""
    scan = open_any(paths, Filters(), progress)
    t0, t1, _ = _span(scan)
    if window_s is not None and t1 - window_s > t0:
        t0 = t1 - window_s
        since = datetime.fromtimestamp(t0, UTC).replace(tzinfo=None)
        scan = open_any(paths, Filters().with_window(since, None), progress)
    bin_s = bin_seconds(t1 - t0)
    start = math.floor(t0 / bin_s) * bin_s
    nbins = max(1, math.floor(t1 / bin_s) - math.floor(t0 / bin_s) + 1)
    d = scan.dialect
    rows = scan.run(
        f"SELECT lane, {d.bucket(bin_s)} AS b, count(*) AS n, {d.count_if(_SERVED)} AS served, "
        f"{scan.extra} FROM {SRC} WHERE request_id IS NOT NULL AND status <> '{CLIENT_ERROR}' "
        "GROUP BY lane, b"
    ).rows
    known = {lane.name: lane.pool for lane in config.lanes}
    lanes = {name: LaneTraffic(name, pool, [0] * nbins) for name, pool in known.items()}
    events = 0
    for lane, b, n, served in rows:
        events += int(n)
        if lane not in lanes:
            continue
        i = int(((epoch_seconds(b) or 0.0) - start) // bin_s)
        lt = lanes[lane]
        lt.counts[min(max(i, 0), nbins - 1)] += int(n)
        lt.served += int(served)
    shares = {name: min(1.0, sample / lt.served) for name, lt in lanes.items() if lt.served}
    if shares:
        conds = []
        for name, share in shares.items():
            c = f"lane = {sql_str(name)}"
            conds.append(c if share >= 1 else f"({c} AND {d.sample('request_id', share)})")
        cols = (
            "lane, prompt_tokens, completion_tokens, max_tokens, stream, "
            "coalesce(cached_tokens, 0) AS cached, prefix_fingerprint"
        )
        shape_rows = scan.run(
            f"SELECT {cols} FROM {SRC} WHERE {_SERVED} AND ({' OR '.join(conds)})"
        ).rows
        for lane, p, c, m, stream, cached, prefix in shape_rows:
            lanes[lane].shapes.append(
                Shape(
                    int(p), int(c), None if m is None else int(m), bool(stream), int(cached), prefix
                )
            )
    for lt in lanes.values():
        lt.shapes.sort(key=lambda s: (s.prompt_tokens, s.output_tokens, s.stream, s.prefix or ""))
    return Traffic(
        bin_s=float(bin_s),
        span_s=float(nbins * bin_s),
        lanes=lanes,
        events=events,
        sampled=any(share < 1 for share in shares.values()),
        start=datetime.fromtimestamp(start, UTC),
        notes=tuple(scan.report.messages()),
    )


def window_seconds(text: str | None) -> float | None:
    """``--window 7d`` -> seconds (None: the whole recording)."""
    if text is None:
        return None
    from obs.durations import seconds

    try:
        value = seconds(text)
    except ValueError as e:
        raise InputError(f"--window {text!r}: {e}") from e
    if value <= 0:
        raise InputError(f"--window {text!r}: must be positive")
    return value
