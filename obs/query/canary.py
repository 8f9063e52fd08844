"""``canary``: each canary arm of a split lane against its baseline arm, and a verdict.

The arms are compared with ``obs.query.comparison.compare`` (the same two-proportion and
Mann-Whitney tests as ``query compare``: baseline as "before", canary as "after"), and
the verdict follows the lane's ``canary`` margins (``obs.config.Canary``):

* **roll back** when the canary's p95 TTFT or p95 TPOT is more than its margin worse than
  the baseline's and the test says the shift is beyond noise, or its availability (the
  share of its requests without a server-side error) is below the lane's objective;
* **hold** when an arm has fewer than ``min_requests`` requests, or a p95 is over its
  margin but not significantly (wait for more traffic);
* **promote** otherwise.

One client cannot carry the verdict: each identity (the event's ``identity``, a keyed hash
of what picked the arm) counts for at most ``canary.max_identity_weight`` times its arm's
median requests per identity (default: the median); its oldest requests count, the rest
are left out of the arm's figures (``Capped``). The verdict weighs clients, not requests:
five keys sending eight slow requests each into an arm where a client sends one count as
five slow requests.

The generated canary alert (``obs.alerts.canary_rules``) fires on the same conditions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from obs.config import Config, Lane
from obs.errors import InputError
from obs.query.comparison import compare, for_display
from obs.query.dialect import Dialect
from obs.query.filters import Filters
from obs.query.inputs import Inputs
from obs.query.scan import SRC, ScanReport, Source
from obs.query.table import Table, render, to_json

PROMOTE: Final = "promote"
HOLD: Final = "hold"
ROLL_BACK: Final = "roll back"
# (event timing, metric row of compare, margin field of obs.config.Canary)
LATENCIES: Final = (
    ("TTFT", "ttft_p95_ms", "ttft_p95_margin"),
    ("TPOT", "tpot_p95_ms", "tpot_p95_margin"),
)
COLUMNS: Final = ["lane", "baseline", "canary", "metric", "baseline_value", "canary_value",
                  "delta_pct", "p_value", "significant"]  # fmt: skip


@dataclass(slots=True)
class Verdict:
    """One canary arm's verdict and the facts behind it."""

    lane: str
    baseline: str
    canary: str
    verdict: str
    reasons: list[str] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "lane": self.lane,
            "baseline": self.baseline,
            "canary": self.canary,
            "verdict": self.verdict,
            "reasons": self.reasons,
            "metrics": [dict(zip(COLUMNS, r, strict=True)) for r in self.rows],
        }


def split_lane(config: Config, name: str) -> Lane:
    """The lane ``name``, which must split its traffic; else an InputError that says so."""
    if name not in config.lane_names:
        raise InputError(
            f"--lane {name!r} is not a lane of the config ({', '.join(config.lane_names)})"
        )
    lane = config.lane(name)
    if lane.split is None:
        raise InputError(f"lane {name!r} has no split: give it `split:` arms to compare")
    return lane


def canary(
    open_scan: Callable[[Filters], Source],
    filters: Filters,
    config: Config,
    lane_name: str,
    alpha: float = 0.01,
) -> list[Verdict]:
    """The verdict of each canary arm of ``lane_name`` over the events ``filters`` select."""
    lane = split_lane(config, lane_name)
    weight = lane.canary_policy.max_identity_weight
    base = Capped(open_scan(filters.with_arm(lane.name, lane.pool)), weight)
    out = []
    for arm in lane.canaries:
        other = Capped(open_scan(filters.with_arm(lane.name, arm)), weight)
        table = compare(base, other, config, alpha)
        out.append(judge(lane, arm, _metrics(table, lane.name)))
    return out


class Capped:
    """An arm's events with each identity's requests past ``weight`` times the median
    identity's left out (events without an identity all count; ``weight`` None: none left
    out). A ``Source`` over another one, on either engine: the cap is counted once, with
    the first query, then each identity's oldest requests up to it are kept
    (``Dialect.first_per``)."""

    def __init__(self, inner: Source, weight: float | None) -> None:
        self.inner = inner
        self.weight = weight
        self._source: str | None = None

    @property
    def source(self) -> str:
        if self._source is None:
            self._source = self._capped()
        return self._source

    def cap(self) -> int | None:
        """How many requests one identity counts for (None: no cap, or no identity)."""
        if self.weight is None:
            return None
        median = self.dialect.quantiles("_n", (0.5,), self.dialect.true)
        (row,) = self.inner.run(
            f"SELECT ({median})[1] AS m FROM (SELECT count(*) AS _n FROM {SRC} "
            "WHERE identity IS NOT NULL GROUP BY identity)"
        ).rows
        return None if row[0] is None else max(1, math.ceil(float(row[0]) * self.weight))

    def _capped(self) -> str:
        n = self.cap()
        if n is None:
            return self.inner.source
        order = f"{self.dialect.ts_column}, request_id"
        return self.dialect.first_per(self.inner.source, "identity", order, n)

    def run(self, sql: str) -> Table:
        return self.inner.run(sql.replace(SRC, self.source))

    def materialize(self, columns: list[str] | tuple[str, ...]) -> None:
        self.inner.materialize([*columns, "identity", "ts", "request_id"])

    @property
    def dialect(self) -> Dialect:
        return self.inner.dialect

    @property
    def filters(self) -> Filters:
        return self.inner.filters

    @property
    def inputs(self) -> Inputs:
        return self.inner.inputs

    @property
    def report(self) -> ScanReport:
        return self.inner.report

    @property
    def extra(self) -> str:
        return self.inner.extra

    @property
    def con(self) -> object:
        return self.inner.con


