"""The ClickHouse event table: DDL from ``Event``, init, upgrades, and clear errors."""

from __future__ import annotations

import calendar
import subprocess
import sys
from dataclasses import fields
from datetime import UTC, datetime, timedelta, timezone

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from obs.clickhouse.client import ClickHouseError, Client, Credentials, error_text, split_table
from obs.clickhouse.rows import row
from obs.clickhouse.schema import COLUMNS, TS_MS, TableSpec, check, ddl, existing_columns, init
from obs.clickhouse.testing import PASSWORD_USER, ClickHouseServer
from obs.errors import ConfigError
from obs.events import Event


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "obs.cli", "clickhouse", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_columns_follow_event_fields() -> None:
    """Every Event field is a column of the mapped type, in order, plus ts_ms."""
    expected = {"str": "String", "int": "Int64", "float": "Float64", "bool": "UInt8"}
    names = [f.name for f in fields(Event)]
    assert list(COLUMNS) == [*names, TS_MS]
    for f in fields(Event):
        base = str(f.type).split("|")[0].strip()
        typ = "DateTime('UTC')" if f.name == "ts" else expected[base]
        assert COLUMNS[f.name] in (typ, f"Nullable({typ})"), f.name
        assert COLUMNS[f.name].startswith("Nullable") == ("None" in str(f.type)), f.name


def test_error_text_reads_old_and_new_formats() -> None:
    """Both 18.16's and current releases' error bodies give the message and code."""
    old = "Code: 60, e.displayText() = DB::Exception: Table t.x doesn't exist., e.what() = DB::"
    new = "Code: 60. DB::Exception: Table t.x does not exist. (UNKNOWN_TABLE) (version 24.3.1)"
    assert error_text(old) == ("Table t.x doesn't exist.", 60)
    assert error_text(new) == ("Table t.x does not exist. (UNKNOWN_TABLE)", 60)


@given(st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)))
def test_row_keeps_the_instant_to_the_millisecond(when: datetime) -> None:
    """ts (any offset) becomes a UTC DateTime text and the same instant in epoch ms."""
    when = when.replace(microsecond=when.microsecond // 1000 * 1000, tzinfo=UTC)
    shifted = when.astimezone(timezone(timedelta(hours=2)))
    line = row({"ts": shifted.isoformat(), "request_id": "r"})
    assert line is not None
    out = orjson.loads(line)
    assert out["ts"] == when.strftime("%Y-%m-%d %H:%M:%S")
    whole_s = calendar.timegm(when.utctimetuple())
    assert out[TS_MS] == whole_s * 1000 + when.microsecond // 1000


def test_bad_table_names_and_urls_are_one_line_errors() -> None:
    """DB.TABLE and http://HOST:PORT are checked; credentials in the URL are refused."""
    with pytest.raises(ConfigError, match=r"not DB\.TABLE"):
        split_table("events")
    with pytest.raises(ConfigError, match="no credentials in the URL"):
        Client("http://u:p@127.0.0.1:8123")
    with pytest.raises(ConfigError, match=r"not http://HOST:PORT"):
        Client("ftp://x")


def test_init_creates_the_table_event_rows_round_trip(clickhouse: ClickHouseServer) -> None:
    """init makes the table idempotently; a full event inserts and reads back unchanged."""
    client = clickhouse.client()
    spec = TableSpec("schema_t", "events")
    assert init(client, spec) == []
    assert init(client, spec) == []
    assert existing_columns(client, "schema_t", "events").keys() == COLUMNS.keys()
    event = Event(
        ts="2026-01-02T03:04:05.678Z",
        request_id="r1",
        trace_id="t" * 32,
        ttft_ms=12.5,
        cache_hit=True,
        stream=True,
        prompt_tokens=7,
        e2e_ms=99.25,
    )
    line = row(event.to_dict())
    assert line is not None
    client.insert(spec.name, line)
    got = client.rows(f"SELECT * FROM {spec.name} FINAL WHERE request_id = 'r1'")[0]
    assert got["ts"] == "2026-01-02 03:04:05"
    assert got[TS_MS] == 1767323045678
    assert (got["ttft_ms"], got["cache_hit"], got["prompt_tokens"]) == (12.5, 1, 7)
    assert got["tpot_ms"] is None and got["e2e_ms"] == 99.25


def test_init_adds_a_new_event_column_old_rows_read_null(clickhouse: ClickHouseServer) -> None:
    """A column the table lacks (a newer Event field) is added by init; old rows read null."""
    client = clickhouse.client()
    spec = TableSpec("schema_up", "events")
    init(client, spec)
    client.insert(spec.name, row({"ts": "2026-01-01T00:00:00Z", "request_id": "old"}) or b"")
    client.execute(f"ALTER TABLE {spec.name} DROP COLUMN itl_max_ms")
    assert check(client, spec) == ["itl_max_ms"]
    assert init(client, spec) == [f"{spec.name}: added column itl_max_ms Nullable(Float64)"]
    got = client.rows(f"SELECT itl_max_ms FROM {spec.name} WHERE request_id = 'old'")
    assert got == [{"itl_max_ms": None}]


def test_wrong_schema_and_missing_table_are_one_line_errors(clickhouse: ClickHouseServer) -> None:
    """check names a missing table (and how to create it) or the first mistyped column."""
    client = clickhouse.client()
    with pytest.raises(ConfigError, match=r"does not exist .* clickhouse init"):
        check(client, TableSpec("nowhere", "events"))
    client.execute("CREATE DATABASE IF NOT EXISTS wrong")
    client.execute(
        "CREATE TABLE IF NOT EXISTS wrong.events (ts DateTime, request_id String, "
        "lane String, e2e_ms String) ENGINE = MergeTree() ORDER BY ts"
    )
    with pytest.raises(ConfigError, match="wrong schema: column"):
        check(client, TableSpec("wrong", "events"))


def test_cli_schema_init_and_credential_errors(clickhouse: ClickHouseServer) -> None:
    """schema prints DDL; init works with env credentials; bad ones give one line, exit 2."""
    out = _cli("schema", "--table", "cli_t.events")
    assert out.returncode == 0 and out.stdout.strip() == (
        ";\n\n".join(ddl(TableSpec("cli_t", "events"))) + ";"
    )
    user, password = PASSWORD_USER
    env = {"PATH": "/usr/bin:/bin", "CLICKHOUSE_USER": user, "CLICKHOUSE_PASSWORD": password}
    ok = _cli("init", clickhouse.url, "--table", "cli_t.events", env=env)
    assert ok.returncode == 0, ok.stderr
    assert "cli_t.events ready" in ok.stdout
    bad = _cli("init", clickhouse.url, env={**env, "CLICKHOUSE_PASSWORD": "nope"})
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0
    assert "authentication failed for user 'obs'" in bad.stderr and "nope" not in bad.stderr
    down = _cli("init", "http://127.0.0.1:9", env=env)
    assert down.returncode == 2 and "unreachable" in down.stderr
    assert down.stderr.strip().count("\n") == 0


def test_wrong_password_raises_without_the_password(clickhouse: ClickHouseServer) -> None:
    """A refused login is a non-retryable ClickHouseError whose text holds no secret."""
    client = clickhouse.client(Credentials(PASSWORD_USER[0], "secret-guess"))
    with pytest.raises(ClickHouseError) as info:
        client.ping()
    assert not info.value.retryable and "secret-guess" not in str(info.value)
