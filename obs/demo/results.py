"""The end of a demo: the project's own commands over the output folder, and what to print.

Every artefact is made by the same ``vllm-obs`` command a user would run (the
demo prints each one), in a subprocess of this interpreter; the formatting
helpers here are pure.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from obs.demo.prometheus import Alert
from obs.errors import ObsError

# `vllm-obs query report` over the demo's output folder.
REPORT_ARGS = [
    "query", "report", "events.jsonl", "--config", "lanes.yaml", "--out", "report",
    "--title", "vllm-obs demo", "--no-progress",
]  # fmt: skip

# Rows of `vllm-obs query summary` shown on screen; summary.txt keeps them all.
SCREEN_ROWS = (
    "lane",
    "requests",
    "ok",
    "error_rate",
    "rejection_rate",
    "cache_hit_ratio",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p95_ms",
    "e2e_p50_ms",
    "e2e_p95_ms",
    "queue_p95_ms",
    "goodput_ratio",
)

# Files of the output folder, as listed at the end.
FILES = (
    ("events.jsonl", "the sidecar's request events, one JSON line per request"),
    ("load.jsonl", "the load generator's client-side records (join: vllm-obs load check)"),
    ("report/report.html", "HTML report with embedded plots (vllm-obs query report)"),
    ("summary.txt", "the full per-lane summary, SLO attainment and alerts"),
    ("rules/", "Prometheus recording and alerting rules (vllm-obs alerts)"),
    ("dashboards/", "Grafana dashboards, JSON (vllm-obs dashboards)"),
    ("alerts.json", "Prometheus alerts pending or firing at the end of the load"),
    ("lanes.yaml", "the lanes/SLO config the sidecar, rules and dashboards used"),
    ("mix.yaml", "the traffic mix (replay: vllm-obs load --mix mix.yaml)"),
    ("prometheus/", "prometheus.yml and the scraped data"),
    ("logs/", "vLLM, sidecar and Prometheus logs"),
    ("pids.json", "every process the demo started (all stopped)"),
)


class CommandError(ObsError):
    """A ``vllm-obs`` command the demo ran failed."""


def vllm_obs(args: Sequence[str], *, cwd: Path) -> str:
    """Run ``vllm-obs ARGS`` with this interpreter; return stdout or raise with stderr."""
    cmd = [sys.executable, "-m", "obs.cli", *args]
    proc = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False
    )
    if proc.returncode != 0:
        raise CommandError(
            f"`{display(args)}` failed (exit {proc.returncode}):\n{proc.stderr.strip()[-3000:]}"
        )
    return proc.stdout


def display(args: Sequence[str]) -> str:
    """How a user would type the command."""
    return "vllm-obs " + shlex.join(args)


def screen_table(table: str, rows: Sequence[str] = SCREEN_ROWS) -> str:
    """The lines of a transposed summary table whose row label is in ``rows``."""
    lines = table.splitlines()
    keep = [
        line
        for i, line in enumerate(lines)
        if i == 1 or (line.split(maxsplit=1) or [""])[0] in rows
    ]
    return "\n".join(keep) + "\n"


def _pct(v: Any, digits: int = 1) -> str:
    return "-" if v is None else f"{v * 100:.{digits}f}%"


def _verdict(v: Any) -> str:
    return "-" if v is None else ("yes" if v else "NO")


def slo_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Per lane: each SLO as attained / objective, goodput, and whether all were met."""
    header = ["lane", "TTFT", "TPOT", "availability", "goodput", "SLOs met"]
    body = []
    for r in rows:
        cells = [str(r["lane"])]
        for kind in ("ttft", "tpot"):
            if r.get(f"{kind}_objective") is None:
                cells.append("-")
                continue
            cells.append(
                f"{_pct(r.get(f'{kind}_attainment'))} of {_pct(r[f'{kind}_objective'], 0)}"
                f" <= {r[f'{kind}_slo_ms']:g} ms {_verdict(r.get(f'{kind}_slo_met'))}"
            )
        if r.get("availability_objective") is None:
            cells.append("-")
        else:
            cells.append(
                f"{_pct(r.get('availability'), 2)} of {_pct(r['availability_objective'], 1)} "
                f"{_verdict(r.get('availability_slo_met'))}"
            )
        cells += [_pct(r.get("goodput_ratio")), _verdict(r.get("slo_met"))]
        body.append(cells)
    return _columns(header, body)


def alerts_text(alerts: Sequence[Alert]) -> str:
    """Firing alerts first, then pending ones, one line each with their lane/pool labels."""
    if not alerts:
        return "  none pending or firing\n"
    lines = []
    for a in alerts:
        labels = dict(a.labels)
        if "long_window" in labels and "short_window" in labels:
            labels["windows"] = f"{labels['long_window']}/{labels['short_window']}"
        where = " ".join(
            f"{k}={labels[k]}"
            for k in ("lane", "pool", "replica", "slo", "severity", "windows")
            if k in labels
        )
        lines.append(f"  {a.state:<8} {a.name}  {where}".rstrip())
    return "\n".join(lines) + "\n"


def alerts_section(url: str | None, alerts: Sequence[Alert] | None, notes: Sequence[str]) -> str:
    """The alerts part of the demo's summary: what Prometheus at ``url`` said at the end."""
    if url is None:
        return "Alerts: no Prometheus this run (install it: scripts/setup)\n"
    head = f"Alerts at the end of the load ({url}/api/v1/alerts)"
    body = "" if alerts is None else alerts_text(alerts)
    hint = (
        "  (pending: the condition holds now; an alert fires once it has held for the\n"
        "   rule's `for:`, 2 minutes for the fastest page and hours for tickets)\n"
        if alerts and not any(a.state == "firing" for a in alerts)
        else ""
    )
    return f"{head}\n{body}{hint}" + "".join(f"  {n}\n" for n in notes)


def timing_line(total_s: float, timings: Mapping[str, float]) -> str:
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in timings.items() if v >= 0.05)
    return f"Demo took {total_s:.0f} s ({parts})."


def alerts_json(alerts: Sequence[Alert]) -> str:
    data = [
        {"alertname": a.name, "state": a.state, "labels": a.labels, "activeAt": a.active_at}
        for a in alerts
    ]
    return json.dumps(data, indent=2) + "\n"


def _columns(header: list[str], body: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *body]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def files_text(out: Path, entries: Sequence[tuple[str, str]]) -> str:
    """``path  what`` for each entry that exists under ``out``."""
    shown = [(name, what) for name, what in entries if (out / name.rstrip("/")).exists()]
    width = max((len(n) for n, _ in shown), default=0)
    return "".join(f"  {name.ljust(width)}  {what}\n" for name, what in shown)
