"""Reading logs: globs, rotation, gzip, Parquet datasets, malformed and truncated lines."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from obs.config import default_config_path, load_config
from obs.errors import InputError
from obs.query.aggregate import summary
from obs.query.filters import Filters
from obs.query.inputs import resolve, truncated_tail
from obs.query.parquet import export
from obs.query.scan import Scan
from obs.query.testing import event, mixed_events, ts, write_jsonl

pytestmark = pytest.mark.inproc

CONFIG = load_config(default_config_path())


def requests_by_lane(paths: list[str], filters: Filters | None = None) -> dict[str, int]:
    table = summary(Scan(paths, filters), CONFIG)
    return dict(zip(table.values("lane"), table.values("requests"), strict=True))


def test_rotated_and_gzipped_files_read_like_one_log(tmp_path: Path):
    """events.jsonl + .1 + .2.gz, given as a quoted glob, read every event once."""
    events = mixed_events()
    write_jsonl(tmp_path / "events.jsonl", events[:10])
    write_jsonl(tmp_path / "events.jsonl.1", events[10:20])
    write_jsonl(tmp_path / "events.jsonl.2.gz", events[20:], compress=True)
    (tmp_path / "whole").mkdir()
    whole = write_jsonl(tmp_path / "whole" / "all.jsonl", events)
    got = requests_by_lane([str(tmp_path / "events.jsonl*")])
    assert got == requests_by_lane([str(whole)])
    assert sum(got.values()) == len(events)


def test_directory_input_reads_its_jsonl_files(tmp_path: Path):
    """A directory argument means every JSONL file below it."""
    events = mixed_events()
    (tmp_path / "a").mkdir()
    write_jsonl(tmp_path / "a" / "x.jsonl", events[:5])
    write_jsonl(tmp_path / "a" / "y.ndjson.gz", events[5:], compress=True)
    (tmp_path / "a" / "notes.txt").write_text("not a log\n")
    inputs = resolve([str(tmp_path / "a")])
    assert [os.path.basename(f) for f in inputs.jsonl] == ["x.jsonl", "y.ndjson.gz"]
    assert sum(requests_by_lane([str(tmp_path / "a")]).values()) == len(events)


@pytest.mark.parametrize("bad", ["missing.jsonl", "nothing-*.jsonl"])
def test_missing_inputs_raise_input_error(tmp_path: Path, bad: str):
    """A path or glob that names no file is an InputError naming it."""
    with pytest.raises(InputError, match=r"missing|matches no file"):
        resolve([str(tmp_path / bad)])


def test_empty_directory_is_an_input_error(tmp_path: Path):
    """A directory with no event files says so."""
    with pytest.raises(InputError, match=r"no \.jsonl or \.parquet"):
        resolve([str(tmp_path)])


def test_malformed_lines_are_counted_per_file_and_skipped(tmp_path: Path):
    """Bad JSON, arrays, objects without request_id are skipped and counted; blank lines ignored."""
    events = mixed_events()
    a = write_jsonl(
        tmp_path / "a.jsonl",
        events[:10],
        extra_lines=[b'{"request_id": "x", broken', b"[1, 2]", b"", b'{"lane": "chat"}'],
    )
    b = write_jsonl(tmp_path / "b.jsonl", events[10:], extra_lines=[b"garbage"])
    scan = Scan([str(a), str(b)])
    table = summary(scan, CONFIG)
    assert sum(table.values("requests")) == len(events)
    assert scan.report.malformed == {str(a): 3, str(b): 1}
    assert scan.report.truncated == ()
    assert any("skipped 3 malformed lines" in m for m in scan.report.messages())


def test_truncated_last_line_is_reported_not_counted_as_malformed(tmp_path: Path):
    """A last line cut short (no newline, invalid JSON) is skipped and reported as truncated."""
    events = mixed_events()
    tail = events[0].to_json()[:40]
    path = write_jsonl(tmp_path / "live.jsonl", events, truncated_tail=tail)
    assert truncated_tail(str(path))
    scan = Scan([str(path)])
    assert sum(summary(scan, CONFIG).values("requests")) == len(events)
    assert scan.report.truncated == (str(path),)
    assert scan.report.malformed.get(str(path), 0) == 0
    assert any("truncated last line" in m for m in scan.report.messages())


def test_truncated_tail_detected_inside_gzip(tmp_path: Path):
    """A gzipped log whose last line was cut is detected as truncated too."""
    events = mixed_events()
    path = write_jsonl(tmp_path / "old.jsonl.gz", events, compress=True, truncated_tail=b'{"req')
    assert truncated_tail(str(path))
    scan = Scan([str(path)])
    summary(scan, CONFIG)
    assert scan.report.truncated == (str(path),)


def test_complete_last_line_without_newline_is_an_event(tmp_path: Path):
    """A final complete JSON object lacking its newline is read, not reported."""
    events = mixed_events()
    path = write_jsonl(tmp_path / "e.jsonl", events[:-1], truncated_tail=events[-1].to_json()[:-1])
    assert not truncated_tail(str(path))
    scan = Scan([str(path)])
    assert sum(summary(scan, CONFIG).values("requests")) == len(events)
    assert scan.report.messages() == []


def test_wrong_typed_field_reads_as_null(tmp_path: Path):
    """A field of the wrong type does not drop the event: that field reads as null."""
    line = (
        event(lane="chat", queue_ms=5.0).to_json().replace(b'"tpot_ms":null', b'"tpot_ms":"fast"')
    )
    path = write_jsonl(tmp_path / "e.jsonl", [], extra_lines=[line])
    table = summary(Scan([str(path)]), CONFIG)
    assert table.values("requests") == [1]
    assert table.values("tpot_p50_ms") == [None]


def test_offsets_in_timestamps_are_honoured(tmp_path: Path):
    """A ts written with a +02:00 offset is placed at its UTC instant."""
    e1 = event(lane="chat", ts="2025-06-02T14:00:30.000+02:00")
    e2 = event(lane="chat", ts=ts(3600))
    path = write_jsonl(tmp_path / "e.jsonl", [e1, e2])
    f = Filters.parse(since="2025-06-02T12:00:00", until="2025-06-02T12:01:00")
    assert requests_by_lane([str(path)], f) == {"chat": 1}


def test_parquet_export_round_trips_and_partitions_by_date_and_lane(tmp_path: Path):
    """export writes date=/lane= partitions; summary over them equals summary over the JSONL."""
    events = [*mixed_events(), event(lane="chat", ts=ts(86400), queue_ms=1.0, prefill_ms=9.0)]
    log = write_jsonl(tmp_path / "e.jsonl", events)
    out = tmp_path / "ds"
    result = export(Scan([str(log)]), out)
    assert result["events"] == len(events)
    parts = sorted(p.relative_to(out).parent.as_posix() for p in out.rglob("*.parquet"))
    assert "date=2025-06-02/lane=chat" in parts and "date=2025-06-03/lane=chat" in parts
    from_json = summary(Scan([str(log)]), CONFIG).records()
    from_parquet = summary(Scan([str(out)]), CONFIG).records()
    assert from_parquet == from_json
    f = Filters.parse(lane=["rag"], since="2025-06-02T12:00:00")
    assert requests_by_lane([str(out)], f) == requests_by_lane([str(log)], f)


def test_export_refuses_a_non_empty_directory_unless_appending(tmp_path: Path):
    """A second export into the same directory needs --append, which then adds events."""
    log = write_jsonl(tmp_path / "e.jsonl", mixed_events())
    out = tmp_path / "ds"
    export(Scan([str(log)]), out)
    with pytest.raises(InputError, match="--append"):
        export(Scan([str(log)]), out)
    export(Scan([str(log)], Filters.parse(lane=["batch"])), out, append=True)
    assert requests_by_lane([str(out)])["batch"] == 2 * requests_by_lane([str(log)])["batch"]


def test_jsonl_and_parquet_inputs_combine(tmp_path: Path):
    """Parquet and JSONL inputs in one query are read together."""
    events = mixed_events()
    a = write_jsonl(tmp_path / "a.jsonl", events[:14])
    b = write_jsonl(tmp_path / "b.jsonl", events[14:])
    export(Scan([str(b)]), tmp_path / "ds")
    both = requests_by_lane([str(a), str(tmp_path / "ds")])
    assert both == requests_by_lane([str(a), str(b)])
