"""The sweep's HTML report: the matrix, verdicts, tests and plots, in ``query report``'s style.

``OUT/report.html`` embeds every figure as a base64 PNG; the PNGs are written
beside it too.
"""

from __future__ import annotations

import base64
import html
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from obs.query import plots
from obs.query.html_report import CSS, distribution, html_table
from obs.query.scan import Scan, connect
from obs.query.table import Table
from obs.sweep.matrix import Matrix, ProfileData

if TYPE_CHECKING:
    from obs.sweep.options import SweepOptions

BEST_COLUMNS = ("lane", "best", "best_share", "runner_up", "runner_up_share", "p_value")
SYSTEM_COLUMNS = ("profile", "offered", "accepted_share", "good", "goodput_share", "goodput_rps")
SIG_COLUMNS = ("profile", "lane", "metric", "before", "after", "delta", "test", "p_value")


def _lanes(matrix: Matrix) -> list[str]:
    seen: list[str] = []
    for r in matrix.rows:
        if r["lane"] not in seen:
            seen.append(r["lane"])
    return seen


def _figures(
    data: list[ProfileData], matrix: Matrix, lanes: list[str]
) -> list[tuple[str, str, bytes]]:
    names = [d.profile.name for d in data]
    palette = plots.colors(names)
    cells = {(r["profile"], r["lane"]): r for r in matrix.rows}
    figs = [
        (
            "goodput",
            "Gated goodput per lane and profile",
            plots.grouped_bars(
                "Gated goodput: requests/s that met their lane's TTFT and TPOT SLOs",
                "good requests / s of load",
                lanes,
                {n: [cells.get((n, lane), {}).get("goodput_rps") for lane in lanes] for n in names},
                palette,
            ),
        )
    ]
    con = connect()
    curves: dict[str, dict[str, Any]] = {"ttft_ms": {}, "itl_p50_ms": {}}
    scans = [Scan(list(d.events), con=con, progress=False) for d in data]  # alive together
    for d, scan in zip(data, scans, strict=True):
        for column, per_profile in curves.items():
            per_profile[d.profile.name] = distribution(scan, column, lanes)
    gates = data[0].profile.gates() if data else {}
    for lane in lanes:
        ttft = gates.get(lane, (None, None))[0]
        note = f" (SLO: {ttft.threshold_ms:g} ms for {ttft.objective:.0%})" if ttft else ""
        for column, label, what in (
            ("ttft_ms", "TTFT", "TTFT (ms)"),
            ("itl_p50_ms", "ITL", "ITL, each request's median gap (ms)"),
        ):
            by_profile = {
                n: per_lane[lane] for n, per_lane in curves[column].items() if lane in per_lane
            }
            if not by_profile:
                continue
            title = f"{label} per profile, lane {lane}" + (note if label == "TTFT" else "")
            png = plots.ecdf(title, what, by_profile, {}, palette)
            figs.append((f"{label.lower()}-{lane}", title, png))
    return figs


def _verdict_table(data: list[ProfileData], matrix: Matrix) -> Table:
    rows = [
        (
            d.profile.name,
            "; ".join(f"{k}: {v.describe()}" for k, v in d.profile.engines.items()),
            len(d.events),
            matrix.verdicts[d.profile.name],
        )
        for d in data
    ]
    return Table(["profile", "pools (vllm serve flags)", "rounds", "verdict"], rows)


def write_report(
    out: Path, data: list[ProfileData], matrix: Matrix, opts: SweepOptions, wall_s: float
) -> Path:
    """Write ``out/report.html`` and ``out/*.png``; return the HTML path."""
    out.mkdir(parents=True, exist_ok=True)
    lanes = _lanes(matrix)
    figs = _figures(data, matrix, lanes)
    for name, _, png in figs:
        (out / f"{name}.png").write_bytes(png)
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    where = "pools given in the profiles" if opts.external else "local CPU vLLM pools"
    if opts.engine == "sim":
        where = "SIMULATED GPU pools (vllm-obs engine sim: a model, not a measurement)"
    parts = [
        "<h1>vllm-obs sweep: the profile matrix</h1>",
        f'<p class="meta">Generated {now} by <code>{html.escape(opts.command)}</code>: '
        f"{len(data)} profiles, {opts.rounds} round(s) each, {opts.rate:g} sessions/s for "
        f"{opts.duration_s:g} s per run, seed {opts.seed}, on {where}; sweep wall time "
        f"{wall_s:.0f} s. Baseline for the tests: {html.escape(str(matrix.baseline))}.</p>",
        "<h2>Verdict per profile</h2>",
        html_table(_verdict_table(data, matrix)),
        "<h2>Whole system per profile</h2>",
        html_table(
            Table(
                list(SYSTEM_COLUMNS), [tuple(r[c] for c in SYSTEM_COLUMNS) for r in matrix.system]
            )
        ),
        f'<p class="note">All lanes together: offered requests, the share accepted by '
        f"admission, the good ones (ok and within their lane's gates). Best overall: "
        f"{html.escape(str((matrix.best_overall or {}).get('best')))}, tested against the "
        "runner-up as below.</p>",
        "<h2>Best gated goodput per lane</h2>",
        html_table(
            Table(list(BEST_COLUMNS), [tuple(b[c] for c in BEST_COLUMNS) for b in matrix.best])
        ),
        f'<p class="note">Two-proportion z-test of the best profile against the runner-up; '
        f"a p-value at or above {opts.alpha:g} means the two are not told apart by this "
        "evidence.</p>",
    ]
    for _, caption, png in figs[:1]:
        parts.append(f"<h2>{html.escape(caption)}</h2>{_img(caption, png)}")
    parts += ["<h2>The matrix</h2>", html_table(matrix.table())]
    parts.append(
        '<p class="note">good: status ok and within the lane\'s TTFT and TPOT SLOs; '
        "goodput_share = good / requests; goodput_rps = good / seconds of load; latency "
        "percentiles over successful requests; itl_p99_ms: p99 over requests of each "
        "request's median inter-token gap; stream_p95_ms: the stream phase (last token "
        "from the engine to last byte read by the client), the slow-reader penalty. "
        "See docs/sweep.md.</p>"
    )
    parts.append("<h2>Distributions per lane</h2>")
    parts += [f"<h3>{html.escape(c)}</h3>{_img(c, png)}" for _, c, png in figs[1:]]
    sig = Table(list(SIG_COLUMNS), [tuple(s[c] for c in SIG_COLUMNS) for s in matrix.significance])
    parts += [
        f"<h2>Against the baseline ({html.escape(str(matrix.baseline))})</h2>",
        html_table(sig) if matrix.significance else "<p>Only one profile finished.</p>",
    ]
    doc = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>vllm-obs sweep</title><style>{CSS}</style></head>"
        f"<body>{''.join(parts)}</body></html>\n"
    )
    path = out / "report.html"
    path.write_text(doc, encoding="utf-8")
    return path


def _img(caption: str, png: bytes) -> str:
    b64 = base64.b64encode(png).decode()
    return f'<img alt="{html.escape(caption)}" src="data:image/png;base64,{b64}">'
