"""``vllm-obs sidecar --workers N`` against a real ``vllm serve``: one port, merged metrics."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from obs import conventions as c
from obs.engines.server import VllmServer
from obs.procs import free_port
from obs.sidecar.server.worker_metrics import merge_pages
from obs.sidecar.testing import SidecarProcess
from tests.conftest import SidecarFactory
from tests.support import chat_body

pytestmark = pytest.mark.engine

CHAT = "/v1/chat/completions"
N = 24


def _chat(url: str, i: int) -> str:
    """One request on its own connection (the kernel spreads connections over workers)."""
    rid = f"w-{i}-{time.monotonic_ns()}"
    body = chat_body("hi", 4)
    with httpx.Client(timeout=60) as client:
        r = client.post(url + CHAT, json=body, headers={"x-request-id": rid})
    assert r.status_code == 200, r.text
    return rid


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def _total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def _worker_pids(sc: SidecarProcess) -> list[int]:
    text = Path(f"/proc/{sc.pid}/task/{sc.pid}/children").read_text()
    return [int(p) for p in text.split()]


def _events(path: Path) -> list[str]:
    out = []
    for f in sorted(path.parent.glob(f"{path.stem}*.jsonl")):
        out += [line for line in f.read_text().splitlines() if line]
    return out


@pytest.fixture
def two_workers(vllm: VllmServer, sidecar: SidecarFactory) -> SidecarProcess:
    return sidecar(vllm.url, traces=False, args=("--workers", "2"))


def test_two_workers_share_the_port_and_every_scrape_counts_every_request(
    two_workers: SidecarProcess,
) -> None:
    """N requests over 2 workers: each worker served some; any scrape counts all N, once."""
    sc = two_workers
    assert len(_worker_pids(sc)) == 2
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda i: _chat(sc.url, i), range(N)))
    assert sc.events_path is not None
    deadline = time.monotonic() + 10
    while len(_events(sc.events_path)) < N and time.monotonic() < deadline:
        time.sleep(0.2)
    files = sorted(sc.events_path.parent.glob(f"{sc.events_path.stem}*.jsonl"))
    stem = sc.events_path.stem
    assert [f.name for f in files] == [f"{stem}.jsonl", f"{stem}.w1.jsonl"], files
    assert all(f.stat().st_size for f in files), "one worker served nothing"
    lines = _events(sc.events_path)
    assert sorted(ids) == sorted(orjson.loads(x)["request_id"] for x in lines)
    for _ in range(4):  # whichever worker answers the scrape, the totals are the same
        s = _samples(sc.url)
        assert _total(s, f"{c.REQUESTS.name}_total") == N
        assert _total(s, f"{c.REQUEST_DURATION.name}_count") == N
        assert _total(s, f"{c.IN_FLIGHT.name}") == 0
        up = [v for (n, _), v in s.items() if n == c.POOL_UP.name]
        assert up == [1.0], "pool state is taken once, not summed"
    # the merged OpenMetrics page keeps the workers' exemplars: trace ids of these requests
    accept = {"accept": "application/openmetrics-text;version=1.0.0"}
    page = httpx.get(sc.url + "/metrics", headers=accept, timeout=10).text
    traces = {orjson.loads(x)["trace_id"] for x in lines}
    exemplars = {
        s.exemplar.labels[c.EXEMPLAR_TRACE_ID]
        for fam in openmetrics_families(page)
        if fam.name == c.REQUEST_DURATION.name
        for s in fam.samples
        if s.exemplar is not None
    }
    assert exemplars and exemplars <= traces


def test_killed_worker_is_restarted_and_counters_do_not_go_back(
    two_workers: SidecarProcess,
) -> None:
    """SIGKILL of a worker: another is forked, the port answers, its counts stay in /metrics."""
    sc = two_workers
    for i in range(6):
        _chat(sc.url, i)
    before = _total(_samples(sc.url), f"{c.REQUESTS.name}_total")
    assert before == 6
    victim = _worker_pids(sc)[1]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pids = _worker_pids(sc)
        if len(pids) == 2 and victim not in pids:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"worker {victim} was not replaced")
    assert httpx.get(sc.url + "/health", timeout=10).status_code == 200
    # The killed worker's requests were scraped (saved) before the kill: they still count.
    assert _total(_samples(sc.url), f"{c.REQUESTS.name}_total") == before
    _chat(sc.url, 99)  # served by whichever worker takes it
    for _ in range(3):
        assert _total(_samples(sc.url), f"{c.REQUESTS.name}_total") == before + 1


def test_metrics_address_merges_and_sigterm_stops_every_worker(
    vllm: VllmServer, sidecar: SidecarFactory
) -> None:
    """--metrics-address shows every worker's requests; SIGTERM ends workers and supervisor."""
    port = free_port()
    args = ("--workers", "2", "--metrics-address", f"127.0.0.1:{port}")
    sc = sidecar(vllm.url, traces=False, args=args)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: _chat(sc.url, i), range(8)))
    assert _total(_samples(f"http://127.0.0.1:{port}"), f"{c.REQUESTS.name}_total") == 8
    pids = _worker_pids(sc)
    assert sc.stop() == 0
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists(), f"worker {pid} outlived the supervisor"


def test_workers_refuse_a_lane_limit_they_cannot_split(
    sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """max_concurrency below --workers is refused at start with a one-line reason."""
    cfg = tmp_path / "lanes.yaml"
    cfg.write_text(
        "pools:\n  - name: p\n    replicas: [http://127.0.0.1:9]\n"
        "default_lane: chat\n"
        "lanes:\n  - name: chat\n    pool: p\n    admission: {max_concurrency: 1}\n"
    )
    with pytest.raises(RuntimeError, match="cannot be split over 2 workers"):
        sidecar(config=cfg, args=("--workers", "2"))


def _page(requests: int, up: float) -> str:
    """A worker's page as prometheus_client writes it: a counter and a pool gauge."""
    reg = CollectorRegistry()
    Counter(c.REQUESTS.name, "Requests.", ["lane"], registry=reg).labels("a").inc(requests)
    Gauge(c.POOL_UP.name, "Up.", ["replica"], registry=reg).labels("r").set(up)
    return generate_latest(reg).decode()


def test_merge_sums_request_series_and_takes_pool_state_once() -> None:
    """Workers' pages (live and retired): counters add up; pool gauges are taken once."""
    live = [_page(3, 1), _page(4, 1)]
    retired = [_page(5, 0)]  # a dead worker's saved page: its counters still count
    merged = {
        s.name: s.value
        for fam in merge_pages(live, retired)
        for s in fam.samples
        if not s.name.endswith("_created")
    }
    assert merged == {f"{c.REQUESTS.name}_total": 12.0, c.POOL_UP.name: 1.0}
