"""Time and dimension filters, SQL rendering, and result rendering."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta

import pytest

from obs.durations import parse_duration, parse_time
from obs.errors import InputError
from obs.query.filters import Filters
from obs.query.progress import Progress
from obs.query.table import Table, render

NOW = datetime(2025, 6, 2, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "text, want",
    [
        ("30m", datetime(2025, 6, 2, 11, 30)),
        ("2h", datetime(2025, 6, 2, 10, 0)),
        ("1d", datetime(2025, 6, 1, 12, 0)),
        ("90s", datetime(2025, 6, 2, 11, 58, 30)),
        ("2025-06-01", datetime(2025, 6, 1)),
        ("2025-06-01T10:15", datetime(2025, 6, 1, 10, 15)),
        ("2025-06-01T10:15:00Z", datetime(2025, 6, 1, 10, 15)),
        ("2025-06-01T12:15:00+02:00", datetime(2025, 6, 1, 10, 15)),
        ("2025-06-01 10:15:00.250", datetime(2025, 6, 1, 10, 15, 0, 250000)),
    ],
)
def test_parse_time_reads_relative_and_absolute_times_as_naive_utc(text, want):
    """Relative times count back from now; absolute ones convert offsets to UTC."""
    assert parse_time(text, NOW) == want


def test_bad_times_and_durations_name_the_accepted_forms():
    """Unparseable input raises InputError with an example of what works."""
    with pytest.raises(InputError, match="ISO 8601"):
        parse_time("yesterday", NOW)
    with pytest.raises(InputError, match="30m"):
        parse_duration("5 minutes")
    assert parse_duration("1w") == timedelta(days=7)


def test_filters_validate_status_and_window():
    """Unknown statuses and an empty window are refused."""
    with pytest.raises(InputError, match="statuses are"):
        Filters.parse(status=["failed"])
    with pytest.raises(InputError, match="not before"):
        Filters.parse(since="2025-06-02", until="2025-06-01")


def test_filters_render_quoted_sql():
    """Values are split on commas, de-duplicated and quoted; quotes cannot break out."""
    f = Filters.parse(lane=["chat,rag", "chat"], tenant=["o'brien"], since="2025-06-02")
    sql = f.to_sql()
    assert "lane IN ('chat', 'rag')" in sql
    assert "tenant IN ('o''brien')" in sql
    assert "ts >= TIMESTAMP '2025-06-02 00:00:00'" in sql
    assert Filters().to_sql() == "TRUE"
    assert "lane chat, rag" in f.describe()


def test_render_formats():
    """table aligns and humanises, markdown pipes, csv is raw, json keeps types."""
    t = Table(["lane", "error_rate", "p95_ms", "met"], [("chat", 0.0125, 1234.5678, True)])
    text = render(t)
    assert "1.25%" in text and "1234.6" in text and "yes" in text
    assert render(t, "markdown").splitlines()[0] == "| lane | error_rate | p95_ms | met |"
    assert render(t, "csv").splitlines()[1] == "chat,0.0125,1234.5678,True"
    assert json.loads(render(t, "json")) == [
        {"lane": "chat", "error_rate": 0.0125, "p95_ms": 1234.5678, "met": True}
    ]
    assert render(Table(["lane"], []), "table") == "(no matching events)\n"


class _FakeConnection:
    """Stands in for DuckDB's connection: only query_progress() is called from the thread."""

    def query_progress(self) -> float:
        return 42.0


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.inproc
def test_progress_draws_only_on_a_terminal():
    """A terminal gets a redrawn percentage line that is cleared at the end; a pipe gets nothing."""
    import time

    tty = _Tty()
    with Progress(_FakeConnection(), "scanning x", stream=tty, delay_s=0.0, interval_s=0.01):
        time.sleep(0.1)
    assert "scanning x:  42.0%" in tty.getvalue() and tty.getvalue().endswith("\r\033[K")
    pipe = io.StringIO()
    with Progress(_FakeConnection(), "scanning x", stream=pipe, delay_s=0.0):
        time.sleep(0.05)
    assert pipe.getvalue() == ""
