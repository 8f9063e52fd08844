"""Figures for the HTML report (matplotlib, Agg, no pyplot global state).

Every function takes plain data (lists and dicts) and returns PNG bytes.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from obs.conventions import PHASES

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


def colors(names: Sequence[str]) -> dict[str, str]:
    """A stable colour per lane, in the given order."""
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _plain_log_ticks(axis: Any) -> None:
    """Label a log axis 50, 100, 200 rather than 5x10^1."""
    from matplotlib.ticker import FuncFormatter

    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    axis.set_major_formatter(fmt)
    axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(v)[0] in "25" else ""))


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def ecdf(
    title: str,
    xlabel: str,
    curves: dict[str, tuple[list[float], list[float]]],
    thresholds: dict[str, float],
    palette: dict[str, str],
) -> bytes:
    """Cumulative distributions per lane (log x), SLO thresholds as dashed lines."""
    fig = _figure(9, 4.5)
    ax = fig.add_subplot()
    for lane, (xs, ps) in curves.items():
        pts = [(x, p) for x, p in zip(xs, ps, strict=True) if x is not None and x > 0]
        if pts:
            ax.plot([x for x, _ in pts], [p * 100 for _, p in pts], label=lane, color=palette[lane])
    for lane, t in thresholds.items():
        if lane in curves:
            ax.axvline(t, color=palette[lane], linestyle="--", linewidth=1, alpha=0.8)
    ax.set_xscale("log")
    _plain_log_ticks(ax.xaxis)
    note = "; dashed: the lane's SLO threshold" if thresholds else ""
    ax.set_xlabel(f"{xlabel} (log scale{note})")
    ax.set_ylabel("% of requests at or below")
    ax.set_ylim(0, 100)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title)
    if curves:
        ax.legend(loc="lower right", fontsize="small")
    return _png(fig)


# The phase chart's segments: the queue split into the sidecar's own (admission, connect) and
# the engine's (its span's, or inferred from the pool's state: obs.engine_queue).
CHART_PHASES = ("queue", "engine_queue", *PHASES[1:])
CHART_LABELS = {"queue": "queue (sidecar)", "engine_queue": "engine queue"}


def phases(means: dict[str, dict[str, float]], palette_phases: Sequence[str] = PALETTE) -> bytes:
    """Share of mean end-to-end time per phase, one bar per lane, mean e2e labelled; the
    engine's queue (``engine_queue`` in ``means``) drawn apart from the sidecar's queue and
    from prefill."""
    fig = _figure(9, 0.6 * max(len(means), 2) + 1.6)
    ax = fig.add_subplot()
    lanes = list(means)
    left = [0.0] * len(lanes)
    totals = [sum(means[lane].get(p) or 0.0 for p in CHART_PHASES) or 1.0 for lane in lanes]
    for i, phase in enumerate(CHART_PHASES):
        shares = [
            100 * (means[lane].get(phase) or 0.0) / t for lane, t in zip(lanes, totals, strict=True)
        ]
        label = CHART_LABELS.get(phase, phase)
        ax.barh(lanes, shares, left=left, label=label, color=palette_phases[i])
        left = [a + b for a, b in zip(left, shares, strict=True)]
    for y, t in enumerate(totals):
        ax.text(101, y, f"{t:,.0f} ms", va="center", fontsize="small")
    ax.set_xlim(0, 115)
    ax.invert_yaxis()
    ax.set_xlabel("% of mean end-to-end time (label: mean e2e of successful requests)")
    ax.set_title("Where the time goes: phase breakdown per lane")
    ax.legend(ncols=3, loc="upper center", bbox_to_anchor=(0.5, -0.25), fontsize="small")
    return _png(fig)


def timeline(
    starts: list[datetime],
    rps: dict[str, list[float]],
    error_rate: list[float | None],
    rejection_rate: list[float | None],
    ttft_p95: dict[str, list[float | None]],
    thresholds: dict[str, float],
    palette: dict[str, str],
) -> bytes:
    """Three stacked panels over time: load per lane, failure rates, TTFT p95 per lane."""
    fig = _figure(11, 8)
    ax1, ax2, ax3 = fig.subplots(3, 1, sharex=True)
    for lane, ys in rps.items():
        ax1.plot(starts, ys, label=lane, color=palette[lane])
    ax1.set_ylabel("requests/s")
    ax1.set_title("Load, failures and TTFT over time (UTC)")
    ax1.legend(loc="upper left", fontsize="small", ncols=3)
    ax1.grid(True, alpha=0.3)

    def pct(v: list[float | None]) -> list[float]:
        return [float("nan") if x is None else 100 * x for x in v]

    ax2.plot(starts, pct(error_rate), label="error rate", color="#d62728")
    ax2.plot(starts, pct(rejection_rate), label="rejection rate", color="#ff7f0e")
    ax2.set_ylabel("% of requests")
    ax2.legend(loc="upper left", fontsize="small")
    ax2.grid(True, alpha=0.3)
    for lane, p95 in ttft_p95.items():
        vals = [float("nan") if y is None else y for y in p95]
        ax3.plot(starts, vals, label=lane, color=palette[lane])
        if lane in thresholds:
            ax3.axhline(thresholds[lane], color=palette[lane], linestyle="--", linewidth=0.8)
    ax3.set_yscale("log")
    _plain_log_ticks(ax3.yaxis)
    ax3.set_ylabel("TTFT p95 (ms, log)")
    ax3.grid(True, which="both", alpha=0.3)
    fig.autofmt_xdate()
    return _png(fig)


def incident_ttft(
    points: dict[str, tuple[list[datetime], list[float]]],
    thresholds: dict[str, float],
    palette: dict[str, str],
    window: tuple[datetime, datetime],
    trigger: tuple[str, list[datetime]] | None,
) -> bytes:
    """Each request's TTFT over the incident's window, per lane, its SLO threshold dashed; the
    trigger lane's arrivals as ticks along the bottom."""
    fig = _figure(11, 4.5)
    ax = fig.add_subplot()
    for lane, (ts, ys) in points.items():
        xs: Any = ts  # matplotlib plots datetimes (its stubs say floats)
        ax.scatter(xs, ys, s=12, label=lane, color=palette.get(lane, "#777777"))
        if lane in thresholds:
            ax.axhline(thresholds[lane], color=palette.get(lane), linestyle="--", linewidth=0.8)
    if trigger is not None:
        lane, arrivals = trigger
        at: Any = arrivals
        ax.plot(at, [0.02] * len(arrivals), "|", markersize=14, color="black",
                transform=ax.get_xaxis_transform(), label=f"{lane} arrivals (trigger)")  # fmt: skip
    lo: Any
    hi: Any
    lo, hi = window
    ax.axvspan(lo, hi, color="#f0a030", alpha=0.12)
    ax.set_yscale("log")
    _plain_log_ticks(ax.yaxis)
    ax.set_ylabel("TTFT (ms, log)")
    ax.set_title("TTFT per request around the incident (UTC; shaded: its window)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")  # off the points
    ax.grid(True, which="both", alpha=0.3)
    fig.autofmt_xdate()
    return _png(fig)


