"""``summary``: per lane (or pool, model): rates, latency percentiles, SLOs and goodput.

One aggregate query, one pass over the logs. Latency percentiles describe
successful requests (status ``ok``) unless the filters name statuses, in
which case they describe the selected requests. Percentiles are exact,
linearly interpolated between the two nearest ranks (DuckDB
``quantile_cont``, NumPy's default method).
"""

from __future__ import annotations

from typing import Any

from obs.config import Config
from obs.conventions import CLIENT_ERROR, DISCONNECTED, ERROR, OK, REJECTED
from obs.errors import InputError
from obs.query import slo, throughput
from obs.query.dialect import DUCKDB, Dialect
from obs.query.scan import SRC, Source
from obs.query.schema import GROUP_BY, OUTCOME_GROUPS
from obs.query.table import Table

QUANTILES = (0.5, 0.9, 0.95, 0.99)
# Timings summarised, by output name -> event column.
METRICS = {
    "queue": "queue_ms",
    "prefill": "prefill_ms",
    "first_token": "first_token_ms",
    "decode": "decode_ms",
    "stream": "stream_ms",
    "e2e": "e2e_ms",
    "ttft": "ttft_ms",
    "tpot": "tpot_ms",
    "itl": "itl_p50_ms",  # per-request median inter-token gap
}
MEANS = ("queue", "prefill", "first_token", "decode", "stream", "e2e")
# Requests a row stands for: 1, or a summary record's count (``Event.summarized``).
WEIGHT = "coalesce(summarized, 1)"
_RATES = {
    "error_rate": ERROR,
    "rejection_rate": REJECTED,
    "client_error_rate": CLIENT_ERROR,
    "disconnect_rate": DISCONNECTED,
}


def pct_label(q: float) -> str:
    """0.95 -> ``p95``, 0.999 -> ``p99.9``."""
    return "p" + f"{q * 100:g}"


def latency_condition(scan: Source, by: str | None = None) -> str:
    """Rows whose latencies are summarised: ``ok`` ones, unless statuses were filtered
    or the grouping is by outcome (then every request of the group)."""
    if scan.filters.statuses or by in OUTCOME_GROUPS:
        return scan.dialect.true
    return f"status = '{OK}'"


def _is(status: str) -> str:
    return f"status = '{status}'"


def aggregates(
    lat: str, quantiles: tuple[float, ...] = QUANTILES, d: Dialect = DUCKDB
) -> list[str]:
    """Select-list items shared by ``summary``, ``timeline`` and ``compare``.

    They read the SLO flags :func:`obs.query.slo.judged_rows` adds to each row,
    and ask the dialect ``d`` for what the engines spell differently.
    """
    items = [
        f"coalesce({d.agg_if('sum', WEIGHT, 'request_id IS NOT NULL')}, 0) AS requests",
        f"{d.count_if(_is(OK))} AS ok",
        *(
            f"coalesce({d.agg_if('sum', WEIGHT, _is(s))}, 0) AS _n_{name}"
            for name, s in _RATES.items()
        ),
        "count(cache_hit) AS _cache_n",
        f"{d.count_if('cache_hit')} AS _cache_hits",
        "sum(cached_tokens) AS _cached_tokens",
        f"{d.agg_if('sum', 'prompt_tokens', 'cached_tokens IS NOT NULL')} AS _prompt_tokens",
        *(f"{d.quantiles(col, quantiles, lat)} AS _q_{m}" for m, col in METRICS.items()),
        *(f"{d.agg_if('avg', METRICS[m], lat)} AS _mean_{m}" for m in MEANS),
        f"{d.count_if('_ttft_judged')} AS _ttft_judged",
        f"{d.count_if('_ttft_met')} AS _ttft_met",
        f"{d.count_if('_tpot_judged')} AS _tpot_judged",
        f"{d.count_if('_tpot_met')} AS _tpot_met",
        f"{d.count_if(slo.BAD)} AS _bad",
        f"{d.count_if('_good')} AS good",
    ]
    return items


def _ratio(num: Any, den: Any) -> float | None:
    return None if not den or num is None else float(num) / float(den)


