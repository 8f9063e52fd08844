"""Rendering of the annotation templates as Prometheus does, and the YAML writer."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from obs.alerts.gotemplate import go_float, humanize, humanize_duration, render
from obs.alerts.writer import MARKER, dump, write


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0"), (0.5, "500m"), (1234567, "1.235M"), (95.00000000000001, "95"), (0.001234, "1.234m")],
)
def test_humanize_matches_prometheus(value: float, text: str) -> None:
    """humanize: 4 significant digits and an SI prefix, as Prometheus prints them."""
    assert humanize(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0s"),
        (0.49, "490ms"),
        (1.5, "1.5s"),
        (58.5, "58.5s"),
        (90, "1m 30s"),
        (3725, "1h 2m 5s"),
        (90061, "1d 1h 1m 1s"),
    ],
)
def test_humanize_duration_matches_prometheus(value: float, text: str) -> None:
    """humanizeDuration: sub-second prefixes, then d/h/m/s parts."""
    assert humanize_duration(value) == text


def test_render_substitutes_value_and_labels() -> None:
    """Each supported action renders; printf uses the given verb."""
    text = (
        'a {{ $value | humanizePercentage }} b {{ printf "%.1f" $value }} '
        "c {{ $labels.replica }} d {{ $value }}"
    )
    assert render(text, 0.172, {"replica": "r1"}) == "a 17.2% b 0.2 c r1 d 0.172"


def test_render_rejects_unknown_actions() -> None:
    """A template form the renderer does not know raises instead of passing silently."""
    with pytest.raises(ValueError, match="not supported"):
        render("{{ $value | humanize1024 }}", 1.0, {})


def test_go_float_formats_like_go() -> None:
    """Shortest digits; %e below 1e-4 and from 1e6 on, with two exponent digits."""
    values = (0.0, 1.0, 0.25, 1e-7, 3725.0, 1234567.0, 95.00000000000001)
    assert [go_float(v) for v in values] == [
        "0",
        "1",
        "0.25",
        "1e-07",
        "3725",
        "1.234567e+06",
        "95.00000000000001",
    ]


def test_humanize_percentage_is_four_significant_digits() -> None:
    """humanizePercentage prints value*100 with %.4g, never an SI prefix."""
    pct = "{{ $value | humanizePercentage }}"
    assert [render(pct, v, {}) for v in (0.95, 0.001234, 0.1)] == ["95%", "0.1234%", "10%"]


def test_dump_writes_multiline_promql_as_literal_blocks() -> None:
    """Multi-line strings become `|-` blocks and the file starts with the generated marker."""
    text = dump({"expr": "a\n/\nb", "x": "one line"}, "lanes.yaml")
    assert text.startswith(f"{MARKER} from lanes.yaml")
    assert "expr: |-\n  a\n  /\n  b\n" in text
    assert yaml.safe_load(text) == {"expr": "a\n/\nb", "x": "one line"}


def test_write_prunes_only_stale_generated_files(tmp_path: Path) -> None:
    """A generated file the new run no longer makes is removed; hand-written files stay."""
    write(tmp_path, {"old.rules.yml": {"groups": []}, "keep.rules.yml": {"groups": []}}, "a.yaml")
    (tmp_path / "mine.yml").write_text("groups: []\n", encoding="utf-8")
    written = write(tmp_path, {"keep.rules.yml": {"groups": []}}, "a.yaml")
    assert written == [tmp_path / "keep.rules.yml"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.rules.yml", "mine.yml"]


def test_range_query_block_renders_the_first_sample_or_the_else_text() -> None:
    """A `range query` block prints the sample's labels and value, or its else branch; a
    query the test did not supply raises rather than guessing."""
    text = (
        "top: {{ range query `topk(1, x)` }}{{ .Labels.phase }}/{{ .Labels.cause }} "
        '({{ printf "%.1f" .Value }}x){{ else }}none{{ end }}; burn {{ $value }}'
    )
    sample = ({"phase": "queue", "cause": "admission_queue"}, 12.96)
    assert render(text, 2.5, {}, {"topk(1, x)": sample}) == (
        "top: queue/admission_queue (13.0x); burn 2.5"
    )
    assert render(text, 2.5, {}, {"topk(1, x)": None}) == "top: none; burn 2.5"
    with pytest.raises(ValueError, match="topk"):
        render(text, 2.5, {})
