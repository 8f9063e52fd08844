"""The sidecar in front of a real llama.cpp ``llama-server`` (tiny GGUF model, CPU).

Relay fidelity, usage and cached tokens, and the llama.cpp pool state the sidecar
reads from its ``/metrics`` (``--metrics``): KV usage and preemptions are absent,
never 0, because llama.cpp does not report them.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import gguf
import httpx
import pytest
import yaml

from obs.engines.adapters.base import ENGINE_VIEW_FIELDS
from obs.engines.llamacpp_server import LlamaServer
from obs.engines.llamacpp_setup import LLAMACPP_VERSION, LlamaCppPaths, ensure_llamacpp
from obs.engines.server import ServerError
from obs.sidecar.pools.engine_scrape import read_state
from obs.sidecar.testing import SidecarProcess
from tests.conftest import SidecarFactory
from tests.support import probes

pytestmark = pytest.mark.engine

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
# What differs between two identical requests: clock, random ids, timings, cache reuse.
_VOLATILE = (
    (re.compile(rb'"created":\d+'), b'"created":0'),
    (re.compile(rb'"id":"[^"]*"'), b'"id":""'),
    (re.compile(rb'"timings":\{[^}]*\}'), b'"timings":{}'),
    (re.compile(rb'"cached_tokens":\d+'), b'"cached_tokens":0'),
)


def _normal(body: bytes) -> bytes:
    for pattern, fixed in _VOLATILE:
        body = pattern.sub(fixed, body)
    return body


def _body(route: str, stream: bool, usage: bool | None, max_tokens: int = 8) -> dict[str, Any]:
    return probes.request_body(route, stream, usage, max_tokens)


def test_llama_server_metrics_map_to_llamacpp_pool_state(llama: LlamaServer) -> None:
    """llama-server's /metrics: running/waiting and prompt-cache tokens; no KV, no preemptions."""
    httpx.post(llama.url + CHAT, json=_body(CHAT, False, None), timeout=60).raise_for_status()
    text = httpx.get(llama.url + "/metrics", timeout=10).text
    state = read_state("auto", text)
    assert state.engine == "llamacpp"
    assert state.kv_cache_usage is None and state.preemptions is None
    assert (state.running, state.waiting) == (0.0, 0.0)
    assert state.prefix_queries is not None and state.prefix_queries > 0
    assert state.prefix_hits is not None and 0 <= state.prefix_hits <= state.prefix_queries


@pytest.mark.parametrize("route", [CHAT, COMPLETIONS])
@pytest.mark.parametrize(
    ("stream", "usage"), [(False, None), (True, None), (True, False), (True, True)]
)
def test_relay_is_byte_faithful_for_llama_server(
    llama: LlamaServer, sidecar: SidecarFactory, route: str, stream: bool, usage: bool | None
) -> None:
    """Through the sidecar a client gets llama-server's own bytes (ids, clock, timings aside)."""
    sc = sidecar(llama.url, traces=False)
    body = _body(route, stream, usage)
    direct = httpx.post(llama.url + route, json=body, timeout=60)
    relayed = httpx.post(sc.url + route, json=body, timeout=60)
    assert relayed.status_code == direct.status_code == 200
    assert _normal(relayed.content) == _normal(direct.content)
    if stream:  # llama.cpp puts its timings on the last frame it sends, usage or not
        assert probes.sse_frames(relayed.content)[-2].count(b'"timings":') == 1
    (event,) = sc.wait_events(1)
    assert event["usage_injected"] is (stream and not usage)
    assert event["completion_tokens"] == 8 and event["prompt_tokens"] > 0


def test_repeated_prompt_shows_llamacpp_cached_tokens(
    llama: LlamaServer, sidecar: SidecarFactory
) -> None:
    """A prompt sent twice is served from llama.cpp's slot cache; the event says how much."""
    sc = sidecar(llama.url, traces=False)
    doc = " ".join(f"def function_{i}(x): return x * {i}" for i in range(20))
    body = {"model": "tiny", "prompt": doc, "max_tokens": 2, "temperature": 0, "stream": True}
    for _ in range(2):
        assert httpx.post(sc.url + COMPLETIONS, json=body, timeout=60).status_code == 200
    first, second = sc.wait_events(2)
    assert first["prompt_tokens"] == second["prompt_tokens"] > 100
    assert second["cached_tokens"] > 0 and second["cache_hit"] is True
    assert first["engine_view"] == second["engine_view"] == "absent"


def test_llama_server_error_is_relayed_and_recorded(
    llama: LlamaServer, sidecar: SidecarFactory
) -> None:
    """llama-server's own 4xx error body reaches the client unchanged; the event records it."""
    sc = sidecar(llama.url, traces=False)
    body = {"model": "tiny", "messages": "not a list", "max_tokens": 2}
    direct = httpx.post(llama.url + CHAT, json=body, timeout=60)
    relayed = httpx.post(sc.url + CHAT, json=body, timeout=60)
    assert 400 <= direct.status_code < 500
    assert (relayed.status_code, relayed.content) == (direct.status_code, direct.content)
    (event,) = sc.wait_events(1)
    assert event["http_status"] == direct.status_code


