"""The recorded traffic read through the query layer: per-interval counts and a bounded shape
sample, the same from JSONL and Parquet."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from obs.config import load_config
from obs.plan.source import bin_seconds, read_traffic
from obs.query.parquet import copy_dataset
from obs.query.scan import Scan
from obs.query.testing import event, ts, write_jsonl

pytestmark = pytest.mark.inproc

CONFIG = Path(__file__).resolve().parents[2] / "obs" / "data" / "lanes.yaml"


def _events() -> list:
    """Chat: 30 in the first 10 s, 5 in the next; rag: 12 late; one client error, one
    refusal; a lane the config does not know."""
    out = []
    for i in range(30):
        out.append(event(ts=ts(i / 3), lane="chat", pool="interactive", prompt_tokens=100 + i,
                         completion_tokens=20, max_tokens=64, cached_tokens=32,
                         prefix_fingerprint="abc"))  # fmt: skip
    for i in range(5):
        out.append(event(ts=ts(10 + i), lane="chat", pool="interactive", prompt_tokens=50,
                         completion_tokens=5, stream=False))  # fmt: skip
    for i in range(12):
        out.append(event(ts=ts(25 + i / 4), lane="rag", pool="interactive", prompt_tokens=3000,
                         completion_tokens=80))  # fmt: skip
    out.append(event(ts=ts(1), lane="chat", pool="interactive", status="client_error"))
    out.append(event(ts=ts(2), lane="chat", pool="interactive", status="rejected"))
    out.append(event(ts=ts(3), lane="canary", pool="interactive", prompt_tokens=1,
                     completion_tokens=1))  # fmt: skip
    return out


def test_counts_per_interval_exclude_client_errors_and_keep_refusals(tmp_path: Path) -> None:
    """Each lane's offered requests land in their 10 s interval; a client error is not offered
    load, a refusal is (it was demand); shapes come from served requests only."""
    log = write_jsonl(tmp_path / "events.jsonl", _events())
    t = read_traffic([str(log)], load_config(CONFIG), progress=False)
    assert t.bin_s == 10.0
    chat, rag = t.lanes["chat"], t.lanes["rag"]
    assert chat.offered == 36 and chat.served == 35 and len(chat.shapes) == 35
    assert chat.counts[:2] == [31, 5] and sum(rag.counts) == 12
    assert {s.prefix for s in chat.shapes} == {"abc", None}
    assert "canary" not in t.lanes and t.events == 49
    assert not t.sampled


def test_parquet_reads_the_same_traffic_as_jsonl(tmp_path: Path) -> None:
    """The same events exported to a Parquet dataset give the same counts and shapes."""
    log = write_jsonl(tmp_path / "events.jsonl", _events())
    out = tmp_path / "dataset"
    scan = Scan([str(log)], progress=False)
    copy_dataset(
        duckdb.connect(), f"(SELECT * FROM {scan.source} WHERE request_id IS NOT NULL)", out
    )
    config = load_config(CONFIG)
    a = read_traffic([str(log)], config, progress=False)
    b = read_traffic([str(out)], config, progress=False)
    for name in a.lanes:
        assert a.lanes[name].counts == b.lanes[name].counts
        assert sorted(a.lanes[name].shapes, key=repr) == sorted(b.lanes[name].shapes, key=repr)


def test_the_shape_sample_is_bounded_and_said(tmp_path: Path) -> None:
    """With room for 10 shapes per lane, chat's 35 served requests are sampled (about 10
    kept, by a hash of the request id) and the traffic says it was sampled."""
    log = write_jsonl(tmp_path / "events.jsonl", _events())
    t = read_traffic([str(log)], load_config(CONFIG), sample=10, progress=False)
    assert t.sampled and 1 <= len(t.lanes["chat"].shapes) <= 20
    assert t.lanes["chat"].offered == 36  # counts are never sampled


def test_a_window_keeps_the_last_stretch(tmp_path: Path) -> None:
    """--window 15s keeps what came in the 15 s up to the last event (27.75 s): chat's two
    at 13 and 14 s, rag's twelve."""
    log = write_jsonl(tmp_path / "events.jsonl", _events())
    t = read_traffic([str(log)], load_config(CONFIG), window_s=15, progress=False)
    assert t.lanes["chat"].offered == 2 and t.lanes["rag"].offered == 12


def test_intervals_grow_so_a_long_window_holds_at_most_two_thousand() -> None:
    """10 s intervals, or longer for long windows (a week: 303 s)."""
    assert bin_seconds(60) == 10 and bin_seconds(7 * 86400) == 303


@pytest.mark.process
def test_a_window_is_read_in_utc_whatever_the_local_zone(tmp_path: Path) -> None:
    """DuckDB hands back naive UTC times: under TZ=America/New_York the window still keeps
    the same events (a naive time read as local would move it by five hours)."""
    log = write_jsonl(tmp_path / "events.jsonl", _events())
    code = (
        "import sys; from obs.config import load_config; from obs.plan.source import "
        f"read_traffic; t = read_traffic([{str(log)!r}], load_config({str(CONFIG)!r}), "
        "window_s=15, progress=False); print(t.lanes['chat'].offered, t.lanes['rag'].offered)"
    )
    env = {**os.environ, "TZ": "America/New_York"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.split() == ["2", "12"], out.stderr
