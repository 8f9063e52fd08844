"""The shipped deployments as data: units (a compose service, a Kubernetes pod) of containers.

A container is what its manifest says it runs: the image, the command line (the manifest's
``command`` and ``args``, or compose's ``entrypoint`` and ``command``), its environment, the
ports it declares and what is mounted where (a host path, a ConfigMap's files, or an empty
folder). A unit's ``hostnames`` are the names other units reach it by: a compose service's name;
every Service whose selector matches a pod (``NAME``, ``NAME.NAMESPACE``, ``NAME.NAMESPACE.svc``
and ``NAME.NAMESPACE.svc.cluster.local``) with the Service's port -> container port map.

Compose files are read with compose's ``${VAR:-default}`` interpolation from a given
environment (the caller's, or none); the kustomize package is rendered with the real
``kubectl kustomize``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from obs.errors import ConfigError

_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")
WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet")


@dataclass(frozen=True, slots=True)
class Mount:
    """What a container sees at ``target``: a host path, ConfigMap files, or a fresh folder."""

    target: str
    source: Path | None = None  # a host file or folder (a compose bind mount)
    files: Mapping[str, str] | None = None  # a ConfigMap's keys and texts
    volume: str = ""  # a named volume or emptyDir: units sharing the name share the folder
    external: str = ""  # what cannot be had here (a hostPath on a node)


@dataclass(slots=True)
class Container:
    name: str
    image: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)  # declared: name (or str(port)) -> port
    mounts: list[Mount] = field(default_factory=list)
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)  # Kubernetes probes

    @property
    def family(self) -> str:
        """The image without registry tag: ``vllm/vllm-openai``, ``prom/prometheus``, ..."""
        return self.image.rsplit(":", 1)[0] if ":" in self.image.split("/")[-1] else self.image

    def port_number(self, port: int | str) -> int | None:
        """A probe's or Service's ``port``: a number, or the name of a declared port."""
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        return self.ports.get(str(port))


@dataclass(slots=True)
class Unit:
    """A compose service or a pod: its containers share one network address."""

    name: str
    kind: str  # "service" (compose) or "pod"
    containers: list[Container]
    hostnames: dict[str, dict[int, int]] = field(default_factory=dict)  # name -> port map
    depends: dict[str, str] = field(default_factory=dict)  # compose depends_on: unit -> condition
    labels: dict[str, str] = field(default_factory=dict)
    namespace: str = ""


@dataclass(slots=True)
class Deployment:
    """Everything one manifest (or rendered package) runs, and the monitoring it declares."""

    source: str
    units: list[Unit]
    root: Path  # what relative host paths are relative to
    resources: list[dict[str, Any]] = field(default_factory=list)  # rendered Kubernetes objects

    def unit(self, name: str) -> Unit:
        for unit in self.units:
            if unit.name == name:
                return unit
        raise KeyError(name)

    def by_kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.resources if r.get("kind") == kind]


def interpolate(obj: Any, env: Mapping[str, str]) -> Any:
    """Compose's ``${VAR}``/``${VAR:-default}``/``${VAR-default}`` over every string."""
    if isinstance(obj, str):
        return _VAR.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), obj)
    if isinstance(obj, dict):
        return {k: interpolate(v, env) for k, v in obj.items()}
    if isinstance(obj, list):
        return [interpolate(v, env) for v in obj]
    return obj


def _argv(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(a) for a in value] if isinstance(value, list) else str(value).split()


def _environment(value: Any) -> dict[str, str]:
    if isinstance(value, list):
        return dict(str(v).partition("=")[::2] for v in value)
    return {str(k): "" if v is None else str(v) for k, v in (value or {}).items()}


def _compose_port(text: Any) -> int:
    return int(str(text).rsplit(":", 1)[-1].split("/")[0])


