"""Running the sidecar: its own HTTP server (httptools over uvloop), with structured logs.

``RelayServer`` listens (on its port, or a worker's share of the supervisor's socket),
runs the app's lifespan around serving (startup: pools, health listener; shutdown:
requests cut at the end of the grace finish, exporters flush), and stops on SIGTERM
or SIGINT: it stops accepting, lets the requests in flight finish for
``shutdown_grace_s``, cancels what is left (the relay answers each with its last
words), then ends the lifespan. Each connection is an ``HttpConnection``
(obs.sidecar.server.connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace

import structlog
import uvloop
from prometheus_client import start_http_server

from obs.errors import ConfigError
from obs.sidecar.app import SidecarApp, create_app
from obs.sidecar.relay.relay import SHUTDOWN_FLUSH_S
from obs.sidecar.server.budgets import nofile_cap, raise_nofile
from obs.sidecar.server.connection import HttpConnection, ServerState
from obs.sidecar.server.guard import Guard, GuardCollector
from obs.sidecar.server.worker_metrics import WorkerSlot, serve_private_metrics
from obs.sidecar.server.workers import Supervisor, check_config, listen, worker_events_path
from obs.sidecar.settings import Settings
from obs.sidecar.types import Receive, Scope, Send

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
        handoff = app.span_handoff
        spans = None if handoff is None else handoff.receive
        serve_private_metrics(metrics_sock, app.registry, settings.worker, spans)
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
    if server.stopped_by is not None:  # exit as the signal would have (SIGTERM: 143)
        signal.signal(server.stopped_by, signal.SIG_DFL)
        os.kill(os.getpid(), server.stopped_by)
    return 0


def relay_server(settings: Settings, app: SidecarApp) -> RelayServer:
    """The server ``serve`` runs ``app`` on, not started: httptools over uvloop behind the
    connection limits of ``settings.limits`` (``Guard``: fitted to the open-file limit,
    raised to its hard value first; its counters on the app's registry). Other
    process-wide tuning (the collector, the switch interval, structlog) is left to the
    caller: ``run()`` in a thread of another program (a test) installs no signal handlers."""
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
    if app.health_listener is not None:  # liveness: a relay refusing everyone is not alive
        app.health_listener.watch(guard.full_for)
    return RelayServer(
        app,
        guard,
        host=settings.host,
        port=settings.port,
        shutdown_grace_s=settings.shutdown_grace_s,
        lifespan=app.lifespan,
    )


BACKLOG = 2048
TICK_S = 0.05  # how often shutdown looks at what is still open


class RelayServer:
    """Serves the ASGI ``app`` on ``host:port`` (or given sockets) until ``should_exit``,
    inside ``lifespan`` (see the module's doc). ``stopped_by``: the signal it stopped on."""

    def __init__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]],
        guard: Guard,
        *,
        host: str,
        port: int,
        shutdown_grace_s: float,
        lifespan: Callable[[], AbstractAsyncContextManager[None]] = contextlib.nullcontext,
    ) -> None:
        self.app = app
        self.guard = guard
        self.host, self.port, self.shutdown_grace_s = host, port, shutdown_grace_s
        self.lifespan = lifespan
        self.stopped_by: int | None = None
        self.started = False
        self.force_exit = False
        self.state: ServerState | None = None
        self._exit = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit_event: asyncio.Event | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop serving, once ``serve`` runs (None before); ``call_soon_threadsafe``
        on it runs code between the server's callbacks (a test's look at its state)."""
        return self._loop

    @property
    def should_exit(self) -> bool:
        return self._exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        """Ask the server to stop (from any thread: a test's, or a signal handler)."""
        self._exit = value
        loop, event = self._loop, self._exit_event
        if value and loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        """Serve until stopped, on a uvloop event loop of this thread."""
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(self.serve(sockets))

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._exit_event = asyncio.Event()
        signals = threading.current_thread() is threading.main_thread()
        if signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            async with self.lifespan():
                await self._serve(loop, sockets)
        finally:
            if signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)

    def _on_signal(self, sig: int) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: no grace
        self.stopped_by = self.stopped_by or sig
        self.should_exit = True

    async def _until_exit(self) -> None:
        if not self._exit:
            await self._exit_event.wait()  # type: ignore[union-attr]

    async def _serve(
        self, loop: asyncio.AbstractEventLoop, sockets: list[socket.socket] | None
    ) -> None:
        state = self.state = ServerState(self.app, self.guard)
        try:
            if sockets:
                servers = [
                    await loop.create_server(lambda: HttpConnection(state), sock=sock)
                    for sock in sockets
                ]
            else:
                servers = [
                    await loop.create_server(
                        lambda: HttpConnection(state), self.host, self.port, backlog=BACKLOG
                    )
                ]
        except OSError as err:
            raise ConfigError(f"--port {self.port} on {self.host}: {err.strerror}") from err
        self.started = True
        log.info("sidecar_listening", host=self.host, port=self.port, pid=os.getpid())
        await self._until_exit()
        for server in servers:
            server.close()  # no new connections
        for conn in list(state.connections):
            conn.shutdown()
        deadline = time.monotonic() + self.shutdown_grace_s
        while (state.connections or state.tasks) and not self.force_exit:
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(TICK_S)
        if state.tasks:  # past the grace: the relay answers each with its last words
            log.warning("shutdown_grace_ended", requests=len(state.tasks))
            for task in list(state.tasks):
                task.cancel()
            await asyncio.wait(list(state.tasks), timeout=SHUTDOWN_FLUSH_S + 1)
        for conn in list(state.connections):
            conn.transport.close()
