"""One sidecar over a real vLLM pool and a real llama.cpp pool, scraped by a real Prometheus.

Both pools' state, the events, the pools dashboard's queries and the generated rules
are right for each engine: llama.cpp's pool has no KV-usage or preemption series at
all (the panels show "not reported by this engine"), never a fabricated 0.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from obs import conventions as c
from obs.alerts.model import build_model
from obs.alerts.rules import rule_files
from obs.alerts.writer import write
from obs.config import load_config
from obs.dashboards import all_queries
from obs.demo.prometheus import PrometheusProcess, find_prometheus
from obs.demo.prometheus import write_config as write_prometheus_config
from obs.engines.llamacpp_server import LlamaServer
from obs.engines.server import VllmServer
from obs.procs import free_port
from obs.sidecar.testing import SidecarProcess
from tests.conftest import SidecarFactory, require_binary
from tests.engines.test_llamacpp import write_mixed_config
from tests.support import chat_body, probes

pytestmark = pytest.mark.engine

CHAT = "/v1/chat/completions"
LOCAL = {"x-lane": "local"}


@pytest.fixture
def mixed(
    vllm: VllmServer, llama: LlamaServer, sidecar: SidecarFactory, tmp_path: Path
) -> Iterator[tuple[SidecarProcess, PrometheusProcess, Path]]:
    """The sidecar over both pools, and Prometheus scraping it with the generated rules."""
    require_binary("promtool")
    config_path = write_mixed_config(tmp_path / "lanes.yaml", vllm.url, llama.url)
    rules_dir = tmp_path / "rules"
    write(rules_dir, rule_files(build_model(load_config(config_path))), str(config_path))
    sc = sidecar(config=config_path, traces=False, args=("--pool-poll-interval", "0.5"))
    binary = find_prometheus() or require_binary("prometheus")
    prometheus = PrometheusProcess(
        binary,
        write_prometheus_config(
            tmp_path / "prometheus.yml",
            sidecar_url=sc.url,
            pools={"gpu": [vllm.url], "cpu": [llama.url]},
            rules_dir=rules_dir,
            interval_s=1,
        ),
        tmp_path / "prometheus",
        tmp_path / "prometheus.log",
        free_port(),
    ).start()
    try:
        yield sc, prometheus, config_path
    finally:
        prometheus.stop()


def _chat(url: str, headers: dict[str, str] | None = None) -> None:
    # Greedy and past EOS: six tokens from either engine (llama-server samples at 0.8 by
    # default, and the tiny model's sampled EOS once ended an answer at five).
    body = chat_body("def fibonacci(n):", 6, stream=True, temperature=0, ignore_eos=True)
    httpx.post(url + CHAT, json=body, headers=headers, timeout=60).raise_for_status()


def _pools(prometheus: PrometheusProcess, expr: str) -> set[str]:
    return {s["metric"].get(c.POOL, "") for s in prometheus.client.query(expr)}


def test_mixed_pools_state_events_dashboards_and_rules(
    mixed: tuple[SidecarProcess, PrometheusProcess, Path], vllm: VllmServer, llama: LlamaServer
) -> None:
    """Each pool's state is its engine's; the KV and preemption series exist for vLLM only."""
    sc, prometheus, config_path = mixed
    for _ in range(3):
        _chat(sc.url)
        _chat(sc.url, LOCAL)
    events = sc.wait_events(6)
    assert (
        sorted((e["lane"], e["pool"]) for e in events)
        == [("chat", "gpu")] * 3 + [("local", "cpu")] * 3
    )
    for e in events:
        assert e["status"] == "ok" and e["completion_tokens"] == 6
        assert e["cached_tokens"] is not None  # both engines report cached prompt tokens
        assert e["replica"] == (llama.url if e["pool"] == "cpu" else vllm.url)

    time.sleep(1.2)  # a pool poll after the traffic
    s = probes.samples(sc.url)
    engines = {lb["pool"]: lb["engine"] for lb, _ in s["vllm_obs_pool_engine_info"]}
    assert engines == {"gpu": "vllm", "cpu": "llamacpp"}
    by_pool = {
        name: {lb["pool"]: v for lb, v in s.get(name, [])}
        for name in (
            "vllm_obs_pool_kv_cache_usage_ratio",
            "vllm_obs_pool_preemptions_total",
            "vllm_obs_pool_requests_running",
            "vllm_obs_pool_prefix_cache_queries_total",
        )
    }
    assert set(by_pool["vllm_obs_pool_kv_cache_usage_ratio"]) == {"gpu"}
    assert set(by_pool["vllm_obs_pool_preemptions_total"]) == {"gpu"}
    assert set(by_pool["vllm_obs_pool_requests_running"]) == {"gpu", "cpu"}
    assert by_pool["vllm_obs_pool_prefix_cache_queries_total"]["cpu"] > 0

    deadline = time.monotonic() + 30
    while not _pools(prometheus, f"{c.POOL_ENGINE_INFO.name} == 1") >= {"gpu", "cpu"}:
        assert time.monotonic() < deadline, "Prometheus did not scrape the sidecar"
        time.sleep(0.5)
    for _ in range(2):  # traffic inside Prometheus' rate window
        _chat(sc.url, LOCAL)
        _chat(sc.url)
    time.sleep(3)
    config = load_config(config_path)
    queries = {
        title: expr
        for uid, title, expr in all_queries(config, values={"__rate_interval": "1m"})
        if uid == "vllm-obs-pools"
    }
    assert _pools(prometheus, queries["KV cache usage"]) == {"gpu"}
    assert _pools(prometheus, queries["Preemptions"]) == {"gpu"}
    assert _pools(prometheus, queries["Prefix-cache hit ratio by pool"]) == {"gpu", "cpu"}
    running = _pools(prometheus, queries["Running and waiting"])
    assert running == {"gpu", "cpu"}
    _every_panel_is_real_or_not_reported(prometheus, config_path)
    count, errors = prometheus.rule_health()
    assert count > 0 and errors == []
    kv_pools = {
        r["labels"].get(c.POOL)
        for g in prometheus.api("rules")["groups"]
        for r in g["rules"]
        if r["type"] == "alerting" and r["name"] == c.ALERT_KV_CACHE_USAGE_HIGH
    }
    assert kv_pools == {"gpu"}


ABSENT_FOR_LLAMACPP = ("kv_cache_usage", "preemptions")  # what llama-server does not report


def _every_panel_is_real_or_not_reported(prometheus: PrometheusProcess, config_path: Path) -> None:
    """Every generated panel query runs on the real Prometheus.

    For the llama.cpp pool (and its lane) the KV and preemption panels have no series at
    all, which Grafana shows as "not reported by this engine", and its prefix-cache panels
    a real ratio, never a fabricated 0.
    """
    config = load_config(config_path)
    for uid, title, expr in all_queries(config, values={"__rate_interval": "1m"}):
        series = prometheus.client.query(expr)  # raises on a query Prometheus refuses
        cpu = [
            float(s["value"][1])
            for s in series
            if s["metric"].get(c.POOL) == "cpu" or s["metric"].get(c.LANE) == "local"
        ]
        if any(name in expr for name in ABSENT_FOR_LLAMACPP):
            assert cpu == [], f"{uid} / {title}: a llama.cpp series for a value it lacks"
        elif "prefix_cache_hits" in expr:  # the same prompt again: llama.cpp's slot cache hit
            assert cpu and all(0 < v <= 1 for v in cpu), f"{uid} / {title}: {cpu}"