def compose(path: Path, env: Mapping[str, str] | None = None) -> Deployment:
    """``docker-compose.yml``: one unit per service, named and reached by the service's name."""
    try:
        data = interpolate(yaml.safe_load(path.read_text(encoding="utf-8")), env or {})
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: {err}") from err
    if not isinstance(data, dict) or not isinstance(data.get("services"), dict):
        raise ConfigError(f"{path}: no services: not a compose file")
    units = []
    for name, spec in data["services"].items():
        ports = {str(p): _compose_port(p) for p in spec.get("expose", [])}
        ports |= {str(_compose_port(p)): _compose_port(p) for p in spec.get("ports", [])}
        mounts = []
        for volume in spec.get("volumes", []):
            source, target = str(volume).split(":")[:2]
            if source.startswith((".", "/")):
                mounts.append(Mount(target, source=(path.parent / source).resolve()))
            else:
                mounts.append(Mount(target, volume=source))
        container = Container(
            name=name,
            image=str(spec.get("image", "")),
            argv=_argv(spec.get("entrypoint")) + _argv(spec.get("command")),
            env=_environment(spec.get("environment")),
            ports=ports,
            mounts=mounts,
        )
        depends = spec.get("depends_on") or {}
        if isinstance(depends, list):
            depends = {d: {"condition": "service_started"} for d in depends}
        units.append(
            Unit(
                name,
                "service",
                [container],
                hostnames={name: {}},
                depends={d: str(c.get("condition", "service_started")) for d, c in depends.items()},
            )
        )
    return Deployment(str(path), units, path.parent)


def render(package: Path, kubectl: str | None = None) -> list[dict[str, Any]]:
    """``kubectl kustomize package``: the rendered resources."""
    binary = kubectl or shutil.which("kubectl")
    if binary is None:
        raise ConfigError("kubectl not found: it renders the kustomize package (scripts/setup)")
    out = subprocess.run(
        [binary, "kustomize", str(package)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise ConfigError(f"kubectl kustomize {package}: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def kubernetes(package: Path, resources: list[dict[str, Any]] | None = None) -> Deployment:
    """The rendered package: one unit per workload (a pod), reached by its Services' names."""
    docs = render(package) if resources is None else resources
    maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    units = [_pod(d, maps) for d in docs if d["kind"] in WORKLOADS]
    for svc in (d for d in docs if d["kind"] == "Service"):
        selector = svc["spec"].get("selector") or {}
        ns = svc["metadata"].get("namespace", "default")
        name = svc["metadata"]["name"]
        for unit in units:
            if selector and selector.items() <= unit.labels.items():
                ports = {}
                for p in svc["spec"].get("ports", []):
                    target = p.get("targetPort", p["port"])
                    numbers = [c.port_number(target) for c in unit.containers]
                    ports[int(p["port"])] = next((n for n in numbers if n), int(p["port"]))
                for host in (name, f"{name}.{ns}", f"{name}.{ns}.svc"):
                    unit.hostnames[host] = ports
                unit.hostnames[f"{name}.{ns}.svc.cluster.local"] = ports
    return Deployment(str(package), units, package, docs)


def _pod(workload: dict[str, Any], maps: dict[str, dict[str, str]]) -> Unit:
    template = workload["spec"]["template"]
    spec = template["spec"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    name = workload["metadata"]["name"]
    containers = []
    for c in spec.get("containers", []):
        mounts = []
        for m in c.get("volumeMounts", []):
            v = volumes.get(m["name"], {})
            if "configMap" in v:
                mounts.append(Mount(m["mountPath"], files=maps.get(v["configMap"]["name"], {})))
            elif "hostPath" in v:
                mounts.append(Mount(m["mountPath"], external=f"hostPath {v['hostPath']['path']}"))
            else:
                mounts.append(Mount(m["mountPath"], volume=f"{name}/{m['name']}"))
        containers.append(
            Container(
                name=c["name"],
                image=c.get("image", ""),
                argv=_argv(c.get("command")) + _argv(c.get("args")),
                env={e["name"]: str(e["value"]) for e in c.get("env", []) if "value" in e},
                ports={
                    p.get("name", str(p["containerPort"])): int(p["containerPort"])
                    for p in c.get("ports", [])
                },
                mounts=mounts,
                probes={k: v for k, v in c.items() if k.endswith("Probe")},
            )
        )
    labels = template.get("metadata", {}).get("labels", {})
    namespace = workload["metadata"].get("namespace", "default")
    return Unit(name, "pod", containers, labels=dict(labels), namespace=namespace)
