"""A crafted two-replica pool, one replica a slower simulated GPU: VllmObsReplicaOutlier fires
in a real Prometheus loading the generated rules, and `query incident` names that replica as
the mechanism, from the sidecar's events of the same run."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from obs import conventions as c
from obs.cli import main
from obs.config import Config
from obs.demo.prometheus import PrometheusProcess, find_prometheus
from obs.demo.prometheus import write_config as write_prometheus_config
from obs.demo.workload import write_lanes
from obs.engines.sim.process import SimServer
from obs.procs import free_port
from obs.sidecar.testing import SidecarProcess

pytestmark = pytest.mark.stack

# The slow replica: an L4 run at a twentieth of real time, beside an H100 at real time (the
# sim's roofline, docs/sim.md): its time to first token is far past chat's 500 ms threshold.
FAST = ("--gpu", "H100", "--served-model-name", "tiny", "--max-model-len", "2048")
SLOW = ("--gpu", "L4", "--served-model-name", "tiny", "--max-model-len", "2048", "--speed", "0.05")
REQUESTS = 96
CLIENTS = 16
FIRING_WAIT_S = 120.0  # how long Prometheus is given to evaluate the rule once load has run


def _config(path: Path, fast: str, slow: str, bulk: str) -> Config:
    """The shipped lanes with the interactive pool on the two replicas (simulated vLLM)."""
    sim = {"kind": "sim"}
    return write_lanes(
        path, {"interactive": [fast, slow], "bulk": [bulk]}, {"interactive": sim, "bulk": sim}
    )


def _chat(client: httpx.Client, url: str, i: int) -> int:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": f"question {i}: " + "why is the sky blue? " * 8}],
        "max_tokens": 16,
        "stream": True,
    }
    with client.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers={"X-Client-Class": "chat"}
    ) as resp:
        for _ in resp.iter_bytes():
            pass
        return resp.status_code


def test_slow_replica_fires_the_outlier_alert_and_incident_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Chat streams spread over a fast and a 20x slower replica: Prometheus fires
    VllmObsReplicaOutlier for the slow one's instance, and `query incident` over the events
    says the mechanism is that replica (drain it)."""
    prometheus_bin = find_prometheus()
    if prometheus_bin is None:
        pytest.skip("prometheus is not installed (scripts/setup installs it)")
    fast = SimServer(FAST, log_path=tmp_path / "fast.log").start()
    slow = SimServer(SLOW, log_path=tmp_path / "slow.log").start()
    bulk = SimServer(FAST, log_path=tmp_path / "bulk.log").start()
    sidecar = prom = None
    try:
        lanes = tmp_path / "lanes.yaml"
        _config(lanes, fast.url, slow.url, bulk.url)
        rules = tmp_path / "rules"
        argv = ["alerts", "--config", str(lanes), "--out", str(rules), "--max-for", "0s",
                "--max-interval", "2s"]  # fmt: skip
        assert main(argv) == 0
        events = tmp_path / "events.jsonl"
        sidecar = SidecarProcess(
            config=lanes, events=events, args=["--pool-poll-interval", "1"],
            log_path=tmp_path / "sidecar.log",
        ).start(timeout_s=60)  # fmt: skip
        pools = {"interactive": [fast.url, slow.url], "bulk": [bulk.url]}
        prom_yml = write_prometheus_config(
            tmp_path / "prometheus.yml", sidecar_url=sidecar.url, pools=pools,
            rules_dir=rules, interval_s=1,
        )  # fmt: skip
        prom = PrometheusProcess(
            prometheus_bin, prom_yml, tmp_path / "prom", tmp_path / "prom.log", free_port()
        ).start()
        # A counter's first rise needs a sample before it: both replicas scraped at 0 first.
        scraped = f'count({c.VLLM_TTFT}_count{{pool="interactive"}} == 0) == 2'
        deadline = time.monotonic() + FIRING_WAIT_S
        while not prom.client.query(scraped) and time.monotonic() < deadline:
            time.sleep(0.5)
        with httpx.Client(timeout=120) as client, ThreadPoolExecutor(CLIENTS) as pool:
            codes = list(pool.map(lambda i: _chat(client, sidecar.url, i), range(REQUESTS)))
        assert codes == [200] * REQUESTS
        slow_instance = slow.url.removeprefix("http://")
        query = f'ALERTS{{alertname="{c.ALERT_REPLICA_OUTLIER}",alertstate="firing"}}'
        deadline = time.monotonic() + FIRING_WAIT_S
        firing: list[dict] = []
        while not firing and time.monotonic() < deadline:
            firing = prom.client.query(query)
            time.sleep(1)
        assert [f["metric"]["instance"] for f in firing] == [slow_instance], firing
        assert firing[0]["metric"]["pool"] == "interactive"
        sidecar.stop()  # its event log whole; Prometheus still answers for the alerts
        capsys.readouterr()
        argv = ["query", "incident", str(events), "--config", str(lanes), "--no-progress",
                "--format", "json", "--prometheus", prom.url]  # fmt: skip
        assert main(argv) == 0
        doc = json.loads(capsys.readouterr().out)
    finally:
        for part in (prom, sidecar, bulk, slow, fast):
            if part is not None:
                part.stop()
    (inc,) = [i for i in doc["incidents"] if i["pool"] == "interactive"]
    assert inc["mechanism_kind"] == "slow_replica" and inc["slow_replica"] == slow.url
    assert inc["lever"].startswith(f"drain replica {slow.url}")
    # The draft's alerts name the same replica, as Prometheus' ALERTS series has it.
    outliers = [a for a in doc["alerts"] if a["alert"] == c.ALERT_REPLICA_OUTLIER]
    assert outliers and {a["labels"]["instance"] for a in outliers} == {slow_instance}
