"""The simulated replica's ``llm_request`` spans and its request-level ``/metrics`` series.

The simulator runs as the real command in a subprocess, behind the real sidecar, with
the real ``openai`` client; its spans go to the sidecar's OTLP endpoint as vLLM's do,
and reach the session's real OTLP receiver through the sidecar.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from obs.engines.sim.process import SimServer
from obs.procs import free_port
from obs.sidecar.testing import OtlpReceiver, SidecarProcess
from tests.support import probes

pytestmark = pytest.mark.process

MODEL = "llama-3.1-8b"
CAPTURE = Path(__file__).parents[1] / "data" / "vllm-0.32-llm_request-span.json"


def test_sim_pool_sends_llm_request_spans_the_sidecar_joins(
    tmp_path: Path, otlp_receiver: OtlpReceiver
) -> None:
    """Started with --otlp-traces-endpoint, the simulator sends one llm_request span per
    request, a child of the sidecar's span, with the real capture's attribute keys and
    vLLM's request id; the sidecar joins it into the event of an ``engine_traces`` pool."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/v1/traces"
    with SimServer(["--otlp-traces-endpoint", endpoint]) as sim:
        config = {
            "version": 1,
            "pools": [
                {"name": "gpu", "replicas": [sim.url], "engine": "sim", "engine_traces": True}
            ],
            "lanes": [{"name": "chat", "pool": "gpu"}],
            "default_lane": "chat",
        }
        path = tmp_path / "lanes.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        sc = SidecarProcess(
            config=path,
            events=tmp_path / "events.jsonl",
            args=("--engine-join-wait", "5"),
            env={
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": otlp_receiver.url,
                "OTEL_BSP_SCHEDULE_DELAY": "100",
            },
            log_path=tmp_path / "sidecar.log",
            port=port,
        ).start()
        try:

            async def go() -> str:
                async with openai.AsyncOpenAI(
                    base_url=sc.url + "/v1", api_key="none", max_retries=0
                ) as client:
                    stream = await client.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": "trace me"}],
                        stream=True,
                        max_tokens=9,
                        extra_headers={"X-Request-Id": "sim-span"},
                    )
                    return "".join([c.choices[0].delta.content or "" async for c in stream])

            assert asyncio.run(go())
            (event,) = sc.wait_events(1, timeout_s=20)
        finally:
            sc.stop()
    assert event["engine_view"] == "joined"
    assert event["engine_ttft_ms"] is not None and event["engine_decode_ms"] > 0
    spans = otlp_receiver.wait_for(event["trace_id"], ["llm_request"])
    (span,) = [s for s in spans if s.name == "llm_request"]
    assert span.parent_span_id == event["span_id"] and span.kind == 2
    capture = json.loads(CAPTURE.read_text())
    assert set(span.attributes) == set(capture["attributes"])
    assert span.scope == capture["scope"]
    assert span.attributes["gen_ai.request.id"] == "chatcmpl-sim-span"
    assert span.attributes["gen_ai.usage.completion_tokens"] == 9
    assert span.attributes["gen_ai.latency.time_in_queue"] * 1000 == pytest.approx(
        event["engine_queue_ms"], abs=0.01
    )


def test_finished_and_aborted_requests_are_counted_and_measured() -> None:
    """/metrics counts finished requests by finish reason (length when max_tokens is set,
    stop otherwise) and a request whose client left under abort, and fills vLLM's
    per-request and per-step histograms."""
    with SimServer(["--default-output-tokens", "6", "--speed", "0.05"]) as sim:

        async def go() -> None:
            async with openai.AsyncOpenAI(
                base_url=sim.url + "/v1", api_key="none", max_retries=0
            ) as client:
                await client.completions.create(model=MODEL, prompt="one", max_tokens=4)
                await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "two"}]
                )
                # At 1/20 of real speed a 500-token answer takes seconds: leave early.
                stream = await client.completions.create(
                    model=MODEL, prompt="three", max_tokens=500, stream=True
                )
                async for _ in stream:
                    break
                await stream.close()

        asyncio.run(go())
        probes.wait_for(
            "the abort is counted",
            lambda: (
                probes.metric(sim.url, "vllm:request_success_total", finished_reason="abort")
                or None
            ),
            timeout_s=10,
        )
        page = probes.samples(sim.url)
        success = {lb["finished_reason"]: v for lb, v in page["vllm:request_success_total"]}
        assert success["length"] == 1 and success["stop"] == 1 and success["abort"] == 1
        for name in (
            "vllm:request_inference_time_seconds_count",
            "vllm:request_time_per_output_token_seconds_count",
            "vllm:request_prompt_tokens_count",
            "vllm:request_generation_tokens_count",
            "vllm:request_params_n_count",
            "vllm:request_params_max_tokens_count",
        ):
            assert probes.metric(sim.url, name) >= 2, name
        assert probes.metric(sim.url, "vllm:iteration_tokens_total_count") >= 10
        assert probes.metric(sim.url, "vllm:request_generation_tokens_sum") >= 10
        with httpx.Client(base_url=sim.url) as h:
            assert h.get("/health").status_code == 200
