"""vLLM's own llm_request spans, received by the sidecar and merged into its events."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from obs.engines.server import VllmServer
from obs.sidecar.testing import OtlpReceiver, SidecarProcess
from tests.conftest import SidecarFactory, TracedEngine
from tests.support import probes

pytestmark = pytest.mark.engine

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


class Traced:
    def __init__(self, vllm: VllmServer, sidecar: SidecarProcess) -> None:
        self.vllm = vllm
        self.sidecar = sidecar


@pytest.fixture(scope="module")
def traced(
    traced_engine: TracedEngine,
    otlp_receiver: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Traced]:
    """The package's traced vLLM (small KV cache), a sidecar in front receiving its spans."""
    work = tmp_path_factory.mktemp("traced-view")
    sidecar = SidecarProcess(
        upstream=traced_engine.vllm.url,
        events=work / "events.jsonl",
        args=("--engine-traces", "--engine-join-wait", "5"),
        env={
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": otlp_receiver.url,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        },
        log_path=work / "sidecar.log",
        port=traced_engine.span_port,
    ).start()
    yield Traced(traced_engine.vllm, sidecar)
    sidecar.stop()


def _by_id(sc: SidecarProcess, n: int) -> dict[str, dict[str, Any]]:
    return {e["request_id"]: e for e in sc.wait_events(n, timeout_s=20)}


def test_streamed_and_whole_answers_get_the_engine_view(traced: Traced) -> None:
    """Both kinds of request are joined; engine times fit inside the sidecar's phases."""
    sc = traced.sidecar
    before = len(sc.events())
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x = 1"}], "max_tokens": 16}
    r1 = httpx.post(sc.url + CHAT, json=body | {"stream": True}, headers={"X-Request-Id": "ev-s"})
    r2 = httpx.post(sc.url + CHAT, json=body, headers={"X-Request-Id": "ev-n"})
    assert r1.status_code == r2.status_code == 200
    events = _by_id(sc, before + 2)
    s, n = events["ev-s"], events["ev-n"]
    for e in (s, n):
        assert e["engine_view"] == "joined"
        for k in ("engine_queue_ms", "engine_prefill_ms", "engine_decode_ms", "engine_ttft_ms"):
            assert e[k] is not None and e[k] >= 0
        phases = sum(e[f"{p}_ms"] for p in ("queue", "prefill", "first_token", "decode", "stream"))
        assert abs(phases - e["e2e_ms"]) <= 1.0
    # Streamed: the engine's queue + prefill happened inside our queue (moved) + prefill.
    assert s["engine_prefill_ms"] <= s["prefill_ms"] + 1.0
    assert s["engine_queue_ms"] <= s["queue_ms"] + 1.0
    assert s["engine_ttft_ms"] <= s["ttft_ms"] + 1.0
    # Whole answer: the engine view gives it a TTFT and a decode phase.
    assert n["ttft_ms"] is not None and n["ttft_ms"] <= n["e2e_ms"]
    assert n["decode_ms"] > 0
    assert n["decode_ms"] == pytest.approx(n["engine_decode_ms"], abs=1.0)


def test_requests_sharing_a_client_trace_each_get_their_event_and_span(traced: Traced) -> None:
    """An agent's calls under one traceparent: every event written, each joined (issue 22)."""
    sc = traced.sidecar
    before = len(sc.events())
    parent = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "y = 2"}], "max_tokens": 4}
    ids = [f"shared-{i}" for i in range(3)]
    with httpx.Client(base_url=sc.url) as client:
        for rid in ids:
            headers = {"X-Request-Id": rid, "traceparent": parent}
            assert client.post(CHAT, json=body, headers=headers).status_code == 200
    events = _by_id(sc, before + 3)
    assert {events[rid]["trace_id"] for rid in ids} == {"ab" * 16}
    assert [events[rid]["engine_view"] for rid in ids] == ["joined"] * 3


def _queue_time(vllm: VllmServer) -> tuple[float, float]:
    """vLLM's queue-time histogram: (requests counted, seconds in all)."""
    text = httpx.get(vllm.url + "/metrics").text
    got = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("vllm:request_queue_time_seconds_"):
                got[s.name.rsplit("_", 1)[1]] = float(s.value)
    assert {"count", "sum"} <= set(got), "vllm:request_queue_time_seconds not found"
    return got["count"], got["sum"]


