"""SGLang's and TGI's request spans joined like vLLM's, into the same ``engine_*`` fields.

Neither engine runs on these machines: the spans are the captures written from
their sources (tests/data/README.md), sent through the receiver's decoder
(``decode``, what ``/v1/traces`` runs) and the engine join, as a pool would.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from obs.config import parse_config
from obs.engines.spans import engine_of, read_span, rust_duration_s
from obs.engines.view import MAX_ENGINE_S, BadEngineSpan
from obs.errors import ConfigError
from obs.events import Event
from obs.phases import Clock
from obs.record import Finished
from obs.sidecar.record.engine_join import EngineJoin
from obs.sidecar.relay.traces import MAX_TRACE_BYTES, decode
from obs.tracecontext import TraceIds
from tests.support import span_captures

MS = 1_000_000
SGLANG = "sglang-request-spans.json"
TGI = "tgi-chat-spans.json"
VLLM = "vllm-0.32-llm_request-span.json"


def _finished(stream: bool) -> Finished:
    ids = TraceIds(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x0123456789ABCDEF, None, True)
    ev = Event(request_id="req-1", trace_id=ids.trace_id_hex, span_id=ids.span_id_hex)
    ev.stream = stream
    clock = Clock(received=0, dispatched=1 * MS, first_up=60 * MS, first_sent=61 * MS,
                  last_up=170 * MS, end=171 * MS)  # fmt: skip
    return Finished(ev, clock, 0, ids)


def _phase_sum(ev: Event) -> float:
    phases = (ev.queue_ms, ev.prefill_ms, ev.first_token_ms, ev.decode_ms, ev.stream_ms)
    return sum(p or 0.0 for p in phases)


def _join(capture: list[dict], stream: bool = True) -> tuple[Event, list[str]]:
    """Relay one request to a traced pool, then receive the capture's export for it."""
    f = _finished(stream)
    exported: list[Finished] = []
    results: list[str] = []
    trace_id, span_id = f.event.trace_id or "", f.event.span_id or ""
    body = span_captures.export(capture, trace_id, span_id)

    async def main() -> None:
        join = EngineJoin(exported.append, 30.0, results.append)
        join.issue(trace_id, span_id)
        join.submit(f, engine_traces=True)
        for span in decode(body, "", MAX_TRACE_BYTES, join.knows_parent, False).spans:
            join.on_span(span)
        join.flush()

    asyncio.run(main())
    assert len(exported) == 1
    return exported[0].event, results


@pytest.mark.parametrize(
    ("capture", "kept"),
    [(VLLM, ["llm_request"]), (SGLANG, [" Req 9c4f27d1"]), (TGI, ["chat_completions"])],
)
def test_the_receiver_keeps_only_each_engines_request_span(capture: str, kept: list[str]) -> None:
    """Of an engine's export, only its request span reaches the join (not threads, slices, HTTP)."""
    body = span_captures.export(span_captures.load(capture), "ab" * 16, "cd" * 8)
    spans = decode(body, "", MAX_TRACE_BYTES, lambda _t, _p: True, False).spans
    assert [s.name for s in spans] == kept


def test_sglang_root_span_joins_without_a_fabricated_queue() -> None:
    """SGLang's root span: prefill/decode/inference/TTFT joined; it has no queue time, so null."""
    ev, results = _join(span_captures.load(SGLANG))
    assert results == ["joined"]
    assert ev.engine_view == "joined"
    assert ev.engine_queue_ms is None
    assert (ev.engine_prefill_ms, ev.engine_decode_ms) == (39.8, 111.1)
    assert (ev.engine_inference_ms, ev.engine_ttft_ms) == (150.9, 42.1)
    assert ev.queue_ms == 1.0  # nothing moved into the queue phase: the sidecar's own wait only
    assert _phase_sum(ev) == pytest.approx(ev.e2e_ms)


def test_tgi_handler_span_joins_queue_and_inference_only() -> None:
    """TGI's chat_completions span: queue and inference from its duration strings, no split."""
    ev, results = _join(span_captures.load(TGI), stream=False)
    assert results == ["joined"]
    assert ev.engine_view == "joined"
    assert ev.engine_queue_ms == pytest.approx(9.512, abs=0.001)
    assert ev.engine_inference_ms == pytest.approx(142.214, abs=0.001)
    assert (ev.engine_prefill_ms, ev.engine_decode_ms, ev.engine_ttft_ms) == (None, None, None)
    assert ev.ttft_ms is None  # a whole answer and no engine decode time: no TTFT to place
    assert ev.queue_ms == pytest.approx(1.0 + 9.512, abs=0.01)  # the engine queue moved in
    assert _phase_sum(ev) == pytest.approx(ev.e2e_ms)


def test_a_span_without_timing_joins_nothing() -> None:
    """An SGLang root span with no latency (an aborted request's) is rejected, nothing joined."""
    capture = span_captures.load(SGLANG)
    capture[0]["attributes"] = {
        k: v for k, v in capture[0]["attributes"].items() if not k.startswith("gen_ai.latency")
    }
    ev, results = _join(capture)
    assert results == ["rejected"]
    assert ev.engine_view == "absent"
    assert ev.engine_prefill_ms is None and ev.engine_queue_ms is None


@pytest.mark.parametrize("bad", ["soon", "1.5 ms", "-3ms", "1e9s", "99999999999999999999s", "7"])
def test_a_tgi_duration_that_is_not_one_rejects_the_span(bad: str) -> None:
    """A TGI timing field that is not a plausible Rust Duration: rejected, never joined."""
    capture = span_captures.load(TGI)
    capture[1]["attributes"]["queue_time"] = bad
    ev, results = _join(capture)
    assert results == ["rejected"]
    assert ev.engine_view == "absent"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1.000000001s", 1.000000001), ("152.930417ms", 0.152930417), ("7µs", 7e-6),
     ("7μs", 7e-6), ("100ns", 1e-7), ("0ns", 0.0), ("3s", 3.0)],
)  # fmt: skip
def test_rust_duration_debug_strings_parse(text: str, seconds: float) -> None:
    """Rust's Duration debug format, every unit it prints, read as seconds."""
    assert rust_duration_s(text) == pytest.approx(seconds, rel=1e-12)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.text(max_size=30))
def test_rust_duration_is_a_plausible_duration_or_refused(text: str) -> None:
    """Any text: a finite duration in [0, a day] comes out, or BadEngineSpan."""
    try:
        s = rust_duration_s(text)
    except BadEngineSpan:
        return
    assert math.isfinite(s) and 0 <= s <= MAX_ENGINE_S


def test_other_spans_are_no_engines() -> None:
    """Names alone are not enough: an SGLang-like name without its module, TGI without timing."""
    assert engine_of(" Req 1234abcd", {"module": "other"}) is None
    assert engine_of("generate_stream", {"code.namespace": "text_generation_router::infer"}) is None
    assert engine_of("generate", {"queue_time": "1ms"}) == "tgi"
    assert read_span("HTTP POST", {}) is None


def test_a_llamacpp_pool_cannot_claim_engine_spans() -> None:
    """llama.cpp exports no spans: ``engine_traces`` on its pool is a one-line config error."""
    pool = {"name": "cpu", "replicas": ["http://127.0.0.1:8080"], "engine": "llamacpp"}
    with pytest.raises(ConfigError, match="llama-server exports no spans"):
        parse_config(
            {
                "pools": [{**pool, "engine_traces": True}],
                "lanes": [{"name": "local", "pool": "cpu"}],
                "default_lane": "local",
            }
        )
