"""The reference tables of docs/reference.md are the ones the code generates."""

from __future__ import annotations

from pathlib import Path

import pytest

from obs.reference import main, render

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"


def test_reference_tables_match_the_code() -> None:
    """The four generated tables in docs/reference.md equal what obs.reference makes now."""
    text = REFERENCE.read_text()
    assert "<!-- BEGIN GENERATED event-fields -->" in text
    assert "<!-- BEGIN GENERATED metrics -->" in text
    assert "<!-- BEGIN GENERATED engines -->" in text
    assert "<!-- BEGIN GENERATED engine-events -->" in text
    assert render(text) == text, "run: python -m obs.reference docs/reference.md"


def test_a_missing_file_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A path that does not exist: exit 2 and one line naming it on stderr, no traceback."""
    assert main([str(tmp_path / "nope.md")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope.md" in err and "Traceback" not in err
