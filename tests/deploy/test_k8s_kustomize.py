"""The kustomize package (deploy/k8s): generated parts in sync, rendered by the real
``kubectl kustomize``, every resource valid against the Kubernetes schemas (kubernetes-validate)
and the Prometheus Operator CRDs' schemas (tests/data/k8s, with jsonschema)."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from obs import conventions as c
from obs.alerts.model import RUNBOOK_PATH, build_model
from obs.alerts.rules import rule_files
from obs.cli import main
from obs.config import default_config_path, load_config, parse_config
from obs.dashboards.build import render as render_dashboards
from tests.conftest import IN_CI

# kustomize and the schema validator run once per module (cached): whichever test asks first.
pytestmark = pytest.mark.process

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
DATA = Path(__file__).resolve().parents[1] / "data" / "k8s"
KUBERNETES_VERSION = "1.32.0"  # the schemas the core resources are checked against
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_v1_servicemonitor.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_v1_prometheusrule.json",
}


def _kubectl() -> str:
    """kubectl with a kustomize of v4 or later (``labels``, inline patches); else skip/fail."""
    path = shutil.which("kubectl")
    out = "" if path is None else subprocess.run(
        [path, "version", "--client"], capture_output=True, text=True, timeout=60, check=False
    ).stdout  # fmt: skip
    m = re.search(r"Kustomize Version: v(\d+)", out)
    if path is None or m is None or int(m.group(1)) < 4:
        msg = f"kubectl with kustomize v4+ needed (scripts/setup); found: {out.strip() or 'none'}"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return path


@cache
def _render(path: Path) -> tuple[dict[str, Any], ...]:
    """``kubectl kustomize path``: the rendered resources."""
    out = subprocess.run(
        [_kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def _by_kind(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _strict(schema: Any) -> Any:
    """The schema with ``additionalProperties: false`` on every object that lists its
    properties and allows no others: an unknown field (a typo) fails, as kubeconform's
    strict mode does (the API server would prune it silently)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@cache
def _crd_validator(api: str, kind: str) -> jsonschema.Draft7Validator:
    schema = json.loads((DATA / CRD_SCHEMAS[(api, kind)]).read_text(encoding="utf-8"))
    return jsonschema.Draft7Validator(_strict(schema))


def _validate(doc: dict[str, Any]) -> None:
    """Raise unless ``doc`` is valid for its kind (a CRD's schema, else Kubernetes')."""
    key = (doc["apiVersion"], doc["kind"])
    if key in CRD_SCHEMAS:
        _crd_validator(*key).validate(doc)
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_generated_parts_match_the_default_lanes_config(tmp_path: Path) -> None:
    """`vllm-obs k8s --check` passes on deploy/k8s and fails on a package missing them."""
    assert main(["k8s", "--check", "--out", str(K8S)]) == 0, "run: vllm-obs k8s --out deploy/k8s"
    assert main(["k8s", "--check", "--out", str(tmp_path)]) == 1
    assert main(["k8s", "--out", str(tmp_path)]) == 0
    assert main(["k8s", "--check", "--out", str(tmp_path)]) == 0


def test_kustomize_renders_both_pools_a_prometheus_rule_and_service_monitors() -> None:
    """The package renders a Deployment, Service and ServiceMonitor per default pool, one
    PrometheusRule, a dashboard ConfigMap per dashboard labelled for Grafana's sidecar, and the
    dcgm-exporter DaemonSet with the Service and ServiceMonitor that scrape it."""
    docs = _render(K8S)
    pools = [p.name for p in load_config(default_config_path()).pools]
    for kind in ("Deployment", "Service", "ServiceMonitor"):
        names = sorted(d["metadata"]["name"] for d in _by_kind(docs, kind))
        dcgm = ["dcgm-exporter"] if kind != "Deployment" else []
        assert names == sorted([*dcgm, *(f"vllm-{p}" for p in pools)]), kind
    (daemon,) = _by_kind(docs, "DaemonSet")  # the GPU panels' and alerts' DCGM_FI_DEV_* series
    (monitor,) = [
        d
        for d in _by_kind(docs, "ServiceMonitor")
        if d["metadata"]["name"] == daemon["metadata"]["name"]
    ]
    port = daemon["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"]
    assert monitor["spec"]["endpoints"][0]["port"] == port
    (rule,) = _by_kind(docs, "PrometheusRule")
    assert rule["spec"]["groups"]
    boards = [
        d for d in _by_kind(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]
    ]
    uids = {name.removesuffix(".json") for d in boards for name in d["data"]}
    assert uids == set(render_dashboards(load_config(default_config_path())))
    for pool in pools:  # each overlay renders on its own too
        rendered = _render(K8S / "overlays" / pool)
        assert {d["kind"] for d in rendered} == {
            "ConfigMap",
            "Deployment",
            "Service",
            "ServiceMonitor",
        }


