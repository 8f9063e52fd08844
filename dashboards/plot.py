"""Draw a dashboard snapshot as one PNG, in the dashboard's own grid layout (matplotlib).

Pure: a ``DashboardSnapshot`` in, PNG bytes out (Agg canvas, no pyplot state).
Time series panels draw lines (stacked where the panel stacks) and their dashed
threshold lines, stat panels their last value per series in the colour of its
threshold step, heatmaps the per-bucket rates, text panels their markdown table;
a panel without data says "no data", as Grafana does.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .snapshot import DATA_PANELS, DashboardSnapshot, PanelSnapshot, Series

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

WIDTH_IN = 16.0  # 24 grid columns
UNIT_IN = 0.3  # one grid row (Grafana: 30 px)
HEADER_IN = 0.7
GAP_IN = 0.04
MAX_LEGEND = 10
STAT_CELL_IN = 1.25  # the narrowest a stat value gets
PAD_LEFT_IN, PAD_RIGHT_IN, PAD_TOP_IN, PAD_BOTTOM_IN = 0.62, 0.12, 0.3, 0.3
PLAIN: dict[str, Any] = {"parse_math": False}  # "$lane" is text, not mathtext
COLOURS = {"green": "#37872d", "yellow": "#e0b400", "orange": "#fa6400", "red": "#c4162a"}


def fmt_value(v: float, unit: str) -> str:
    """A value as the panel's unit shows it: ``0.25`` s -> ``250 ms``, percentunit -> ``%``."""
    if not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("+Inf" if v > 0 else "-Inf")
    if unit == "percentunit":
        return f"{_num(v * 100)}%"
    if unit == "s":
        return f"{_num(v * 1000)} ms" if abs(v) < 1 else f"{_num(v)} s"
    suffix = {"reqps": " req/s", "ops": "/s", "x": "x"}.get(unit, "")
    return f"{_num(v)}{suffix}"


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def step_colour(steps: Sequence[tuple[str, float | None]], v: float) -> str:
    """The colour of the threshold step ``v`` falls in (Grafana: the last step at or below)."""
    colour = "#333333"
    for name, start in steps:
        if start is None or (math.isfinite(v) and v >= start):
            colour = COLOURS.get(name, name)
    return colour


def draw(snap: DashboardSnapshot, subtitle: str = "", dpi: int = 80) -> bytes:
    """The whole dashboard as PNG bytes."""
    from matplotlib.figure import Figure

    rows = max((p.grid[1] + p.grid[3] for p in snap.panels), default=1)
    height = HEADER_IN + rows * UNIT_IN + 0.1
    fig = Figure(figsize=(WIDTH_IN, height), dpi=dpi)
    fig.text(0.1 / WIDTH_IN, 1 - 0.28 / height, snap.title, fontsize=14, weight="bold", **PLAIN)
    if subtitle:
        fig.text(0.1 / WIDTH_IN, 1 - 0.5 / height, subtitle, fontsize=8, color="#555", **PLAIN)
    for panel in snap.panels:
        _draw_panel(fig, panel, snap, height)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _draw_panel(fig: Figure, p: PanelSnapshot, snap: DashboardSnapshot, height: float) -> None:
    x, y, w, h = p.grid
    left, top = x / 24 * WIDTH_IN, HEADER_IN + y * UNIT_IN
    width_in, height_in = w / 24 * WIDTH_IN, h * UNIT_IN

    def rect(
        pad_l: float, pad_r: float, pad_t: float, pad_b: float
    ) -> tuple[float, float, float, float]:
        """Figure coordinates of the panel's rectangle less the paddings (inches)."""
        return (
            (left + pad_l) / WIDTH_IN,
            1 - (top + height_in - pad_b) / height,
            (width_in - pad_l - pad_r) / WIDTH_IN,
            (height_in - pad_t - pad_b) / height,
        )

    if p.kind == "row":
        fig.text(
            rect(0.1, 0, 0, 0)[0],
            1 - (top + UNIT_IN * 0.7) / height,
            p.title,
            fontsize=10,
            weight="bold",
            color="#333",
            **PLAIN,
        )
        return
    box = fig.add_axes(rect(GAP_IN, GAP_IN, GAP_IN, GAP_IN))
    box.set_xticks([])
    box.set_yticks([])
    box.set_facecolor("#f7f7f9")
    for spine in box.spines.values():
        spine.set_color("#d8d9dc")
    box.text(0.006 * 24 / w, 0.985, p.title, va="top", fontsize=8.5, weight="bold", **PLAIN)
    if p.kind == "text":
        _text(box, p.text)
        return
    if p.kind not in DATA_PANELS:
        return
    if p.errors:
        _message(box, "query error: " + p.errors[0][:160], "#c00")
        return
    if not p.has_data:
        _message(box, "no data", "#888")
        return
    if p.kind == "stat":
        _stat(box, p, width_in, height_in)
        return
    ax = fig.add_axes(rect(PAD_LEFT_IN, PAD_RIGHT_IN, PAD_TOP_IN, PAD_BOTTOM_IN))
    ax.tick_params(labelsize=6.5)
    if p.kind == "heatmap":
        _heatmap(ax, p, snap)
    else:
        _timeseries(ax, p, snap)


def _message(box: Axes, text: str, color: str) -> None:
    box.text(0.5, 0.45, text, ha="center", va="center", fontsize=9, color=color, wrap=True, **PLAIN)


