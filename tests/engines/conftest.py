"""The engine-view modules' shared engine: one traced vLLM for tests/engines/test_engine_view.py
and test_engine_view_workers.py (a vLLM start is ~22 s here; both need the same flags)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from obs.engines.server import VllmServer
from obs.engines.setup import EnginePaths
from obs.procs import free_port


@dataclass(frozen=True)
class TracedEngine:
    """A vLLM that exports its request spans to ``span_port``, where each module starts its
    own sidecar (one module at a time)."""

    vllm: VllmServer
    span_port: int


@pytest.fixture(scope="package")
def traced_engine(
    engine_paths: EnginePaths, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TracedEngine]:
    """A vLLM with a small KV cache (4096 tokens: concurrent long prompts must queue) that sends
    its spans to a port the engine-view modules' sidecars listen on."""
    port = free_port()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")  # vLLM batches spans for 5 s by default
        vllm = VllmServer(
            engine_paths.model_dir,
            otlp_traces_endpoint=f"http://127.0.0.1:{port}/v1/traces",
            kv_cache_bytes=4 << 20,
            log_path=tmp_path_factory.mktemp("traced") / "vllm.log",
            python=engine_paths.python,
            launcher=engine_paths.launcher,
        ).start()
    yield TracedEngine(vllm, port)
    vllm.stop()
