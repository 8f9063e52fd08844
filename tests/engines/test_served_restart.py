"""Option flips on the record: a real vLLM restarted with other flags, behind a sidecar.

One ``vllm serve`` of its own starts with ``--no-enable-prefix-caching --max-num-seqs 64``
(in vLLM's dev mode, so its ``/server_info`` reports its scheduler flags) behind a sidecar
whose pool declares ``max_num_seqs: 64``, serves a few requests through the sidecar scraped
by a real Prometheus, is stopped and started again on the same port with prefix caching on
and ``--max-num-seqs 128``, and serves a few more. The info series changes, the dashboards'
annotation query returns that one change naming both flags with their old and new values,
the drift series turns 1 for max_num_seqs, the events either side carry different
fingerprints, and ``query compare --around-changes`` reports the change with TTFT and the
cache-hit ratio before and after.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import yaml

from obs import conventions as c
from obs.config import default_config_path, load_config
from obs.dashboards.build import render
from obs.demo.prometheus import PrometheusProcess, find_prometheus, host_port
from obs.engines.server import VllmServer
from obs.engines.setup import EnginePaths
from obs.procs import free_port
from obs.sidecar.testing import SidecarProcess
from tests.conftest import SidecarFactory, require_binary
from tests.support import probes


def _binary() -> str:
    return find_prometheus() or require_binary("prometheus")


pytestmark = pytest.mark.engine

CHAT = "/v1/chat/completions"
PROMPT = "You are a careful assistant. " * 40 + "Write a haiku about caches."


@pytest.fixture
def prometheus_dir(tmp_path: Path) -> Path:
    """A directory for Prometheus' config and data."""
    d = tmp_path / "prom"
    d.mkdir()
    return d


def _chat(url: str) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 4,
        "stream": True,
    }
    httpx.post(url + CHAT, json=body, timeout=120).raise_for_status()


def _paced(url: str, n: int = 12, every_s: float = 0.25) -> None:
    """``n`` requests on a fixed schedule, so both sides of the change span the same time."""
    t0 = time.monotonic()
    for i in range(n):
        time.sleep(max(0.0, t0 + i * every_s - time.monotonic()))
        _chat(url)


def _vllm(engine_paths: EnginePaths, port: int, log: Path, *args: str) -> VllmServer:
    return VllmServer(
        engine_paths.model_dir,
        port=port,
        extra_args=args,
        log_path=log,
        python=engine_paths.python,
        launcher=engine_paths.launcher,
        in_process_model=True,  # ready sooner (obs.engines.server.IN_PROCESS_MODEL_FLAGS)
    ).start()


def _settings(prometheus: PrometheusProcess) -> list[dict[str, str]]:
    return [s["metric"] for s in prometheus.client.query(c.POOL_SETTINGS_INFO.name)]


def _declaring(path: Path, url: str, max_num_seqs: int) -> Path:
    """A lanes config whose one pool (``default``) declares ``max_num_seqs``."""
    pool = {
        "name": "default",
        "replicas": [url],
        "engine": {"kind": "vllm", "max_num_seqs": max_num_seqs},
    }
    lanes = [{"name": "default", "pool": "default"}]
    path.write_text(yaml.safe_dump({"pools": [pool], "lanes": lanes, "default_lane": "default"}))
    return path


def _drift(prometheus: PrometheusProcess) -> dict[str, str]:
    return {
        s["metric"][c.SETTING]: s["value"][1]
        for s in prometheus.client.query(c.POOL_SETTINGS_DRIFT.name)
    }