def _metrics(table: Table, lane: str) -> dict[str, tuple[Any, ...]]:
    """compare's rows of ``lane``, by metric: (before, after, delta, pct, test, p, sig)."""
    return {r[1]: tuple(r[2:]) for r in table.rows if r[0] == lane}


def judge(lane: Lane, arm: str, m: dict[str, tuple[Any, ...]]) -> Verdict:
    """The verdict from compare's metrics of the two arms (pure: see the module doc)."""
    policy = lane.canary_policy
    v = Verdict(lane.name, lane.pool, arm, PROMOTE)
    rollback, hold = [], []
    n_base, n_arm = (int(x or 0) for x in m.get("requests", (0, 0))[:2])
    v.rows.append(_row(v, "requests", m.get("requests")))
    if min(n_base, n_arm) < policy.min_requests:
        hold.append(
            f"{n_base} baseline and {n_arm} canary requests: each arm needs "
            f"{policy.min_requests} (canary.min_requests)"
        )
    for title, metric, margin_field in LATENCIES:
        row = m.get(metric)
        v.rows.append(_row(v, metric, row))
        margin = getattr(policy, margin_field)
        pct, p, sig = (row[3], row[5], row[6]) if row else (None, None, None)
        if pct is None or pct <= margin:
            continue
        text = f"p95 {title} {pct * 100:+.0f}% vs the baseline (margin {margin * 100:g}%"
        if sig:
            rollback.append(f"{text}, p={p:.2g})")
        else:
            hold.append(f"{text}, not significant yet: p={'-' if p is None else f'{p:.2g}'})")
    errors = m.get("error_rate")
    v.rows.append(_row(v, "error_rate", errors))
    objective = lane.slo.availability.objective if lane.slo.availability else None
    if objective is not None and errors and errors[1] is not None and n_arm:
        availability = 1 - errors[1]
        if availability < objective:
            rollback.append(
                f"availability {availability * 100:.2f}% is below the lane's objective "
                f"{objective * 100:g}%"
            )
    if rollback:
        v.verdict, v.reasons = ROLL_BACK, rollback + hold
    elif hold:
        v.verdict, v.reasons = HOLD, hold
    else:
        v.reasons = ["within every margin" + ("" if objective is None else " and the objective")]
    return v


def _row(v: Verdict, metric: str, r: tuple[Any, ...] | None) -> tuple[Any, ...]:
    b, a, _, pct, _, p, sig = r if r else (None,) * 7
    return (v.lane, v.baseline, v.canary, metric, b, a, pct, p, sig)


def as_table(verdicts: list[Verdict]) -> Table:
    """Every verdict's metric rows, one table."""
    return Table(list(COLUMNS), [r for v in verdicts for r in v.rows])


def render_verdicts(verdicts: list[Verdict], fmt: str) -> str:
    """The metric rows and, under them, each verdict with its reasons (json: one document)."""
    if fmt == "json":
        return to_json([v.to_dict() for v in verdicts])
    table = as_table(verdicts)
    if fmt in ("table", "markdown"):  # cells as ``query compare`` shows them
        rows = [(r[0], r[3], r[4], r[5], None, r[6], None, r[7], r[8]) for r in table.rows]
        shown = for_display(Table(["lane", "metric", "b", "a", "d", "pct", "t", "p", "s"], rows))
        cells = [
            (*r[:4], *t[2:4], t[5], *t[7:9]) for r, t in zip(table.rows, shown.rows, strict=True)
        ]
        table = Table(table.columns, cells)
    out = render(table, fmt)
    return out if fmt == "csv" else out + "\n" + describe(verdicts)


def describe(verdicts: list[Verdict]) -> str:
    """The verdict lines printed under the table."""
    lines = []
    for v in verdicts:
        lines.append(
            f"lane {v.lane}: canary {v.canary} vs baseline {v.baseline}: {v.verdict.upper()}"
        )
        lines += [f"  - {r}" for r in v.reasons]
    return "\n".join(lines) + "\n"
