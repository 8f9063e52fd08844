"""``vllm-obs sidecar --workers N``: N relay processes on one port, one set of metrics.

One process relays about 50k tokens/s on one core (docs/performance.md); where
that is not enough, ``--workers`` forks N copies of the sidecar that accept on
the same listening socket (the kernel hands each new connection to one of
them). The supervisor (the process started) only binds, forks, restarts a
worker that dies, and passes SIGTERM on; it runs no event loop.

What stays correct across workers:

- **Metrics.** Each worker also serves its own registry on a private loopback
  port. A scrape, answered by whichever worker takes it (or by worker 0 on
  ``--metrics-address``), reads every worker's page and merges them: counters,
  histograms and the in-flight/queued gauges are summed; the pool state and
  ``lane_info``, which every worker reads the same, are taken once; ``_created``
  is the earliest. Every page a worker serves is also saved to a file (and at
  least every second), so a worker that does not answer contributes its saved
  page, and a worker that dies leaves its counts behind (the supervisor
  renames its file to ``retired-*``, in one step): merged counters never go
  backwards, at the cost of the dead worker's last second of increments.
- **Admission.** Each worker enforces ``1/N`` of every lane's limits
  (``max_concurrency``, ``max_queue``, ``token_budget``; rounded up), so the
  lane's totals hold. A lane whose ``max_concurrency`` is below N is refused
  at start. Connections, not requests, are spread over the workers, so a lane
  can queue in one worker while another has room.
- **Events.** Worker 0 writes the ``--events`` path, worker i writes it with
  ``.wI`` before the suffix (``events.w1.jsonl``), each rotated on its own:
  ``vllm-obs query ... 'events*.jsonl*'`` reads them together.

Pools that send their engine spans to the sidecar (``engine_traces``) are
refused with more than one worker: vLLM posts a span to one worker while the
request's event waits in another.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests
import structlog
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from obs import conventions as c
from obs.config import Config
from obs.errors import ConfigError
from obs.procs import loopback_session

log = structlog.get_logger("vllm_obs.workers")

FETCH_TIMEOUT_S = 2.0
RESTART_BACKOFF_S = 1.0
CRASH_LOOP = 3  # a worker that dies this many times in a row within the backoff stops them all
# Families every worker reads the same (pool polling, the config): taken once, not summed.
TAKEN_ONCE_PREFIXES = (f"{c.NAMESPACE}_pool_", c.LANE_INFO.name)
COUNTING = ("counter", "histogram")  # what a dead worker's saved page still contributes
SAVE_EVERY_S = 1.0
# One page generated and saved at a time in this process, so the saved file never goes back
# to an older page than one already saved or served.
_SAVE_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    """Who this process is among the workers, and where its siblings' metrics are."""

    index: int
    count: int
    metric_ports: tuple[int, ...]
    rundir: str  # saved pages: worker-I.prom, retired-*.prom

    def page_path(self, i: int) -> Path:
        return Path(self.rundir) / f"worker-{i}.prom"

    def own_page(self, registry: CollectorRegistry) -> bytes:
        """This worker's page, saved before it is returned (replaced in one step)."""
        with _SAVE_LOCK:
            page = generate_latest(registry)
            path = self.page_path(self.index)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(page)
            os.replace(tmp, path)
            return page

    def saved(self, i: int) -> str | None:
        try:
            return self.page_path(i).read_text()
        except OSError:
            return None

    def retired(self) -> list[str]:
        return [p.read_text() for p in sorted(Path(self.rundir).glob("retired-*.prom"))]


def check_config(config: Config, workers: int) -> None:
    """Refuse what cannot be split over ``workers`` processes, with a one-line reason."""
    if workers < 1:
        raise ConfigError(f"--workers: {workers} is not a positive number of processes")
    if workers == 1:
        return
    traced = [p.name for p in config.pools if p.engine_traces]
    if traced:
        raise ConfigError(
            f"--workers {workers}: pool(s) {', '.join(traced)} send engine spans to the sidecar "
            "(engine_traces), which needs one process; use --workers 1 for them"
        )
    for lane in config.lanes:
        mc = lane.admission.max_concurrency
        if mc is not None and mc < workers:
            raise ConfigError(
                f"--workers {workers}: lane {lane.name!r} has max_concurrency {mc}, which "
                f"cannot be split over {workers} workers; lower --workers or raise the limit"
            )


def share(limit: int | None, workers: int) -> int | None:
    """One worker's part of a lane-wide limit (rounded up)."""
    return None if limit is None else math.ceil(limit / workers)


def worker_events_path(path: Path | None, index: int) -> Path | None:
    if path is None or index == 0:
        return path
    return path.with_name(f"{path.stem}.w{index}{path.suffix}")


# ---- merging the workers' metrics ---------------------------------------------------------


def merge_pages(pages: Sequence[str], retired: Sequence[str] = ()) -> list[Metric]:
    """One exposition from several workers' pages (see the module docstring for the rules).

    ``retired``: pages of workers that died, of which only counters and histograms count.
    """
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for page, dead in [(p, False) for p in pages] + [(p, True) for p in retired]:
        for fam in text_string_to_metric_families(page):
            if dead and (fam.type not in COUNTING or fam.name.startswith(TAKEN_ONCE_PREFIXES)):
                continue
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type)
                values[fam.name] = {}
            once = fam.name.startswith(TAKEN_ONCE_PREFIXES)
            vals = values[fam.name]
            for s in fam.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                old = vals.get(key)
                if old is None:
                    vals[key] = s.value
                elif s.name.endswith("_created"):
                    vals[key] = min(old, s.value)
                elif not once:
                    vals[key] = old + s.value
    for name, fam in families.items():
        for (sample, labels), value in values[name].items():
            fam.add_sample(sample, dict(labels), value)
    return list(families.values())


