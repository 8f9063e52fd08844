"""The sidecar's ClickHouse exporter: start-up checks, the spool, and a restart under load."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from obs.clickhouse.client import Client
from obs.clickhouse.schema import TableSpec, init
from obs.clickhouse.testing import ClickHouseServer
from obs.engines.server import VllmServer
from obs.procs import free_port
from tests.conftest import SidecarFactory

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in a Prometheus exposition (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.match(r"^(\w+)\{([^}]*)\} (\S+)$", line)
        if m and m.group(1) == name:
            have = ",".join(sorted(m.group(2).split(",")))
            if have == want:
                return float(m.group(3))
    return 0.0


def _wait_count(client: Client, table: str, n: int, timeout_s: float = 90.0) -> int:
    deadline = time.monotonic() + timeout_s
    got = 0
    while time.monotonic() < deadline:
        got = int(client.rows(f"SELECT count() AS n FROM {table} FINAL")[0]["n"])
        if got >= n:
            return got
        time.sleep(0.5)
    return got


def test_missing_table_stops_the_sidecar_with_one_line(clickhouse: ClickHouseServer) -> None:
    """A table that does not exist: exit 2 at start with one line naming the fix."""
    cmd = [sys.executable, "-m", "obs.cli", "sidecar", "--upstream", "http://127.0.0.1:9"]
    cmd += ["--port", str(free_port()), "--events", "none"]
    cmd += ["--clickhouse-url", clickhouse.url, "--clickhouse-table", "absent.events"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("vllm-obs sidecar")]
    assert len(lines) == 1 and "absent.events does not exist" in lines[0]
    assert "Traceback" not in out.stderr


def test_wrong_schema_or_password_stops_the_sidecar_with_one_line(
    clickhouse: ClickHouseServer,
) -> None:
    """A table with the wrong column types, or a refused login: exit 2, one line, no secret."""
    client = clickhouse.client()
    client.execute("CREATE DATABASE IF NOT EXISTS misfit")
    client.execute(
        "CREATE TABLE IF NOT EXISTS misfit.events (ts DateTime, request_id String, "
        "lane String, e2e_ms String) ENGINE = MergeTree() ORDER BY ts"
    )
    cmd = [sys.executable, "-m", "obs.cli", "sidecar", "--upstream", "http://127.0.0.1:9"]
    cmd += ["--port", str(free_port()), "--events", "none", "--clickhouse-url", clickhouse.url]
    wrong = subprocess.run(
        [*cmd, "--clickhouse-table", "misfit.events"], capture_output=True, text=True, timeout=60
    )
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
    assert "misfit.events has the wrong schema: column" in wrong.stderr
    env = {**os.environ, "CLICKHOUSE_USER": "obs", "CLICKHOUSE_PASSWORD": "not-it"}
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 2 and "authentication failed for user 'obs'" in refused.stderr
    assert "not-it" not in refused.stderr and "Traceback" not in refused.stderr


def test_unreachable_clickhouse_spools_then_counts_spool_full(
    sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """ClickHouse down at start: the sidecar serves, spools events, counts what overflows."""
    spool = tmp_path / "spool.jsonl"
    args = ("--clickhouse-url", f"http://127.0.0.1:{free_port()}", "--clickhouse-spool", str(spool))
    sc = sidecar("http://127.0.0.1:9", args=(*args, "--clickhouse-spool-max-mb", "0.004"))
    for _ in range(12):  # each request fails upstream (no pool there) and is still an event
        httpx.post(sc.url + "/v1/chat/completions", json=BODY, timeout=10)
    deadline = time.monotonic() + 20
    dropped = failures = 0.0
    spooled: list[bytes] = []
    while time.monotonic() < deadline and len(spooled) + dropped < 12:
        text = httpx.get(sc.url + "/metrics").text
        dropped = _metric(
            text, "vllm_obs_events_dropped_total", exporter="clickhouse", reason="spool_full"
        )
        failures = _metric(text, "vllm_obs_exporter_failures_total", exporter="clickhouse")
        spooled = spool.read_bytes().splitlines() if spool.exists() else []
        time.sleep(0.3)
    assert failures >= 1 and dropped >= 1 and spooled
    assert len(spooled) + dropped == 12


@pytest.mark.engine
def test_events_survive_a_clickhouse_restart_under_load(
    vllm: VllmServer, sidecar: SidecarFactory, clickhouse: ClickHouseServer
) -> None:
    """Real vLLM + sidecar under load, ClickHouse stopped mid-run: every event lands once."""
    client = clickhouse.client()
    spec = TableSpec("restart", "events")
    init(client, spec)
    sc = sidecar(
        vllm.url,
        args=("--clickhouse-url", clickhouse.url, "--clickhouse-table", spec.name),
        traces=False,
    )

    def fire(n: int) -> None:
        url = sc.url + "/v1/chat/completions"
        with httpx.Client(timeout=60) as client, ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda _: client.post(url, json=BODY).status_code, range(n)))
        assert codes == [200] * n

    fire(40)
    clickhouse.stop()
    fire(40)
    time.sleep(1.5)  # at least one flush fails and spools
    clickhouse.start()
    fire(40)
    events = sc.wait_events(120, timeout_s=30)
    client = clickhouse.client()
    assert _wait_count(client, spec.name, 120) == 120
    ids = {r["request_id"] for r in client.rows(f"SELECT request_id FROM {spec.name}")}
    assert ids == {e["request_id"] for e in events}
    total = client.rows(f"SELECT count() AS n FROM {spec.name}")[0]["n"]
    assert total == 120  # not only FINAL: no batch was inserted twice
    metrics = httpx.get(sc.url + "/metrics").text
    assert _metric(metrics, "vllm_obs_exporter_failures_total", exporter="clickhouse") >= 1
    for reason in ("spool_full", "queue_full"):
        dropped = _metric(
            metrics, "vllm_obs_events_dropped_total", exporter="clickhouse", reason=reason
        )
        assert dropped == 0


def test_config_file_section_enables_the_exporter(
    clickhouse: ClickHouseServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """The lanes file's clickhouse: section alone sends every event, failed ones included."""
    client = clickhouse.client()
    spec = TableSpec("from_config", "events")
    init(client, spec)
    config = tmp_path / "lanes.yaml"
    config.write_text(
        "version: 1\npools: [{name: p, replicas: ['http://127.0.0.1:9']}]\n"
        "lanes: [{name: chat, pool: p}]\ndefault_lane: chat\n"
        f"clickhouse: {{url: '{clickhouse.url}', table: {spec.name}}}\n"
    )
    sc = sidecar(config=config, traces=False)
    for _ in range(5):  # the pool is unreachable: five error events
        httpx.post(sc.url + "/v1/chat/completions", json=BODY, timeout=10)
    assert _wait_count(client, spec.name, 5, timeout_s=20) == 5
    rows = client.rows(f"SELECT DISTINCT status, lane FROM {spec.name}")
    assert rows == [{"status": "error", "lane": "chat"}]


@pytest.mark.process
def test_clickhouse_flags_need_a_url() -> None:
    """--clickhouse-table without a URL, or a URL that is not http(s): one-line errors."""
    cmd = [sys.executable, "-m", "obs.cli", "sidecar", "--upstream", "http://127.0.0.1:9"]
    for flags, message in (
        (("--clickhouse-table", "a.b"), "need --clickhouse-url"),
        (("--clickhouse-url", "ftp://x"), "--clickhouse-url (or clickhouse.url"),
    ):
        out = subprocess.run(
            [*cmd, "--events", "none", *flags], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 2 and message in out.stderr
        assert out.stderr.count("\n") == 1
