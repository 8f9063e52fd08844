"""What the Prometheus Operator would run for the rendered package: one Prometheus unit.

The Kubernetes package ships ServiceMonitors and a PrometheusRule, not a Prometheus: the
cluster's operator turns them into scrape configs and rule files. ``with_prometheus`` does the
same for a local run: each ServiceMonitor endpoint becomes a scrape job on the selected Services'
pods (the Service's name and the container port its port targets, which the run resolves to the
pod's address), labelled as the operator labels them (``namespace``, ``service``, ``pod``,
``container``) and relabelled by the endpoint's ``replace`` relabelings (a fixed ``replacement``
or a Service label, ``__meta_kubernetes_service_label_NAME``); every PrometheusRule's groups
become one rule file. Only these relabelings are read: the package uses no others.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from obs.deploy.manifest import Container, Deployment, Mount, Unit

PROMETHEUS_IMAGE = "prom/prometheus:v3.5.0"
CONFIG_DIR = "/etc/prometheus"
SERVICE_LABEL = "__meta_kubernetes_service_label_"


def _label_name(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", key)


def _labels(endpoint: dict[str, Any], service: dict[str, Any], pod: Unit) -> dict[str, str]:
    svc_labels = {_label_name(k): v for k, v in service["metadata"].get("labels", {}).items()}
    labels = {
        "namespace": pod.namespace,
        "service": service["metadata"]["name"],
        "pod": pod.name,
        "job": service["metadata"]["name"],
    }
    for relabel in endpoint.get("relabelings", []):
        if relabel.get("action", "replace") != "replace" or "targetLabel" not in relabel:
            continue
        sources = relabel.get("sourceLabels") or []
        if sources:
            value = ";".join(svc_labels.get(s.removeprefix(SERVICE_LABEL), "") for s in sources)
        else:
            value = str(relabel.get("replacement", ""))
        if value:
            labels[relabel["targetLabel"]] = value
    return labels


def scrape_configs(deployment: Deployment) -> list[dict[str, Any]]:
    """One scrape job per ServiceMonitor endpoint and Service, on the selected pods."""
    jobs = []
    services = deployment.by_kind("Service")
    for monitor in deployment.by_kind("ServiceMonitor"):
        wanted = monitor["spec"].get("selector", {}).get("matchLabels", {})
        for svc in services:
            if not wanted.items() <= svc["metadata"].get("labels", {}).items():
                continue
            name = svc["metadata"]["name"]
            ports = {p.get("name"): int(p["port"]) for p in svc["spec"].get("ports", [])}
            pods = [
                u
                for u in deployment.units
                if name in u.hostnames and svc["spec"]["selector"].items() <= u.labels.items()
            ]
            for i, endpoint in enumerate(monitor["spec"].get("endpoints", [])):
                port = ports.get(endpoint.get("port"))
                if port is None:
                    continue
                static = [
                    {
                        "targets": [f"{name}:{pod.hostnames[name].get(port, port)}"],
                        "labels": _labels(endpoint, svc, pod),
                    }
                    for pod in pods
                ]
                jobs.append(
                    {
                        "job_name": f"serviceMonitor/{monitor['metadata']['name']}/{name}/{i}",
                        "scrape_interval": endpoint.get("interval", "30s"),
                        "metrics_path": endpoint.get("path", "/metrics"),
                        "honor_labels": bool(endpoint.get("honorLabels", False)),
                        "static_configs": static,
                    }
                )
    return jobs


def rule_groups(deployment: Deployment) -> list[dict[str, Any]]:
    return [g for r in deployment.by_kind("PrometheusRule") for g in r["spec"].get("groups", [])]


def with_prometheus(deployment: Deployment) -> Deployment:
    """``deployment`` with a Prometheus unit that scrapes its ServiceMonitors' targets and
    loads its PrometheusRules, as the operator would configure one."""
    config = {
        "global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
        "rule_files": [f"{CONFIG_DIR}/rules/*.yaml"],
        "scrape_configs": scrape_configs(deployment),
    }
    files = {"prometheus.yml": yaml.safe_dump(config, sort_keys=False)}
    rules = yaml.safe_dump({"groups": rule_groups(deployment)}, sort_keys=False)
    container = Container(
        name="prometheus",
        image=PROMETHEUS_IMAGE,
        argv=[f"--config.file={CONFIG_DIR}/prometheus.yml", "--storage.tsdb.path=/prometheus"],
        ports={"web": 9090},
        mounts=[
            Mount(CONFIG_DIR, files=files),
            Mount(f"{CONFIG_DIR}/rules", files={"vllm-obs.yaml": rules}),
            Mount("/prometheus", volume="prometheus/data"),
        ],
    )
    unit = Unit("prometheus", "pod", [container], hostnames={"prometheus": {}})
    return Deployment(deployment.source, [*deployment.units, unit], deployment.root,
                      deployment.resources)  # fmt: skip
