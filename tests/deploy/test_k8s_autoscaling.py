"""The Kubernetes package's autoscaling component (deploy/k8s/autoscaling): an HPA per pool on
the sidecar's saturation metric through the Prometheus adapter, rendered by the real ``kubectl
kustomize``, valid against the Kubernetes schemas, and its bounds written by ``vllm-obs plan
--k8s``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from obs import conventions as c
from obs.config import default_config_path, load_config
from obs.deploy import manifest
from obs.kube import autoscale
from obs.loadgen.mix import load_mix
from obs.sweep.profile import resolve
from obs.sweep.replay import Replay
from tests.conftest import require_binary

pytestmark = pytest.mark.process  # kubectl kustomize, promtool, the plan's CLI

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
HERE = K8S / "autoscaling"
KUBERNETES_VERSION = "1.32.0"


def _adapter_rules() -> list[dict[str, Any]]:
    values = yaml.safe_load((HERE / "prometheus-adapter.yaml").read_text(encoding="utf-8"))
    rules: list[dict[str, Any]] = values["rules"]["custom"]
    return rules


def test_each_pool_has_a_valid_hpa_on_the_sidecar_saturation_metric() -> None:
    """The component renders one autoscaling/v2 HPA per default pool, valid for Kubernetes,
    scaling that pool's Deployment of the package on the adapter's pods metric, its target
    80% of the pool's max_num_seqs."""
    hpas = manifest.render(HERE)
    config = load_config(default_config_path())
    deployments = {d["metadata"]["name"] for d in manifest.render(K8S) if d["kind"] == "Deployment"}
    assert sorted(h["metadata"]["name"] for h in hpas) == sorted(
        f"vllm-{p.name}" for p in config.pools
    )
    served = {rule["name"]["as"] for rule in _adapter_rules()}
    for hpa in hpas:
        kubernetes_validate.validate(hpa, KUBERNETES_VERSION, strict=True)
        spec = hpa["spec"]
        assert spec["scaleTargetRef"]["name"] in deployments
        (metric,) = spec["metrics"]
        assert metric["pods"]["metric"]["name"] == autoscale.METRIC and autoscale.METRIC in served
        pool = config.pool(hpa["metadata"]["name"].removeprefix("vllm-"))
        seqs = pool.declared.values()["max_num_seqs"] if pool.declared else 256
        assert metric["pods"]["target"]["averageValue"] == str(int(0.8 * seqs))  # type: ignore[operator]
        assert 1 <= spec["minReplicas"] <= spec["maxReplicas"]


def test_adapter_rules_read_sidecar_and_dcgm_series_with_valid_promql(tmp_path: Path) -> None:
    """The adapter's rules select the sidecar's own pool gauges (and dcgm-exporter's GPU
    utilisation, the alternative) by namespace and pod, and their queries, with the adapter's
    templates filled in, are PromQL that promtool accepts."""
    promtool = require_binary("promtool")
    rules = _adapter_rules()
    (saturation,) = [r for r in rules if r["name"]["as"] == autoscale.METRIC]
    for source in (c.POOL_RUNNING.name, c.POOL_WAITING.name):
        assert f"{source}{{<<.LabelMatchers>>}}" in saturation["metricsQuery"]
    recording = []
    for i, rule in enumerate(rules):
        assert rule["resources"]["overrides"] == {
            "namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}
        }  # fmt: skip
        query = rule["metricsQuery"].replace("<<.GroupBy>>", "namespace, pod")
        query = query.replace("<<.LabelMatchers>>", 'namespace="default", pod=~"vllm-.*"')
        recording.append({"record": f"adapter:rule{i}", "expr": query})
    path = tmp_path / "adapter.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "adapter", "rules": recording}]}))
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_gpu_utilisation_patch_switches_every_hpa_to_dcgm(tmp_path: Path) -> None:
    """The alternative signal applies as documented: every HPA then scales on the adapter's
    DCGM_FI_DEV_GPU_UTIL pods metric, still valid."""
    tree = tmp_path / "autoscaling"
    shutil.copytree(HERE, tree)
    kustomization = yaml.safe_load((tree / "kustomization.yaml").read_text())
    kustomization["patches"].append(
        {"path": "gpu-utilisation.yaml", "target": {"kind": "HorizontalPodAutoscaler"}}
    )
    (tree / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    for hpa in manifest.render(tree):
        kubernetes_validate.validate(hpa, KUBERNETES_VERSION, strict=True)
        (metric,) = hpa["spec"]["metrics"]
        assert metric["pods"]["metric"]["name"] == "DCGM_FI_DEV_GPU_UTIL"


def test_plan_k8s_writes_each_pool_bounds_from_recorded_to_grown(tmp_path: Path) -> None:
    """`vllm-obs plan --growth 3 --k8s DIR` writes DIR/autoscaling/bounds.yaml: the pool's HPA
    from the replicas for the recorded traffic to those for the grown traffic (plan.json's),
    a patch kustomize applies to the pool's HPA."""
    events = tmp_path / "events.jsonl.gz"
    Replay(resolve("single-balanced"), load_mix(), events).run(150, 4.0, 0)
    profile = ROOT / "obs" / "data" / "profile-single-balanced.yaml"
    package = tmp_path / "k8s"
    cmd = [sys.executable, "-m", "obs.cli", "plan", str(events), "--config", str(profile),
           "--growth", "3", "--out", str(tmp_path / "plan"), "--k8s", str(package)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    (pool,) = json.loads((tmp_path / "plan" / "plan.json").read_text())["pools"]
    (bounds,) = yaml.safe_load_all((package / "autoscaling" / "bounds.yaml").read_text())
    assert bounds["metadata"]["name"] == "vllm-main"
    assert bounds["spec"]["maxReplicas"] == pool["replicas"]
    assert 1 <= bounds["spec"]["minReplicas"] <= pool["replicas"]
    config = resolve("single-balanced").config
    (package / "autoscaling" / "hpa.yaml").write_text(autoscale.hpa_file(config, ""))
    shutil.copyfile(HERE / "kustomization.yaml", package / "autoscaling" / "kustomization.yaml")
    (hpa,) = manifest.render(package / "autoscaling")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (
        bounds["spec"]["minReplicas"], bounds["spec"]["maxReplicas"]
    )  # fmt: skip
