"""The lanes-config annotation: a sidecar restarted with the same config makes none, another
config makes one with the old and new hashes (real sidecars, a real Prometheus; the pool is a
closed port: no engine is needed to load a config)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from obs import conventions as c
from obs.dashboards.annotations import config_changes
from obs.demo.prometheus import find_prometheus
from obs.procs import free_port
from obs.sidecar.testing import SidecarProcess
from tests.conftest import require_binary
from tests.support import probes

pytestmark = pytest.mark.stack


def _config(path: Path, upstream: str, max_queue: int) -> Path:
    config = {
        "pools": [{"name": "gpu", "replicas": [upstream]}],
        "lanes": [{"name": "chat", "pool": "gpu", "admission": {"max_queue": max_queue}}],
        "default_lane": "chat",
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@pytest.fixture
def sidecars(tmp_path: Path) -> Iterator[list[SidecarProcess]]:
    """Sidecars this test starts one after another on one port; all stopped after."""
    started: list[SidecarProcess] = []
    yield started
    for proc in started:
        proc.stop()


def test_config_annotation_only_for_another_config(
    tmp_path: Path, sidecars: list[SidecarProcess]
) -> None:
    """A sidecar restarted with the same config makes no annotation; another config makes one."""
    port, down = free_port(), f"http://127.0.0.1:{free_port()}"
    same = _config(tmp_path / "a.yaml", down, 64)
    other = _config(tmp_path / "b.yaml", down, 32)

    def run(config: Path) -> SidecarProcess:
        if sidecars:
            sidecars[-1].stop()
        proc = SidecarProcess(config=config, port=port, log_path=tmp_path / "sidecar.log")
        sidecars.append(proc.start())
        return proc

    def hashes(expr: str, start: float) -> list[dict[str, str]]:
        return [s["metric"] for s in prometheus.client.query_range(expr, start, time.time(), 1)]

    # the test's Prometheus scrapes every second: the old config, live for ~12 s, is found at 1 s
    query = config_changes(offset="3s", seen="1h", resolution="1s")
    run(same)
    prometheus = probes.prometheus_at(
        tmp_path, f"127.0.0.1:{port}", find_prometheus() or require_binary("prometheus")
    )
    try:
        first = probes.wait_for(
            "the config series", lambda: prometheus.client.query(c.CONFIG_INFO.name)
        )
        old_hash = first[0]["metric"][c.CONFIG_HASH]
        time.sleep(5)  # past the offset: the first config counts as seen
        t_same = time.time()
        run(same)
        time.sleep(6)
        assert hashes(query, t_same) == []
        t_other = time.time()
        run(other)
        got = probes.wait_for("the config annotation", lambda: hashes(query, t_other), timeout_s=20)
        assert {g[c.CONFIG_HASH] for g in got} != {old_hash}
        assert {g[f"old_{c.CONFIG_HASH}"] for g in got} == {old_hash}
        assert {g[c.CONFIG_VERSION] for g in got} == {"1"}
    finally:
        prometheus.stop()