def test_every_rendered_resource_validates_against_its_schema() -> None:
    """Deployments, Services and ConfigMaps against Kubernetes 1.32's schemas (strict); the
    ServiceMonitors and the PrometheusRule against the Prometheus Operator CRDs' schemas."""
    docs = _render(K8S)
    assert {(d["apiVersion"], d["kind"]) for d in docs} >= set(CRD_SCHEMAS)
    for doc in docs:
        _validate(doc)


def test_schema_validation_catches_a_misspelt_field() -> None:
    """A ServiceMonitor endpoint with a typo and a Deployment with a string replica count fail:
    the validation above can fail."""
    docs = _render(K8S)
    monitor = copy.deepcopy(_by_kind(docs, "ServiceMonitor")[0])
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError, match="intervall"):
        _validate(monitor)
    deployment = copy.deepcopy(_by_kind(docs, "Deployment")[0])
    deployment["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(deployment)


def test_prometheus_rule_holds_every_rule_vllm_obs_alerts_writes() -> None:
    """The PrometheusRule's groups are the rule files' groups for the default config."""
    (rule,) = _by_kind(_render(K8S), "PrometheusRule")
    model = build_model(load_config(default_config_path()), runbook_url=RUNBOOK_PATH)
    want = [g for f in rule_files(model).values() for g in f["groups"]]
    assert rule["spec"]["groups"] == want


def test_each_pool_sidecar_serves_its_lanes_from_the_engine_beside_it() -> None:
    """Each pod's lanes config is valid, has its pool only, on the vLLM container's port with
    engine spans, and the pools' lanes together are the default config's lanes."""
    docs = _render(K8S)
    default = load_config(default_config_path())
    configs = {
        d["metadata"]["name"]: parse_config(yaml.safe_load(d["data"]["lanes.yaml"]))
        for d in _by_kind(docs, "ConfigMap")
        if "lanes.yaml" in d.get("data", {})
    }
    lanes: list[str] = []
    for deployment in _by_kind(docs, "Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        cm = next(v["configMap"]["name"] for v in spec["volumes"] if v["name"] == "lanes")
        config = configs[cm]
        (pool,) = config.pools
        assert deployment["metadata"]["name"] == f"vllm-{pool.name}"
        vllm = next(ct for ct in spec["containers"] if ct["name"] == "vllm")
        port = vllm["args"][vllm["args"].index("--port") + 1]
        assert pool.replicas == [f"http://127.0.0.1:{port}"] and pool.engine_traces
        assert {lane.pool for lane in config.lanes} == {pool.name}
        assert config.default_lane in config.lane_names
        lanes += config.lane_names
    assert sorted(lanes) == sorted(default.lane_names)


def test_service_monitor_scrapes_sidecar_and_engine_with_the_pool_label() -> None:
    """Each ServiceMonitor selects its pool's Service and scrapes its http (sidecar) and
    engine (vLLM, labelled with the pool) ports, which the Service declares."""
    docs = _render(K8S)
    services = {d["metadata"]["name"]: d for d in _by_kind(docs, "Service")}
    pools = [
        m for m in _by_kind(docs, "ServiceMonitor") if m["metadata"]["name"] != "dcgm-exporter"
    ]
    for monitor in pools:
        service = services[monitor["metadata"]["name"]]
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert selector.items() <= service["metadata"]["labels"].items()
        assert selector["vllm-obs/pool"] == service["metadata"]["labels"]["vllm-obs/pool"]
        ports = {p["name"] for p in service["spec"]["ports"]}
        endpoints = {e["port"]: e for e in monitor["spec"]["endpoints"]}
        assert set(endpoints) == {"http", "engine"} <= ports
        relabel = endpoints["engine"]["relabelings"]
        assert any(r.get("targetLabel") == c.POOL for r in relabel)
