"""``budget``: where each lane's error budget went, by phase and cause (``obs.attribution``).

Per lane and SLO over the window: the requests judged, the misses, the budget the window
allowed (``(1 - objective) x judged``) and the share of it spent; that spending split by
phase and cause, the replicas, tenants and models behind the misses, and the worst misses
with the ``vllm-obs query show`` command for each. Apart, not charged: the client's own time
(``slow_upload``: requests whose upload, ``upload_ms``, alone took longer than the lane's TTFT
threshold; the server's clock starts after it, so no gate judges it).

Judged, as the alert rules judge (``obs.alerts``): TTFT and TPOT as ``obs.query.slo`` does;
availability over every request but refused and abandoned ones. A miss's phase and cause is
one answer (``causes``): the one the sidecar stamped on the event for its first missed gate
(``miss_slo``, ``miss_phase``, ``miss_cause``: what ``show`` prints, what the burn-rate
alerts' ``top_cause`` counts and ``incident`` tells); a gate the event carries no stamp for
(a second missed gate, a log written before the fields, a lane the sidecar did not judge) is
attributed by ``obs.attribution``'s rule against the window's exact baseline: the mean of
each phase over the lane's good requests in the window. Two queries, on DuckDB and
ClickHouse alike: one aggregate for the baselines and counts, one that reads back only the
misses; the attribution runs here, once per miss.
"""

from __future__ import annotations

import shlex
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from obs.attribution import Baseline, Facts, Miss, attribute
from obs.config import Config, Lane
from obs.conventions import AVAILABILITY_EXCLUDED_OUTCOMES, MISS_CAUSES, PHASES, SLO_KINDS
from obs.durations import parse_duration
from obs.errors import InputError
from obs.query import slo
from obs.query.filters import Filters, sql_str
from obs.query.scan import SRC, Source
from obs.query.table import Table, informative, to_json
from obs.query.table import render as render_table
from obs.query.terminal import wrap

TOP = 5  # replicas, tenants, models listed per lane and SLO
WORST = 5  # worst misses listed per lane and SLO
DIMENSIONS = ("replica", "tenant", "model")
_FACT_COLUMNS = (
    "lane", "status", "stream", "e2e_ms", *(f"{p}_ms" for p in PHASES), "ttft_ms", "tpot_ms",
    "error_class", "error_phase", "rejection_reason", "prompt_tokens", "cache_hit",
    "engine_queue_ms", "stream_blocked_ms", "engine_view", "engine_prefill_ms", "pool_in_flight",
    "pool_max_running",
    "pool_waiting", "pool_kv_usage", "pool_preempting", "pool_ahead_prompt_tokens",
    "pool_prompt_tokens_during", "pool_requests_during", "engine_decode_ms", "completion_tokens",
    "cached_tokens",
)  # fmt: skip
# The client's own time, judged by no gate (the server's clock starts after it), shown apart
# as a client cause: uploads that alone took longer than the lane's TTFT threshold.
SLOW_UPLOAD = "slow_upload"
STAMP = ("miss_slo", "miss_phase", "miss_cause")  # the sidecar's attribution of the first gate
COLUMNS = ("request_id", "ts", *DIMENSIONS, *_FACT_COLUMNS, "upload_ms", *STAMP)


@dataclass(slots=True)
class Spend:
    """One lane's SLO over the window: its budget and what spent it."""

    lane: str
    slo: str
    objective: float
    judged: int
    threshold_ms: float | None
    misses: list[tuple[Miss, dict[str, Any]]] = field(default_factory=list)
    slow_uploads: int = 0  # TTFT: requests whose upload alone passed the threshold (not charged)

    @property
    def allowed(self) -> float:
        """Misses the window's budget allows: (1 - objective) x judged."""
        return round(1 - self.objective, 12) * self.judged

    def spent(self, n: int) -> float | None:
        """The share of the window's budget ``n`` misses spend (1.0: all of it)."""
        return None if not self.allowed else n / self.allowed


def window_filters(scan: Source, window: str | None) -> Filters:
    """The scan's filters narrowed to the ``window`` that ends with its newest event."""
    f = scan.filters
    if window is None:
        return f
    try:
        length = parse_duration(window)
    except (ValueError, InputError) as e:
        raise InputError(f"--window {window}: {e}") from e
    end = f.until
    if end is None:
        col = scan.dialect.ts_column
        (newest,) = scan.run(f"SELECT max({col}) FROM {SRC} WHERE request_id IS NOT NULL").rows[0]
        if newest is None:
            return f
        end = as_utc(newest) + timedelta(milliseconds=1)
    since = end - length
    return f.with_window(max(since, f.since) if f.since else since, end)


