"""Hand-made logs dated where no sidecar writes (issue 63): a line dated 9999-12-31 (or year 1)
is skipped as not an event and counted in the warning, through the CLI: ``query timeline`` and
``query report`` answer (before: an internal error, a datetime overflow) and ``plan`` replays
the real events' 100 s (before: a span of 2.5e11 s, still replaying after 200 s)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from obs.cli import main
from obs.config import default_config_path
from obs.query.testing import event, ts, write_jsonl

pytestmark = pytest.mark.inproc

WARNING = "skipped 2 malformed lines (not an event: unreadable, or dated before 2000"


@pytest.fixture
def forged(tmp_path: Path) -> Path:
    """200 chat requests over 100 s, one line dated 9999-12-31 and one dated year 1."""
    common = dict(lane="chat", pool="interactive", model="m", prompt_tokens=200)
    evs = [
        event(ts=ts(i * 0.5), prefill_ms=50.0, decode_ms=100.0, completion_tokens=50, **common)
        for i in range(200)
    ]
    for when in ("9999-12-31T23:59:59.000Z", "0001-01-01T00:00:00.000Z"):
        evs.append(event(ts=when, prefill_ms=50.0, completion_tokens=50, **common))
    return write_jsonl(tmp_path / "events.jsonl", evs)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_timeline_and_report_skip_and_count_forged_dates(
    forged: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The timeline's intervals hold the 200 real requests only, the report is written, and
    both warn of the two lines skipped."""
    rc, out, err = cli(capsys, "query", "timeline", str(forged), "--format", "json")
    assert rc == 0 and WARNING in err
    rows = json.loads(out)
    assert sum(r["requests"] for r in rows) == 200
    assert all(r["start"].startswith("2025-06-02") for r in rows)
    rc, _, err = cli(capsys, "query", "report", str(forged), "--out", str(tmp_path / "report"))
    assert rc == 0 and WARNING in err
    assert (tmp_path / "report" / "report.html").exists()


def test_plan_replays_only_the_real_span(
    forged: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``plan`` reads the 200 events over their own 100 s and warns of the two skipped."""
    out = tmp_path / "plan"
    config = str(default_config_path())
    rc, _, err = cli(capsys, "plan", str(forged), "--config", config, "--out", str(out))
    assert rc == 0, err[-2000:]
    assert "[plan] read 200 events" in err and "over 100 s" in err
    assert WARNING in err
    assert json.loads((out / "plan.json").read_text())["pools"]


def test_a_timeline_of_too_many_intervals_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Dates within the bounds, 25 years apart, at ``--interval 1s``: an error asking for a
    longer interval (802 million rows), not a timeline that never ends."""
    evs = [event(ts=ts(i)) for i in range(5)]
    evs.append(event(ts="2000-01-02T00:00:00.000Z"))
    path = write_jsonl(tmp_path / "events.jsonl", evs)
    rc, _, err = cli(capsys, "query", "timeline", str(path), "--interval", "1s")
    assert rc == 2
    assert "802,094,405 intervals of 1 s (at most 100,000): give a longer --interval" in err
