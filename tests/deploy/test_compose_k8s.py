"""The Kubernetes example: vLLM and the sidecar in one pod, ports and paths consistent."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from obs.config import parse_config

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "vllm-with-sidecar.yaml"
DOCS = {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text(encoding="utf-8")) if d}
POD = DOCS["Deployment"]["spec"]["template"]
CONTAINERS = {c["name"]: c for c in POD["spec"]["containers"]}


def _args(container: dict[str, Any]) -> list[str]:
    return [str(a) for a in container.get("command", []) + container.get("args", [])]


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def _ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def test_manifest_has_the_config_the_deployment_and_the_service() -> None:
    """The file parses into a ConfigMap, a Deployment and a Service; the lanes config is valid."""
    assert set(DOCS) == {"ConfigMap", "Deployment", "Service"}
    config = parse_config(yaml.safe_load(DOCS["ConfigMap"]["data"]["lanes.yaml"]), "configmap")
    assert config.default_lane in config.lane_names
    assert set(CONTAINERS) == {"vllm", "sidecar"}


def test_sidecar_reaches_vllm_in_the_same_pod() -> None:
    """Every replica URL is localhost on the port vLLM listens on and declares."""
    config = parse_config(yaml.safe_load(DOCS["ConfigMap"]["data"]["lanes.yaml"]))
    vllm = CONTAINERS["vllm"]
    port = int(_flag(_args(vllm), "--port"))
    assert port == _ports(vllm)["engine"]
    for pool in config.pools:
        for url in pool.replicas:
            parts = urlsplit(url)
            assert (parts.hostname, parts.port) == ("127.0.0.1", port), url


def test_sidecar_listens_where_the_pod_says() -> None:
    """The sidecar's --port is its http port; the scrape annotation names that port."""
    sidecar = CONTAINERS["sidecar"]
    args = _args(sidecar)
    assert args[:2] == ["vllm-obs", "sidecar"]
    port = int(_flag(args, "--port"))
    assert port == _ports(sidecar)["http"]
    assert POD["metadata"]["annotations"]["prometheus.io/port"] == str(port)


def test_vllm_sends_spans_to_the_sidecar_otlp_port() -> None:
    """vLLM's --otlp-traces-endpoint is the sidecar's OTLP port on localhost."""
    endpoint = urlsplit(_flag(_args(CONTAINERS["vllm"]), "--otlp-traces-endpoint"))
    assert endpoint.hostname == "127.0.0.1"
    assert endpoint.port == _ports(CONTAINERS["sidecar"])["otlp"]
    args = _args(CONTAINERS["vllm"])
    assert "--enable-prefix-caching" in args and "--enable-prompt-tokens-details" in args


def test_config_map_is_mounted_where_the_sidecar_reads_it() -> None:
    """--config and --events live under volume mounts; the config volume is the ConfigMap."""
    sidecar = CONTAINERS["sidecar"]
    args = _args(sidecar)
    volumes = {v["name"]: v for v in POD["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}
    config_path = Path(_flag(args, "--config"))
    config_volume = volumes[mounts[str(config_path.parent)]]
    assert config_volume["configMap"]["name"] == DOCS["ConfigMap"]["metadata"]["name"]
    assert config_path.name in DOCS["ConfigMap"]["data"]
    assert str(Path(_flag(args, "--events")).parent) in mounts


def test_probes_and_service_use_declared_ports() -> None:
    """Probes and Service target ports name container ports; the selector matches the pod."""
    names = {n for c in CONTAINERS.values() for n in _ports(c)}
    for container in CONTAINERS.values():
        for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
            if probe in container:
                assert container[probe]["httpGet"]["port"] in _ports(container), probe
    service = DOCS["Service"]["spec"]
    assert {p["targetPort"] for p in service["ports"]} <= names
    labels = POD["metadata"]["labels"]
    assert service["selector"].items() <= labels.items()
    assert DOCS["Deployment"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
