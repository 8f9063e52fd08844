"""Access settings that need no engine: /metrics on its own address, event file permissions."""

from __future__ import annotations

import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from obs import conventions as c
from obs.procs import free_port
from tests.conftest import SidecarFactory
from tests.support import probes

pytestmark = pytest.mark.process


@pytest.fixture
def dead_pool() -> Iterator[str]:
    """A pool that refuses every connection."""
    with probes.refused_url() as url:
        yield url


def test_metrics_address_serves_metrics_apart_from_the_relay(
    sidecar: SidecarFactory, dead_pool: str
) -> None:
    """--metrics-address: /metrics answers there, and the relay's port answers 404 for it."""
    port = free_port()
    sc = sidecar(dead_pool, args=("--metrics-address", f"127.0.0.1:{port}"), traces=False)
    relay = httpx.get(sc.url + "/metrics")
    assert relay.status_code == 404
    assert f"127.0.0.1:{port}" in relay.json()["error"]["message"]
    scraped = httpx.get(f"http://127.0.0.1:{port}/metrics")
    assert scraped.status_code == 200
    assert "vllm_obs_requests_total" in scraped.text or "vllm_obs_lane_info" in scraped.text


def test_rejection_counters_exist_at_zero_before_any_request(
    sidecar: SidecarFactory, dead_pool: str
) -> None:
    """Every lane x reason rejection series is 0 from the start, so rate() sees a first burst."""
    sc = sidecar(dead_pool, traces=False)
    series = probes.samples(sc.url)[c.ADMISSION_REJECTIONS.name + "_total"]
    seen = {(lb[c.LANE], lb[c.REASON]): v for lb, v in series}
    lanes = {lb[c.LANE] for lb, _ in probes.samples(sc.url)[c.LANE_INFO.name]}
    assert lanes and set(seen) == {(ln, r) for ln in lanes for r in c.REJECTION_REASONS}
    assert set(seen.values()) == {0.0}


def test_metrics_address_in_use_is_a_clear_error(tmp_path: Path, dead_pool: str) -> None:
    """A --metrics-address that cannot be bound stops the start with one line, no traceback."""
    port = free_port()
    taken = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=0.2)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        r = subprocess.run(
            [sys.executable, "-m", "obs.cli", "sidecar", "--upstream", dead_pool,
             "--port", str(free_port()), "--events", str(tmp_path / "e.jsonl"),
             "--metrics-address", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        taken.kill()
        taken.wait()
    assert r.returncode == 2
    assert f"--metrics-address 127.0.0.1:{port}" in r.stderr
    assert "Traceback" not in r.stderr


def test_event_file_is_readable_by_its_owner_only(sidecar: SidecarFactory, dead_pool: str) -> None:
    """The JSONL event log is created 0600: prompts' metadata is not for every local user."""
    sc = sidecar(dead_pool, traces=False)
    httpx.post(sc.url + "/v1/completions", json={"model": "m", "prompt": "x"}, timeout=10)
    sc.wait_events(1)
    assert sc.events_path is not None
    assert stat.S_IMODE(sc.events_path.stat().st_mode) == 0o600
