"""The sidecar in the test process: its real server in a thread, for the hot path in milliseconds.

``InProcessSidecar`` builds the app with ``create_app`` (on a registry of its own) and runs
it on the very server ``vllm-obs sidecar`` runs (``obs.sidecar.serve.relay_server``: the
sidecar's ``RelayServer``, httptools over uvloop behind the connection limits) in a thread,
on a free 127.0.0.1 port. It starts in a fraction of a second and stops cleanly (the
server's own shutdown, as on SIGTERM: the lifespan flushes the exporters). A test reads
the HTTP answers as a user does, each request's event from an in-memory exporter
(``event``: ``obs.exporters.memory``, the event as the JSONL log would hold it, there as soon
as the request has finished: no file, no flush to wait for) and ``/metrics``
(``samples``).

What stays out of the test process: ``serve``'s process-wide tuning (``gc.freeze``, the
switch interval, signal handlers, structlog's configuration), which ``relay_server`` leaves
to its caller; it does raise the soft open-file limit to the hard one, as ``serve`` does.
A pool here is ``ScriptedUpstream`` (also a thread of this process) or a port nothing
listens on; what only a real engine shows needs the ``engine`` tier.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from obs.config import Config, parse_config
from obs.exporters.memory import InMemoryExporter
from obs.procs import free_port, wait_http
from obs.sidecar.app import create_app
from obs.sidecar.serve import RelayServer, relay_server
from obs.sidecar.server.guard import Guard
from obs.sidecar.server.limits import Limits
from obs.sidecar.settings import Settings
from obs.sidecar.types import Receive, Scope, Send
from tests.support.probes import Samples, parse_samples
from tests.support.quick_ack import quick_ack_client

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
T = TypeVar("T")


@contextlib.contextmanager
def served_app(
    app: Callable[[Scope, Receive, Send], Awaitable[None]], ready_path: str = "/"
) -> Iterator[int]:
    """``app`` alone on the sidecar's own server (``RelayServer``, default limits) in a
    thread, on a free 127.0.0.1 port (yielded) once ``ready_path`` answers; stopped after."""
    port = free_port()
    server = RelayServer(app, Guard(Limits()), host="127.0.0.1", port=port, shutdown_grace_s=1)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_http(f"http://127.0.0.1:{port}{ready_path}")
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(STOP_TIMEOUT_S)
    assert not thread.is_alive()


def request_id() -> str:
    """A fresh request id (what a test scripts the pool's answer under)."""
    return uuid.uuid4().hex[:16]


def lane_config(pools: dict[str, list[str]], *more: dict[str, Any], **lane: Any) -> Config:
    """A config with these pools (name: replica URLs) and the default lane, ``main``, on the
    first pool; ``lane``: more of its fields (``timeouts``, ``admission``, ``fallback``);
    ``more``: other lanes, whole (each with its ``match``)."""
    first = next(iter(pools))
    return parse_config(
        {
            "pools": [{"name": name, "replicas": urls} for name, urls in pools.items()],
            "lanes": [{"name": "main", "pool": first, **lane}, *more],
            "default_lane": "main",
        },
        "<inproc>",
    )


class InProcessSidecar:
    """``vllm-obs sidecar`` for ``config`` in a thread of this process; ``stop()`` ends it.

    ``settings``: more ``Settings`` fields (``max_body_bytes``, ``limits``, ...). Pools are
    polled once a minute: a test decides when a replica is down, not the poll. ``clock``: the
    monotonic clock ``create_app`` gives the sidecar's injected timers (the event budget, the
    kept answers), e.g. a ``tests.support.clock.ManualClock`` the test moves.
    """

    def __init__(
        self,
        config: Config,
        events_path: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        **settings: Any,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        fields: dict[str, Any] = {"pool_poll_interval_s": 60.0, "shutdown_grace_s": 1.0}
        self.settings = Settings(
            config=config,
            port=self.port,
            events_path=events_path,
            log_level="warning",
            **{**fields, **settings},
        )
        self.memory = InMemoryExporter()  # every finished request's record, read directly
        self._app = create_app(
            self.settings, registry=CollectorRegistry(), exporters=[self.memory], clock=clock
        )
        self._server = relay_server(self.settings, self._app)
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="inproc-sidecar", daemon=True)
        # One keep-alive client for the tests' requests: a new httpx client per request
        # costs tens of milliseconds (its TLS context) before a byte is sent. It acknowledges
        # what it reads at once: a stream's event waits for the client's last ACK, which a
        # keep-alive client would otherwise hold up to 40 ms (tests.support.quick_ack).
        self.client = quick_ack_client(self.url)

    @property
    def events_path(self) -> Path | None:
        return self.settings.events_path

    def _run(self) -> None:
        try:
            self._server.run()
        except BaseException as err:  # a bind failure (ConfigError) included
            self._failure = err

    def start(self) -> InProcessSidecar:
        """Serve, and return once the server accepts connections (RuntimeError if it fails)."""
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the in-process sidecar did not start: {self._failure!r}")
            time.sleep(0.002)
        return self

    def stop(self) -> None:
        """Shut down as on SIGTERM (requests in flight get ``shutdown_grace_s``), and wait."""
        self._server.should_exit = True
        self.client.close()
        if self._thread.is_alive():
            self._thread.join(STOP_TIMEOUT_S)
        assert not self._thread.is_alive(), "the in-process sidecar did not stop"

    def on_loop(self, fn: Callable[[], T], turns: int = 2) -> T:
        """``fn()`` run on the sidecar's event loop, ``turns`` loop turns from now (what the
        callbacks under way leave done), while the loop runs nothing else; its result."""
        loop = self._server.loop
        assert loop is not None, "the in-process sidecar is not serving"

        async def later() -> T:
            for _ in range(turns):
                await asyncio.sleep(0)  # one turn of the loop
            return fn()

        return asyncio.run_coroutine_threadsafe(later(), loop).result(timeout=10)

    def event(self, request_id: str) -> dict[str, Any]:
        """The one event of ``request_id``, as soon as its request has finished."""
        return self.memory.event(request_id)

    def metrics(self) -> str:
        """``/metrics`` as a scraper reads it (the text format)."""
        return self.client.get("/metrics", timeout=10).text

    def samples(self) -> Samples:
        """``/metrics``' samples by name: (labels, value) pairs."""
        return parse_samples(self.metrics())

    def __enter__(self) -> InProcessSidecar:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