def as_utc(t: datetime | int) -> datetime:
    """A time column as naive UTC: DuckDB's timestamp, or ClickHouse's epoch milliseconds."""
    if isinstance(t, datetime):
        return t
    return datetime.fromtimestamp(t / 1000, UTC).replace(tzinfo=None)


def _lane_in(config: Config) -> str:
    names = [lane.name for lane in config.lanes if any(getattr(lane.slo, k) for k in SLO_KINDS)]
    return "lane IN (" + ", ".join(sql_str(n) for n in names) + ")" if names else "1 = 0"


def _baselines(scan: Source, config: Config) -> tuple[dict[str, Baseline], dict[str, dict]]:
    d = scan.dialect
    good = "_good"
    counted = "status NOT IN (" + ", ".join(map(sql_str, AVAILABILITY_EXCLUDED_OUTCOMES)) + ")"
    hit = "CASE WHEN cache_hit THEN 1.0 ELSE 0.0 END"
    ahead = f"{good} AND pool_in_flight > 0 AND pool_ahead_prompt_tokens IS NOT NULL"
    joined = f"{good} AND engine_view = 'joined'"
    computed = "(prompt_tokens - coalesce(cached_tokens, 0))"  # prefilled, not from the cache
    prefill = f"{joined} AND engine_prefill_ms IS NOT NULL AND {computed} > 0"
    decode = f"{joined} AND engine_decode_ms IS NOT NULL AND completion_tokens > 1"
    paces = (f"engine_prefill_ms / {computed}", "engine_decode_ms / (completion_tokens - 1)")
    items = [
        *(f"{d.agg_if('avg', f'{p}_ms', good)} AS _b_{p}" for p in PHASES),
        f"{d.agg_if('avg', 'prompt_tokens', good)} AS _b_prompt",
        f"{d.agg_if('avg', hit, f'{good} AND cache_hit IS NOT NULL')} AS _b_hit",
        f"{d.agg_if('avg', 'coalesce(engine_queue_ms, 0.0)', good)} AS _b_engine_queue",
        f"{d.agg_if('avg', 'pool_ahead_prompt_tokens / pool_in_flight', ahead)} AS _b_ahead",
        f"{d.agg_if('avg', 'pool_in_flight', good)} AS _b_in_flight",
        f"{d.agg_if('avg', paces[0], prefill)} AS _b_prefill_pace",
        f"{d.agg_if('avg', paces[1], decode)} AS _b_decode_pace",
        f"{d.count_if('_ttft_judged')} AS _n_ttft",
        f"{d.count_if('_tpot_judged')} AS _n_tpot",
        f"{d.count_if(f'request_id IS NOT NULL AND {counted}')} AS _n_availability",
        f"{d.count_if('_ttft_thr IS NOT NULL AND upload_ms > _ttft_thr')} AS _n_{SLOW_UPLOAD}",
    ]
    source = slo.judged_rows(config, SRC, d)
    raw = scan.run(
        f"SELECT lane AS _lane, {', '.join(items)}, {scan.extra} FROM {source} "
        f"WHERE {_lane_in(config)} GROUP BY _lane"
    )
    bases, counts = {}, {}
    for rec in raw.records():

        def f(k: str, rec: dict[str, Any] = rec) -> float | None:
            v = rec[k]
            return None if v is None else float(v)

        bases[rec["_lane"]] = Baseline(
            tuple(f(f"_b_{p}") or 0.0 for p in PHASES),
            f("_b_prompt"), f("_b_hit"), f("_b_engine_queue"), f("_b_ahead"),
            f("_b_in_flight"), f("_b_prefill_pace"), f("_b_decode_pace"),
        )  # fmt: skip
        counts[rec["_lane"]] = {k: int(rec[f"_n_{k}"] or 0) for k in (*SLO_KINDS, SLOW_UPLOAD)}
    return bases, counts


