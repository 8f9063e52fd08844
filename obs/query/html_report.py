"""``report``: one self-contained HTML file with tables and plots, plus the PNGs.

It opens with what happened: each incident of ``vllm-obs query incident`` (trigger, victims
ranked by harm, mechanism, what was fine, lever) and, for the first, every request's TTFT
zoomed to its window; then the summary, the figures, the whole draft and the budget.

``OUT/report.html`` embeds every figure as a base64 PNG (it opens anywhere,
offline, and can be attached to an incident ticket); the same figures are
written beside it as ``OUT/*.png``.
"""

from __future__ import annotations

import base64
import html
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from obs.config import Config
from obs.query import plots
from obs.query.aggregate import METRICS, latency_condition, summary
from obs.query.error_budget import COLUMNS as BUDGET_COLUMNS
from obs.query.error_budget import budget, tables
from obs.query.incident import MAX_TOLD, draft, harm_done, words
from obs.query.incident import NEEDED as INCIDENT_COLUMNS
from obs.query.intervals import timeline
from obs.query.requests import SLOWEST_COLUMNS, slowest
from obs.query.scan import SRC, Source
from obs.query.schema import PHASE_COLUMNS
from obs.query.table import Table, human

GRID = [i / 100 for i in range(1, 100)] + [0.995, 0.999]
SUMMARY_COLUMNS = (
    "requests",
    "error_rate",
    "rejection_rate",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_p99_ms",
    "tpot_p95_ms",
    "itl_p95_ms",
    "e2e_p95_ms",
    "cache_hit_ratio",
    "ttft_attainment",
    "tpot_attainment",
    "availability",
    "goodput_ratio",
    "slo_met",
)
SLOW_COLUMNS = (
    "request_id",
    "ts",
    "lane",
    "status",
    "stream",
    "e2e_ms",
    "ttft_ms",
    *PHASE_COLUMNS,
    "completion_tokens",
)
_NEEDED = (
    *SLOWEST_COLUMNS,
    *METRICS.values(),
    "cache_hit",
    "cached_tokens",
    "schema_version",
    "summarized",
    *BUDGET_COLUMNS,
    *INCIDENT_COLUMNS,
)
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1200px;
color:#222;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em}
h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #ddd}
.meta{color:#555;font-size:.9em}
.warn{background:#fff4e5;border-left:4px solid #f0a030;padding:.5em 1em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0} th,td{padding:.25em .6em;
border-bottom:1px solid #e5e5e5;text-align:right} th:first-child,td:first-child{text-align:left}
th{background:#f6f6f6} td.no{color:#b00020;font-weight:600} td.yes{color:#1b7f3b}
img{max-width:100%;border:1px solid #eee;margin:.5em 0} .note{color:#555;font-size:.85em}
.wide{overflow-x:auto} td{white-space:nowrap}
pre{white-space:pre-wrap;overflow-wrap:anywhere} .story td{white-space:normal}
.story p{margin:.3em 0}
"""
ZOOM_PAD = timedelta(seconds=30)  # shown either side of the incident's window


def _distribution(
    scan: Source, column: str, lanes: list[str]
) -> dict[str, tuple[list[float], list[float]]]:
    """Per lane, the timing's quantiles on a fine grid: the points of its CDF."""
    qs = scan.dialect.quantiles(column, tuple(GRID), latency_condition(scan))
    rows = scan.run(
        f"SELECT lane AS _lane, {qs} AS _qs FROM {SRC} WHERE request_id IS NOT NULL GROUP BY _lane"
    ).rows
    found = {lane: (list(qs), GRID) for lane, qs in rows if lane is not None and qs}
    return {lane: found[lane] for lane in lanes if lane in found}


def _html_table(table: Table, columns: tuple[str, ...] | list[str] | None = None) -> str:
    cols = list(columns or table.columns)
    cols = [c for c in cols if c in table.columns]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = []
    for rec in table.records():
        cells = []
        for c in cols:
            v = rec[c]
            cls = f' class="{"yes" if v else "no"}"' if c.endswith("_met") and v is not None else ""
            cells.append(f"<td{cls}>{html.escape(human(c, v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<div class="wide"><table><tr>{head}</tr>{"".join(body)}</table></div>'


def _transposed_html(table: Table, columns: tuple[str, ...]) -> str:
    keys = [str(r[0]) for r in table.rows]
    head = "<th>metric</th>" + "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    body = []
    for c in columns:
        if c not in table.columns:
            continue
        i = table.index(c)
        tds = []
        for r in table.rows:
            v = r[i]
            cls = f' class="{"yes" if v else "no"}"' if c.endswith("_met") and v is not None else ""
            tds.append(f"<td{cls}>{html.escape(human(c, v))}</td>")
        body.append(f"<tr><td>{html.escape(c)}</td>{''.join(tds)}</tr>")
    return f'<div class="wide"><table><tr>{head}</tr>{"".join(body)}</table></div>'


def _figures(scan: Source, config: Config, summ: Table) -> dict[str, tuple[str, bytes]]:
    lanes = [str(v) for v in summ.values("lane")]
    palette = plots.colors(lanes)
    recs = {r["lane"]: r for r in summ.records()}
    ttft_thr = {n: r["ttft_slo_ms"] for n, r in recs.items() if r.get("ttft_slo_ms")}
    figs: dict[str, tuple[str, bytes]] = {}
    figs["ttft"] = (
        "TTFT distribution per lane",
        plots.ecdf(
            "TTFT per lane", "TTFT (ms)", _distribution(scan, "ttft_ms", lanes), ttft_thr, palette
        ),
    )
    figs["itl"] = (
        "Inter-token latency per lane (each request's median gap)",
        plots.ecdf(
            "ITL per lane (per-request median gap)",
            "ITL (ms)",
            _distribution(scan, "itl_p50_ms", lanes),
            {},
            palette,
        ),
    )
    means = {
        lane: {
            p.removesuffix("_ms"): recs[lane][p.replace("_ms", "_mean_ms")] for p in PHASE_COLUMNS
        }
        for lane in lanes
    }
    for lane, engine in _engine_queue_means(scan).items():
        if lane in means and means[lane]["queue"] is not None:
            # The engine's wait is in the queue phase (joined or inferred): drawn apart.
            means[lane]["engine_queue"] = min(engine, means[lane]["queue"])
            means[lane]["queue"] -= means[lane]["engine_queue"]
    figs["phases"] = ("Phase breakdown per lane", plots.phases(means))
    overall = timeline(scan, config)
    by_lane = timeline(scan, config, interval=f"{_interval_of(overall)}s", by="lane")
    starts = overall.values("start")
    series: dict[str, dict[str, list[Any]]] = {}
    for rec in by_lane.records():
        s = series.setdefault(str(rec["lane"]), {"rps": [], "ttft": []})
        s["rps"].append(rec["rps"])
        s["ttft"].append(rec["ttft_p95_ms"])
    figs["timeline"] = (
        "Timeline",
        plots.timeline(
            starts,
            {k: v["rps"] for k, v in series.items() if k in palette},
            overall.values("error_rate"),
            overall.values("rejection_rate"),
            {k: v["ttft"] for k, v in series.items() if k in palette},
            ttft_thr,
            palette,
        ),
    )
    kinds = {"ttft": "ttft_attainment", "tpot": "tpot_attainment", "availability": "availability"}
    objectives = {
        "ttft": [recs[n].get("ttft_objective") for n in lanes],
        "tpot": [recs[n].get("tpot_objective") for n in lanes],
        "availability": [recs[n].get("availability_objective") for n in lanes],
    }
    values: dict[str, list[float | None]] = {
        k: [recs[n].get(col) for n in lanes] for k, col in kinds.items()
    }
    values["goodput"] = [recs[n].get("goodput_ratio") for n in lanes]
    figs["slo"] = ("SLO attainment", plots.attainment(lanes, values, objectives))
    return figs


def _engine_queue_means(scan: Source) -> dict[str, float]:
    """Per lane, the mean engine wait of its successful requests (0 where none was seen), the
    population of the phase means."""
    rows = scan.run(
        f"SELECT lane, avg(coalesce(engine_queue_ms, 0)) AS q FROM {SRC} "
        "WHERE request_id IS NOT NULL AND status = 'ok' GROUP BY lane"
    ).rows
    return {str(lane): float(q or 0.0) for lane, q in rows}


def _incident_section(doc: dict[str, Any]) -> str:
    """The postmortem's first draft (``vllm-obs query incident``) over the report's window."""
    return f"<h2>Incident draft</h2><pre>{html.escape(words(doc))}</pre>"


def _story_section(doc: dict[str, Any], zoom: bytes | None) -> str:
    """What happened, first: each incident's trigger, victims, mechanism and lever."""
    parts = ['<h2>What happened</h2><div class="story">']
    if not doc["incidents"]:
        parts.append("<p>No lane missed an SLO in the window.</p>")
    shown = sorted(doc["incidents"], key=harm_done, reverse=True)[:MAX_TOLD]
    for inc in (i for i in doc["incidents"] if i in shown):  # the most harmful, in time order
        t = inc["trigger"]
        who = f"lane <b>{html.escape(str(t['lane']))}</b>"
        if t.get("tenant"):
            who += f" (tenant {html.escape(t['tenant'])})"
        when = f"from {inc['start']} to {inc['end']}" if inc["start"] != inc["end"] else ""
        parts.append(
            f"<p><b>Pool {html.escape(inc['pool'])}</b>, {html.escape(when)} UTC. Trigger: "
            f"{who} sent {t['requests']} requests ({t['prompt_tokens']} prompt tokens)"
            + (f", {t['missed']} of them missed" if t.get("missed") else "")
            + ".</p>"
        )
        rows = "".join(
            f"<tr><td>{html.escape(v['lane'])}</td><td>{v['missed']}</td><td>{v['requests']}"
            f"</td><td>{v['trigger_share']:.0%}</td><td>{'yes' if v['small'] else ''}</td></tr>"
            for v in inc["victims"]
        )
        if not rows:
            parts.append(f"<p>No other lane missed: {html.escape(str(t['lane']))} alone.</p>")
        else:
            parts.append(
                "<table><tr><th>victim lane</th><th>missed</th><th>requests</th>"
                f"<th>{html.escape(str(t['lane']))} ahead (share of wait)</th>"
                f"<th>small lane</th></tr>{rows}</table>"
            )
        parts.append(f"<p>Mechanism: {html.escape(inc['mechanism'])}.</p>")
        if inc["fine"]:
            parts.append(f"<p>Fine: {html.escape('; '.join(inc['fine']))}.</p>")
        parts.append(f"<p>Lever: {html.escape(inc['lever'])}.</p>")
    rest = len(doc["incidents"]) - len(shown)
    if rest:
        parts.append(f"<p>{rest} more incidents with fewer misses (the draft below).</p>")
    parts.append("</div>")
    if zoom is not None:
        b64 = base64.b64encode(zoom).decode()
        parts.append(f'<img alt="TTFT around the incident" src="data:image/png;base64,{b64}">')
    return "".join(parts)


def _zoom(scan: Source, config: Config, doc: dict[str, Any]) -> bytes | None:
    """Every request's TTFT around the most harmful incident's window (None: no incident)."""
    if not doc["incidents"]:
        return None
    inc = max(doc["incidents"], key=harm_done)
    start, end = (datetime.fromisoformat(inc[k]) for k in ("start", "end"))
    lo, hi = start - ZOOM_PAD, end + ZOOM_PAD
    d, col = scan.dialect, scan.dialect.ts_column
    rows = scan.run(
        f"SELECT lane, {col} AS _t, ttft_ms FROM {SRC} WHERE request_id IS NOT NULL AND "
        f"{col} >= {d.ts_literal(lo)} AND {col} <= {d.ts_literal(hi)} ORDER BY _t"
    ).rows
    points: dict[str, tuple[list[datetime], list[float]]] = {}
    arrivals: list[datetime] = []
    for lane, v, ttft in rows:
        t = d.ts_value(v)  # ClickHouse's ts_ms is epoch milliseconds
        if lane == inc["trigger"]["lane"]:
            arrivals.append(t)
        if ttft is not None:
            xs, ys = points.setdefault(str(lane), ([], []))
            xs.append(t)
            ys.append(max(float(ttft), 0.1))
    thresholds = {
        lane.name: lane.slo.ttft.threshold_ms for lane in config.lanes if lane.slo.ttft is not None
    }
    palette = plots.colors(sorted(points))
    trigger = (str(inc["trigger"]["lane"]), arrivals) if arrivals else None
    return plots.incident_ttft(points, thresholds, palette, (start, end), trigger)


def _budget_section(scan: Source, config: Config) -> str:
    """Where each lane's error budget went (``vllm-obs query budget``), as HTML tables."""
    doc = budget(scan, config, list(scan.inputs.files))
    parts = ["<h2>Where the error budget went</h2>"]
    for title, table in tables(doc).items():
        parts.append(f"<h3>{html.escape(title)}</h3>")
        parts.append(_html_table(table) if len(table) else "<p>None.</p>")
    parts.append(
        '<p class="note">Each SLO miss is charged to the phase that ran furthest over what '
        "the lane's good requests take in it, and to a cause (docs/query.md, Where the error "
        "budget went).</p>"
    )
    return "".join(parts)


def _interval_of(t: Table) -> int:
    starts = t.values("start")
    return int((starts[1] - starts[0]).total_seconds()) if len(starts) > 1 else 60


def report(scan: Source, config: Config, out: str | Path, title: str | None = None) -> Path:
    """Write ``out/report.html`` and ``out/*.png``; return the HTML path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    scan.materialize(_NEEDED)
    summ = summary(scan, config)
    figs = _figures(scan, config, summ) if len(summ) else {}
    for name, (_, png) in figs.items():
        (out / f"{name}.png").write_bytes(png)
    slow = slowest(scan, "e2e", 10)
    slow_ttft = slowest(scan, "ttft", 10)
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    files = ", ".join(html.escape(Path(f).name) for f in scan.inputs.files[:10])
    more = f" and {len(scan.inputs.files) - 10} more" if len(scan.inputs.files) > 10 else ""
    problems = "".join(f"<li>{html.escape(m)}</li>" for m in scan.report.messages())
    parts = [
        f"<h1>{html.escape(title or 'vLLM request log report')}</h1>",
        f'<p class="meta">Generated {now} by vllm-obs query report. Logs: {files}{more}. '
        f"Filter: {html.escape(scan.filters.describe())}.</p>",
    ]
    if problems:
        parts.append(f'<div class="warn"><ul>{problems}</ul></div>')
    story = draft(scan, config, list(scan.inputs.files))
    zoom = _zoom(scan, config, story)
    if zoom is not None:
        (out / "incident.png").write_bytes(zoom)
    parts.append(_story_section(story, zoom))
    parts.append("<h2>Summary per lane</h2>")
    parts.append(_transposed_html(summ, SUMMARY_COLUMNS) if len(summ) else "<p>No events.</p>")
    parts.append(
        '<p class="note">Latency percentiles cover successful requests. TTFT of a '
        "non-streamed request is judged on its end-to-end time; a request is good (goodput) "
        "when its status is ok and it meets every latency SLO of its lane that applies to it. "
        "See docs/query.md for the exact definitions.</p>"
    )
    for _, (caption, png) in figs.items():
        b64 = base64.b64encode(png).decode()
        parts.append(f"<h2>{html.escape(caption)}</h2>")
        parts.append(f'<img alt="{html.escape(caption)}" src="data:image/png;base64,{b64}">')
    parts.append(_incident_section(story))
    parts.append(_budget_section(scan, config))
    parts.append("<h2>Slowest requests (end-to-end)</h2>" + _html_table(slow, SLOW_COLUMNS))
    parts.append("<h2>Slowest first tokens (TTFT)</h2>" + _html_table(slow_ttft, SLOW_COLUMNS))
    doc = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title or 'vllm-obs report')}</title><style>{_CSS}</style>"
        f"</head><body>{''.join(parts)}</body></html>\n"
    )
    path = out / "report.html"
    path.write_text(doc, encoding="utf-8")
    return path


# The sweep's report (obs.sweep.report) renders in the same house style.
CSS = _CSS
distribution = _distribution
html_table = _html_table
