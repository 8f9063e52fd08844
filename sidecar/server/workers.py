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

- **Engine spans.** A pool's engine posts its request spans (``engine_traces``) to
  whichever worker accepts the connection; each worker's span ids name it, and the
  worker that receives a span hands it to the one that relayed its request over that
  worker's private loopback port (``obs.sidecar.record.span_handoff``), where it joins.
  Only the spans a worker relayed itself are forwarded to the operator's collector
  (``OTEL_EXPORTER_OTLP_*``) from there; a handed-over span joins its event but is not
  forwarded again.
- **Rate limits and saturation.** A tenant's rate limits are each worker's own unless
  they are shared through Redis (``rate_limits.store``); a pool admitted by saturation
  needs no sharing: each worker reads the pool and counts its own requests
  (docs/flow.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from obs.config import Config
from obs.errors import ConfigError
from obs.sidecar.server.worker_metrics import WorkerSlot

log = structlog.get_logger("vllm_obs.workers")

RESTART_BACKOFF_S = 1.0
CRASH_LOOP = 3  # a worker that dies this many times in a row within the backoff stops them all


def check_config(config: Config, workers: int) -> None:
    """Refuse what cannot be split over ``workers`` processes, with a one-line reason."""
    if workers < 1:
        raise ConfigError(f"--workers: {workers} is not a positive number of processes")
    if workers == 1:
        return
    for lane in config.lanes:
        mc = lane.admission.max_concurrency
        if mc is not None and mc < workers:
            raise ConfigError(
                f"--workers {workers}: lane {lane.name!r} has max_concurrency {mc}, which "
                f"cannot be split over {workers} workers; lower --workers or raise the limit"
            )


def worker_events_path(path: Path | None, index: int) -> Path | None:
    if path is None or index == 0:
        return path
    return path.with_name(f"{path.stem}.w{index}{path.suffix}")


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
        secret = secrets.token_urlsafe(32)  # span hand-offs between workers carry it
        self.slots = [WorkerSlot(i, count, ports, self.rundir, secret) for i in range(count)]
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
