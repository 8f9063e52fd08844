"""Test helper users can use too: a real ``clickhouse-server`` as a plain process.

``ClickHouseServer`` writes its own config, users file and data directory under
a given directory, listens on free 127.0.0.1 ports, and is stopped by PID
(``stop``; an ``obs.procs.ManagedProcess``, its process group reaped), so it
needs no root service. ``restart`` keeps the data and ports.
Several servers can form a cluster (``cluster=`` names the shards' HTTP-free
TCP addresses) for a ``Distributed`` table. A user ``obs`` with a password
exists besides ``default`` (no password) for credential tests.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from obs.clickhouse.client import ClickHouseError, Client, Credentials
from obs.procs import ManagedProcess, NotReady, free_port

PASSWORD_USER = ("obs", "obs-test-password")
_CONFIG = """<?xml version="1.0"?>
<yandex>
  <logger><level>warning</level><log>{d}/server.log</log><errorlog>{d}/error.log</errorlog></logger>
  <http_port>{http}</http_port>
  <tcp_port>{tcp}</tcp_port>
  <listen_host>127.0.0.1</listen_host>
  <path>{d}/data/</path>
  <tmp_path>{d}/data/tmp/</tmp_path>
  <user_files_path>{d}/data/user_files/</user_files_path>
  <format_schema_path>{d}/data/format_schemas/</format_schema_path>
  <mark_cache_size>268435456</mark_cache_size>
  <uncompressed_cache_size>268435456</uncompressed_cache_size>
  <users_config>{d}/users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <timezone>UTC</timezone>
  <mlock_executable>false</mlock_executable>
  <remote_servers>{remote}</remote_servers>
</yandex>
"""
_USER = (
    "<{name}><password>{password}</password><networks><ip>127.0.0.1</ip></networks>"
    "<profile>default</profile><quota>default</quota></{name}>"
)
_USERS = """<?xml version="1.0"?>
<yandex>
  <profiles><default><max_memory_usage>4000000000</max_memory_usage></default></profiles>
  <users>{users}</users>
  <quotas><default><interval><duration>3600</duration><queries>0</queries><errors>0</errors>
  <result_rows>0</result_rows><read_rows>0</read_rows><execution_time>0</execution_time>
  </interval></default></quotas>
</yandex>
"""


def server_binary() -> str | None:
    """The ``clickhouse-server`` (Debian) or ``clickhouse`` (upstream) binary, if installed."""
    for name in ("clickhouse-server", "clickhouse"):
        path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
        if path:
            return path
    return None


def _remote(cluster: str, shards: Sequence[int]) -> str:
    replicas = "".join(
        f"<shard><replica><host>127.0.0.1</host><port>{p}</port></replica></shard>" for p in shards
    )
    return f"<{cluster}>{replicas}</{cluster}>"


class ClickHouseServer:
    """One ``clickhouse-server`` on 127.0.0.1 with its data in ``directory``."""

    def __init__(self, directory: Path, *, tcp_port: int | None = None) -> None:
        self.dir = Path(directory)
        self.http_port = free_port()
        self.tcp_port = tcp_port or free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self._process: ManagedProcess | None = None
        self.cluster: tuple[str, tuple[int, ...]] | None = None

    def configure(self, cluster: str | None = None, shards: Sequence[int] = ()) -> None:
        """Write config and users; ``cluster`` names the shards' TCP ports."""
        self.cluster = (cluster, tuple(shards)) if cluster else None
        self.dir.mkdir(parents=True, exist_ok=True)
        remote = _remote(cluster, shards) if cluster else ""
        (self.dir / "config.xml").write_text(
            _CONFIG.format(d=self.dir, http=self.http_port, tcp=self.tcp_port, remote=remote)
        )
        users = _USER.format(name="default", password="") + _USER.format(
            name=PASSWORD_USER[0], password=PASSWORD_USER[1]
        )
        (self.dir / "users.xml").write_text(_USERS.format(users=users))

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    def start(self, timeout_s: float = 30.0) -> ClickHouseServer:
        binary = server_binary()
        if binary is None:
            raise RuntimeError("clickhouse-server is not installed (scripts/setup installs it)")
        if not (self.dir / "config.xml").exists():
            self.configure()
        cmd = [binary, f"--config-file={self.dir / 'config.xml'}"]
        if binary.endswith("/clickhouse"):
            cmd.insert(1, "server")
        self._process = ManagedProcess(
            "clickhouse-server", cmd, log_path=self.dir / "stdout.log", append_log=True
        )
        self._process.start()
        client = self.client(timeout_s=2.0)
        try:
            self._process.wait_ready(lambda: _answers(client), timeout_s, "it answered a ping")
        except NotReady:
            self.stop()
            raise RuntimeError(f"clickhouse-server did not start: {self.log_tail()}") from None
        finally:
            client.close()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM by PID, wait, then SIGKILL; its process group reaped."""
        if self._process is not None:
            self._process.stop(timeout_s)

    def restart(self) -> None:
        self.stop()
        self.start()

    def client(self, credentials: Credentials | None = None, timeout_s: float = 30.0) -> Client:
        return Client(self.url, credentials or Credentials(), timeout_s=timeout_s)

    def log_tail(self, n: int = 2000) -> str:
        text = ""
        for name in ("stdout.log", "error.log"):
            path = self.dir / name
            if path.exists():
                text += path.read_text(errors="replace")[-n:]
        return text


def _answers(client: Client) -> bool:
    try:
        client.ping()
    except ClickHouseError:
        return False
    return True