def test_restart_with_other_flags_is_one_annotated_compared_change(
    engine_paths: EnginePaths,
    sidecar: SidecarFactory,
    tmp_path: Path,
    prometheus_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Info series, annotation (old/new), drift, event fingerprints and --around-changes agree."""
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")  # vLLM's /server_info: its scheduler flags
    port = free_port()
    log1 = tmp_path / "vllm-1.log"
    engine = _vllm(engine_paths, port, log1, "--no-enable-prefix-caching", "--max-num-seqs", "64")
    try:
        config = _declaring(tmp_path / "lanes.yaml", engine.url, 64)
        sc = sidecar(config=config, traces=False, args=("--pool-poll-interval", "0.5"))
        prometheus = probes.prometheus_at(prometheus_dir, host_port(sc.url), _binary())
        try:
            t_start = time.time()
            off = probes.wait_for("the settings series", lambda: _settings(prometheus))
            _paced(sc.url)
            assert len(off) == 1 and off[0]["prefix_caching"] == "false"
            assert off[0][c.ENGINE] == "vllm" and off[0]["version"]
            assert all(v != "" for v in off[0].values())  # absent settings have no label
            assert "max_running" not in off[0]  # vLLM reports no engine-neutral scheduler limits
            assert off[0]["max_num_seqs"] == "64"  # declared, and /server_info agrees
            probes.wait_for("no drift", lambda: _drift(prometheus) == {"max_num_seqs": "0"})

            engine.stop()
            t_stopped = time.time()
            log2 = tmp_path / "vllm-2.log"
            engine = _vllm(engine_paths, port, log2, "--max-num-seqs", "128")
            on = probes.wait_for(
                "the new settings",
                lambda: [s for s in _settings(prometheus) if s["prefix_caching"] == "true"],
            )
            t_back = time.time()
            _paced(sc.url)
            time.sleep(2)  # two scrapes after the last request

            annotations = render(load_config(default_config_path()))["vllm-obs-overview"]
            query = next(
                a["expr"]
                for a in annotations["annotations"]["list"]
                if a["name"] == "Replica settings changed"
            )
            series = prometheus.client.query_range(query, t_start, time.time(), 1.0)
            assert len(series) == 1, series
            labels, values = series[0]["metric"], series[0]["values"]
            assert labels[c.POOL] == "default" and labels[c.REPLICA] == engine.url
            assert (labels[c.CHANGED], labels[c.OLD], labels[c.NEW]) == (
                "prefix_caching,max_num_seqs",
                "prefix_caching=false max_num_seqs=64",
                "prefix_caching=true max_num_seqs=128",
            )
            assert _drift(prometheus) == {"max_num_seqs": "1"}
            at_ms = {float(v) for _, v in values}
            assert len(at_ms) == 1 and t_stopped * 1000 < at_ms.pop() < t_back * 1000
            assert on[0][c.FINGERPRINT] != off[0][c.FINGERPRINT]
            _check_log(sc, off[0][c.FINGERPRINT], on[0][c.FINGERPRINT], t_stopped, prometheus.url)
        finally:
            prometheus.stop()
    finally:
        engine.stop()


def _check_log(sc: SidecarProcess, old: str, new: str, t_stopped: float, prom: str) -> None:
    """Events either side carry the two fingerprints; --around-changes finds and compares."""
    events = sc.wait_events(24)
    fingerprints = [e["settings_fingerprint"] for e in sorted(events, key=lambda e: e["ts"])]
    assert fingerprints == [old] * 12 + [new] * 12
    assert len({e["config_fingerprint"] for e in events}) == 1

    assert sc.events_path is not None
    cli = [sys.executable, "-m", "obs.cli", "query", "compare", str(sc.events_path)]
    out = subprocess.run(
        [*cli, "--around-changes", "--prometheus", prom, "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = {r["metric"]: r for r in json.loads(out.stdout)}
    change = rows["requests"]
    at = datetime.fromisoformat(change["change_at"]).replace(tzinfo=UTC).timestamp()
    assert t_stopped < at < time.time()
    assert change["change"].endswith(
        f"settings {old} -> {new} (prefix_caching=false max_num_seqs=64 -> "
        "prefix_caching=true max_num_seqs=128)"
    )
    assert rows["requests"]["before"] >= 6 and rows["requests"]["after"] >= 6
    assert rows["cache_hit_ratio"]["before"] == 0.0 and rows["cache_hit_ratio"]["after"] > 0.5
    assert rows["ttft_p50_ms"]["before"] > 0 and rows["ttft_p50_ms"]["after"] > 0
    assert rows["ttft_p50_ms"]["test"] == "mann-whitney"
