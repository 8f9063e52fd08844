"""``vllm-obs dashboards render``: legends, units, colours and the drawing, from plain data.

Fetching runs against a real Prometheus in tests/deploy/test_live_stack.py; here the snapshot is
built by hand, so every panel kind is drawn without any server.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from obs.cli import main
from obs.dashboards.plot import draw, fmt_value, step_colour
from obs.dashboards.snapshot import DashboardSnapshot, PanelSnapshot, Series, legend

PNG = b"\x89PNG\r\n\x1a\n"
T0 = 1_800_000_000.0


def _series(label: str, values: list[float], **labels: str) -> Series:
    times = tuple(T0 + 10 * i for i in range(len(values)))
    return Series(label, labels, times, tuple(values))


def _panel(kind: str, title: str, grid: tuple[int, int, int, int], **kw: object) -> PanelSnapshot:
    fields: dict[str, Any] = {
        "unit": "",
        "stacked": False,
        "thresholds": (),
        "steps": (),
        "ymax": None,
        "text": "",
        "series": (),
        "errors": (),
        "queries": 1,
    }
    fields.update(kw)
    return PanelSnapshot(title, kind, grid, **fields)


def test_legend_fills_label_names_like_grafana() -> None:
    """``{{lane}} p95`` takes the series' label; no format lists the labels."""
    assert legend("{{lane}} p95", {"lane": "chat"}) == "chat p95"
    assert legend("{{ pool }} {{replica}}", {"pool": "bulk"}) == "bulk"
    assert legend("", {"__name__": "up", "job": "x", "lane": "a"}) == '{job="x", lane="a"}'


def test_values_read_in_the_panel_unit() -> None:
    """Seconds below 1 in ms, ratios in percent, rates per second, big numbers with commas."""
    assert fmt_value(0.25, "s") == "250 ms"
    assert fmt_value(2.5, "s") == "2.5 s"
    assert fmt_value(0.955, "percentunit") == "95.5%"
    assert fmt_value(-23.86, "percentunit") == "-2,386%"
    assert fmt_value(3.0, "reqps") == "3 req/s"
    assert fmt_value(14.4, "x") == "14.4x"
    assert fmt_value(math.nan, "s") == "NaN"


def test_stat_colour_is_the_last_step_at_or_below_the_value() -> None:
    """Grafana's threshold steps: the base colour below the first bound, then each bound's."""
    steps = (("red", None), ("orange", 0.0), ("green", 0.5))
    assert step_colour(steps, -0.2) == step_colour(steps, math.nan)
    assert step_colour(steps, 0.1) != step_colour(steps, 0.7) != step_colour(steps, -0.2)


def test_draw_renders_every_panel_kind_to_png() -> None:
    """Rows, stacked and plain series, stats, heatmaps, text, empty and failed panels draw."""
    ramp = [0.0, 0.5, 1.0, 1.5, math.nan, 2.0]
    buckets = tuple(
        _series(le, [n * i for i in range(6)], le=le)
        for le, n in (("0.1", 1.0), ("0.5", 3.0), ("+Inf", 4.0))
    )
    table = "| lane | limit |\n|---|---|\n| chat | 64 |"
    snap = DashboardSnapshot(
        uid="u",
        title="vllm-obs / Test $lane",
        start=T0,
        end=T0 + 50,
        step=10,
        variables={"lane": ".*"},
        panels=(
            _panel("row", "A row", (0, 0, 24, 1)),
            _panel(
                "timeseries",
                "Stacked",
                (0, 1, 12, 8),
                stacked=True,
                unit="reqps",
                series=(_series("a", ramp), _series("_b $x", ramp)),
            ),
            _panel(
                "timeseries",
                "Lines with a threshold",
                (12, 1, 12, 8),
                unit="percentunit",
                thresholds=(0.9,),
                ymax=1.0,
                series=(_series("kv", [0.2, 0.95, 0.4, 1.0, 0.3, 0.9]),),
            ),
            _panel(
                "stat",
                "Stat",
                (0, 9, 8, 5),
                unit="percentunit",
                steps=(("red", None), ("green", 0.5)),
                series=(_series("chat", [0.9]), _series("rag", [-0.4])),
            ),
            _panel("heatmap", "Heatmap", (8, 9, 8, 5), unit="s", series=buckets),
            _panel("timeseries", "Empty", (16, 9, 4, 5)),
            _panel("timeseries", "Broken", (20, 9, 4, 5), errors=("bad_data: parse error",)),
            _panel("text", "Limits", (0, 14, 24, 4), queries=0, text=table),
        ),
    )
    png = draw(snap, subtitle="$__rate_interval=15s")
    assert png[:8] == PNG and len(png) > 20_000
    assert snap.empty == ["Empty"] and snap.failed == ["Broken: bad_data: parse error"]
    assert [p.title for p in snap.data_panels] == [
        "Stacked",
        "Lines with a threshold",
        "Stat",
        "Heatmap",
        "Empty",
        "Broken",
    ]


def test_render_refuses_bad_arguments_before_querying(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A range that ends before it starts, or an unknown lane, is exit 2 with the flag named."""
    base = ["dashboards", "render", "--prometheus", "http://127.0.0.1:9", "--out", str(tmp_path)]
    assert main([*base, "--start", "2025-01-02T00:00Z", "--end", "2025-01-01T00:00Z"]) == 2
    assert "--start" in capsys.readouterr().err
    assert main([*base, "--lane", "nope"]) == 2
    assert "--lane nope" in capsys.readouterr().err
    assert main(["dashboards"]) == 2
    assert "--out" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
