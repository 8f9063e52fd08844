"""``query compare --around-changes``: changes found from fingerprints, windows, the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from obs.cli import main
from obs.config import default_config_path, load_config
from obs.query.canary import HOLD, PROMOTE, ROLL_BACK, Verdict
from obs.query.changes import Change, around_changes, find_changes, verdicts, windows
from obs.query.filters import Filters
from obs.query.scan import Scan, connect
from obs.query.testing import T0, event, ts, write_jsonl

pytestmark = pytest.mark.inproc

CONFIG = load_config(default_config_path())
R = "http://10.0.0.1:8000"


def _log(path: Path) -> Path:
    """Settings A -> B at 100 s (TTFT 100 -> 300 ms, cache hits stop); config c1 -> c2 at 150 s."""
    events = []
    for i in range(200):
        after = i >= 100
        events.append(
            event(
                ts=ts(i),
                lane="chat",
                pool="gpu",
                replica=R,
                prefill_ms=300.0 + i % 7 if after else 100.0 + i % 7,
                cache_hit=not after,
                settings_fingerprint="bbbbbbbb" if after else "aaaaaaaa",
                config_fingerprint="c2c2c2c2" if i >= 150 else "c1c1c1c1",
            )
        )
    events.append(event(ts=ts(5), lane="chat", pool="gpu", replica=R))  # an older log line
    return write_jsonl(path, events)


def test_changes_are_found_per_replica_and_config(tmp_path):
    """Each first event under a new settings or config fingerprint is one change, in order."""
    scan = Scan(str(_log(tmp_path / "e.jsonl")), con=connect())
    got = find_changes(scan)
    assert [(c.at, c.what, c.last_before) for c in got] == [
        (ts_naive(100), f"replica {R} settings aaaaaaaa -> bbbbbbbb", ts_naive(99)),
        (ts_naive(150), "config c1c1c1c1 -> c2c2c2c2", ts_naive(149)),
    ]


def ts_naive(offset_s: float):
    from datetime import timedelta

    return (T0 + timedelta(seconds=offset_s)).replace(tzinfo=None)


def test_windows_have_equal_lengths_bounded_by_neighbours():
    """Before ends at the last old event, after starts at the change, both as long as the
    nearer of the pool's neighbouring changes (or the log's ends) allows."""
    a = Change("gpu", ts_naive(100), "x", last_before=ts_naive(90))  # a 10 s restart
    b = Change("gpu", ts_naive(150), "y", last_before=ts_naive(149))
    other = Change("cpu", ts_naive(120), "z")
    spans = {"gpu": (ts_naive(0), ts_naive(199)), "cpu": (ts_naive(110), ts_naive(300))}
    got = {ch.what: w for ch, *w in windows([a, other, b], spans)}
    assert got["x"] == [ts_naive(40.001), ts_naive(90.001), ts_naive(150)]
    assert got["z"] == [ts_naive(110), ts_naive(120), ts_naive(130)]
    assert got["y"] == [ts_naive(100), ts_naive(149.001), ts_naive(199.001)]


def test_around_changes_compares_ttft_and_cache_hits_either_side(tmp_path):
    """The settings change shows TTFT up and the cache-hit ratio down, both significant."""
    path = _log(tmp_path / "e.jsonl")
    con = connect()
    table = around_changes(
        Scan(str(path), con=con), lambda f: Scan(str(path), f, con=con), Filters(), CONFIG
    )
    named = [dict(zip(table.columns, r, strict=True)) for r in table.rows]
    rows = {(r["change"].split()[0], r["metric"]): r for r in named}
    ttft = rows[("replica", "ttft_p50_ms")]
    assert ttft["before"] == pytest.approx(103, abs=4) and ttft["after"] == pytest.approx(
        303, abs=4
    )
    assert ttft["significant"] is True
    hits = rows[("replica", "cache_hit_ratio")]
    assert (hits["before"], hits["after"], hits["significant"]) == (1.0, 0.0, True)
    assert rows[("replica", "requests")]["before"] == rows[("replica", "requests")]["after"] == 50
    assert rows[("config", "ttft_p50_ms")]["significant"] is False  # the config made no change


def test_cli_around_changes_json_and_errors(tmp_path, capsys):
    """The command prints every change's rows; with windows too it refuses in one line."""
    path = str(_log(tmp_path / "e.jsonl"))
    assert main(["query", "compare", path, "--around-changes", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["change"].split()[0] for r in rows} == {"replica", "config"}
    assert main(["query", "compare", path, "--around-changes", "--before", "..1h"]) != 0
    assert "--around-changes takes one log" in capsys.readouterr().err


def test_cli_prometheus_errors_are_one_line(tmp_path, capsys):
    """--prometheus needs --around-changes, and an unreachable Prometheus is one line."""
    path = str(_log(tmp_path / "e.jsonl"))
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens on loopback
    assert main(["query", "compare", path, "--before", "..1h", "--prometheus", closed]) != 0
    assert "--prometheus goes with --around-changes" in capsys.readouterr().err
    assert main(["query", "compare", path, "--around-changes", "--prometheus", closed]) != 0
    err = capsys.readouterr().err
    assert "127.0.0.1:9" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def _doubling_log(path: Path, factor: float = 2.0, n: int = 300) -> Path:
    """Settings A -> B at n s; the chat lane's TTFT (prefill) is ``factor`` times longer after."""
    events = [
        event(
            ts=ts(i),
            lane="chat",
            pool="gpu",
            replica=R,
            prefill_ms=(100.0 + i % 11) * (factor if i >= n else 1.0),
            settings_fingerprint="bbbbbbbb" if i >= n else "aaaaaaaa",
            config_fingerprint="c1c1c1c1",
        )
        for i in range(2 * n)
    ]
    return write_jsonl(path, events)


def _verdicts(path: Path) -> dict[str, Verdict]:
    con = connect()
    table = around_changes(
        Scan(str(path), con=con), lambda f: Scan(str(path), f, con=con), Filters(), CONFIG
    )
    return {v.lane: v for _, v in verdicts(table, CONFIG)}


def test_ttft_doubling_after_a_settings_change_says_roll_back(tmp_path):
    """p95 TTFT doubles after the change, beyond noise and the 15% margin: roll back."""
    found = _verdicts(_doubling_log(tmp_path / "e.jsonl"))
    chat = found["chat"]
    assert chat.verdict == ROLL_BACK
    assert any("p95 TTFT +100%" in r for r in chat.reasons)


def test_an_unchanged_pool_is_promoted_and_a_thin_one_held(tmp_path):
    """The same TTFT either side is promoted; 50 requests a side (under min_requests) hold."""
    same = _verdicts(_doubling_log(tmp_path / "a.jsonl", 1.0))["chat"]
    assert same.verdict == PROMOTE
    thin = _verdicts(_doubling_log(tmp_path / "b.jsonl", 1.0, n=50))["chat"]
    assert thin.verdict == HOLD


def test_cli_prints_the_verdict_under_the_table_and_in_json(tmp_path, capsys):
    """The table ends with each change's verdict and reasons; JSON rows carry the verdict."""
    path = str(_doubling_log(tmp_path / "e.jsonl"))
    assert main(["query", "compare", path, "--around-changes"]) == 0
    out = capsys.readouterr().out
    assert "settings aaaaaaaa -> bbbbbbbb: lane chat: ROLL BACK" in out
    assert "  - p95 TTFT +100% vs the baseline (margin 15%" in out
    assert main(["query", "compare", path, "--around-changes", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["verdict"] for r in rows if r["lane"] == "chat"} == {ROLL_BACK}
