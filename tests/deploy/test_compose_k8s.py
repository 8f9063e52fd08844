"""The Kubernetes package's pool pod (deploy/k8s/base): vLLM and the sidecar in one pod, ports
and paths consistent with each overlay's lanes config (the rendered package:
test_k8s_kustomize.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from obs.config import parse_config

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
MANIFEST = K8S / "base" / "pool.yaml"
DOCS = {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text(encoding="utf-8")) if d}
OVERLAYS = sorted(p.parent for p in K8S.glob("overlays/*/kustomization.yaml"))
LANES = {o.name: yaml.safe_load((o / "lanes.yaml").read_text(encoding="utf-8")) for o in OVERLAYS}
POD = DOCS["Deployment"]["spec"]["template"]
CONTAINERS = {c["name"]: c for c in POD["spec"]["containers"]}


def _args(container: dict[str, Any]) -> list[str]:
    return [str(a) for a in container.get("command", []) + container.get("args", [])]


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def _ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def test_manifest_has_the_deployment_and_the_service_and_overlays_their_config() -> None:
    """The pod file parses into a Deployment and a Service; each overlay's lanes config is
    valid and names its pool."""
    assert set(DOCS) == {"Deployment", "Service"}
    assert [o.name for o in OVERLAYS] == ["bulk", "interactive"]
    for pool, data in LANES.items():
        config = parse_config(data, f"overlays/{pool}/lanes.yaml")
        assert config.default_lane in config.lane_names
        assert [p.name for p in config.pools] == [pool]
    assert set(CONTAINERS) == {"vllm", "sidecar"}


def test_sidecar_reaches_vllm_in_the_same_pod() -> None:
    """Every replica URL is localhost on the port vLLM listens on and declares."""
    vllm = CONTAINERS["vllm"]
    port = int(_flag(_args(vllm), "--port"))
    assert port == _ports(vllm)["engine"]
    for data in LANES.values():
        for pool in parse_config(data).pools:
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


def test_vllm_sends_spans_to_the_sidecar_port() -> None:
    """vLLM's --otlp-traces-endpoint is the sidecar's one port on localhost (POST /v1/traces),
    and its port the declared one, in the base and in each overlay's flags (which replace the
    base's)."""
    patches = [
        yaml.safe_load((o / "vllm.yaml").read_text("utf-8"))["spec"]["template"]["spec"]
        for o in OVERLAYS
    ]
    for vllm in [CONTAINERS["vllm"], *(p["containers"][0] for p in patches)]:
        args = _args(vllm)
        endpoint = urlsplit(_flag(args, "--otlp-traces-endpoint"))
        assert endpoint.hostname == "127.0.0.1"
        assert endpoint.port == _ports(CONTAINERS["sidecar"])["http"]
        assert endpoint.path == "/v1/traces"
        assert int(_flag(args, "--port")) == _ports(CONTAINERS["vllm"])["engine"]
        assert "--enable-prefix-caching" in args and "--enable-prompt-tokens-details" in args


def test_config_map_is_mounted_where_the_sidecar_reads_it() -> None:
    """--config and --events live under volume mounts; the config volume is the ConfigMap."""
    sidecar = CONTAINERS["sidecar"]
    args = _args(sidecar)
    volumes = {v["name"]: v for v in POD["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}
    config_path = Path(_flag(args, "--config"))
    config_volume = volumes[mounts[str(config_path.parent)]]
    for overlay in OVERLAYS:  # the overlay generates the ConfigMap the volume names
        kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text("utf-8"))
        (generator,) = kustomization["configMapGenerator"]
        assert config_volume["configMap"]["name"] == generator["name"]
        assert config_path.name in generator["files"]
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