def causes(row: dict[str, Any], lane: Lane | None, base: Baseline) -> tuple[Miss, ...]:
    """Each gate of ``lane`` the event ``row`` missed, with the phase and cause it is charged
    to: the sidecar's stamp for the gate it stamped (``miss_slo``'s first, else the first
    gate missed; a known cause and phase only), ``obs.attribution``'s rule against ``base``
    for any other. The one answer ``budget``, ``incident`` and ``report`` give, and the one
    ``show`` prints and the burn-rate alerts count."""
    out = attribute(Facts.of_row(row), lane, base)
    cause, phase = row.get("miss_cause"), row.get("miss_phase")
    if not out or cause not in MISS_CAUSES:
        return out
    gate = str(row.get("miss_slo") or out[0].slo).split(",")[0]
    return tuple(
        Miss(m.slo, phase if phase in PHASES else m.phase, cause) if m.slo == gate else m
        for m in out
    )


def _missed_rows(scan: Source, config: Config) -> list[dict[str, Any]]:
    cond = f"(_ttft_judged AND NOT _ttft_met) OR (_tpot_judged AND NOT _tpot_met) OR {slo.BAD}"
    source = slo.judged_rows(config, SRC, scan.dialect)
    return scan.run(
        f"SELECT {', '.join(COLUMNS)}, {scan.dialect.ts_column} AS _t FROM {source} "
        "WHERE request_id IS NOT NULL "
        f"AND {_lane_in(config)} AND ({cond})"
    ).records()


def spending(scan: Source, config: Config) -> list[Spend]:
    """Per lane (config order) and SLO (``SLO_KINDS`` order): its budget and its misses."""
    scan.materialize(COLUMNS)
    bases, counts = _baselines(scan, config)
    out: dict[tuple[str, str], Spend] = {}
    for lane in config.lanes:
        if lane.name not in counts:
            continue
        for kind in SLO_KINDS:
            target = getattr(lane.slo, kind)
            if target is not None:
                thr = getattr(target, "threshold_ms", None)
                judged = counts[lane.name][kind]
                spend = Spend(lane.name, kind, target.objective, judged, thr)
                if kind == "ttft":
                    spend.slow_uploads = counts[lane.name][SLOW_UPLOAD]
                out[(lane.name, kind)] = spend
    for row in _missed_rows(scan, config):
        lane = row["lane"]
        for m in causes(row, config.lane(lane), bases.get(lane, Baseline())):
            out[(lane, m.slo)].misses.append((m, row))
    return list(out.values())


def _value(s: Spend, row: dict[str, Any]) -> float:
    """How far over its gate a miss went (ms); a failure ranks by its end-to-end time."""
    if s.slo == "availability" or s.threshold_ms is None:
        return float(row["e2e_ms"] or 0.0)
    v = Facts.of_row(row).ttft_value if s.slo == "ttft" else row["tpot_ms"]
    return float(v or 0.0) - s.threshold_ms


def _ranked(c: Counter[Any]) -> list[tuple[Any, int]]:
    """Most first; ties in key order (the same on every engine, whatever its row order)."""
    return sorted(c.items(), key=lambda kv: (-kv[1], str(kv[0])))


def show_command(request_id: str, paths: list[str]) -> str:
    """The command that shows one request's event and waterfall."""
    return shlex.join(["vllm-obs", "query", "show", request_id, *paths])


def budget(scan: Source, config: Config, paths: list[str]) -> dict[str, Any]:
    """The whole answer as plain data (the ``--format json`` document)."""
    f = scan.filters
    out: dict[str, Any] = {
        "since": f.since.isoformat() if f.since else None,
        "until": f.until.isoformat() if f.until else None,
        "slos": [],
    }
    for s in spending(scan, config):
        n = len(s.misses)
        by = Counter((m.phase, m.cause) for m, _ in s.misses)
        entry: dict[str, Any] = {
            "lane": s.lane, "slo": s.slo, "objective": s.objective, "judged": s.judged,
            "misses": n, "allowed": round(s.allowed, 6), "budget_spent": s.spent(n),
        }  # fmt: skip
        if s.slo == "ttft":  # the client's time: no gate judges it, no budget pays for it
            entry["not_charged"] = [{"cause": SLOW_UPLOAD, "requests": s.slow_uploads}]
        for name, key in (("by_phase", 0), ("by_cause", 1)):
            c: Counter[str] = Counter()
            for pc, k in by.items():
                c[pc[key]] += k
            entry[name] = [
                {name[3:]: v, "misses": k, "budget_spent": s.spent(k)} for v, k in _ranked(c)
            ]
        entry["by_phase_cause"] = [
            {"phase": p, "cause": c_, "misses": k, "budget_spent": s.spent(k)}
            for (p, c_), k in _ranked(by)
        ]
        for dim in DIMENSIONS:
            c = Counter(str(row[dim]) if row[dim] is not None else "-" for _, row in s.misses)
            entry[f"top_{dim}s"] = [
                {dim: v, "misses": k, "share": k / n} for v, k in _ranked(c)[:TOP]
            ]
        worst = sorted(s.misses, key=lambda mr: (-_value(s, mr[1]), mr[1]["request_id"]))[:WORST]
        entry["worst"] = [
            {
                "request_id": row["request_id"],
                "ts": as_utc(row["_t"]).isoformat(timespec="milliseconds"),
                "phase": m.phase,
                "cause": m.cause,
                "over_ms" if s.slo != "availability" else "e2e_ms": round(_value(s, row), 3),
                "show": show_command(row["request_id"], paths),
            }
            for m, row in worst
        ]
        out["slos"].append(entry)
    return out