def test_auto_pool_detects_llamacpp_and_exports_no_kv_series(
    llama: LlamaServer, sidecar: SidecarFactory
) -> None:
    """A pool with ``engine: auto`` in front of llama-server: its engine is found, no KV series."""
    sc = sidecar(llama.url, traces=False, args=("--pool-poll-interval", "0.5"))
    httpx.post(sc.url + CHAT, json=_body(CHAT, True, None), timeout=60).raise_for_status()
    sc.wait_events(1)
    time.sleep(1.2)  # a pool poll after the request
    s = probes.samples(sc.url)
    assert [lb["engine"] for lb, _ in s["vllm_obs_pool_engine_info"]] == ["llamacpp"]
    assert s["vllm_obs_pool_up"][0][1] == 1
    assert s["vllm_obs_pool_prefix_cache_queries_total"][0][1] > 0
    assert "vllm_obs_pool_kv_cache_usage_ratio" not in s
    assert "vllm_obs_pool_preemptions_total" not in s


def test_llamacpp_requests_never_get_an_engine_view(
    llama: LlamaServer, sidecar: SidecarFactory
) -> None:
    """No spans from llama-server: once a traced ``auto`` pool sees it, events go out at once."""
    args = ("--engine-traces", "--engine-join-wait", "60", "--pool-poll-interval", "0.5")
    sc = sidecar(llama.url, traces=False, args=args)
    deadline = time.monotonic() + 30
    while "llamacpp" not in [lb["engine"] for lb, _ in _engine_info(sc)]:
        assert time.monotonic() < deadline, "the pool's engine was never detected"
        time.sleep(0.2)
    for stream in (True, False):
        httpx.post(sc.url + CHAT, json=_body(CHAT, stream, None), timeout=60).raise_for_status()
    events = {e["stream"]: e for e in sc.wait_events(2, timeout_s=30)}  # not the 60 s wait
    for e in events.values():
        assert e["status"] == "ok" and e["engine_view"] == "absent"
        assert [e[f] for f in ENGINE_VIEW_FIELDS] == [None] * len(ENGINE_VIEW_FIELDS)
    assert events[True]["ttft_ms"] is not None and events[False]["ttft_ms"] is None
    spans = probes.samples(sc.url).get("vllm_obs_engine_spans_total", [])
    assert sum(v for _, v in spans) == 0


def _engine_info(sc: SidecarProcess) -> list[tuple[dict[str, str], float]]:
    return probes.samples(sc.url).get("vllm_obs_pool_engine_info", [])


def write_mixed_config(path: Path, vllm_url: str, llama_url: str) -> Path:
    """One vLLM pool and one llama.cpp pool; lane ``local`` (header) goes to llama.cpp."""
    config = {
        "pools": [
            {"name": "gpu", "replicas": [vllm_url], "engine": "vllm"},
            {"name": "cpu", "replicas": [llama_url], "engine": "llamacpp"},
        ],
        "lanes": [
            {"name": "chat", "pool": "gpu"},
            {"name": "local", "pool": "cpu", "match": [{"header": {"x-lane": "local"}}]},
        ],
        "default_lane": "chat",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def test_setup_second_call_finds_everything_cached(llamacpp_paths: LlamaCppPaths) -> None:
    """ensure_llamacpp() again: the cached binary and model, reported ready, nothing rebuilt."""
    messages: list[str] = []
    again = ensure_llamacpp(progress=messages.append)
    assert again == llamacpp_paths
    assert len(messages) == 2 and all("ready at" in m for m in messages)
    assert again.server.parent.parent.name == LLAMACPP_VERSION


def test_missing_server_binary_is_a_one_line_error(
    llamacpp_paths: LlamaCppPaths, tmp_path: Path
) -> None:
    """A llama-server that is not built fails start() with what to run, not a traceback."""
    server = LlamaServer(llamacpp_paths.model, server=tmp_path / "llama-server")
    with pytest.raises(ServerError, match=r"not found; run `vllm-obs engine setup --llamacpp`"):
        server.start()


def test_tiny_gguf_model_is_a_small_llama(llamacpp_paths: LlamaCppPaths) -> None:
    """The tiny model is a 2-layer llama GGUF with a byte vocabulary and a chat template."""
    reader = gguf.GGUFReader(str(llamacpp_paths.model))
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]) == b"llama"
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == 259
    assert "tokenizer.chat_template" in reader.fields
    assert len(reader.tensors) == 3 + 2 * 9
    assert llamacpp_paths.model.stat().st_size < 1 << 20
