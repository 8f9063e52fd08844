"""``query report``: a self-contained HTML file with embedded plots, and the PNG files."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from obs.config import default_config_path, load_config
from obs.query import plots
from obs.query.html_report import report
from obs.query.scan import Scan
from obs.query.testing import mixed_events, write_jsonl
from tests.query.test_query_incident import _burst

pytestmark = pytest.mark.inproc

CONFIG = load_config(default_config_path())
PNG = b"\x89PNG\r\n\x1a\n"


def test_report_embeds_every_figure_and_writes_it_beside(tmp_path: Path):
    """Each figure is inline base64 PNG in the HTML and an identical PNG file in the folder."""
    log = write_jsonl(tmp_path / "e.jsonl", mixed_events())
    path = report(Scan([str(log)]), CONFIG, tmp_path / "out", title="Incident 42")
    doc = path.read_text()
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', doc)
    files = sorted((tmp_path / "out").glob("*.png"))
    assert {f.stem for f in files} == {"incident", "ttft", "itl", "phases", "timeline", "slo"}
    assert len(embedded) == len(files)
    blobs = {base64.b64decode(b) for b in embedded}
    assert all(b.startswith(PNG) for b in blobs)
    assert blobs == {f.read_bytes() for f in files}
    assert "Incident 42" in doc and "http://" not in doc.replace("http://www.w3.org", "")


def test_report_tables_show_the_summary_and_slowest_requests(tmp_path: Path):
    """The HTML names every lane, the SLO verdicts, the slowest request ids and the incident
    draft (`query incident`) over its window."""
    events = mixed_events()
    log = write_jsonl(tmp_path / "e.jsonl", events)
    doc = report(Scan([str(log)]), CONFIG, tmp_path / "out").read_text()
    for lane in ("chat", "rag", "batch", "canary"):
        assert f"<th>{lane}</th>" in doc
    slowest = max(events, key=lambda e: e.e2e_ms)
    assert slowest.request_id in doc
    assert 'class="no"' in doc  # chat misses its SLOs in this log
    assert "<h2>Incident draft</h2>" in doc and "Lane chat missed its" in doc


def test_report_notes_skipped_lines(tmp_path: Path):
    """Malformed lines appear as a warning box in the report."""
    log = write_jsonl(tmp_path / "e.jsonl", mixed_events(), extra_lines=[b"not json"])
    doc = report(Scan([str(log)]), CONFIG, tmp_path / "out").read_text()
    assert "skipped 1 malformed line" in doc


def test_report_opens_with_what_happened(tmp_path: Path):
    """The first section after the title is the incident as `query incident` tells it (the
    trigger lane, its victims or that there were none, mechanism and lever) with
    every request's TTFT zoomed to its window; long lines wrap (pre-wrap), never scroll."""
    log = write_jsonl(tmp_path / "e.jsonl", mixed_events())
    doc = report(Scan([str(log)]), CONFIG, tmp_path / "out").read_text()
    first = doc.index("<h2>")
    assert doc.index("<h2>What happened</h2>") == first
    story = doc[first : doc.index("<h2>Summary per lane</h2>")]
    assert "Trigger: lane <b>rag</b> (tenant t1) sent 7 requests" in story
    assert "No other lane missed: rag alone." in story  # this log's lanes miss on their own
    assert "Mechanism: " in story and "Lever: " in story
    assert 'alt="TTFT around the incident"' in story
    assert "pre{white-space:pre-wrap" in doc


def test_attainment_draws_a_bar_for_a_lane_at_zero():
    """A lane that attained 0% gets a visible bar (the same chart without it differs)."""
    objectives: dict[str, list[float | None]] = {"ttft": [0.9, 0.9], "tpot": [0.9, 0.9]}
    with_zero = plots.attainment(["a", "b"], {"ttft": [0.0, 1.0], "tpot": [None, 0.0]}, objectives)
    without = plots.attainment(["a", "b"], {"ttft": [None, 1.0], "tpot": [None, 0.0]}, objectives)
    assert with_zero.startswith(PNG) and with_zero != without


def test_report_story_lists_the_victims_with_the_trigger_share(tmp_path: Path):
    """A burst of one lane's long prompts: the story's table names the victim lane, its
    misses and the share of its wait the trigger's requests were ahead."""
    log, config = _burst(tmp_path)
    doc = report(Scan([log]), load_config(config), tmp_path / "out").read_text()
    story = doc[doc.index("<h2>What happened</h2>") : doc.index("<h2>Summary per lane</h2>")]
    assert "Trigger: lane <b>batch</b> sent 20 requests (30000 prompt tokens)" in story
    assert "<th>batch ahead (share of wait)</th>" in story
    assert re.search(r"<tr><td>chat</td><td>10</td><td>120</td><td>(9\d|100)%</td>", story)
