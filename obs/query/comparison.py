"""``compare``: two logs, or two windows of one log, side by side per lane.

For each lane and metric: the value before and after, the delta, and whether
the change exceeds the noise:

* rates and ratios (error, rejection, goodput, SLO attainment, cache hits): a pooled
  two-proportion z-test;
* latency percentiles (TTFT, TPOT, e2e): a two-sided Mann-Whitney U test
  on that timing's whole distribution (tie-corrected, normal approximation).
  It asks whether requests after tend to be slower or faster than before; a
  percentile row carries its distribution's p-value, so a shift confined to
  the tail can show in the percentile but not in the test.

``significant`` is ``p_value < alpha`` (default 0.01). With the sample sizes
of request logs even small shifts are significant: read the delta too.
"""

from __future__ import annotations

from typing import Any

from obs.config import Config
from obs.errors import InputError
from obs.query import slo
from obs.query.aggregate import aggregates, derive, latency_condition, pct_label
from obs.query.scan import SRC, Source
from obs.query.stats import mann_whitney, two_proportions
from obs.query.table import Table, human
from obs.query.throughput import RATE_COLUMNS, token_rates

QUANTILES = (0.5, 0.95, 0.99)
DISTRIBUTIONS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2e": "e2e_ms"}
# metric -> (numerator, denominator) raw aggregate columns
PROPORTIONS = {
    "error_rate": ("_n_error_rate", "requests"),
    "rejection_rate": ("_n_rejection_rate", "requests"),
    "goodput_ratio": ("good", "requests"),
    "ttft_attainment": ("_ttft_met", "_ttft_judged"),
    "tpot_attainment": ("_tpot_met", "_tpot_judged"),
    "cache_hit_ratio": ("_cache_hits", "_cache_n"),
}
COLUMNS = [
    "lane",
    "metric",
    "before",
    "after",
    "delta",
    "delta_pct",
    "test",
    "p_value",
    "significant",
]
_NEEDED = (
    "ts",
    "lane",
    "status",
    "summarized",
    "stream",
    "cache_hit",
    "cached_tokens",
    "prompt_tokens",
    "completion_tokens",
    "pool",
    "queue_ms",
    "prefill_ms",
    "first_token_ms",
    "decode_ms",
    "stream_ms",
    "e2e_ms",
    "ttft_ms",
    "tpot_ms",
    "itl_p50_ms",
    "settings_fingerprint",
    "config_fingerprint",
)


def _per_lane(scan: Source, config: Config) -> dict[str, dict[str, Any]]:
    items = ",\n  ".join(aggregates(latency_condition(scan), QUANTILES, scan.dialect))
    source = slo.judged_rows(config, SRC, scan.dialect)
    raw = scan.run(f"SELECT lane AS _key,\n  {items},\n  {scan.extra}\nFROM {source} GROUP BY _key")
    return {r["_key"]: r for r in raw.records() if r["requests"]}


def _rank_tests(before: Source, after: Source, column: str) -> dict[str, Any]:
    def side(scan: Source, n: int) -> str:
        return (
            f"SELECT lane, {n} AS side, {column} AS v FROM {scan.source} "
            f"WHERE request_id IS NOT NULL AND {latency_condition(scan)} AND {column} IS NOT NULL"
        )

    sql = before.dialect.rank_sums(f"{side(before, 0)} UNION ALL {side(after, 1)}")
    rows = before.run(sql).rows
    return {
        lane: mann_whitney(int(n1), int(n2), float(r1 or 0.0), float(ties or 0))
        for lane, n1, n2, r1, ties in rows
    }


def _delta(b: float | None, a: float | None) -> tuple[float | None, float | None]:
    if a is None or b is None:
        return None, None
    d = a - b
    return d, (d / b if b else None)


def compare(before: Source, after: Source, config: Config, alpha: float = 0.01) -> Table:
    """Per lane and metric: before, after, delta, the test used, its p-value and verdict."""
    if before.con is not after.con and before.con != after.con:
        raise InputError("compare: both scans must share one DuckDB connection or server")
    if not 0 < alpha < 1:
        raise InputError(f"--alpha {alpha}: must be between 0 and 1")
    for scan in (before, after):
        scan.materialize(_NEEDED)
    b_raw, a_raw = _per_lane(before, config), _per_lane(after, config)
    b_tok, a_tok = token_rates(before, config, "lane"), token_rates(after, config, "lane")
    tests = {m: _rank_tests(before, after, col) for m, col in DISTRIBUTIONS.items()}
    lanes = [n for n in config.lane_names if n in b_raw or n in a_raw]
    lanes += sorted(k for k in {*b_raw, *a_raw} if k not in lanes and k is not None)
    rows: list[tuple[Any, ...]] = []
    for lane in lanes:
        br, ar = b_raw.get(lane), a_raw.get(lane)
        bd = {**(derive(br, QUANTILES) if br else {"requests": 0}), **b_tok.get(lane, {})}
        ad = {**(derive(ar, QUANTILES) if ar else {"requests": 0}), **a_tok.get(lane, {})}

        checks: list[tuple[str, str | None, float | None]] = [("requests", None, None)]
        checks += [(rate, None, None) for rate in RATE_COLUMNS]  # tokens/s: no test, the rates
        for metric, (num, den) in PROPORTIONS.items():
            p = two_proportions(br[num], br[den], ar[num], ar[den]) if br and ar else None
            checks.append((metric, "two-proportion z" if p is not None else None, p))
        for m in DISTRIBUTIONS:
            mw = tests[m].get(lane)
            for q in QUANTILES:
                test = "mann-whitney" if mw else None
                checks.append((f"{m}_{pct_label(q)}_ms", test, mw.p_value if mw else None))
        for metric, test, p in checks:
            b, a = bd.get(metric), ad.get(metric)
            d, pct = _delta(b, a)
            sig = None if p is None else p < alpha
            rows.append((lane, metric, b, a, d, pct, test, p, sig))
    return Table(list(COLUMNS), rows)


def for_display(table: Table) -> Table:
    """Cells as text for table/markdown output: each value in its metric's unit."""
    rows = []
    for lane, metric, b, a, d, pct, test, p, sig in table.rows:
        delta = human(metric, d)
        if d is not None and d > 0:
            delta = "+" + delta
        rows.append(
            (
                lane,
                metric,
                human(metric, b),
                human(metric, a),
                delta,
                "-" if pct is None else f"{pct * 100:+.1f}%",
                test or "-",
                "-" if p is None else ("<1e-300" if p == 0 else f"{p:.2g}"),
                human("significant", sig),
            )
        )
    return Table(list(table.columns), rows)