def derive(
    rec: dict[str, Any], quantiles: tuple[float, ...] = QUANTILES, means: bool = True
) -> dict[str, Any]:
    """Turn the raw aggregate columns of one group into the published ones."""
    n = rec["requests"]
    out: dict[str, Any] = {"requests": n, "ok": rec["ok"]}
    for name in _RATES:
        out[name] = _ratio(rec[f"_n_{name}"], n)
    out["cache_hit_ratio"] = _ratio(rec["_cache_hits"], rec["_cache_n"])
    out["cached_token_ratio"] = _ratio(rec["_cached_tokens"], rec["_prompt_tokens"])
    out["ttft_attainment"] = _ratio(rec["_ttft_met"], rec["_ttft_judged"])
    out["ttft_judged"] = rec["_ttft_judged"]
    out["tpot_attainment"] = _ratio(rec["_tpot_met"], rec["_tpot_judged"])
    out["tpot_judged"] = rec["_tpot_judged"]
    out["availability"] = None if not n else 1.0 - rec["_bad"] / n
    out["good"] = rec["good"]
    out["goodput_ratio"] = _ratio(rec["good"], n)
    for m in METRICS:
        values = rec[f"_q_{m}"] or [None] * len(quantiles)
        for q, v in zip(quantiles, values, strict=True):
            out[f"{m}_{pct_label(q)}_ms"] = None if v is None else round(float(v), 3)
    if means:
        for m in MEANS:
            v = rec[f"_mean_{m}"]
            out[f"{m}_mean_ms"] = None if v is None else round(float(v), 3)
    return out


def _slo_columns(config: Config, lane: str, row: dict[str, Any]) -> dict[str, Any]:
    """The lane's SLO targets and whether each was met."""
    s = config.lane(lane).slo if lane in config.lane_names else None
    out: dict[str, Any] = {}
    verdicts = []
    for kind in ("ttft", "tpot"):
        target = getattr(s, kind) if s else None
        att = row[f"{kind}_attainment"]
        met = None if target is None or att is None else att >= target.objective
        out[f"{kind}_slo_ms"] = target.threshold_ms if target else None
        out[f"{kind}_objective"] = target.objective if target else None
        out[f"{kind}_judged"] = row[f"{kind}_judged"]
        out[f"{kind}_attainment"] = att
        out[f"{kind}_slo_met"] = met
        verdicts.append(met)
    avail = s.availability if s else None
    av = row["availability"]
    a_met = None if avail is None or av is None else av >= avail.objective
    out["availability_objective"] = avail.objective if avail else None
    out["availability"] = av
    out["availability_slo_met"] = a_met
    verdicts.append(a_met)
    judged = [v for v in verdicts if v is not None]
    out["slo_met"] = all(judged) if judged else None
    return out


def _order(config: Config, by: str, keys: list[Any]) -> list[Any]:
    known = [k for k in config.lane_names if k in keys] if by == "lane" else []
    return known + sorted((k for k in keys if k not in known), key=lambda k: (k is None, str(k)))


def summary(scan: Source, config: Config, by: str = "lane") -> Table:
    """One row per ``by`` value (a field of ``GROUP_BY``) of the scan's events."""
    if by not in GROUP_BY:
        raise InputError(f"--by {by!r}: choose one of {', '.join(GROUP_BY)}")
    # One pass: the token rates' sums and span ride along (they were three passes more).
    listed = [*aggregates(latency_condition(scan, by), QUANTILES, scan.dialect)]
    items = ",\n  ".join([*listed, *throughput.items(scan)])
    source = slo.judged_rows(config, SRC, scan.dialect)
    raw = scan.run(f"SELECT {by} AS _key,\n  {items},\n  {scan.extra}\nFROM {source} GROUP BY _key")
    records = raw.records()
    by_key = {rec["_key"]: rec for rec in records if rec["requests"]}
    tokens = throughput.rates_from(scan, config, by, records)
    rows = []
    for key in _order(config, by, list(by_key)):
        d = derive(by_key[key])
        head = {by: key, "requests": d["requests"], "ok": d["ok"]}
        rates = {k: d[k] for k in (*_RATES, "cache_hit_ratio", "cached_token_ratio")}
        if by == "lane":
            slos = _slo_columns(config, key, d)
        else:
            slos = {
                k: d[k]
                for k in (
                    "ttft_judged",
                    "ttft_attainment",
                    "tpot_judged",
                    "tpot_attainment",
                    "availability",
                )
            }
        good = {"good": d["good"], "goodput_ratio": d["goodput_ratio"]}
        lat = {k: v for k, v in d.items() if k.endswith("_ms")}
        rows.append({**head, **rates, **tokens.get(key, {}), **slos, **good, **lat})
    if not rows:
        return Table([by], [])
    columns = list(dict.fromkeys(k for r in rows for k in r))
    return Table(columns, [tuple(r.get(c) for c in columns) for r in rows])
