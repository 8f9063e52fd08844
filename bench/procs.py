"""The processes a relay benchmark runs, and what it reads about them from /proc.

``FakeVllm`` and ``Nginx`` are subprocesses on free loopback ports (``Server``,
as are the peers of ``bench.peers``, each an ``obs.procs.ManagedProcess``),
stopped by PID with their process group reaped; ``ProcStat`` reads CPU
seconds (all threads, optionally children: nginx's workers) and peak RSS,
which it can reset between runs (``clear_refs``).
``Scraper`` reads a ``/metrics`` page at a fixed interval, as Prometheus would.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from obs.engines.server import VllmServer
from obs.engines.setup import ensure_engine
from obs.procs import ManagedProcess, NotReady, free_port
from obs.sidecar.process import SidecarProcess

_TICKS = os.sysconf("SC_CLK_TCK")
ROOT = Path(__file__).resolve().parent.parent
FAKE_VLLM = ["-m", "bench.fake_vllm"]  # run from ROOT


class ProcStat:
    """CPU time and peak RSS of one process (and, optionally, its direct children)."""

    def __init__(self, pid: int, children: bool = False) -> None:
        self.pid = pid
        self.children = children

    def pids(self) -> list[int]:
        if not self.children:
            return [self.pid]
        try:
            text = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except OSError:
            return [self.pid]
        return [self.pid, *(int(p) for p in text.split())]

    def cpu_s(self, system_only: bool = False) -> float:
        """User + system (or system only) CPU seconds, all threads, summed over the processes."""
        total = 0
        for pid in self.pids():
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[12]) + (0 if system_only else int(fields[11]))  # stime, utime
        return total / _TICKS

    def reset_peak_rss(self) -> None:
        for pid in self.pids():
            with contextlib.suppress(OSError):
                Path(f"/proc/{pid}/clear_refs").write_text("5")

    def peak_rss_mib(self) -> float:
        """Largest VmHWM among the processes (nginx: its busiest worker)."""
        peak = 0
        for pid in self.pids():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
        return peak / 1024


class Server:
    """One server subprocess, logging to ``log_path``, ready once ``health`` answers 2xx."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        log_path: Path,
        health: str,
        *,
        env: dict[str, str] | None = None,
        start_timeout_s: float = 30.0,
    ) -> None:
        self.name = name
        self.cmd = cmd
        self.log_path = log_path
        self.health = health
        self.env = env
        self.start_timeout_s = start_timeout_s
        self._process = ManagedProcess(name, cmd, log_path=log_path, env=env, append_log=True)

    def start(self) -> None:
        self._process.start()
        try:
            self._process.wait_http(self.health, self.start_timeout_s)
        except NotReady as err:
            self.stop()
            raise RuntimeError(f"{self.name} did not start: {err}") from None

    @property
    def pid(self) -> int:
        return self._process.pid

    def stop(self) -> None:
        self._process.stop(15.0)


class FakeVllm(Server):
    """``python -m bench.fake_vllm`` in a subprocess (its own interpreter and CPU)."""

    def __init__(self, work: Path, ttft_ms: float, itl_ms: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, *FAKE_VLLM, "--port", str(self.port)]
        cmd += ["--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms)]
        super().__init__("fake vllm", cmd, work / "fake_vllm.log", self.url + "/health")


NGINX_CONF = """\
{user}worker_processes {workers};
error_log {work}/nginx-error.log warn;
pid {work}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log {access};
    client_body_temp_path {work}/nginx-body;
    proxy_temp_path {work}/nginx-proxy;
    fastcgi_temp_path {work}/nginx-fastcgi;
    uwsgi_temp_path {work}/nginx-uwsgi;
    scgi_temp_path {work}/nginx-scgi;
    upstream pool {{
        server 127.0.0.1:{upstream_port};
        keepalive 512;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=1024;
        location / {{
            proxy_pass http://pool;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_cache off;
            proxy_read_timeout 600s;
            chunked_transfer_encoding on;
            tcp_nodelay on;
        }}
    }}
}}
"""


class Nginx(Server):
    """nginx as an SSE reverse proxy: buffering off, keep-alive upstream connections."""

    def __init__(self, work: Path, upstream_port: int, workers: int = 1) -> None:
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        if not Path(binary).exists():
            raise RuntimeError("nginx is not installed (apt-get install nginx; scripts/setup)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        conf = work / "nginx.conf"
        conf.write_text(
            NGINX_CONF.format(
                user="user root;\n" if os.geteuid() == 0 else "",
                workers=workers,
                work=work,
                access=f"{work}/nginx-access.log combined buffer=64k flush=1s",
                upstream_port=upstream_port,
                port=self.port,
            )
        )
        cmd = [binary, "-c", str(conf), "-p", str(work), "-e", str(work / "nginx-error.log")]
        cmd += ["-g", "daemon off;"]
        super().__init__("nginx", cmd, work / "nginx.log", self.url + "/health")


class Scraper:
    """Reads ``url`` every ``interval_s`` in a thread, like a Prometheus scrape."""

    def __init__(self, url: str, interval_s: float) -> None:
        self.url = url
        self.interval_s = interval_s
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"scrape {url}")

    def start(self) -> Scraper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(OSError), urllib.request.urlopen(self.url, timeout=5) as r:
                r.read()
                self.scrapes += 1


@contextlib.contextmanager
def vllm_and_sidecar(
    prefix: str, sidecar_env: dict[str, str]
) -> Iterator[tuple[VllmServer, SidecarProcess, Path]]:
    """A real ``vllm serve`` (tiny model) and a sidecar in front of it, in a new work dir.

    Yields (engine, sidecar, work dir); both are stopped by PID on the way out.
    """
    paths = ensure_engine()
    work = Path(tempfile.mkdtemp(prefix=prefix))
    with VllmServer(
        paths.model_dir, log_path=work / "vllm.log", python=paths.python, launcher=paths.launcher
    ) as vllm:
        sc = SidecarProcess(
            upstream=vllm.url,
            events=work / "events.jsonl",
            log_path=work / "sidecar.log",
            env=sidecar_env,
        ).start()
        try:
            yield vllm, sc, work
        finally:
            sc.stop()
