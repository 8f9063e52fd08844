"""obs.sidecar.record.recorder: a request's record from start to end, processors then the
exporters."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from obs import conventions as c
from obs.events import Event
from obs.phases import Clock
from obs.record import Finished
from obs.sidecar.record.engine_join import EngineJoin
from obs.sidecar.record.record_rate import RefusedRecord
from obs.sidecar.record.recorder import (
    JoinEngineSpan,
    Recorder,
    SampleRefusals,
    StampConfig,
    Start,
    Step,
    Timings,
)
from obs.tracecontext import new_ids

MS = 1_000_000


def _finished(**fields: object) -> Finished:
    ev = Event(request_id="r1", **fields)  # type: ignore[arg-type]
    clock = Clock(received=0, dispatched=2 * MS, first_up=10 * MS, first_sent=11 * MS,
                  last_up=20 * MS, end=21 * MS)  # fmt: skip
    return Finished(ev, clock, 0, new_ids(None))


def test_processors_run_in_order_then_the_record_is_exported() -> None:
    """Each processor sees the record the one before returned; the exporter gets the last."""
    seen: list[str] = []
    out: list[Finished] = []

    class First(Step):
        def on_end(self, finished: Finished) -> Finished:
            seen.append(f"first:{finished.event.config_fingerprint}")
            return finished

    recorder = Recorder([StampConfig("cfg-1"), First(), Timings()], out.append)
    recorder.end(_finished(stream=True))
    assert seen == ["first:cfg-1"]
    assert len(out) == 1 and out[0].event.e2e_ms == 21 and out[0].event.queue_ms == 2


def test_a_processor_that_takes_the_record_ends_its_way() -> None:
    """A processor returning None took the record: later steps and the exporter never see it."""
    out: list[Finished] = []
    after: list[Finished] = []

    class Take(Step):
        def on_end(self, finished: Finished) -> None:
            return None

    class Later(Step):
        def on_end(self, finished: Finished) -> Finished:
            after.append(finished)
            return finished

    recorder = Recorder([Take(), Later()], out.append)
    recorder.end(_finished())
    assert out == [] and after == []


def test_a_failing_processor_never_loses_the_record() -> None:
    """A processor that raises is passed over; the record still reaches the exporter."""
    out: list[Finished] = []

    class Broken(Step):
        def on_end(self, finished: Finished) -> Finished:
            raise ValueError("a pool sent nonsense")

    Recorder([Broken(), StampConfig("cfg-2")], out.append).end(_finished())
    assert [f.event.config_fingerprint for f in out] == ["cfg-2"]


def test_refusals_past_the_budget_go_to_the_metrics_and_a_summary() -> None:
    """Past the per-second budget a refusal reaches the metrics alone, then one summary record."""
    now = [0.0]
    rate = RefusedRecord(1, CollectorRegistry(), clock=lambda: now[0], wall=lambda: now[0])
    metrics: list[Finished] = []
    summaries: list[Finished] = []
    out: list[Finished] = []
    refusals = SampleRefusals(rate, metrics.append, summaries.append)
    recorder = Recorder([refusals], out.append)
    for _ in range(3):
        recorder.end(_finished(status=c.REJECTED, lane="a"))
    assert (len(out), len(metrics), summaries) == (1, 2, [])
    now[0] = 2.0
    refusals.write_due()
    assert [f.event.summarized for f in summaries] == [2]
    recorder.end(_finished(status=c.OK, replica="http://r", lane="a"))  # reached a pool
    assert len(out) == 2


def test_records_of_traced_pools_wait_for_their_engine_span() -> None:
    """The join learns each record's ids at its start; a traced pool's record is held at its
    end, then goes on through the steps after the join (not around them) to the exporter;
    another pool's goes straight on."""
    exported: list[Finished] = []
    out: list[Finished] = []

    async def main() -> None:
        join = EngineJoin(exported.append, 30.0)
        spans = JoinEngineSpan(join, {"traced"}, lambda pool, replica: "vllm")
        recorder = Recorder([spans, StampConfig("after-join")], out.append)
        traced = _finished(pool="traced", replica="http://a", status=c.OK)
        recorder.start(Start(traced.event, traced.ids, ("traced",)))
        plain = _finished(pool="plain")
        recorder.start(Start(plain.event, plain.ids, ("plain",)))
        assert join.knows_parent(traced.ids.trace_id_hex, traced.ids.span_id_hex)
        assert not join.knows_parent(plain.ids.trace_id_hex, plain.ids.span_id_hex)
        recorder.end(traced)
        recorder.end(_finished(pool="plain", replica="http://b", status=c.OK))
        assert (join.pending, len(out)) == (1, 1)
        join.flush()

    asyncio.run(main())
    assert exported == []  # the join hands its records back to the pipeline
    assert [(f.event.pool, f.event.config_fingerprint) for f in out] == [
        ("plain", "after-join"),
        ("traced", "after-join"),
    ]


def test_a_processor_sees_the_start_of_each_record() -> None:
    """on_start reaches the processors that define it, with the request's event and ids."""
    started: list[str] = []

    class Watch(Step):
        def on_start(self, start: Start) -> None:
            started.append(start.event.request_id)

    recorder = Recorder([Timings(), Watch()], lambda f: None)
    f = _finished()
    recorder.start(Start(f.event, f.ids))
    assert started == ["r1"]
