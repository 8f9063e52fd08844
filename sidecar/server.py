"""Running the sidecar under uvicorn (uvloop + httptools), with structured logs."""

from __future__ import annotations

import gc
import logging
import math
import socket
import sys
from dataclasses import replace

import structlog
import uvicorn
from prometheus_client import start_http_server

from obs.errors import ConfigError
from obs.sidecar.app import SidecarApp, create_app
from obs.sidecar.budgets import nofile_cap, raise_nofile
from obs.sidecar.guard import Guard, GuardCollector
from obs.sidecar.settings import Settings
from obs.sidecar.worker_metrics import WorkerSlot, serve_private_metrics
from obs.sidecar.workers import Supervisor, check_config, listen, worker_events_path

log = structlog.get_logger("vllm_obs.sidecar")

GC_THRESHOLD = 7000
SWITCH_INTERVAL_S = 0.0005


def configure_logging(level: str) -> None:
    """JSON log lines on stderr; the only place structlog's global state is set."""
    lvl = getattr(logging, level.upper())
    logging.basicConfig(stream=sys.stderr, level=lvl, format="%(message)s")
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


def serve(settings: Settings) -> int:
    configure_logging(settings.log_level)
    if settings.workers == 1:
        return _serve_one(settings, None, None)
    check_config(settings.config, settings.workers)
    listener = listen(settings.host, settings.port, "--port")

    def run_worker(slot: WorkerSlot, sock: socket.socket, metrics_sock: socket.socket) -> int:
        events = worker_events_path(settings.events_path, slot.index)
        worker = replace(settings, worker=slot, events_path=events)
        if slot.index:  # one worker serves --metrics-address (every worker's metrics, merged)
            # and --health-address
            worker = replace(worker, metrics_address=None, health_address=None)
        return _serve_one(worker, sock, metrics_sock)

    return Supervisor(settings.workers, listener, run_worker).run()


def _serve_one(
    settings: Settings, sock: socket.socket | None, metrics_sock: socket.socket | None
) -> int:
    """One relay process: on its own port, or as a worker on the supervisor's socket."""
    app = create_app(settings)
    server = relay_server(settings, app)
    metrics_server = None
    if metrics_sock is not None and settings.worker is not None:
        serve_private_metrics(metrics_sock, app.registry, settings.worker)
    if settings.metrics_address is not None:
        host, port = settings.metrics_address
        try:  # prometheus_client's own server, in a thread: scrapes never touch the relay loop
            metrics_server, _ = start_http_server(port, addr=host, registry=app.exposition)
        except OSError as err:
            raise ConfigError(f"--metrics-address {host}:{port}: {err.strerror}") from err
    # The relay allocates per request, never per token, and keeps no cycles it relies on the
    # collector for: collect young objects 10x less often than CPython's default (700), and
    # leave everything alive at start-up (modules, config, the app) out of every collection.
    gc.set_threshold(GC_THRESHOLD, 10, 10)
    gc.freeze()
    # The event loop shares the GIL with the exporters' threads (JSONL writer, OTLP batch
    # export, metrics). When a socket wakes the loop while one of them runs, the loop waits
    # for the GIL up to the switch interval: 5 ms by default, added to a token's latency.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        server.run(sockets=None if sock is None else [sock])
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
    return 0


def relay_server(settings: Settings, app: SidecarApp) -> uvicorn.Server:
    """The server ``serve`` runs ``app`` on, not started: uvloop, httptools behind the
    connection limits of ``settings.limits`` (``Guard``: fitted to the open-file limit, raised
    to its hard value first; its counters on the app's registry). Other process-wide tuning
    (the collector, the switch interval, signals, structlog) is left to the caller: ``run()``
    in a thread of another program (a test) installs no signal handlers."""
    nofile = raise_nofile()
    limits = settings.limits.fitted(nofile_cap(nofile))
    if limits.max_connections < settings.limits.max_connections:
        log.warning(
            "max_connections_lowered",
            max_connections=limits.max_connections,
            asked=settings.limits.max_connections,
            nofile=nofile,
        )
    guard = Guard(limits)  # header, timeout and connection limits (docs/security.md)
    app.registry.register(GuardCollector(guard))
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=guard.protocol(),  # httptools, exposing each connection to the relay, limited
        timeout_keep_alive=math.ceil(settings.limits.idle_timeout_s),  # uvicorn takes whole s
        lifespan="on",
        access_log=False,
        log_level=settings.log_level,
        timeout_graceful_shutdown=int(settings.shutdown_grace_s),
        server_header=False,
        proxy_headers=False,  # nothing reads the client's address: no per-request rewrite
    )
    return uvicorn.Server(config)
