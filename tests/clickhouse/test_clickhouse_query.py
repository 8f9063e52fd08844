"""`vllm-obs query` on ClickHouse gives the same answers as on the same events in local files.

Both engines compute exact percentiles, interpolated linearly between the two
nearest ranks. Counts, ratios and strings agree exactly. A timing may differ by
one unit in its last printed digit (0.001 ms): ClickHouse 18.16's text parser
reads some decimals one binary digit off (1.253 as 1.2530000000000001), which
moves a value sitting exactly on a rounding boundary.
"""

from __future__ import annotations

import csv
import io
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from obs.clickhouse.schema import TableSpec, init
from obs.clickhouse.testing import ClickHouseServer
from obs.events import Event
from obs.query.clickhouse_load import load
from obs.query.testing import event, mixed_events, ts, write_jsonl

LANES = ("chat", "rag", "batch", "canary")
STATUSES = ("ok",) * 8 + ("error", "rejected", "client_error", "client_disconnect")


def random_events(n: int, seed: int) -> list[Event]:
    """``n`` varied events over two hours (every lane, status, stream mode, null timings)."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        status = rnd.choice(STATUSES)
        stream = rnd.random() < 0.7
        prefill = round(rnd.lognormvariate(5, 1), 3)
        decode = round(rnd.lognormvariate(6, 1), 3) if status == "ok" else 0.0
        at = rnd.uniform(0, 7200)
        out.append(
            event(
                ts=ts(at),
                config_fingerprint="c1c1c1c1" if at < 3600 else "c2c2c2c2",  # one config change
                lane=rnd.choice(LANES),
                pool=rnd.choice(("interactive", "bulk")),
                tenant=rnd.choice(("t1", "t2", None)),
                status=status,
                stream=stream,
                queue_ms=round(rnd.expovariate(0.5), 3),
                prefill_ms=prefill,
                decode_ms=decode,
                tpot_ms=round(rnd.uniform(5, 80), 3) if stream and status == "ok" else None,
                itl_p50_ms=round(rnd.uniform(5, 60), 3) if stream else None,
                cache_hit=rnd.choice((True, False, None)),
                prompt_tokens=rnd.randint(1, 4000),
                cached_tokens=rnd.choice((None, 0, 16, 64)),
                request_id=f"r{seed}-{i:05d}",
            )
        )
        if status in ("rejected", "client_error", "client_disconnect") and i % 5 == 0:
            out[-1].summarized = 2 + i % 39  # a summary record of a flood's refusals
    return out


@pytest.fixture(scope="module")
def both(
    clickhouse: ClickHouseServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """The same events as a JSONL log and as a ClickHouse table: (log path, clickhouse URL)."""
    d = tmp_path_factory.mktemp("equal")
    events = random_events(3000, 1) + mixed_events()
    log = write_jsonl(d / "events.jsonl", events)
    spec = TableSpec("equal", "events")
    client = clickhouse.client()
    init(client, spec)
    load(client, spec, [str(log)])
    host = clickhouse.url.removeprefix("http://")
    yield str(log), f"clickhouse://{host}/{spec.name}"


def _parse(text: str, fmt: str) -> list[dict[str, Any]]:
    if fmt == "json":
        doc = json.loads(text)
        return list(doc if isinstance(doc, list) else doc.get("rows", doc))
    return list(csv.DictReader(io.StringIO(text)))


def _same(column: str, a: Any, b: Any, timing_row: bool = False) -> bool:
    """Equal, except that a timing may differ by 0.001 ms (see the module doc) and a
    p-value or timing delta by float rounding."""
    if a == b:
        return True
    if a in (None, "") or b in (None, ""):
        return False
    if column.endswith("_ms") or (timing_row and column in ("before", "after", "delta")):
        return abs(float(a) - float(b)) <= 0.0010001
    if timing_row and column == "delta_pct":  # that 0.001 ms over a timing of ~100 ms or more
        return abs(float(a) - float(b)) <= 1e-5
    if column in ("p_value", "delta_pct"):
        return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))
    return False


def _query(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "obs.cli", "query", *args, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


CASES = [
    ("summary", "--format", "csv"),
    ("summary", "--by", "status", "--format", "json"),
    ("summary", "--by", "tenant", "--lane", "chat,rag", "--format", "csv"),
    (
        "summary",
        "--since",
        "2025-06-02T12:30:00",
        "--until",
        "2025-06-02T13:10:00.500",
        "--format",
        "csv",
    ),
    ("timeline", "--interval", "10m", "--format", "csv"),
    ("timeline", "--by", "lane", "--status", "ok,error", "--format", "json"),
    ("slowest", "-n", "15", "--format", "csv"),
    ("slowest", "--by", "ttft", "--pool", "bulk", "--format", "json"),
    (
        "compare",
        "--before",
        "2025-06-02T12:00..2025-06-02T13:00",
        "--after",
        "2025-06-02T13:00..",
        "--format",
        "csv",
    ),
    ("compare", "--around-changes", "--format", "csv"),
]


@pytest.mark.parametrize("args", CASES, ids=[" ".join(c) for c in CASES])
def test_same_output_on_files_and_clickhouse(both: tuple[str, str], args: tuple[str, ...]) -> None:
    """Each query prints the same rows for the log and for its ClickHouse table."""
    log, url = both
    cmd, *rest = args
    fmt = rest[rest.index("--format") + 1]
    ch, local = _parse(_query(cmd, url, *rest), fmt), _parse(_query(cmd, log, *rest), fmt)
    assert len(ch) == len(local) > 0
    for a, b in zip(ch, local, strict=True):
        assert a.keys() == b.keys()
        timing_row = str(a.get("metric", "")).endswith("_ms")
        for k in a:
            assert _same(k, a[k], b[k], timing_row), (k, a[k], b[k], a)


def _budget_doc(source: str, *args: str) -> dict[str, Any]:
    doc = json.loads(_query("budget", source, "--format", "json", *args))
    for e in doc["slos"]:
        for w in e["worst"]:
            assert w.pop("show").endswith(f"show {w['request_id']} {source}")
    return doc


@pytest.mark.parametrize("args", [(), ("--window", "30m", "--lane", "chat,rag")])
def test_budget_is_the_same_on_files_and_clickhouse(
    both: tuple[str, str], args: tuple[str, ...]
) -> None:
    """query budget attributes the same misses to the same phases and causes on either source."""
    log, url = both
    ch, local = _budget_doc(url, *args), _budget_doc(log, *args)
    assert ch.keys() == local.keys() and ch["until"] == local["until"]
    assert len(ch["slos"]) == len(local["slos"]) > 0
    assert sum(e["misses"] for e in local["slos"]) > 0
    for a, b in zip(ch["slos"], local["slos"], strict=True):
        assert _close(a, b), _diff(a, b)


def _diff(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    return [(k, a[k], b.get(k)) for k in a if not _close(a[k], b.get(k), k)]


def _close(a: Any, b: Any, key: str = "") -> bool:
    """Equal; ratios to 1e-9 relative (the engines sum in different orders), a timing to
    0.001 ms (see the module doc)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], k) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return False
        if key.endswith("_ms"):
            return abs(a - b) <= 0.0010001
        return abs(a - b) <= 1e-9 * max(1.0, abs(b))
    return bool(a == b)