class MergedMetrics(Collector):
    """Every worker's registry, merged at each collection (this worker's read directly)."""

    def __init__(self, own: CollectorRegistry, slot: WorkerSlot) -> None:
        self.own = own
        self.slot = slot
        self._lock = threading.Lock()
        self._session = loopback_session()  # used under the lock only

    def _page(self, i: int) -> str | None:
        if i == self.slot.index:
            return self.slot.own_page(self.own).decode()
        url = f"http://127.0.0.1:{self.slot.metric_ports[i]}/metrics"
        try:
            r = self._session.get(url, timeout=FETCH_TIMEOUT_S)
            r.raise_for_status()
            return r.text
        except requests.RequestException:  # restarting or slow: its saved page
            return self.slot.saved(i)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            pages = [p for i in range(self.slot.count) if (p := self._page(i)) is not None]
            yield from merge_pages(pages, self.slot.retired())


def merged_registry(own: CollectorRegistry, slot: WorkerSlot) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(MergedMetrics(own, slot))
    return reg


def serve_private_metrics(
    sock: socket.socket, registry: CollectorRegistry, slot: WorkerSlot
) -> ThreadingHTTPServer:
    """This worker's own page, for its siblings, on its pre-bound loopback socket; saved too."""

    def save_often() -> None:
        while True:
            time.sleep(SAVE_EVERY_S)
            with contextlib.suppress(OSError):
                slot.own_page(registry)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = slot.own_page(registry)
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(sock.getsockname(), Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True, name="worker-metrics").start()
    threading.Thread(target=save_often, daemon=True, name="worker-metrics-save").start()
    return server


# ---- the supervisor -----------------------------------------------------------------------


def listen(host: str, port: int, what: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise ConfigError(f"{what} {host}:{port}: {err.strerror}") from err
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _die_with_parent(parent: int) -> None:
    """Linux: SIGTERM this worker when the supervisor dies (even by SIGKILL)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the line above
        os._exit(0)


class Supervisor:
    """Forks ``count`` workers running ``run_worker(slot, listener, metrics_socket)``."""

    def __init__(
        self,
        count: int,
        listener: socket.socket,
        run_worker: Callable[[WorkerSlot, socket.socket, socket.socket], int],
    ) -> None:
        self.count = count
        self.listener = listener
        self.run_worker = run_worker
        self.metric_socks = [listen("127.0.0.1", 0, "worker metrics") for _ in range(count)]
        ports = tuple(s.getsockname()[1] for s in self.metric_socks)
        self.rundir = tempfile.mkdtemp(prefix="vllm-obs-workers-")
        self.slots = [WorkerSlot(i, count, ports, self.rundir) for i in range(count)]
        self.retired = 0
        self.pids: dict[int, int] = {}  # pid -> worker index
        self.stopping = False

    def _fork(self, i: int) -> None:
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                os.setpgid(0, 0)  # a terminal's Ctrl-C reaches the supervisor only
                _die_with_parent(parent)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                for j, s in enumerate(self.metric_socks):
                    if j != i:
                        s.close()
                code = self.run_worker(self.slots[i], self.listener, self.metric_socks[i])
            except ConfigError as err:
                print(f"vllm-obs sidecar worker {i}: {err}", file=sys.stderr, flush=True)
                code = 2
            except BaseException:
                log.exception("worker_crashed", worker=i)
            finally:
                os._exit(code)
        self.pids[pid] = i
        log.info("worker_started", worker=i, pid=pid)

    def _stop(self, signum: int, _frame: Any) -> None:
        self.stopping = True
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def _retire(self, i: int) -> None:
        """A dead worker's saved counts stay in the merged metrics (one rename: atomic)."""
        self.retired += 1
        with contextlib.suppress(FileNotFoundError):
            os.replace(
                self.slots[i].page_path(i), Path(self.rundir) / f"retired-{self.retired}.prom"
            )

    def run(self) -> int:
        try:
            return self._run()
        finally:
            shutil.rmtree(self.rundir, ignore_errors=True)

    def _run(self) -> int:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        for i in range(self.count):
            self._fork(i)
        failed = False
        started = {i: time.monotonic() for i in range(self.count)}
        quick = dict.fromkeys(range(self.count), 0)  # deaths in a row within the backoff
        while self.pids:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            i = self.pids.pop(pid, -1)
            if i < 0:
                continue
            code = os.waitstatus_to_exitcode(status)
            if self.stopping:
                continue
            log.error("worker_exited", worker=i, pid=pid, code=code)
            self._retire(i)
            quick[i] = quick[i] + 1 if time.monotonic() - started[i] < RESTART_BACKOFF_S else 0
            if code == 2 or quick[i] >= CRASH_LOOP:
                failed = True  # it cannot start: stop them all rather than loop
                self._stop(signal.SIGTERM, None)
                continue
            time.sleep(RESTART_BACKOFF_S * quick[i])
            started[i] = time.monotonic()
            self._fork(i)
        return 1 if failed else 0
