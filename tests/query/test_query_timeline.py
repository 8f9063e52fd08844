"""``query timeline``: per-interval numbers agree with bucketing the events by hand."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from obs.config import default_config_path, load_config
from obs.errors import InputError
from obs.query.filters import Filters
from obs.query.intervals import auto_interval, timeline
from obs.query.scan import Scan
from obs.query.testing import event, ts, write_jsonl
from tests.support import pct

pytestmark = pytest.mark.inproc

CONFIG = load_config(default_config_path())


def bucket(e_ts: str, seconds: int) -> datetime:
    t = datetime.fromisoformat(e_ts.replace("Z", "+00:00")).replace(tzinfo=None)
    epoch = datetime(1970, 1, 1)
    return epoch + timedelta(seconds=(int((t - epoch).total_seconds()) // seconds) * seconds)


def test_timeline_matches_hand_bucketing(mixed_log):
    """Per 2-minute interval: requests, rps, rates and percentiles equal a direct computation."""
    path, events = mixed_log
    table = timeline(Scan([path]), CONFIG, interval="2m")
    got = {r["start"]: r for r in table.records()}
    want: dict[datetime, list] = {}
    for e in events:
        want.setdefault(bucket(e.ts, 120), []).append(e)
    assert sorted(got) == sorted(want)
    for start, evs in want.items():
        row = got[start]
        assert row["requests"] == len(evs)
        assert row["rps"] == pytest.approx(len(evs) / 120)
        assert row["error_rate"] == pytest.approx(sum(e.status == "error" for e in evs) / len(evs))
        assert row["rejection_rate"] == pytest.approx(
            sum(e.status == "rejected" for e in evs) / len(evs)
        )
        ok_ttft = [e.ttft_ms for e in evs if e.status == "ok" and e.ttft_ms is not None]
        for q, col in ((0.5, "ttft_p50_ms"), (0.95, "ttft_p95_ms"), (0.99, "ttft_p99_ms")):
            want_v = pct(ok_ttft, q)
            assert row[col] == (pytest.approx(want_v, abs=1e-3) if want_v is not None else None)
        ok_e2e = [e.e2e_ms for e in evs if e.status == "ok"]
        assert row["e2e_p95_ms"] == pytest.approx(pct(ok_e2e, 0.95), abs=1e-3)


def test_timeline_by_lane_splits_each_interval(mixed_log):
    """--by lane gives one row per interval and lane, counts adding up to the interval's."""
    path, events = mixed_log
    table = timeline(Scan([path]), CONFIG, interval="5m", by="lane")
    for rec in table.records():
        n = sum(1 for e in events if e.lane == rec["lane"] and bucket(e.ts, 300) == rec["start"])
        assert rec["requests"] == n


def test_empty_intervals_are_filled_with_zero_requests(tmp_path: Path):
    """An interval without traffic inside the span appears with zero requests."""
    evs = [event(lane="chat", ts=ts(0)), event(lane="chat", ts=ts(185))]
    path = write_jsonl(tmp_path / "e.jsonl", evs)
    table = timeline(Scan([str(path)]), CONFIG, interval="1m")
    assert table.values("requests") == [1, 0, 0, 1]
    assert table.values("rps")[1] == 0.0 and table.values("ttft_p50_ms")[1] is None


def test_automatic_interval_keeps_at_most_100_buckets():
    """Auto intervals are the shortest nice length giving <= 100 buckets."""
    assert auto_interval(timedelta(minutes=7)) == 5
    assert auto_interval(timedelta(days=1)) == 900
    assert auto_interval(timedelta(days=7)) == 7200
    assert auto_interval(timedelta(0)) == 1


def test_auto_interval_uses_the_filter_window_when_given(mixed_log):
    """With --since and --until the interval is chosen from that window (no extra pass)."""
    path, _ = mixed_log
    f = Filters.parse(since="2025-06-02T12:00:00", until="2025-06-02T12:10:00")
    starts = timeline(Scan([path], f), CONFIG).values("start")
    assert (starts[1] - starts[0]) == timedelta(seconds=10)


def test_bad_interval_is_an_input_error(mixed_log):
    """Sub-second or malformed intervals are refused with a message."""
    path, _ = mixed_log
    with pytest.raises(InputError):
        timeline(Scan([path]), CONFIG, interval="500ms")
    with pytest.raises(InputError):
        timeline(Scan([path]), CONFIG, interval="soon")
