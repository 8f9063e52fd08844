"""The dcgm-exporter both shipped deployments run collects every DCGM field vllm-obs reads: the
file its ``--collectors`` flag names, as mounted into it (a bind mount in docker-compose.yml,
a ConfigMap in the rendered kustomize package), lists each field a rule, dashboard or
autoscaler reads, in dcgm-exporter's counters format; the DaemonSet names the host label after
the node."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from obs import conventions as c
from obs.deploy import manifest, wiring

pytestmark = pytest.mark.process  # kubectl kustomize

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
IMAGE = "nvcr.io/nvidia/k8s/dcgm-exporter"
# What Prometheus, Grafana and the autoscalers load: the rules, the dashboards, the adapter's
# rules and the HPA patch.
READERS = (
    *sorted((ROOT / "deploy" / "prometheus" / "rules").glob("*.yml")),
    *sorted((ROOT / "deploy" / "grafana" / "dashboards").glob("*.json")),
    *sorted((K8S / "monitoring").glob("*.yaml")),
    *sorted((K8S / "autoscaling").glob("*.yaml")),
)
FIELD = re.compile(r"\bDCGM_FI_[A-Z0-9_]*[A-Z0-9]\b")
TYPES = {"gauge", "counter", "histogram", "summary", "label"}  # what dcgm-exporter accepts


def _fields_read() -> set[str]:
    """Every DCGM field the conventions name and the shipped rules, dashboards and autoscaling
    files mention."""
    named = set(c.DCGM_METRICS) | set(c.DCGM_FAULT_METRICS)
    return named | {m for p in READERS for m in FIELD.findall(p.read_text(encoding="utf-8"))}


def _counters(text: str) -> dict[str, str]:
    """Field -> Prometheus type, read as dcgm-exporter reads its counters file: ``#`` starts a
    comment line, every other non-empty line is three comma-separated fields (trimmed)."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    out = {}
    for record in csv.reader(lines):
        assert len(record) == 3, f"not field, type, help: {record}"
        name, kind, _ = (r.strip() for r in record)
        assert kind in TYPES, f"{name}: type {kind!r}"
        out[name] = kind
    return out


def _exporter(deployment: manifest.Deployment) -> manifest.Container:
    (container,) = [ct for u in deployment.units for ct in u.containers if ct.family == IMAGE]
    return container


def _collected(container: manifest.Container) -> dict[str, str]:
    """The counters file the container's --collectors (or -f) names, as mounted into it."""
    path = wiring.flag(container.argv, "--collectors") or wiring.flag(container.argv, "-f")
    assert path, f"{container.name}: no --collectors: it would collect the image's defaults"
    text = wiring.mounted_text(container, path)
    assert text is not None, f"{container.name}: {path} is under no mount"
    return _counters(text)


# The fault counters the rules take increase() or rate() of.
COUNTERS = (
    c.DCGM_ECC_DBE_VOL,
    c.DCGM_UNCORRECTABLE_ROWS,
    c.DCGM_THERMAL_VIOLATION,
    c.DCGM_POWER_VIOLATION,
)


def test_both_deployments_collect_every_dcgm_field_a_rule_or_panel_reads() -> None:
    """docker-compose.yml's dcgm-exporter and the DaemonSet run one release, each with a
    --collectors file holding every field read (the ECC and violation counters among them,
    off in the image's defaults), the fault counters typed as counters."""
    read = _fields_read()
    assert read >= {c.DCGM_GPU_UTIL, *COUNTERS}
    compose = _exporter(manifest.compose(ROOT / "docker-compose.yml"))
    daemon = _exporter(manifest.kubernetes(K8S))
    assert compose.image == daemon.image
    for container in (compose, daemon):
        collected = _collected(container)
        assert sorted(read - set(collected)) == [], container.name
        assert {collected[n] for n in COUNTERS} == {"counter"}, container.name


def test_a_dropped_field_or_a_comma_in_a_help_text_is_caught() -> None:
    """The shipped file less its power-violation line misses that field, and a fourth field
    (a comma in a help text, which dcgm-exporter refuses) fails the read."""
    text = (K8S / "gpu" / "dcgm-counters.csv").read_text(encoding="utf-8")
    kept = [line for line in text.splitlines() if not line.startswith(c.DCGM_POWER_VIOLATION)]
    assert _fields_read() - set(_counters("\n".join(kept))) == {c.DCGM_POWER_VIOLATION}
    with pytest.raises(AssertionError, match="not field, type, help"):
        _counters(f"{c.DCGM_GPU_UTIL}, gauge, busy, in %\n")


def test_daemonset_names_the_host_label_after_the_node() -> None:
    """dcgm-exporter's host label is its NODE_NAME: the DaemonSet sets it from spec.nodeName
    (else it would be the pod's name, new at each restart)."""
    (daemon,) = manifest.kubernetes(K8S).by_kind("DaemonSet")
    containers = daemon["spec"]["template"]["spec"]["containers"]
    (container,) = [ct for ct in containers if ct["image"].startswith(IMAGE)]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