def tables(doc: dict[str, Any]) -> dict[str, Table]:
    """The ``budget`` document as titled tables, for the terminal and the HTML report."""
    spent, split, who, worst, client = [], [], [], [], []
    for e in doc["slos"]:
        lane, kind = e["lane"], e["slo"]
        top = e["by_phase_cause"][0] if e["by_phase_cause"] else {"phase": None, "cause": None}
        spent.append(
            (lane, kind, e["objective"], e["judged"], e["misses"], e["allowed"],
             e["budget_spent"], top["phase"], top["cause"])
        )  # fmt: skip
        split += [
            (lane, kind, r["phase"], r["cause"], r["misses"], r["budget_spent"])
            for r in e["by_phase_cause"]
        ]
        client += [(lane, kind, r["cause"], r["requests"]) for r in e.get("not_charged", ())]
        for dim in DIMENSIONS:
            who += [(lane, kind, dim, r[dim], r["misses"], r["share"]) for r in e[f"top_{dim}s"]]
        worst += [
            (lane, kind, r["request_id"], r["phase"], r["cause"],
             r.get("over_ms", r.get("e2e_ms")), r["show"])
            for r in e["worst"]
        ]  # fmt: skip
    return {
        "Error budget spent per lane and SLO": Table(
            [
                "lane",
                "slo",
                "objective",
                "judged",
                "misses",
                "allowed",
                "budget_share",
                "top_phase",
                "top_cause",
            ],
            spent,
        ),
        "Budget spent by phase and cause": Table(
            ["lane", "slo", "phase", "cause", "misses", "budget_share"], split
        ),
        "Behind the misses: top replicas, tenants, models": Table(
            ["lane", "slo", "dimension", "value", "misses", "miss_share"], who
        ),
        "Worst misses (over_ms: past the threshold; failures: e2e_ms)": Table(
            ["lane", "slo", "request_id", "phase", "cause", "ms", "show"], worst
        ),
        "The client's time, not charged (uploads longer than the TTFT threshold)": Table(
            ["lane", "slo", "cause", "requests"], client
        ),
    }


SPENT, WHO = (
    "Error budget spent per lane and SLO",
    "Behind the misses: top replicas, tenants, models",
)


def render(doc: dict[str, Any], fmt: str) -> str:
    """The document as JSON, or its tables (table or markdown), each under its title. In
    words, an SLO without a miss is one line under the first table, not a row of zeros; a
    row of an unknown tenant or model is left out, and so is a table that then says
    nothing (no row, one value, only zeros)."""
    if fmt == "json":
        return to_json(doc)
    parts = []
    for title, table in tables(doc).items():
        note = ""
        if title == SPENT:
            missed = Table(table.columns, [r for r in table.rows if r[4]])
            clean = [f"{r[0]} {r[1]}" for r in table.rows if not r[4]]
            note = f"No misses: {', '.join(clean)}.\n" if clean else ""
            table = missed
        elif title == WHO:
            table = Table(table.columns, [r for r in table.rows if r[3] not in (None, "", "-")])
        if not informative(table):
            if note:
                parts.append(f"{title}\n\n{wrap(note)}")
            continue
        parts.append(f"{title}\n\n{render_table(table, fmt)}{wrap(note)}")
    return "\n".join(parts) or "No SLO judged any request.\n"