def _text(box: Axes, markdown: str) -> None:
    """A markdown table as a table; other markdown as plain text."""
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in markdown.splitlines()
        if line.strip().startswith("|") and not set(line.strip()) <= set("|-: ")
    ]
    if len(rows) > 1:
        table = box.table(
            cellText=rows[1:], colLabels=rows[0], loc="center", cellLoc="left", edges="horizontal"
        )
        table.auto_set_font_size(False)
        table.set_fontsize(8)
        table.scale(1, 1.3)
    else:
        box.text(0.01, 0.85, markdown, va="top", fontsize=7.5, family="monospace", **PLAIN)


def _times(ts: Sequence[float]) -> list[float]:
    """Unix seconds as matplotlib date numbers."""
    from matplotlib.dates import date2num

    return [float(date2num(datetime.fromtimestamp(t, UTC))) for t in ts]


def _time_axis(ax: Axes, snap: DashboardSnapshot) -> None:
    from matplotlib.dates import DateFormatter
    from matplotlib.ticker import MaxNLocator

    lo, hi = _times([snap.start, snap.end])
    ax.xaxis_date(tz=UTC)
    ax.set_xlim(lo, hi)
    ax.xaxis.set_major_formatter(DateFormatter("%H:%M:%S", tz=UTC))
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5))


def _timeseries(ax: Axes, p: PanelSnapshot, snap: DashboardSnapshot) -> None:
    from matplotlib.ticker import FuncFormatter

    series = [s for s in p.series if s.values]
    if p.stacked:
        grid = sorted({t for s in series for t in s.times})
        ys = []
        for s in series:
            by_t = dict(zip(s.times, s.values, strict=True))
            ys.append([_zero_nan(by_t.get(t, 0.0)) for t in grid])
        ax.stackplot(_times(grid), ys, labels=[_plain(s.label) for s in series], alpha=0.75)
    else:
        for s in series:
            ax.plot(_times(s.times), s.values, label=_plain(s.label), linewidth=1.1)
    for t in p.thresholds:
        ax.axhline(t, color=COLOURS["red"], linestyle="--", linewidth=0.8)
    ax.set_ylim(bottom=0, top=p.ymax)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_value(v, p.unit)))
    ax.grid(alpha=0.3, linewidth=0.5)
    _time_axis(ax, snap)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        n = min(len(handles), MAX_LEGEND)
        ax.legend(
            handles[:n],
            labels[:n],
            fontsize=5.5,
            loc="upper left",
            ncol=2 if n > 5 else 1,
            framealpha=0.7,
            handlelength=1.2,
        )


def _plain(label: str) -> str:
    """A legend label matplotlib shows as written (no mathtext; a leading _ would hide it)."""
    return label.replace("$", r"\$").lstrip("_") or " "


def _zero_nan(v: float) -> float:
    return 0.0 if math.isnan(v) else v


def _stat(box: Axes, p: PanelSnapshot, width_in: float, height_in: float) -> None:
    values = [(s.label, s.finite[-1] if s.finite else math.nan) for s in p.series if s.values]
    cols = max(1, min(len(values), int(width_in // STAT_CELL_IN)))
    lines = math.ceil(len(values) / cols)
    size = max(7.0, min(14.0, (height_in - 0.35) / lines * 28))
    for i, (label, v) in enumerate(values):
        cx = (i % cols + 0.5) / cols
        cy = 0.86 - (i // cols + 0.55) * 0.84 / lines
        colour = step_colour(p.steps, v)
        box.text(
            cx,
            cy,
            fmt_value(v, p.unit),
            ha="center",
            va="bottom",
            fontsize=size,
            weight="bold",
            color=colour,
            **PLAIN,
        )
        box.text(cx, cy, label, ha="center", va="top", fontsize=size * 0.5, color="#444", **PLAIN)


def _heatmap(ax: Axes, p: PanelSnapshot, snap: DashboardSnapshot) -> None:
    import numpy as np

    buckets: dict[float, Series] = {}
    for s in p.series:
        le = s.labels.get("le")
        if le is not None and s.values:
            buckets[float(le)] = s
    bounds = sorted(buckets)
    grid = sorted({t for s in buckets.values() for t in s.times})
    cum = np.array(
        [
            [_zero_nan(by_t.get(t, 0.0)) for t in grid]
            for by_t in (
                dict(zip(buckets[b].times, buckets[b].values, strict=True)) for b in bounds
            )
        ]
    )
    per_bucket = np.clip(np.diff(cum, axis=0, prepend=0.0), 0.0, None)
    x = _times(grid)
    ax.imshow(
        np.ma.masked_less_equal(per_bucket, 0.0),
        aspect="auto",
        origin="lower",
        cmap="Oranges",
        interpolation="nearest",
        extent=(x[0], x[-1] if len(x) > 1 else x[0] + 1e-5, 0, len(bounds)),
    )
    step = max(1, len(bounds) // 6)
    ticks = list(range(0, len(bounds), step))
    ax.set_yticks([i + 0.5 for i in ticks])
    ax.set_yticklabels([_le_label(bounds[i]) for i in ticks])
    _time_axis(ax, snap)


def _le_label(le: float) -> str:
    return "+Inf" if math.isinf(le) else fmt_value(le, "s")
