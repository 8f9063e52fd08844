"""``compare --around-changes``: each settings change in a log, and the windows either side.

A change is the first event of a pool served under another fingerprint than the last
one seen: ``settings_fingerprint`` per replica (the engine restarted with other
settings, or upgraded) or ``config_fingerprint`` (the sidecar runs another lanes
config). Each change is compared (``obs.query.comparison``) over the window before it
and the window after it, of the same length, as long as the neighbouring changes of
that pool allow.

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
from obs.query.comparison import compare
from obs.query.filters import Filters
from obs.query.scan import Source
from obs.query.table import Table

BUCKET_S = 60
CHANGE_COLUMNS = ["change_at", "pool", "change", "before_from", "after_until"]


@dataclass(frozen=True, slots=True)
class Change:
    """One pool's change of fingerprint, and where its windows end."""

    pool: str
    at: datetime
    what: str  # "replica URL settings OLD -> NEW" or "config OLD -> NEW"


def find_changes(scan: Source) -> list[Change]:
    """Every fingerprint change in ``scan``, by time."""
    scan.materialize(("ts", "pool", "replica", "settings_fingerprint", "config_fingerprint"))
    rows = scan.run(
        "SELECT pool, replica, settings_fingerprint, config_fingerprint, "
        f"{scan.dialect.bucket(BUCKET_S)} AS _b, min(ts) AS _first FROM {scan.source} "
        "WHERE request_id IS NOT NULL GROUP BY pool, replica, settings_fingerprint, "
        "config_fingerprint, _b"
    ).rows
    rows.sort(key=lambda r: r[5])
    changes: list[Change] = []
    settings: dict[tuple[str, str], str] = {}
    configs: dict[str, str] = {}
    for pool, replica, sfp, cfp, _, first in rows:
        if sfp and replica:
            old = settings.setdefault((pool, replica), sfp)
            if old != sfp:
                changes.append(Change(pool, first, f"replica {replica} settings {old} -> {sfp}"))
                settings[(pool, replica)] = sfp
        if cfp:
            old = configs.setdefault(pool, cfp)
            if old != cfp:
                changes.append(Change(pool, first, f"config {old} -> {cfp}"))
                configs[pool] = cfp
    return sorted(changes, key=lambda ch: ch.at)


def pool_span(scan: Source, pool: str) -> tuple[datetime, datetime] | None:
    """The first and last event time of ``pool`` in ``scan``."""
    p = pool.replace("'", "''")
    rows = scan.run(
        f"SELECT min(ts), max(ts) FROM {scan.source} WHERE request_id IS NOT NULL AND pool = '{p}'"
    ).rows
    return (rows[0][0], rows[0][1]) if rows and rows[0][0] is not None else None


def windows(
    changes: list[Change], spans: dict[str, tuple[datetime, datetime]]
) -> list[tuple[Change, datetime, datetime]]:
    """Each change with its before-start and after-end: equal lengths, within its neighbours."""
    out = []
    for i, ch in enumerate(changes):
        same = [c.at for c in changes if c.pool == ch.pool]
        k = same.index(ch.at, sum(1 for c in changes[:i] if c.pool == ch.pool))
        lo = same[k - 1] if k > 0 else spans[ch.pool][0]
        hi = same[k + 1] if k + 1 < len(same) else spans[ch.pool][1] + timedelta(microseconds=1)
        length = min(ch.at - lo, hi - ch.at)
        if length > timedelta(0):
            out.append((ch, ch.at - length, ch.at + length))
    return out


def around_changes(
    scan: Source, open_side: Callable[[Filters], Source], base: Filters, config: Config,
    alpha: float = 0.01,
) -> Table:  # fmt: skip
    """Per change and lane: the comparison of the window before with the window after."""
    changes = find_changes(scan)
    spans = {p: s for p in {c.pool for c in changes} if (s := pool_span(scan, p))}
    columns: list[str] = []
    rows: list[tuple[Any, ...]] = []
    for ch, start, end in windows(changes, spans):
        pool = (ch.pool,)
        before = open_side(replace(base, since=start, until=ch.at, pools=pool))
        after = open_side(replace(base, since=ch.at, until=end, pools=pool))
        table = compare(before, after, config, alpha)
        columns = CHANGE_COLUMNS + table.columns
        rows += [(ch.at, ch.pool, ch.what, start, end, *r) for r in table.rows]
    return Table(columns or CHANGE_COLUMNS, rows)
