"""Every address a container sends to, and whether its target's own command listens there.

What a container sends to: each ``http(s)://HOST:PORT`` in its command line, its environment
and the YAML files mounted into it (the sidecar's lanes config, Prometheus's scrape targets and
Alertmanagers, Grafana's datasources), and every ``HOST:PORT`` of a ``targets:`` list.
Where a container listens: what its own command says (a flag, a config file it reads) or its
image's default, per image (``listeners``). ``localhost``/``127.0.0.1`` is the unit itself (a
pod's containers share it); another host must be one of a unit's names (a compose service, a
Kubernetes Service, whose port maps to a container port), else it is outside the deployment
(an OpenTelemetry collector of the cluster) and reported as such, never as wired.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import yaml

from obs.deploy.manifest import Container, Deployment, Unit

URL_RE = re.compile(r"\bhttps?://[A-Za-z0-9.-]+(?::\d+)?[^\s\"',]*")
LOCAL = ("localhost", "127.0.0.1", "0.0.0.0", "::1")
# The port an image listens on when its command does not say (the images' documented defaults).
IMAGE_PORTS = {
    "vllm/vllm-openai": {8000},
    "prom/prometheus": {9090},
    "prom/alertmanager": {9093, 9094},
    "grafana/grafana": {3000},
    "clickhouse/clickhouse-server": {8123, 9000, 9009},
    "nvcr.io/nvidia/k8s/dcgm-exporter": {9400},
    "redis": {6379},
}


@dataclass(frozen=True, slots=True)
class Send:
    """One address ``container`` of ``unit`` sends to, and where it was written."""

    unit: str
    container: str
    where: str  # "command", "env NAME", or the mounted file's path in the container
    url: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class Verdict:
    send: Send
    target: str  # the unit reached, "" when outside the deployment
    ok: bool
    why: str


def mounted_text(container: Container, path: str) -> str | None:
    """The text of the file the container sees at ``path`` (bind mount or ConfigMap)."""
    want = PurePosixPath(path)
    for m in container.mounts:
        target = PurePosixPath(m.target)
        if want == target and m.source is not None and m.source.is_file():
            return m.source.read_text(encoding="utf-8")
        if target in want.parents:
            rel = want.relative_to(target)
            if m.source is not None and (m.source / rel).is_file():
                return (m.source / rel).read_text(encoding="utf-8")
            if m.files is not None and str(rel) in m.files:
                return m.files[str(rel)]
    return None


def flag(argv: list[str], name: str) -> str | None:
    """The value of ``NAME VALUE`` or ``NAME=VALUE`` in ``argv`` (the last one given)."""
    value = None
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(name + "="):
            value = a.split("=", 1)[1]
    return value


def _port_of(address: str | None) -> int | None:
    if not address or ":" not in address:
        return None
    tail = address.rsplit(":", 1)[1]
    return int(tail) if tail.isdigit() else None


def listeners(container: Container) -> set[int] | None:
    """The ports the container's own command listens on; None when it is not known here."""
    argv, family = container.argv, container.family
    if argv[:2] == ["vllm-obs", "sidecar"]:
        ports = {int(flag(argv, "--port") or 8000)}
        health = _port_of(flag(argv, "--health-address"))
        return ports | ({health} if health else set())
    if argv[:1] == ["vllm-obs"]:
        return set()  # the other commands (clickhouse init) serve nothing
    if family == "vllm/vllm-openai":
        return {int(flag(argv, "--port") or 8000)}
    if family in ("prom/prometheus", "prom/alertmanager"):
        default = IMAGE_PORTS[family]
        given = _port_of(flag(argv, "--web.listen-address"))
        return (default - {min(default)}) | {given or min(default)}
    if family == "grafana/tempo":
        return _tempo_ports(container)
    if "dcgm-exporter" in family:
        return {_port_of(container.env.get("DCGM_EXPORTER_LISTEN")) or 9400}
    return IMAGE_PORTS.get(family)


def _tempo_ports(container: Container) -> set[int] | None:
    config = flag(container.argv, "-config.file")
    text = mounted_text(container, config) if config else None
    if text is None:
        return None
    data = yaml.safe_load(text) or {}
    ports = {int(data.get("server", {}).get("http_listen_port", 3200))}
    receivers = data.get("distributor", {}).get("receivers", {})
    for protocol in receivers.get("otlp", {}).get("protocols", {}).values():
        port = _port_of((protocol or {}).get("endpoint"))
        if port:
            ports.add(port)
    return ports


def _strings(obj: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """(the key above it, string) for every string in a YAML document."""
    if isinstance(obj, str):
        yield key, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(v, str(k))
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v, key)


def _addresses(text: str, key: str) -> Iterator[tuple[str, str, int]]:
    for url in URL_RE.findall(text):
        parts = urlsplit(url)
        if parts.hostname:
            default = 443 if parts.scheme == "https" else 80
            yield url, parts.hostname, parts.port or default
    if key == "targets" and re.fullmatch(r"[A-Za-z0-9.-]+:\d+", text):
        host, port = text.rsplit(":", 1)
        yield text, host, int(port)


