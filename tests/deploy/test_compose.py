"""The docker-compose stack: valid compose file, mounts exist, every address names a real port.

There is no Docker engine here: the file is validated against the compose
specification (check-jsonschema's vendored schema) and cross-checked with the
configs it mounts (Prometheus, Grafana provisioning, Tempo, lanes).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from obs import conventions as c
from obs.config import default_config_path, load_config
from tests.conftest import require_binary
from tests.support import strings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DEPLOY = ROOT / "deploy"
URL_RE = re.compile(r"\bhttps?://([A-Za-z0-9.-]+):(\d+)")
LOOPBACK = {"localhost", "127.0.0.1", "0.0.0.0"}
# Ports the official images listen on unless a flag moves them.
IMAGE_PORTS = {"prom/prometheus": 9090, "prom/alertmanager": 9093, "grafana/grafana": 3000}


def _interpolate(obj: Any) -> Any:
    """Apply compose's ``${VAR:-default}`` interpolation with an empty environment."""
    if isinstance(obj, str):
        return re.sub(r"\$\{\w+(?::?-([^}]*))?\}", lambda m: m.group(1) or "", obj)
    if isinstance(obj, dict):
        return {k: _interpolate(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_interpolate(v) for v in obj]
    return obj


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


COMPOSE_DATA: dict[str, Any] = _interpolate(_load(COMPOSE))
SERVICES: dict[str, dict[str, Any]] = COMPOSE_DATA["services"]
PROMETHEUS = _load(DEPLOY / "prometheus" / "prometheus.yml")
DATASOURCES = _load(DEPLOY / "grafana" / "provisioning" / "datasources" / "vllm-obs.yaml")
PROVIDERS = _load(DEPLOY / "grafana" / "provisioning" / "dashboards" / "vllm-obs.yaml")
TEMPO = _load(DEPLOY / "tempo" / "tempo.yaml")
LANES = load_config(DEPLOY / "lanes.compose.yaml")


def _command(service: str) -> list[str]:
    cmd = SERVICES[service]["command"]
    return [str(a) for a in (cmd if isinstance(cmd, list) else cmd.split())]


def _flag(args: list[str], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in an argument list."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _exposed(service: str) -> set[int]:
    """Container ports a service declares (expose, and the container side of ports)."""
    spec = SERVICES[service]
    ports = {int(p) for p in spec.get("expose", [])}
    ports |= {int(str(p).rsplit(":", 1)[-1].split("/")[0]) for p in spec.get("ports", [])}
    return ports


def _mounts(service: str) -> dict[str, str]:
    """Container path -> host source (relative to the compose file, or a named volume)."""
    out = {}
    for entry in SERVICES[service].get("volumes", []):
        src, dst = str(entry).split(":")[:2]
        out[dst] = src
    return out


def _host_path(service: str, container_path: str) -> Path:
    """The file in this repository that appears at ``container_path`` inside ``service``."""
    for dst, src in sorted(_mounts(service).items(), key=lambda kv: -len(kv[0])):
        if container_path == dst or container_path.startswith(dst.rstrip("/") + "/"):
            assert src.startswith("./"), f"{service}: {container_path} is on volume {src}"
            return (COMPOSE.parent / src).resolve() / container_path[len(dst) :].lstrip("/")
    raise AssertionError(f"{service}: nothing mounted at {container_path}")


def _check_address(where: str, host: str, port: int, itself: str | None = None) -> None:
    if host in LOOPBACK:
        assert itself is not None, f"{where}: {host}:{port} is a loopback address"
        host = itself
    assert host in SERVICES, f"{where}: {host} is not a compose service"
    assert port in _exposed(host), f"{where}: {host} does not expose port {port}"


# -- the compose file itself -------------------------------------------------------------------


def _check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.process
def test_compose_file_follows_the_compose_specification() -> None:
    """docker-compose.yml validates against the compose-spec JSON schema."""
    result = _check_jsonschema(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.process
def test_compose_schema_check_rejects_a_broken_file(tmp_path: Path) -> None:
    """The schema check is live: an unknown service key fails it."""
    broken = tmp_path / "docker-compose.yml"
    text = COMPOSE.read_text(encoding="utf-8")
    broken.write_text(text.replace("  sidecar:\n", "  sidecar:\n    restart_policy: always\n", 1))
    assert _check_jsonschema(broken).returncode != 0


def test_mounted_files_and_build_context_exist() -> None:
    """Every bind-mounted path exists, named volumes are declared, the build has a Dockerfile."""
    volumes = set(COMPOSE_DATA.get("volumes") or {})
    for name in SERVICES:
        for dst, src in _mounts(name).items():
            if src.startswith(("./", "/")):
                assert (COMPOSE.parent / src).exists(), f"{name}: {src} (mounted at {dst}) missing"
            else:
                assert src in volumes, f"{name}: volume {src} is not declared"
        if "build" in SERVICES[name]:
            assert (COMPOSE.parent / SERVICES[name]["build"] / "Dockerfile").is_file()


def test_services_listen_on_the_ports_they_expose() -> None:
    """Each service's own settings put it on the ports it declares, and only those."""
    for name in ("vllm-interactive", "vllm-bulk", "sidecar"):
        assert {int(_flag(_command(name), "--port") or 0)} <= _exposed(name), name
    assert _exposed("sidecar") == {8000}  # one port: the API, /metrics and vLLM's spans
    tempo = {TEMPO["server"]["http_listen_port"]}
    for proto in TEMPO["distributor"]["receivers"]["otlp"]["protocols"].values():
        host, port = proto["endpoint"].rsplit(":", 1)
        assert host == "0.0.0.0", "Tempo >= 2.7 binds localhost unless told otherwise"
        tempo.add(int(port))
    assert _exposed("tempo") == tempo
    for name, spec in SERVICES.items():
        image = spec.get("image", "").split(":")[0]
        if image in IMAGE_PORTS:
            assert _exposed(name) == {IMAGE_PORTS[image]}, name
            assert not any("listen-address" in a for a in spec.get("command", [])), name


def test_every_address_in_the_stack_names_a_service_port() -> None:
    """URLs and targets in compose, Prometheus, Grafana and the lanes file hit exposed ports."""
    for name, spec in SERVICES.items():
        for text in strings({k: v for k, v in spec.items() if k != "healthcheck"}):
            for host, port in URL_RE.findall(text):
                _check_address(f"compose {name}", host, int(port))
    for job in PROMETHEUS["scrape_configs"]:
        for sc in job["static_configs"]:
            for target in sc["targets"]:
                host, port = target.rsplit(":", 1)
                _check_address(f"prometheus job {job['job_name']}", host, int(port), "prometheus")
    for am in PROMETHEUS["alerting"]["alertmanagers"]:
        for sc in am["static_configs"]:
            for target in sc["targets"]:
                host, port = target.rsplit(":", 1)
                _check_address("prometheus alerting", host, int(port))
    for ds in DATASOURCES["datasources"]:
        ((host, port),) = URL_RE.findall(ds["url"])
        _check_address(f"grafana datasource {ds['name']}", host, int(port))
    for pool in LANES.pools:
        for url in pool.replicas:
            ((host, port),) = URL_RE.findall(url)
            _check_address(f"lanes pool {pool.name}", host, int(port))
    if LANES.clickhouse is not None:
        ((host, port),) = URL_RE.findall(LANES.clickhouse.url)
        _check_address("lanes clickhouse", host, int(port))


# -- how the parts fit -------------------------------------------------------------------------


def test_prometheus_scrapes_the_sidecar_and_each_replica_with_its_pool() -> None:
    """The sidecar is scraped on its port, each pool replica with label pool=<pool name>, and
    the dcgm-exporter service on its port."""
    targets: dict[str, dict[str, str]] = {}
    for job in PROMETHEUS["scrape_configs"]:
        for sc in job["static_configs"]:
            for t in sc["targets"]:
                targets[t] = sc.get("labels", {})
    assert f"sidecar:{_flag(_command('sidecar'), '--port')}" in targets
    assert "dcgm-exporter:9400" in targets  # the GPU panels' and alerts' DCGM_FI_DEV_* series
    for pool in LANES.pools:
        for url in pool.replicas:
            ((host, port),) = URL_RE.findall(url)
            assert targets.get(f"{host}:{port}") == {"pool": pool.name}, url


def test_prometheus_loads_the_mounted_generated_rules() -> None:
    """rule_files point into the mount of deploy/prometheus/rules; Alertmanager is wired."""
    rules_dir = DEPLOY / "prometheus" / "rules"
    for pattern in PROMETHEUS["rule_files"]:
        assert _host_path("prometheus", str(Path(pattern).parent)) == rules_dir.resolve()
    assert _host_path("prometheus", "/etc/prometheus/prometheus.yml").samefile(
        DEPLOY / "prometheus" / "prometheus.yml"
    )
    assert "--config.file=/etc/prometheus/prometheus.yml" in SERVICES["prometheus"]["command"]


def test_grafana_provisions_the_generated_dashboards_and_datasources() -> None:
    """Grafana loads deploy/grafana/dashboards and the datasource types the dashboards ask for."""
    assert (
        _host_path("grafana", "/etc/grafana/provisioning")
        == (DEPLOY / "grafana" / "provisioning").resolve()
    )
    (provider,) = PROVIDERS["providers"]
    dashboards = _host_path("grafana", provider["options"]["path"])
    assert dashboards == (DEPLOY / "grafana" / "dashboards").resolve()
    home = SERVICES["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert _host_path("grafana", home).is_file()
    by_uid = {ds["uid"]: ds for ds in DATASOURCES["datasources"]}
    assert {ds["type"] for ds in by_uid.values()} >= {"prometheus", "tempo"}
    assert [ds["uid"] for ds in by_uid.values() if ds.get("isDefault")] == ["prometheus"]
    for ds in by_uid.values():
        json_data = ds.get("jsonData", {})
        refs = [d["datasourceUid"] for d in json_data.get("exemplarTraceIdDestinations", [])]
        refs += [
            v["datasourceUid"]
            for v in json_data.values()
            if isinstance(v, dict) and "datasourceUid" in v
        ]
        assert set(refs) <= set(by_uid), ds["name"]


def test_exemplars_are_stored_and_link_to_tempo() -> None:
    """Prometheus runs with exemplar storage (flag and ring size) and the Prometheus datasource
    links the exemplars' trace_id label to the Tempo datasource."""
    assert "--enable-feature=exemplar-storage" in SERVICES["prometheus"]["command"]
    assert PROMETHEUS["storage"]["exemplars"]["max_exemplars"] > 0
    by_uid = {ds["uid"]: ds for ds in DATASOURCES["datasources"]}
    (link,) = by_uid["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert link["name"] == c.EXEMPLAR_TRACE_ID and by_uid[link["datasourceUid"]]["type"] == "tempo"


def test_traces_flow_vllm_to_sidecar_to_tempo() -> None:
    """vLLM sends spans to the sidecar's own port (POST /v1/traces), to a pool whose
    engine_traces is on; the sidecar exports to Tempo's OTLP/HTTP."""
    sidecar_port = int(_flag(_command("sidecar"), "--port") or 0)
    assert all(pool.engine_traces for pool in LANES.pools)
    for name in ("vllm-interactive", "vllm-bulk"):
        endpoint = _flag(_command(name), "--otlp-traces-endpoint") or ""
        ((host, port),) = URL_RE.findall(endpoint)
        assert (host, int(port)) == ("sidecar", sidecar_port), name
        assert endpoint.endswith("/v1/traces"), name
        assert (
            SERVICES[name]["environment"]["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
        )
    exporter = SERVICES["sidecar"]["environment"]["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    ((host, port),) = URL_RE.findall(exporter)
    http = TEMPO["distributor"]["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    assert host == "tempo" and port == http.rsplit(":", 1)[1]
    assert exporter.endswith("/v1/traces")


def _pool_flags_from_default_lanes() -> dict[str, dict[str, str | None]]:
    """The `vllm serve` flags each pool's comment in obs/data/lanes.yaml asks for."""
    flags: dict[str, dict[str, str | None]] = {}
    pending: list[str] = []
    for line in default_config_path().read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and "--" in stripped:
            pending += stripped.lstrip("#").split()
        m = re.match(r"-\s+name:\s*(\S+)", stripped)
        if m and pending:
            tokens = [t for t in pending if t not in ("vllm", "serve", "MODEL")]
            flags[m.group(1)] = {
                t: (
                    tokens[i + 1]
                    if i + 1 < len(tokens) and not tokens[i + 1].startswith("--")
                    else None
                )
                for i, t in enumerate(tokens)
                if t.startswith("--")
            }
            pending = []
        elif not stripped.startswith("#"):
            pending = [] if stripped else pending
    return flags


def test_vllm_pools_run_with_the_flags_the_lanes_file_gives() -> None:
    """Each pool's service runs `vllm serve` with its scheduler flags from obs/data/lanes.yaml."""
    expected = _pool_flags_from_default_lanes()
    assert set(expected) == {p.name for p in LANES.pools}
    for pool, flags in expected.items():
        args = _command(f"vllm-{pool}")
        assert SERVICES[f"vllm-{pool}"]["image"].startswith("vllm/vllm-openai:")
        for flag, value in flags.items():
            assert flag in args or _flag(args, flag) is not None, (pool, flag)
            if value is not None and "SIDECAR" not in value:
                assert _flag(args, flag) == value, (pool, flag)
        for flag in (
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--otlp-traces-endpoint",
        ):
            assert flag in args, (pool, flag)
        devices = SERVICES[f"vllm-{pool}"]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]


def test_compose_lanes_are_the_default_lanes_on_compose_services() -> None:
    """deploy/lanes.compose.yaml = the default config with compose replica URLs; it is mounted."""
    default = load_config(default_config_path())
    assert LANES.lanes == default.lanes
    assert LANES.default_lane == default.default_lane
    assert LANES.recognition == default.recognition
    assert [(p.name, p.kv_cache_usage_max) for p in LANES.pools] == [
        (p.name, p.kv_cache_usage_max) for p in default.pools
    ]
    for pool in LANES.pools:
        assert [URL_RE.findall(u)[0][0] for u in pool.replicas] == [f"vllm-{pool.name}"]
    config = _flag(_command("sidecar"), "--config") or ""
    assert _host_path("sidecar", config).samefile(DEPLOY / "lanes.compose.yaml")


def test_alertmanager_routes_to_defined_receivers() -> None:
    """Every route of alertmanager.yml names a receiver the file defines."""
    config = _load(DEPLOY / "alertmanager" / "alertmanager.yml")
    receivers = {r["name"] for r in config["receivers"]}
    routes = [config["route"], *config["route"].get("routes", [])]
    assert {r["receiver"] for r in routes if "receiver" in r} <= receivers
    path = _flag(SERVICES["alertmanager"]["command"], "--config.file") or ""
    assert _host_path("alertmanager", path).samefile(DEPLOY / "alertmanager" / "alertmanager.yml")


def test_dockerfile_runs_the_sidecar_as_compose_does() -> None:
    """The image exposes the sidecar's ports, runs its command, and its context has the code."""
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    exposed = {
        int(p) for line in re.findall(r"^EXPOSE (.+)$", dockerfile, re.M) for p in line.split()
    }
    assert exposed == _exposed("sidecar")
    cmd = re.search(r"^CMD (\[.+\])$", dockerfile, re.M)
    assert cmd and yaml.safe_load(cmd.group(1)) == _command("sidecar")
    ignored = {
        line.strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    needed = {"pyproject.toml", "README.md", *project["tool"]["setuptools"]["package-dir"].values()}
    assert not needed & ignored, sorted(needed & ignored)


@pytest.mark.stack
def test_promtool_accepts_the_prometheus_config(tmp_path: Path) -> None:
    """promtool checks prometheus.yml, with the rules read from deploy/prometheus/rules."""
    promtool = require_binary("promtool")
    text = (DEPLOY / "prometheus" / "prometheus.yml").read_text(encoding="utf-8")
    config = tmp_path / "prometheus.yml"
    config.write_text(text.replace("/etc/prometheus/rules", str(DEPLOY / "prometheus" / "rules")))
    result = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.stack
def test_amtool_accepts_the_alertmanager_config() -> None:
    """amtool checks alertmanager.yml."""
    amtool = require_binary("amtool")
    path = DEPLOY / "alertmanager" / "alertmanager.yml"
    result = subprocess.run(
        [amtool, "check-config", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
