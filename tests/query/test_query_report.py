"""``query report``: a self-contained HTML file with embedded plots, and the PNG files."""

from __future__ import annotations

import base64
import re
from pathlib import Path

from obs.config import default_config_path, load_config
from obs.query.html_report import report
from obs.query.scan import Scan
from obs.query.testing import mixed_events, write_jsonl

CONFIG = load_config(default_config_path())
PNG = b"\x89PNG\r\n\x1a\n"


def test_report_embeds_every_figure_and_writes_it_beside(tmp_path: Path):
    """Each figure is inline base64 PNG in the HTML and an identical PNG file in the folder."""
    log = write_jsonl(tmp_path / "e.jsonl", mixed_events())
    path = report(Scan([str(log)]), CONFIG, tmp_path / "out", title="Incident 42")
    doc = path.read_text()
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', doc)
    files = sorted((tmp_path / "out").glob("*.png"))
    assert {f.stem for f in files} == {"ttft", "itl", "phases", "timeline", "slo"}
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
