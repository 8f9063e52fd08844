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
import socket
import struct
import sys
import tempfile
import threading
import time
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
# The fake pools a relay benchmark can run against: module, process name.
FAKE_POOLS = {"fake_vllm": "bench.fake_vllm", "fake_openai": "bench.fake_openai"}


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid``, all its threads (ended ones too), in
    nanoseconds: its CPU-time clock (``clock_getcpuclockid``: the kernel's scheduler runtime).
    ``/proc``'s utime and stime come in clock ticks (10 ms): over a 0.3 s run of 900 short
    requests at ~0.2 ms each, one tick was ~5% of a figure, twice per reading. OSError if it
    is gone."""
    return time.clock_gettime_ns(((~pid) << 3) | 2) / 1e9  # MAKE_PROCESS_CPUCLOCK(pid, SCHED)


def stat_cpu_s(stat: Path, system_only: bool = False) -> float:
    """User + system (or system only) CPU seconds in a ``/proc`` stat file: a process's, all its
    threads, or one thread's (``/proc/PID/task/TID/stat``). OSError if it is gone."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[12]) + (0 if system_only else int(fields[11]))) / _TICKS  # stime, utime


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
        total = 0.0
        for pid in self.pids():
            with contextlib.suppress(OSError):
                if system_only:  # the kernel's share is only kept in ticks
                    total += stat_cpu_s(Path(f"/proc/{pid}/stat"), system_only=True)
                else:
                    total += process_cpu_s(pid)
        return total

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
    """A fake pool (``python -m bench.fake_vllm`` unless ``pool`` names another of
    ``FAKE_POOLS``) in a subprocess (its own interpreter and CPU)."""

    def __init__(self, work: Path, ttft_ms: float, itl_ms: float, pool: str = "fake_vllm") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", FAKE_POOLS[pool], "--port", str(self.port)]
        cmd += ["--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms)]
        super().__init__(pool, cmd, work / f"{pool}.log", self.url + "/health")


class PyForward(Server):
    """``python -m bench.pyforward``: the floor of a Python relay (a bare TCP forwarder)."""

    def __init__(self, work: Path, upstream_port: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "bench.pyforward", "--port", str(self.port)]
        cmd += ["--upstream-port", str(upstream_port)]
        super().__init__("pyforward", cmd, work / "pyforward.log", self.url + "/health")


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


class AcceptQueue:
    """Samples a listening socket's accept queue (connections the kernel completed, not yet
    accepted) every ``interval_s`` in a thread, through the kernel's socket diagnostics
    (``NETLINK_SOCK_DIAG``, what ``ss -lnt`` reads as Recv-Q; only listening sockets are
    walked, so thousands of TIME_WAIT sockets cost nothing). By Little's law the queue's
    length summed over time, divided by the connections that went through it, is the mean
    time a connection waited to be accepted, whoever the server is.

    It also finds the processes that hold the socket (nginx: its master and worker) and,
    while a connection waits, reads whether one of their main threads is on or waiting
    for a CPU (state R) or asleep (S: in ``epoll_wait``, not woken by the connection); and
    how long their main threads ran and waited for a CPU over the run (``schedstat``).
    """

    _LISTEN = 10  # TCP_LISTEN
    _DONE = 3  # NLMSG_DONE

    def __init__(self, port: int, interval_s: float = 0.001) -> None:
        self.port = port
        self.interval_s = interval_s
        self.samples = 0
        self.busy = 0  # samples with a connection waiting
        self.busy_asleep = 0  # ... while every holder's main thread slept
        self.longest = 0
        self.queued_s = 0.0  # connection-seconds spent waiting
        self.inode = 0
        self.pids: list[int] = []
        self._sched: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"accept {port}")
        sockid = bytes(44) + struct.pack("=II", 0xFFFFFFFF, 0xFFFFFFFF)  # no cookie
        req = struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 1 << self._LISTEN)
        self._request = struct.pack("=IHHII", 16 + len(req) + len(sockid), 20, 0x301, 1, 0)
        self._request += req + sockid  # SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP

    def queued(self, sock: socket.socket) -> int:
        """Connections now waiting in the accept queue of 127.0.0.1:``port``."""
        sock.send(self._request)
        found = 0
        while True:
            data = sock.recv(65536)
            at = 0
            while at + 16 <= len(data):
                size, kind = struct.unpack_from("=IH", data, at)
                if kind == self._DONE or size < 16:
                    return found
                if struct.unpack_from("!H", data, at + 20)[0] == self.port:
                    found += struct.unpack_from("=I", data, at + 72)[0]  # idiag_rqueue
                    self.inode = struct.unpack_from("=I", data, at + 84)[0]
                at += (size + 3) & ~3

    def _holders(self) -> list[int]:
        link = f"socket:[{self.inode}]"
        pids = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError):
                    if any(os.readlink(fd) == link for fd in (proc / "fd").iterdir()):
                        pids.append(int(proc.name))
        return pids

    def _schedstat(self) -> list[int]:
        """Run and run-queue wait ns of the holders' main threads, summed."""
        total = [0, 0]
        for pid in self.pids:
            with contextlib.suppress(OSError):
                run, wait, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
                total[0] += int(run)
                total[1] += int(wait)
        return total

    def _asleep(self) -> bool:
        for pid in self.pids:
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "R":
                    return False
        return True

    def start(self) -> AcceptQueue:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4) as sock:  # NETLINK_SOCK_DIAG
            self.queued(sock)
        self.pids = self._holders()
        self._sched = self._schedstat()
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        """Stop sampling; the figures of the run."""
        self._stop.set()
        self._thread.join(5)
        run, wait = (b - a for a, b in zip(self._sched, self._schedstat(), strict=True))
        return {
            "accept_queue_max": self.longest,
            "accept_queue_busy_share": self.busy / max(self.samples, 1),
            "accept_busy_asleep_share": self.busy_asleep / max(self.busy, 1),
            "accept_queued_s": self.queued_s,
            "server_cpu_s": run / 1e9,
            "server_runqueue_s": wait / 1e9,
        }

    def _run(self) -> None:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4) as sock:
            last = time.monotonic()
            while not self._stop.wait(self.interval_s):
                n = self.queued(sock)
                now = time.monotonic()
                self.samples += 1
                if n:
                    self.busy += 1
                    self.busy_asleep += self._asleep()
                self.longest = max(self.longest, n)
                self.queued_s += n * (now - last)
                last = now
