"""Backfill into ClickHouse: bad lines counted like the query scanner, re-runs idempotent,
and a two-shard cluster behind a Distributed table."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from obs.clickhouse.client import Client
from obs.clickhouse.schema import TableSpec, init
from obs.clickhouse.testing import ClickHouseServer
from obs.query import api
from obs.query.clickhouse_load import load
from obs.query.testing import event, mixed_events, ts, write_jsonl


def _count(client: Client, table: str, final: bool = True) -> int:
    return int(client.rows(f"SELECT count() AS n FROM {table}{' FINAL' * final}")[0]["n"])


def test_load_skips_bad_lines_as_the_scanner_does(
    clickhouse: ClickHouseServer, tmp_path: Path
) -> None:
    """Malformed and truncated lines are skipped and counted exactly as `query` counts them."""
    events = mixed_events()
    write_jsonl(tmp_path / "a.jsonl", events[:10], extra_lines=[b"not json", b"[1, 2]"])
    write_jsonl(tmp_path / "b.jsonl.gz", events[10:], compress=True, truncated_tail=b'{"ts": "')
    client = clickhouse.client()
    spec = TableSpec("load_t", "events")
    init(client, spec)
    result = load(client, spec, [str(tmp_path / "*.jsonl*")])
    scan = api.events(str(tmp_path / "*.jsonl*")).attrs["scan"]
    assert result.inserted == len(events) == _count(client, spec.name)
    assert result.scan["malformed"] == scan["malformed"] and scan["malformed_total"] == 2
    assert result.scan["truncated"] == scan["truncated"] and len(scan["truncated"]) == 1


def test_load_twice_adds_no_duplicates(clickhouse: ClickHouseServer, tmp_path: Path) -> None:
    """Re-running a backfill over the same files leaves one row per request."""
    write_jsonl(tmp_path / "e.jsonl", [event(ts=ts(i), lane="chat") for i in range(50)])
    client = clickhouse.client()
    spec = TableSpec("load_twice", "events")
    init(client, spec)
    load(client, spec, [str(tmp_path / "e.jsonl")])
    load(client, spec, [str(tmp_path / "e.jsonl")])
    assert _count(client, spec.name) == 50
    client.execute(f"OPTIMIZE TABLE {spec.name} FINAL")
    assert _count(client, spec.name, final=False) == 50


def test_load_reads_parquet_exports(clickhouse: ClickHouseServer, tmp_path: Path) -> None:
    """A `query export` Parquet dataset loads with the same rows as its JSONL source."""
    write_jsonl(tmp_path / "e.jsonl", mixed_events())
    api.export(str(tmp_path / "e.jsonl"), tmp_path / "pq")
    client = clickhouse.client()
    spec = TableSpec("load_pq", "events")
    init(client, spec)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "obs.cli",
            "clickhouse",
            "load",
            clickhouse.url,
            str(tmp_path / "pq"),
            "--table",
            spec.name,
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"inserted {len(mixed_events())} events")
    ids = {r["request_id"] for r in client.rows(f"SELECT request_id FROM {spec.name} FINAL")}
    assert ids == {e.request_id for e in mixed_events()}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ClickHouseServer]]:
    """Two real clickhouse-servers, each a shard of the cluster ``obs_shards``."""
    servers = [ClickHouseServer(tmp_path_factory.mktemp(f"shard{i}")) for i in range(2)]
    for s in servers:
        s.configure("obs_shards", [x.tcp_port for x in servers])
    started: list[ClickHouseServer] = []
    try:
        for s in servers:
            started.append(s.start())
        yield servers
    finally:
        for s in started:
            s.stop()


@pytest.mark.stack  # its own two servers, not the session's
def test_two_shards_behind_a_distributed_table(
    cluster: list[ClickHouseServer], tmp_path: Path
) -> None:
    """init on both shards; a backfill spreads over them; the Distributed table sees all once."""
    spec = TableSpec("fleet", "events", cluster="obs_shards")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "obs.cli",
            "clickhouse",
            "init",
            *(s.url for s in cluster),
            "--table",
            spec.name,
            "--cluster",
            "obs_shards",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    write_jsonl(tmp_path / "e.jsonl", [event(ts=ts(i)) for i in range(200)])
    client = Client(cluster[0].url, settings={"insert_distributed_sync": 1})
    load(client, spec, [str(tmp_path / "e.jsonl")])
    load(client, spec, [str(tmp_path / "e.jsonl")])
    per_shard = [_count(s.client(), spec.local) for s in cluster]
    assert sum(per_shard) == 200 and min(per_shard) > 50
    assert _count(cluster[1].client(), spec.name) == 200
