"""``vllm-obs engine sim``: a simulated vLLM replica over HTTP, with the real ``openai`` client.

The simulator is light (no model, a few ms of CPU per step), so these tests start it
as the real command in a subprocess; it stands in for no behaviour vLLM on CPU shows.
Latencies are compared within one run (queued against unqueued), never to a constant.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from obs import conventions as c
from obs.engines.sim.process import SimServer
from tests.conftest import SidecarFactory
from tests.support import probes

pytestmark = pytest.mark.process

MODEL = "llama-3.1-8b"
PROMPT = "Summarise the following notes about queueing in inference servers. " * 40


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(["--max-num-seqs", "8"]) as server:
        yield server


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


async def _ttft(client: openai.AsyncOpenAI, n: int) -> float:
    """Seconds to the first content frame of a streamed chat (client-side)."""
    t = time.monotonic()
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"{n} {PROMPT}"}],
        stream=True,
        max_tokens=24,
    )
    first = None
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.monotonic() - t
    assert first is not None
    return first


def test_streamed_chat_has_a_usage_frame_and_metrics_name_vllm_series(sim: SimServer) -> None:
    """A streamed chat with include_usage ends with a usage frame; /metrics has vLLM's names."""

    async def go() -> list[openai.types.chat.ChatCompletionChunk]:
        async with _client(sim.url) as client:
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hello"}],
                stream=True,
                stream_options={"include_usage": True},
                max_tokens=12,
            )
            return [chunk async for chunk in stream]

    chunks = asyncio.run(go())
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    page = probes.samples(sim.url)
    for name in (c.VLLM_RUNNING, c.VLLM_WAITING, c.VLLM_KV_CACHE_USAGE, c.VLLM_TTFT + "_count"):
        assert name in page, name
    assert probes.metric(sim.url, c.VLLM_TTFT + "_count") >= 1


def test_64_concurrent_requests_wait_and_raise_ttft(sim: SimServer) -> None:
    """With --max-num-seqs 8, 64 concurrent chats queue in the engine and their median TTFT
    is several times the TTFT of one request alone."""
    waiting: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            waiting.append(probes.metric(sim.url, c.VLLM_WAITING))
            time.sleep(0.02)

    async def go() -> tuple[float, list[float]]:
        async with _client(sim.url) as client:
            alone = statistics.median([await _ttft(client, i) for i in range(3)])
            crowd = await asyncio.gather(*(_ttft(client, 100 + i) for i in range(64)))
            return alone, list(crowd)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        alone, crowd = asyncio.run(go())
    finally:
        stop.set()
        watcher.join()
    assert max(waiting) > 0
    assert statistics.median(crowd) > 3 * alone
    assert probes.metric(sim.url, c.VLLM_QUEUE_TIME + "_sum") > 0


def test_errors_models_tokenize_and_n_choices_as_vllm_answers(sim: SimServer) -> None:
    """Bad JSON, an unknown model and an over-long request get vLLM's error bodies; /v1/models,
    /tokenize and ``n`` whole completions answer in vLLM's shapes."""
    with httpx.Client(base_url=sim.url, timeout=30) as h:
        bad = h.post("/v1/chat/completions", content=b"{nope")
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "BadRequestError"
        unknown = h.post("/v1/completions", json={"model": "other", "prompt": "hi"})
        assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
        long = h.post("/v1/completions", json={"prompt": "hi", "max_tokens": 10**6})
        assert (
            long.status_code == 400 and "maximum context length" in long.json()["error"]["message"]
        )
        assert h.get("/v1/models").json()["data"][0]["id"] == MODEL
        assert h.post("/tokenize", json={"prompt": "one two six"}).json()["count"] == 3
        assert h.get("/health").status_code == 200
        assert h.get("/version").json()["version"].startswith("sim-")

    async def choices() -> openai.types.Completion:
        async with _client(sim.url) as client:
            return await client.completions.create(model=MODEL, prompt="hi", max_tokens=5, n=3)

    whole = asyncio.run(choices())
    assert [ch.index for ch in whole.choices] == [0, 1, 2]
    assert whole.usage is not None and whole.usage.completion_tokens == 15


def test_sim_pool_through_the_sidecar_is_marked_sim(
    sim: SimServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """A pool configured ``engine: sim`` relays through the real sidecar; its event carries
    the usage, and the sidecar's pool state and settings name the engine ``sim``."""
    config = {
        "version": 1,
        "pools": [{"name": "gpu", "replicas": [sim.url], "engine": "sim"}],
        "lanes": [{"name": "chat", "pool": "gpu"}],
        "default_lane": "chat",
    }
    path = tmp_path / "lanes.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    sc = sidecar(config=path, args=("--pool-poll-interval", "0.2"), traces=False)
    probes.wait_for(
        "the sidecar read the sim's settings",
        lambda: "sim" in probes.label_values(sc.url, c.POOL_SETTINGS_INFO.name, c.ENGINE) or None,
        timeout_s=30,
    )
    r = httpx.post(
        sc.url + "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 7,
        },
        timeout=60,
    )
    assert r.status_code == 200 and b"[DONE]" in r.content
    (event,) = sc.wait_events(1)
    assert event["status"] == "ok" and event["completion_tokens"] == 7
    assert event["tokens_source"] == "usage" and event["settings_fingerprint"]
    assert probes.label_values(sc.url, c.POOL_ENGINE_INFO.name, c.ENGINE) == {"sim"}


def test_70b_on_four_h100s_streams_and_reports_its_kv_capacity() -> None:
    """``--gpu H100 --model llama-3.1-70b --tensor-parallel-size 4`` serves a streamed chat
    (real openai client) and /metrics reports the KV capacity the four GPUs hold."""
    args = ["--gpu", "H100", "--model", "llama-3.1-70b", "--tensor-parallel-size", "4"]
    with SimServer(args) as server:

        async def go() -> str:
            async with _client(server.url) as client:
                stream = await client.chat.completions.create(
                    model="llama-3.1-70b",
                    messages=[{"role": "user", "content": "hello"}],
                    stream=True,
                    max_tokens=5,
                )
                return "".join([ch.choices[0].delta.content or "" async for ch in stream])

        assert asyncio.run(go())
        (labels, value), *_ = probes.samples(server.url)["vllm:cache_config_info"]
    assert value == 1 and int(labels["kv_cache_size_tokens"]) > 100_000
    assert int(labels["num_gpu_blocks"]) * 16 == int(labels["kv_cache_size_tokens"])


def test_a_model_too_big_for_its_gpus_is_refused_with_the_fix() -> None:
    """Llama-3.1-70B in BF16 on one H100 is refused at start with a message naming the
    memory and the flags that make it fit, not a stack trace."""
    out = subprocess.run(
        [sys.executable, "-m", "obs.cli", "engine", "sim", "--model", "llama-3.1-70b"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "does not fit" in out.stderr and "--tensor-parallel-size 2" in out.stderr
