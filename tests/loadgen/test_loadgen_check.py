"""Joining client records with sidecar events: missing requests and measured differences."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from obs.cli import main as cli_main
from obs.errors import InputError
from obs.events import Event
from obs.loadgen.check import Distribution, check, check_files
from obs.loadgen.records import Record, RecordWriter


def _records() -> list[Record]:
    """Five client records of run lg-a; #3 failed to connect, #4 was not streamed."""
    recs = []
    for i in range(5):
        recs.append(
            Record(
                run_id="lg-a",
                request_id=f"lg-a-{i:06d}",
                client_class="chat",
                index=i,
                http_status=200,
                ttft_ms=100.0 + i,
                e2e_ms=500.0 + i,
                completion_tokens=10,
                tokens_source="usage",
            )
        )
    recs[3].http_status, recs[3].status, recs[3].ttft_ms = None, "error", None
    recs[4].ttft_ms, recs[4].stream = None, False
    return recs


def _events() -> list[dict[str, Any]]:
    """Sidecar events: #0-#2 and #4 (not #3), an unknown lg-a id, and other traffic."""
    shapes = {0: (98.0, 10, 200), 1: (99.5, 10, 200), 2: (103.0, 12, 503), 4: (None, 10, 200)}
    evs = [
        Event(
            request_id=f"lg-a-{i:06d}",
            ttft_ms=ttft,
            e2e_ms=495.0 + i,
            completion_tokens=tokens,
            http_status=status,
        ).to_dict()
        for i, (ttft, tokens, status) in shapes.items()
    ]
    evs.append(Event(request_id="lg-a-000009", e2e_ms=1.0).to_dict())
    evs.append(Event(request_id="someone-else-1").to_dict())
    evs.append(Event(request_id="lg-a-000001").to_dict())  # a duplicate
    return evs


def test_join_reports_missing_requests_on_both_sides() -> None:
    """Records without events and this run's events without records are both listed."""
    report = check([r.to_dict() for r in _records()], _events())
    assert report.missing_in_events == ("lg-a-000003",)
    assert report.missing_in_records == ("lg-a-000009",)
    assert report.duplicate_events == ("lg-a-000001",)
    assert (report.records, report.matched, report.other_events) == (5, 4, 1)
    assert report.events == 6 and not report.ok


def test_join_reports_ttft_e2e_token_and_status_differences() -> None:
    """Differences are client minus sidecar, over the pairs where both sides measured."""
    report = check([r.to_dict() for r in _records()], _events())
    assert report.ttft_diff_ms == Distribution.of([2.0, 1.5, -1.0])
    assert report.ttft_diff_ms is not None and report.ttft_diff_ms.count == 3
    assert report.e2e_diff_ms is not None and {report.e2e_diff_ms.min} == {5.0}
    assert report.token_diff == Distribution.of([0, 0, -2, 0])
    assert [(m.request_id, m.client, m.sidecar) for m in report.token_mismatches] == [
        ("lg-a-000002", 10, 12)
    ]
    assert [(m.request_id, m.client, m.sidecar) for m in report.status_mismatches] == [
        ("lg-a-000002", 200, 503)
    ]


def test_complete_join_is_ok_and_renders() -> None:
    """When every request is on both sides the report is ok and says so."""
    recs = [r.to_dict() for r in _records()[:3]]
    evs = [e for e in _events() if e["request_id"] in {r["request_id"] for r in recs}]
    report = check(recs, evs)
    assert report.ok and report.to_dict()["ok"] is True
    text = report.render()
    assert "missing from the sidecar's events: 0" in text and text.endswith("OK")


def test_distribution_percentiles() -> None:
    """Distribution.of gives count, mean, nearest-rank percentiles and extremes."""
    d = Distribution.of([float(v) for v in range(1, 101)])
    assert d == Distribution(100, 50.5, 50.0, 95.0, 99.0, 1.0, 100.0)
    assert Distribution.of([]) is None


def _write(tmp_path: Path) -> tuple[Path, Path]:
    rec_path, ev_path = tmp_path / "records.jsonl", tmp_path / "events.jsonl"
    with RecordWriter(rec_path) as w:
        for r in _records():
            w.write(r)
    ev_path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in _events()))
    return rec_path, ev_path


def test_check_files_waits_for_late_events(tmp_path: Path) -> None:
    """check_files rereads the events until complete or out of time (injected clock)."""
    rec_path, ev_path = _write(tmp_path)
    now = [0.0]
    waits: list[float] = []

    def sleep(s: float) -> None:
        waits.append(s)
        now[0] += s
        if len(waits) == 2:  # the late event arrives
            with ev_path.open("ab") as f:
                f.write(Event(request_id="lg-a-000003").to_json())

    report = check_files(rec_path, ev_path, wait_s=5, clock=lambda: now[0], sleep=sleep)
    assert report.missing_in_events == () and len(waits) == 2


def test_check_files_names_a_bad_line(tmp_path: Path) -> None:
    """A corrupt line in the middle of a file is an InputError naming file and line."""
    rec_path, ev_path = _write(tmp_path)
    ev_path.write_bytes(b'{"request_id": "x"}\nnot json\n{}\n')
    with pytest.raises(InputError, match=r"events.jsonl:2: not valid JSON"):
        check_files(rec_path, ev_path)


def test_cli_check_exits_non_zero_when_requests_are_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`vllm-obs load check` prints the report and exits 1 when requests are missing."""
    rec_path, ev_path = _write(tmp_path)
    assert cli_main(["load", "check", str(rec_path), str(ev_path)]) == 1
    assert "FAILED: requests missing" in capsys.readouterr().out
    assert cli_main(["load", "check", str(rec_path), str(ev_path), "--json"]) == 1
    data = orjson.loads(capsys.readouterr().out)
    assert data["ok"] is False and data["missing_in_events"] == ["lg-a-000003"]
    with ev_path.open("ab") as f:
        f.write(Event(request_id="lg-a-000003").to_json())
        f.write(Event(request_id="lg-a-000003").to_json())
    rec_path.write_bytes(rec_path.read_bytes() + Record(request_id="lg-a-000009").to_json())
    assert cli_main(["load", "check", str(rec_path), str(ev_path)]) == 0


def test_every_record_field_is_documented() -> None:
    """docs/load.md has a row for every record field."""
    from obs.loadgen.records import field_docs

    doc = (Path(__file__).parents[2] / "docs" / "load.md").read_text()
    assert [n for n, _, _ in field_docs() if f"| `{n}` |" not in doc] == []