def attainment(
    lanes: list[str],
    values: dict[str, list[float | None]],
    objectives: dict[str, list[float | None]],
) -> bytes:
    """Grouped bars: each SLO's attainment per lane, its objective as a black tick."""
    fig = _figure(10, 4.5)
    ax = fig.add_subplot()
    kinds = list(values)
    width = 0.8 / max(len(kinds), 1)
    shown = [
        100 * v for vs in (*values.values(), *objectives.values()) for v in vs if v is not None
    ]
    floor = max(0.0, min(80.0, 5 * ((min(shown, default=100.0) - 2) // 5)))
    for k, kind in enumerate(kinds):
        xs = [i + (k - (len(kinds) - 1) / 2) * width for i in range(len(lanes))]
        ys = [floor if v is None else max(100 * v, floor) for v in values[kind]]
        # A bar at the axis' floor (0% attained) still shows: a sliver, hatched, its value on it.
        sliver = (100.5 - floor) * 0.015
        heights = [max(y - floor, sliver) for y in ys]
        bars = ax.bar(xs, heights, width, bottom=floor, label=kind, color=PALETTE[k])
        for bar, v, y in zip(bars, values[kind], ys, strict=True):
            if v is None:
                bar.set_alpha(0)
            elif y - floor < sliver:
                bar.set_hatch("///")
                bar.set_edgecolor("black")
                ax.annotate(
                    f"{100 * v:.0f}%", (bar.get_x() + bar.get_width() / 2, floor + sliver),
                    ha="center", va="bottom", fontsize="small",
                )  # fmt: skip
        for x, obj in zip(xs, objectives.get(kind, []), strict=False):
            if obj is not None:
                ax.plot([x - width / 2, x + width / 2], [100 * obj] * 2, color="black", linewidth=2)
    ax.set_xticks(range(len(lanes)), lanes)
    ax.set_ylim(floor, 100.5)
    ax.set_ylabel(f"% of requests (axis from {floor:.0f}%)")
    ax.set_title("SLO attainment per lane (black tick: objective; no bar: no such SLO)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), fontsize="small", ncols=len(kinds))
    ax.grid(True, axis="y", alpha=0.3)
    return _png(fig)


def grouped_bars(
    title: str,
    ylabel: str,
    groups: list[str],
    series: dict[str, list[float | None]],
    palette: dict[str, str],
) -> bytes:
    """One group of bars per ``groups`` entry, one bar per series (no bar: no value)."""
    fig = _figure(11, 4.8)
    ax = fig.add_subplot()
    width = 0.8 / max(len(series), 1)
    for k, (name, values) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(groups))]
        ys = [0.0 if v is None else v for v in values]
        bars = ax.bar(xs, ys, width, label=name, color=palette[name])
        for bar, v in zip(bars, values, strict=True):
            if v is None:
                bar.set_alpha(0)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), fontsize="small", ncols=3)
    ax.grid(True, axis="y", alpha=0.3)
    return _png(fig)