def test_show_finds_the_same_event(both: tuple[str, str]) -> None:
    """show by id prefix prints the same event and waterfall from either source."""
    log, url = both
    for fmt in ("table", "json"):
        assert _query("show", "r1-00042", url, "--format", fmt) == _query(
            "show", "r1-00042", log, "--format", fmt
        )


def test_report_has_the_same_figures(both: tuple[str, str], tmp_path: Path) -> None:
    """report over ClickHouse draws the same figures and tables as over the log.

    PNG bytes may differ where a point moves by a last-digit float difference
    (see the module doc), so the figures are compared by name and the HTML by rows.
    """
    log, url = both
    _query("report", url, "--out", str(tmp_path / "ch"))
    _query("report", log, "--out", str(tmp_path / "log"))
    pngs = sorted(p.name for p in (tmp_path / "log").glob("*.png"))
    assert len(pngs) >= 4
    assert sorted(p.name for p in (tmp_path / "ch").glob("*.png")) == pngs
    html_ch = (tmp_path / "ch" / "report.html").read_text()
    html_log = (tmp_path / "log" / "report.html").read_text()
    assert html_ch.count("<tr>") == html_log.count("<tr>") > 10
    for lane in LANES:
        assert html_ch.count(f">{lane}<") == html_log.count(f">{lane}<") > 0


def test_export_refuses_clickhouse_with_one_line(both: tuple[str, str], tmp_path: Path) -> None:
    """export reads local logs only: a clickhouse:// URL is a one-line error, exit 2."""
    _, url = both
    out = subprocess.run(
        [sys.executable, "-m", "obs.cli", "query", "export", url, "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "export reads local logs only" in out.stderr
    assert out.stderr.count("\n") == 1


def test_clickhouse_url_errors_are_one_line(clickhouse: ClickHouseServer) -> None:
    """A missing table or a refused login: exit 2 and one line, no traceback, no secret."""
    host = clickhouse.url.removeprefix("http://")
    cmd = [sys.executable, "-m", "obs.cli", "query", "summary"]
    missing = subprocess.run(
        [*cmd, f"clickhouse://{host}/nope.events"], capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 2 and "nope.events does not exist" in missing.stderr
    env = {"PATH": "/usr/bin:/bin", "CLICKHOUSE_USER": "obs", "CLICKHOUSE_PASSWORD": "guess"}
    refused = subprocess.run(
        [*cmd, f"clickhouse://{host}/equal.events"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert refused.returncode == 2 and "authentication failed" in refused.stderr
    assert "guess" not in refused.stderr and refused.stderr.count("\n") == 1


def test_summary_records_count_as_their_requests_on_both(both: tuple[str, str]) -> None:
    """The requests summary counts equal the events' weights (summarized or 1), on either."""
    log, url = both
    events = random_events(3000, 1) + mixed_events()
    want = sum(e.summarized or 1 for e in events)
    for source in (log, url):
        rows = _parse(_query("summary", source, "--format", "json"), "json")
        assert sum(int(r["requests"]) for r in rows) == want
