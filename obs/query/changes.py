"""``compare --around-changes``: each settings change in a log, and the windows either side.

A change is the first event of a pool served under another fingerprint than the last
one seen: ``settings_fingerprint`` per replica (the engine restarted with other
settings, or upgraded) or ``config_fingerprint`` (the sidecar runs another lanes
config). Each change is compared (``obs.query.comparison``) over the window before it
and the window after it, of the same length, as long as the neighbouring changes of
that pool allow.

Each change and lane gets the canary verdict (``obs.query.canary.judge``, the lane's
``canary`` margins: p95 TTFT/TPOT more than the margin worse and beyond noise, or
availability under the objective: roll back; too few requests or not significant yet:
hold; else promote), the window before standing for the baseline arm and the window after
for the canary.

Fingerprint runs are found from one grouped query (per pool, replica, fingerprints and
minute), so a log of any size comes back as a few rows per minute; two flips inside
one minute of one replica read as none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from obs.config import Config
from obs.query.canary import Verdict, judge
from obs.query.comparison import compare
from obs.query.filters import Filters, sql_str
from obs.query.scan import Source
from obs.query.table import Table

BUCKET_S = 60
CHANGE_COLUMNS = [
    "change_at", "pool", "change", "before_from", "before_until", "after_until", "verdict",
]  # fmt: skip
BEFORE, AFTER = "before", "after"  # the verdict's baseline and canary
EDGE = timedelta(milliseconds=1)  # a window's end is exclusive: one tick past its last event


@dataclass(frozen=True, slots=True)
class Change:
    """One pool's change of fingerprint: its first event under the new one, and the last
    event under the old one (the time between, a restart, belongs to neither window)."""

    pool: str
    at: datetime
    what: str  # "replica URL settings OLD -> NEW" or "config OLD -> NEW"
    last_before: datetime | None = None
    replica: str | None = None  # a settings change's replica (None: a config change)
    old: str = ""  # the fingerprints
    new: str = ""


def find_changes(scan: Source) -> list[Change]:
    """Every fingerprint change in ``scan``, by time."""
    scan.materialize(("ts", "pool", "replica", "settings_fingerprint", "config_fingerprint"))
    # The first event of each run at the source's full precision (ClickHouse: ts_ms).
    rows = scan.run(
        "SELECT pool, replica, settings_fingerprint, config_fingerprint, "
        f"{scan.dialect.bucket(BUCKET_S)} AS _b, min({scan.dialect.ts_column}) AS ts "
        f"FROM {scan.source} WHERE request_id IS NOT NULL GROUP BY pool, replica, "
        "settings_fingerprint, config_fingerprint, _b"
    ).rows
    rows.sort(key=lambda r: r[5])
    changes: list[Change] = []
    settings: dict[tuple[str, str], str] = {}
    configs: dict[str, str] = {}
    for pool, replica, sfp, cfp, _, first in rows:
        if sfp and replica:
            old = settings.setdefault((pool, replica), sfp)
            if old != sfp:
                what = f"replica {replica} settings {old} -> {sfp}"
                last = _last(scan, first, pool, replica)
                changes.append(Change(pool, first, what, last, replica, old, sfp))
                settings[(pool, replica)] = sfp
        if cfp:
            old = configs.setdefault(pool, cfp)
            if old != cfp:
                changes.append(
                    Change(pool, first, f"config {old} -> {cfp}", _last(scan, first, pool))
                )
                configs[pool] = cfp
    return sorted(changes, key=lambda ch: ch.at)


def _last(scan: Source, before: datetime, pool: str, replica: str | None = None) -> datetime:
    """The time of the pool's (or replica's) last event before ``before``."""
    ts = scan.dialect.ts_column
    where = f"pool = {sql_str(pool)}" + (f" AND replica = {sql_str(replica)}" if replica else "")
    rows = scan.run(
        f"SELECT max({ts}) AS ts FROM {scan.source} WHERE request_id IS NOT NULL AND {where} "
        f"AND {ts} < {scan.dialect.ts_literal(before)}"
    ).rows
    return rows[0][0] if rows and rows[0][0] is not None else before


def pool_span(scan: Source, pool: str) -> tuple[datetime, datetime] | None:
    """The first and last event time of ``pool`` in ``scan``, as datetimes on either source:
    the alias ``ts`` is what makes ClickHouse's epoch milliseconds (``ts_ms``) read back as
    one (``ClickHouseScan``'s conversion of an Int64 ``ts``)."""
    ends = [
        scan.run(
            f"SELECT {fn}({scan.dialect.ts_column}) AS ts FROM {scan.source} "
            f"WHERE request_id IS NOT NULL AND pool = {sql_str(pool)}"
        ).rows
        for fn in ("min", "max")
    ]
    first, last = ends[0][0][0], ends[1][0][0]
    return (first, last) if first is not None and last is not None else None


def windows(
    changes: list[Change], spans: dict[str, tuple[datetime, datetime]]
) -> list[tuple[Change, datetime, datetime, datetime]]:
    """Each change with its before window ``[from, until)`` and the after window's end (it
    starts at the change): equal lengths, within the pool's neighbouring changes."""
    out = []
    for i, ch in enumerate(changes):
        same = [c.at for c in changes if c.pool == ch.pool]
        k = same.index(ch.at, sum(1 for c in changes[:i] if c.pool == ch.pool))
        lo = same[k - 1] if k > 0 else spans[ch.pool][0]
        hi = same[k + 1] if k + 1 < len(same) else spans[ch.pool][1] + EDGE
        until = min(max(ch.last_before or ch.at, lo) + EDGE, ch.at)
        length = min(until - lo, hi - ch.at)
        if length > timedelta(0):
            out.append((ch, until - length, until, ch.at + length))
    return out


def around_changes(
    scan: Source, open_side: Callable[[Filters], Source], base: Filters, config: Config,
    alpha: float = 0.01, describe: Callable[[list[Change]], list[Change]] | None = None,
) -> Table:  # fmt: skip
    """Per change and lane: the comparison of the window before with the window after.

    ``describe`` may say what each change's fingerprints stand for (``obs.query.settings_names``).
    """
    changes = find_changes(scan)
    if describe is not None:
        changes = describe(changes)
    spans = {p: s for p in {c.pool for c in changes} if (s := pool_span(scan, p))}
    columns: list[str] = []
    rows: list[tuple[Any, ...]] = []
    for ch, start, until, end in windows(changes, spans):
        pool = (ch.pool,)
        before = open_side(replace(base, since=start, until=until, pools=pool))
        after = open_side(replace(base, since=ch.at, until=end, pools=pool))
        table = compare(before, after, config, alpha)
        columns = CHANGE_COLUMNS + table.columns
        verdicts = {v.lane: v.verdict for v in judge_table(table, config)}
        rows += [
            (ch.at, ch.pool, ch.what, start, until, end, verdicts.get(r[0]), *r) for r in table.rows
        ]
    return Table(columns or CHANGE_COLUMNS, rows)


def judge_table(table: Table, config: Config) -> list[Verdict]:
    """The canary verdict of each configured lane of one ``compare`` table (before as the
    baseline, after as the canary)."""
    out = []
    for lane in config.lanes:
        metrics = {r[1]: tuple(r[2:]) for r in table.rows if r[0] == lane.name}
        if metrics:
            v = judge(lane, AFTER, metrics)
            v.baseline = BEFORE
            out.append(v)
    return out


def verdicts(table: Table, config: Config) -> list[tuple[str, Verdict]]:
    """Each change's verdict per lane, from ``around_changes``'s table: (change, verdict)."""
    n = len(CHANGE_COLUMNS)
    groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for r in table.rows:
        groups.setdefault(tuple(r[:3]), []).append(r[n:])
    out = []
    for (at, pool, what), rows in groups.items():
        label = f"{at:%Y-%m-%d %H:%M:%S} pool {pool}: {what}"
        out += [(label, v) for v in judge_table(Table(table.columns[n:], rows), config)]
    return out


def describe_verdicts(found: list[tuple[str, Verdict]]) -> str:
    """The verdict lines printed under the table: per change and lane, with the reasons."""
    lines = []
    for change, v in found:
        lines.append(f"{change}: lane {v.lane}: {v.verdict.upper()}")
        lines += [f"  - {r}" for r in v.reasons]
    return "\n".join(lines) + "\n" if lines else ""