def test_engine_queueing_lands_in_the_queue_phase(traced: Traced) -> None:
    """Under KV pressure the wait is in the queue phase and matches vLLM's own queue time."""
    sc, vllm = traced.sidecar, traced.vllm
    before_events = len(sc.events())
    before_n, before_q = _queue_time(vllm)
    ids = [f"q-{i}" for i in range(12)]
    # Distinct from the first token (so the prefix cache cannot share blocks), ~1000 tokens each.
    prompts = {rid: " ".join(f"{rid}_{i} = compute({i})" for i in range(110)) for rid in ids}

    statuses: dict[str, int] = {}
    # All twelve arrive together: a client each is built first (httpx's TLS setup costs ~20 ms
    # of CPU), so a fast engine cannot finish the first before the last is sent.
    together = threading.Barrier(len(ids))

    def send(rid: str) -> None:
        body = {"model": "tiny", "prompt": prompts[rid], "max_tokens": 64, "ignore_eos": True}
        with httpx.Client(base_url=sc.url, timeout=120) as client:
            together.wait()
            r = client.post(COMPLETIONS, json=body, headers={"X-Request-Id": rid})
        statuses[rid] = r.status_code

    threads = [threading.Thread(target=send, args=(rid,)) for rid in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == dict.fromkeys(ids, 200)
    events = _by_id(sc, before_events + len(ids))
    # vLLM has counted the twelve in its histogram (it may do so after the answers went out).
    probes.wait_for(
        "vLLM to count the twelve requests' queue time",
        lambda: _queue_time(vllm)[0] >= before_n + len(ids),
        60,
        every_s=0.05,
    )
    engine_queue_s = _queue_time(vllm)[1] - before_q
    mine = [events[rid] for rid in ids]
    assert all(e["engine_view"] == "joined" for e in mine)
    ours = sum(e["engine_queue_ms"] for e in mine) / 1000
    assert engine_queue_s > 0.05, "the small KV cache should have made requests wait"
    assert ours == pytest.approx(engine_queue_s, rel=0.05, abs=0.02)
    for e in mine:
        assert e["queue_ms"] >= e["engine_queue_ms"] - 1.0


def test_received_spans_are_forwarded_into_one_tree(
    traced: Traced, otlp_receiver: OtlpReceiver
) -> None:
    """vLLM's spans reach the trace backend through the sidecar, under the sidecar's root span."""
    sc = traced.sidecar
    before = len(sc.events())
    body = {"model": "tiny", "prompt": "def f():", "max_tokens": 4}
    assert (
        httpx.post(sc.url + COMPLETIONS, json=body, headers={"X-Request-Id": "fwd"}).status_code
        == 200
    )
    event = _by_id(sc, before + 1)["fwd"]
    spans = otlp_receiver.wait_for(event["trace_id"], ["llm_request", "text_completion tiny"])
    by_name = {s.name: s for s in spans}
    engine = by_name["llm_request"]
    assert engine.parent_span_id == by_name["text_completion tiny"].span_id == event["span_id"]
    assert engine.scope == "vllm.tracing.otel"
    assert engine.attributes["gen_ai.request.id"] == "cmpl-fwd-0"
    assert engine.attributes["gen_ai.latency.time_in_queue"] * 1000 == pytest.approx(
        event["engine_queue_ms"], abs=0.01
    )


def test_pool_without_tracing_yields_complete_events_marked_absent(
    vllm: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """With no span coming, the event is written once the join wait ends, complete, marked
    absent (the wait's timing is pinned in virtual time: tests/sidecar/record/test_engine_join.py;
    here the 60 s are a hang guard)."""
    sc = sidecar(vllm.url, args=("--engine-traces", "--engine-join-wait", "0.5"), traces=False)
    body = {"model": "tiny", "prompt": "import os", "max_tokens": 4, "stream": True}
    assert httpx.post(sc.url + COMPLETIONS, json=body, timeout=60).status_code == 200
    (event,) = sc.wait_events(1, timeout_s=60)
    assert event["engine_view"] == "absent"
    assert event["engine_queue_ms"] is None
    assert event["ttft_ms"] is not None and event["completion_tokens"] == 4
