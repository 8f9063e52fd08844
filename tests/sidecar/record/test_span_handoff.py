"""Engine spans across --workers: span ids name their worker (obs.tracecontext), and a
worker hands a received span to the worker that relayed its request over that worker's real
private loopback server (obs.sidecar.record.span_handoff, obs.sidecar.server.worker_metrics)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from obs.sidecar.record.otlp import ReceivedSpan
from obs.sidecar.record.span_handoff import SpanHandoff, decode, encode
from obs.sidecar.server.worker_metrics import WorkerSlot, serve_private_metrics
from obs.sidecar.server.workers import listen
from obs.tracecontext import new_ids, new_span_id, owner_of


@given(index=st.integers(0, 15), extra=st.integers(0, 15))
def test_span_ids_name_their_worker(index: int, extra: int) -> None:
    """A span id made for worker ``index`` of ``count`` maps back to it, and is never 0."""
    count = index + 1 + extra
    sid = new_span_id((index, count))
    assert sid != 0 and owner_of(f"{sid:016x}", count) == index
    ids = new_ids("00-" + "1" * 32 + "-" + "2" * 16 + "-01", (index, count))
    assert owner_of(ids.span_id_hex, count) == index


def _span(parent: str, name: str = "llm_request") -> ReceivedSpan:
    return ReceivedSpan(
        name, "ab" * 16, "cd" * 8, parent, 2, 1, 2, "vllm", {"gen_ai.request.id": "x", "n": 1}
    )


def test_spans_survive_the_wire() -> None:
    """A span handed over reads back as it was sent."""
    spans = [_span("00000000000000ff"), _span("0000000000000100", "other")]
    assert decode(encode(spans)) == spans


@pytest.mark.inproc
def test_a_sibling_receives_its_spans(tmp_path: Path) -> None:
    """Worker 0 keeps the spans whose parent it made and posts worker 1's to worker 1's
    private server, where they join on worker 1's loop."""
    socks = [listen("127.0.0.1", 0, "worker metrics") for _ in range(2)]
    ports = tuple(s.getsockname()[1] for s in socks)
    slot1 = WorkerSlot(1, 2, ports, str(tmp_path), "this-start")

    async def go() -> None:
        got: list[ReceivedSpan] = []
        async with aiohttp.ClientSession() as session:
            one = SpanHandoff(1, ports, lambda: session, got.append)
            one.bind(asyncio.get_running_loop())
            server = serve_private_metrics(socks[1], CollectorRegistry(), slot1, one.receive)
            try:
                zero = SpanHandoff(0, ports, lambda: session, lambda s: None,
                                   slot1.handoff_headers())  # fmt: skip
                mine, theirs = (
                    _span(f"{new_span_id((0, 2)):016x}"),
                    _span(f"{new_span_id((1, 2)):016x}"),
                )
                kept = await zero([mine, theirs])
                assert kept == [mine]
                for _ in range(100):
                    if got:
                        break
                    await asyncio.sleep(0.01)
                assert got == [theirs] and zero.lost == 0
            finally:
                server.shutdown()

    asyncio.run(go())
    for s in socks:
        s.close()