def _config_files(container: Container) -> Iterator[tuple[str, str]]:
    """(path in the container, text) of each YAML file its command names and it can read."""
    for arg in container.argv:
        path = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
        if path.startswith("/") and path.endswith((".yml", ".yaml")):
            text = mounted_text(container, path)
            if text is not None:
                yield path, text
    for m in container.mounts:  # provisioning folders (Grafana) and ConfigMaps
        if m.files is not None:
            for name, text in m.files.items():
                if name.endswith((".yml", ".yaml")):
                    yield f"{m.target}/{name}", text
        elif m.source is not None and m.source.is_dir():
            for f in sorted(m.source.rglob("*.y*ml")):
                yield f"{m.target}/{f.relative_to(m.source)}", f.read_text(encoding="utf-8")


def sends(unit: Unit) -> list[Send]:
    """Every address the unit's containers send to."""
    out: list[Send] = []
    seen: set[tuple[str, str, str]] = set()
    for c in unit.containers:
        places = [("command", a, "") for a in c.argv]
        places += [(f"env {k}", v, "") for k, v in c.env.items()]
        for path, text in _config_files(c):
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError:
                continue
            places += [(path, s, key) for key, s in _strings(data)]
        for where, text, key in places:
            for url, host, port in _addresses(text, key):
                if (c.name, where, url) not in seen:
                    seen.add((c.name, where, url))
                    out.append(Send(unit.name, c.name, where, url, host, port))
    return out


def resolve(deployment: Deployment, unit: Unit, host: str, port: int) -> tuple[Unit, int] | None:
    """The unit and container port ``host:port`` reaches from ``unit``; None: outside."""
    if host in LOCAL:
        return unit, port
    for target in deployment.units:
        if host in target.hostnames:
            return target, target.hostnames[host].get(port, port)
    return None


def unit_listeners(unit: Unit) -> set[int] | None:
    ports: set[int] = set()
    for c in unit.containers:
        listening = listeners(c)
        if listening is None:
            return None
        ports |= listening
    return ports


def check(deployment: Deployment) -> list[Verdict]:
    """A verdict on every address every unit sends to."""
    verdicts = []
    for unit in deployment.units:
        for send in sends(unit):
            found = resolve(deployment, unit, send.host, send.port)
            if found is None:
                verdicts.append(Verdict(send, "", True, "outside the deployment"))
                continue
            target, port = found
            listening = unit_listeners(target)
            if listening is None:
                verdicts.append(Verdict(send, target.name, False, "its listeners are unknown"))
            elif port in listening:
                verdicts.append(Verdict(send, target.name, True, f"listens on {port}"))
            else:
                ports = ", ".join(map(str, sorted(listening))) or "nothing"
                why = f"nothing listens on {port} (its command listens on {ports})"
                verdicts.append(Verdict(send, target.name, False, why))
    return verdicts


def undeclared(deployment: Deployment) -> list[str]:
    """Declared container ports that the container's own command does not listen on."""
    out = []
    for unit in deployment.units:
        for c in unit.containers:
            listening = listeners(c)
            if listening is None:
                continue
            for name, port in c.ports.items():
                if port not in listening:
                    out.append(f"{unit.name}/{c.name}: port {name} ({port}): nothing listens")
    return out


def probe_problems(deployment: Deployment) -> list[str]:
    """Kubernetes probes on a port the container does not listen on."""
    out = []
    for unit in deployment.units:
        for c in unit.containers:
            listening = listeners(c) or set()
            for kind, probe in c.probes.items():
                port = c.port_number(probe.get("httpGet", probe.get("tcpSocket", {})).get("port"))
                if port not in listening:
                    out.append(f"{unit.name}/{c.name}: {kind} on port {port}: nothing listens")
    return out


def manifest_files(deployment: Deployment) -> list[Path]:
    """The host files mounted into the deployment's containers (for the static checks)."""
    return sorted(
        {m.source for u in deployment.units for c in u.containers for m in c.mounts if m.source}
    )


def monitor_problems(deployment: Deployment) -> list[str]:
    """ServiceMonitor endpoints that name no port of a selected Service, or a Service port
    whose target no container of the selected pods listens on."""
    out = []
    services = deployment.by_kind("Service")
    for monitor in deployment.by_kind("ServiceMonitor"):
        name = monitor["metadata"]["name"]
        wanted = monitor["spec"].get("selector", {}).get("matchLabels", {})
        chosen = [s for s in services if wanted.items() <= s["metadata"].get("labels", {}).items()]
        if not chosen:
            out.append(f"ServiceMonitor {name}: selects no Service")
        for svc in chosen:
            ports = {p.get("name"): p for p in svc["spec"].get("ports", [])}
            pods = [
                u
                for u in deployment.units
                if svc["spec"].get("selector", {}).items() <= u.labels.items()
            ]
            for endpoint in monitor["spec"].get("endpoints", []):
                port = ports.get(endpoint.get("port"))
                if port is None:
                    out.append(f"ServiceMonitor {name}: Service {svc['metadata']['name']} has "
                               f"no port {endpoint.get('port')!r}")  # fmt: skip
                    continue
                for pod in pods:
                    target = pod.hostnames.get(svc["metadata"]["name"], {}).get(int(port["port"]))
                    if target not in (unit_listeners(pod) or set()):
                        out.append(f"ServiceMonitor {name}: {pod.name} listens on no port "
                                   f"{port.get('targetPort')!r}")  # fmt: skip
    return out
