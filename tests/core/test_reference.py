"""The README's reference tables are the ones the code generates."""

from __future__ import annotations

from pathlib import Path

from obs.reference import render

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_tables_match_the_code() -> None:
    """Event fields and metric names in the README equal what obs.reference generates."""
    text = README.read_text()
    assert "<!-- BEGIN GENERATED event-fields -->" in text
    assert "<!-- BEGIN GENERATED metrics -->" in text
    assert render(text) == text, "run: python -m obs.reference README.md"
