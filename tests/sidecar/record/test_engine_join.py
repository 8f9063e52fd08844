"""The engine join as a policy: which spans it takes, and that no span can lose an event.

Spans are built in the test (``ReceivedSpan``, what ``/v1/traces`` decodes): the
point is what a forged or broken span does, which no real vLLM sends.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from obs import conventions as c
from obs.engines.view import MAX_ENGINE_S, BadEngineSpan, engine_numbers
from obs.events import Event
from obs.phases import Clock
from obs.record import Finished
from obs.sidecar.record.engine_join import EngineJoin
from obs.sidecar.record.otlp import ReceivedSpan
from obs.sweep.virtual import VirtualLoop
from obs.tracecontext import TraceIds

MS = 1_000_000


def _finished(trace_id: int, span_id: int, request_id: str) -> Finished:
    ids = TraceIds(trace_id, span_id, None, True)
    ev = Event(request_id=request_id, trace_id=ids.trace_id_hex, span_id=ids.span_id_hex)
    ev.stream = True
    clock = Clock(received=0, dispatched=1 * MS, first_up=50 * MS, first_sent=51 * MS,
                  last_up=90 * MS, end=91 * MS)  # fmt: skip
    return Finished(ev, clock, 0, ids)


def _span(f: Finished, **latency: float) -> ReceivedSpan:
    attrs: dict[str, object] = {f"gen_ai.latency.{k}": v for k, v in latency.items()}
    attrs["gen_ai.request.id"] = f"chatcmpl-{f.event.request_id}"
    return ReceivedSpan("llm_request", f.event.trace_id or "", "ab" * 8, f.event.span_id or "",
                        2, 0, 0, "vllm.tracing.otel", attrs)  # fmt: skip


class Harness:
    def __init__(self, wait_s: float = 30.0) -> None:
        self.exported: list[Finished] = []
        self.results: list[str] = []
        self.join = EngineJoin(self.exported.append, wait_s, self.results.append)

    def send(self, f: Finished) -> None:
        """The relay's side: ids issued at dispatch, the event submitted at the end."""
        self.join.issue(f.event.trace_id or "", f.event.span_id or "")
        self.join.submit(f, engine_traces=True)


def _run(fn: Callable[[], None]) -> None:
    """Run ``fn`` inside an event loop (the join arms its wait with ``call_later``)."""

    async def main() -> None:
        fn()

    asyncio.run(main())


@pytest.mark.parametrize("bad", [math.nan, math.inf, 1e308, -1.0, 10**400, "5"])
def test_a_bad_number_writes_the_event_at_once_without_the_engine_view(bad: object) -> None:
    """A NaN, huge, negative or non-number latency rejects the span; the event is still written."""
    h = Harness()

    def scenario() -> None:
        victims = [_finished(7, 100 + i, f"r{i}") for i in range(6)]
        for v in victims:
            h.send(v)
        for v in victims:
            span = _span(v, time_in_queue=0.01)
            span.attributes["gen_ai.latency.time_in_model_prefill"] = bad
            h.join.on_span(span)
        assert h.join.pending == 0

    _run(scenario)
    assert len(h.exported) == 6
    assert all(f.event.engine_view == "absent" for f in h.exported)
    assert h.results == ["rejected"] * 6


def test_a_forged_early_span_for_ids_the_sidecar_never_issued_is_ignored() -> None:
    """A span naming a guessed trace and request id joins nothing (engine_queue_ms stays ours)."""
    h = Harness()

    def scenario() -> None:
        real = _finished(42, 4242, "victim")
        forged = _span(real, time_in_queue=42.0)
        forged.parent_span_id = "00000000000000ff"  # the attacker cannot know our span id
        h.join.on_span(forged)
        h.send(real)
        h.join.flush()

    _run(scenario)
    (event,) = [f.event for f in h.exported]
    assert event.engine_view == "absent" and event.engine_queue_ms is None
    assert h.results == ["unknown"]


def test_two_requests_sharing_a_trace_id_each_get_their_own_span() -> None:
    """Requests of one client trace are held apart and each joined to its span (item 10)."""
    h = Harness()

    def scenario() -> None:
        a, b = _finished(9, 1, "a"), _finished(9, 2, "b")
        h.send(a)
        h.send(b)
        h.join.on_span(_span(b, time_in_queue=0.002))
        h.join.on_span(_span(a, time_in_queue=0.001))

    _run(scenario)
    by_id = {f.event.request_id: f.event for f in h.exported}
    assert set(by_id) == {"a", "b"}
    assert by_id["a"].engine_queue_ms == 1.0 and by_id["b"].engine_queue_ms == 2.0
    assert h.results == ["joined", "joined"]


def test_a_span_for_another_request_id_does_not_join() -> None:
    """Matching ids but a different gen_ai.request.id: not our request's span."""
    h = Harness()

    def scenario() -> None:
        f = _finished(5, 5, "mine")
        h.send(f)
        span = _span(f, time_in_queue=0.5)
        span.attributes["gen_ai.request.id"] = "chatcmpl-theirs"
        h.join.on_span(span)
        h.join.flush()

    _run(scenario)
    assert h.exported[0].event.engine_view == "absent"
    assert h.results == ["unknown"]


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                f"gen_ai.latency.{k}"
                for k in ("time_in_queue", "time_in_model_prefill", "time_in_model_decode", "e2e")
            ]
            + ["other"]
        ),
        st.one_of(st.floats(), st.integers(), st.text(max_size=3), st.booleans(), st.none()),
    )
)
def test_engine_numbers_keeps_only_finite_durations_or_refuses(attrs: dict[str, object]) -> None:
    """Any attribute values: either durations in [0, a day] come out, or BadEngineSpan."""
    try:
        out = engine_numbers(attrs)
    except BadEngineSpan:
        return
    assert set(out) <= {k for k in attrs if k.startswith("gen_ai.latency.")}
    assert all(math.isfinite(v) and 0 <= v <= MAX_ENGINE_S for v in out.values())


def test_failed_requests_are_not_held() -> None:
    """Only successful requests wait for a span (vLLM sends none for failed ones)."""
    h = Harness()

    def scenario() -> None:
        f = _finished(3, 3, "x")
        f.event.status = c.ERROR
        h.send(f)

    _run(scenario)
    assert len(h.exported) == 1


def test_a_record_without_its_span_is_written_absent_exactly_when_the_wait_ends() -> None:
    """No span comes: the record is held through the join wait, not written a tick before its
    end, and written once at it, marked absent (virtual time: the loop's clock jumps)."""
    loop = VirtualLoop()
    h = Harness(wait_s=0.5)
    seen: list[tuple[float, int]] = []

    async def scenario() -> None:
        h.send(_finished(4, 4, "w"))
        await asyncio.sleep(0.5 - 1e-6)
        seen.append((loop.time(), len(h.exported)))
        await asyncio.sleep(2e-6)
        seen.append((loop.time(), len(h.exported)))

    loop.run_until_complete(scenario())
    loop.close()
    assert [n for _, n in seen] == [0, 1]
    assert h.exported[0].event.engine_view == "absent" and h.results == []
