"""The JSONL event exporter: whole lines, owner-only files, rotation, and failures counted."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from obs.events import Event
from obs.exporters.jsonl import JsonlExporter
from obs.phases import Clock
from obs.record import Finished
from obs.tracecontext import new_ids
from tests.support.probes import EventCounts

pytestmark = pytest.mark.inproc


def _finished(i: int) -> Finished:
    return Finished(Event(request_id=f"r{i}"), Clock(received=0, end=1), 0, new_ids(None))


def test_every_event_is_one_whole_line_after_shutdown(tmp_path: Path) -> None:
    """Each export becomes exactly one parseable line, all flushed at shutdown."""
    counts = EventCounts()
    exp = JsonlExporter(tmp_path / "ev.jsonl", counters=counts)
    for i in range(1000):
        exp.export(_finished(i))
    exp.force_flush()
    exp.shutdown()
    lines = (tmp_path / "ev.jsonl").read_bytes().splitlines()
    assert [orjson.loads(line)["request_id"] for line in lines] == [f"r{i}" for i in range(1000)]
    assert counts.written == 1000


def test_event_line_is_the_dict_of_its_fields() -> None:
    """An event's JSONL line (orjson writing the dataclass) is its ``to_dict`` in field order,
    whatever its fields hold."""
    ev = Event(request_id='r\u2028"x', lane="chat", http_status=200, e2e_ms=1.25)
    ev.ttft_ms, ev.cache_hit, ev.miss_slo = 0.1 + 0.2, False, "ttft,e2e"
    line = ev.to_json()
    assert line == orjson.dumps(ev.to_dict(), option=orjson.OPT_APPEND_NEWLINE)
    assert list(orjson.loads(line)) == list(ev.to_dict())


def test_event_line_holds_its_fields_alone() -> None:
    """An event given an attribute that is no field (it has a ``__dict__``) still writes its
    fields alone, in field order: the same line as without that attribute."""
    ev = Event(request_id="r", lane="chat")
    before = ev.to_json()
    ev.not_a_field = 1  # type: ignore[attr-defined]
    assert ev.to_json() == before
    assert "not_a_field" not in orjson.loads(ev.to_json())


def test_event_file_is_owner_only(tmp_path: Path) -> None:
    """The event log is created with mode 0600."""
    exp = JsonlExporter(tmp_path / "ev.jsonl")
    exp.export(_finished(0))
    exp.shutdown()
    assert stat.S_IMODE(os.stat(tmp_path / "ev.jsonl").st_mode) == 0o600


def test_rotation_keeps_backups_and_loses_nothing(tmp_path: Path) -> None:
    """Past max_bytes the log rotates to .1, .2...; no event is lost across rotations."""
    exp = JsonlExporter(tmp_path / "ev.jsonl", max_bytes=20_000, backups=50)
    for i in range(300):
        exp.export(_finished(i))
        if i % 50 == 0:
            exp.force_flush()
    exp.shutdown()
    files = sorted(tmp_path.glob("ev.jsonl*"))
    assert len(files) > 2
    ids = [orjson.loads(x)["request_id"] for f in files for x in f.read_bytes().splitlines()]
    assert sorted(ids) == sorted(f"r{i}" for i in range(300))
    # A file is rotated once it passes max_bytes; it may exceed it by at most one batch.
    assert all(f.stat().st_size <= 20_000 + 60_000 for f in files)


def test_unwritable_directory_counts_drops_and_keeps_running(tmp_path: Path) -> None:
    """When the log cannot be written, events are counted as dropped; export never raises."""
    target = tmp_path / "file-not-dir"
    target.write_text("x")
    counts = EventCounts()
    exp = JsonlExporter(target / "ev.jsonl", counters=counts)
    for i in range(10):
        exp.export(_finished(i))
    exp.force_flush()
    exp.shutdown()
    assert counts.dropped.get("io_error") == 10
    assert counts.written == 0


def test_rotation_never_lets_a_file_pass_its_limit(tmp_path: Path) -> None:
    """One 2,000-event batch against a 200 kB limit: every file stays within it (item 14)."""
    exp = JsonlExporter(tmp_path / "ev.jsonl", max_bytes=200_000, backups=50)
    for i in range(2000):
        exp.export(_finished(i))
    exp.shutdown()
    files = sorted(tmp_path.glob("ev.jsonl*"))
    assert len(files) > 2
    assert all(f.stat().st_size <= 200_000 for f in files)
    ids = [orjson.loads(x)["request_id"] for f in files for x in f.read_bytes().splitlines()]
    assert sorted(ids) == sorted(f"r{i}" for i in range(2000))


_FULL_DISK = """
import resource, sys
from obs.events import Event
from obs.exporters.jsonl import JsonlExporter
from obs.phases import Clock
from obs.record import Finished
from obs.tracecontext import new_ids

def f(i):
    return Finished(Event(request_id=f"r{i}"), Clock(received=0, end=1), 0, new_ids(None))

exp = JsonlExporter(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, resource.RLIM_INFINITY))
for i in range(1000):
    exp.export(f(i))
exp.force_flush()
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
for i in range(1000, 1005):
    exp.export(f(i))
exp.shutdown()
"""


@pytest.mark.process
def test_a_short_write_leaves_no_torn_line(tmp_path: Path) -> None:
    """A disk that takes half a line (file size limit): cut back, later events whole (item 14).

    The full disk is a file size limit (RLIMIT_FSIZE) on a child process: the same short
    write and EFBIG a full disk gives, without a disk to fill.
    """
    path = tmp_path / "ev.jsonl"
    subprocess.run([sys.executable, "-c", _FULL_DISK, str(path)], check=True, timeout=60)
    data = path.read_bytes()
    assert data.endswith(b"\n")
    ids = [orjson.loads(line)["request_id"] for line in data.splitlines()]
    assert ids[-5:] == [f"r{i}" for i in range(1000, 1005)]
    assert len(ids) == len(set(ids))


_SHORT_BATCH = """
import resource, sys
from obs.events import Event
from obs.exporters.jsonl import JsonlExporter
from obs.phases import Clock
from obs.record import Finished
from obs.tracecontext import new_ids

def f(i):
    return Finished(Event(request_id=f"r{i}"), Clock(received=0, end=1), 0, new_ids(None))

line = len(f(0).event.to_json())
exp = JsonlExporter(sys.argv[1], flush_interval_s=60)
resource.setrlimit(resource.RLIMIT_FSIZE, (50 * line + line // 2, resource.RLIM_INFINITY))
for i in range(150):
    exp.export(f(i))
exp.force_flush()
print(len(open(sys.argv[1], "rb").read().splitlines()), flush=True)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
exp.export(f(150))
exp.shutdown()
"""


@pytest.mark.process
def test_a_short_write_keeps_the_lines_that_fit_and_spools_the_rest(tmp_path: Path) -> None:
    """150 events in one batch where 50 fit: those 50 are kept at once, the other 100 are
    written, in order, once the disk takes them again (issue 25)."""
    path = tmp_path / "ev.jsonl"
    out = subprocess.run(
        [sys.executable, "-c", _SHORT_BATCH, str(path)],
        check=True, timeout=60, capture_output=True, text=True,
    )  # fmt: skip
    assert [x for x in out.stdout.splitlines() if x.isdigit()] == ["50"]  # beside the log line
    ids = [orjson.loads(line)["request_id"] for line in path.read_bytes().splitlines()]
    assert ids == [f"r{i}" for i in range(151)]
