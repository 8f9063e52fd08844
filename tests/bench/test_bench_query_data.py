"""The query benchmarks' synthetic log stays a log of today's events (it drifted once: two
fields added to ``Event`` made every benchmark stop at its schema check)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from bench.query_bench import generate_jsonl
from obs.events import Event

ROOT = Path(__file__).resolve().parents[2]


def test_generated_events_have_every_event_field_and_load_back(tmp_path: Path) -> None:
    """Every generated line carries exactly Event's fields, in order, and loads into Event."""
    path = tmp_path / "events.jsonl"
    generate_jsonl(path, 200)
    lines = path.read_bytes().splitlines()
    assert len(lines) == 200
    names = [f for f in Event.__dataclass_fields__]
    for line in lines:
        row = orjson.loads(line)
        assert list(row) == names
        Event(**row)


@pytest.mark.process  # the CLI in a subprocess
def test_the_query_tool_summarises_the_generated_log(tmp_path: Path) -> None:
    """`vllm-obs query summary` reads the synthetic log whole: every event counted, none bad."""
    path = tmp_path / "events.jsonl"
    generate_jsonl(path, 500)
    cmd = [sys.executable, "-m", "obs.cli", "query", "summary", str(path), "--format", "json"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = orjson.loads(r.stdout)
    assert sum(row["requests"] for row in rows) == 500
    assert "malformed" not in r.stderr
