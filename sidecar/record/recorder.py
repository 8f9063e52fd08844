"""A finished request's one way out: a pipeline of processors, then the exporters.

The relay builds each request's record (``obs.record.Finished``) and hands it to
``Recorder.record``; it reads nothing back and nothing calls back into whoever built
it. As structlog runs its processors before the renderer, and OpenTelemetry its span
processors before the exporters, the record passes each processor in order. A
processor fills or stamps the record and returns it, or takes it and returns
``None`` (the record went its own way: a refusal sampled out to the metrics alone, a
record held until its engine span arrives). A processor that raises is logged and
passed over: a record is never lost over one step.

The sidecar's pipeline (``sidecar_pipeline``, built once by ``create_app``):

1. ``timings``: the phases and the timings derived from the clock (``obs.record``);
2. ``LearnSlowReaders``: a client's finished stream teaches the recognizer whether
   it reads slowly (``obs.sidecar.policy.recognition``);
3. ``stamp_config``: the fingerprint of the lanes file the sidecar runs;
4. ``SampleRefusals``: client-caused refusals past their budget go to the metrics
   alone, and once a second as summary records (``obs.sidecar.record.record_rate``);
5. ``JoinEngineSpan``: a record of a pool that sends engine spans is held until its
   span arrives (``obs.sidecar.record.engine_join``), which then exports it;

then the exporters (``obs.exporters.base.Fanout``, ``obs.attribution.MissStamp`` first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import structlog

from obs.engines.spans import SPANLESS
from obs.phases import Clock
from obs.record import Finished, fill_timings
from obs.sidecar.policy.recognition import SlowReaders
from obs.sidecar.record.engine_join import EngineJoin
from obs.sidecar.record.record_rate import RefusedRecord
from obs.tracecontext import new_ids

log = structlog.get_logger("vllm_obs.recorder")

Processor = Callable[[Finished], Finished | None]
Export = Callable[[Finished], None]


class Recorder:
    """Run each record through ``processors`` in order, then hand it to ``export``."""

    __slots__ = ("_export", "processors")

    def __init__(self, processors: Sequence[Processor], export: Export) -> None:
        self.processors = tuple(processors)
        self._export = export

    def record(self, finished: Finished) -> None:
        for step in self.processors:
            try:
                out = step(finished)
            except Exception:  # never lose the record over one step (what a pool sent, ...)
                log.exception(
                    "record_step_failed",
                    step=getattr(step, "__name__", type(step).__name__),
                    request_id=finished.event.request_id,
                )
                continue
            if out is None:
                return
            finished = out
        self._export(finished)


def timings(finished: Finished) -> Finished:
    """The event's phases and derived timings, from the request's clock."""
    fill_timings(finished)
    return finished


def stamp_config(fingerprint: str) -> Processor:
    """Stamp each record with the fingerprint of the lanes file in force."""

    def stamp(finished: Finished) -> Finished:
        finished.event.config_fingerprint = fingerprint
        return finished

    return stamp


class LearnSlowReaders:
    """Each finished stream tells the recognizer whether its client reads slowly."""

    def __init__(self, slow: SlowReaders) -> None:
        self.slow = slow

    def __call__(self, finished: Finished) -> Finished:
        self.slow.observe(finished.client_id, finished.event)
        return finished


class SampleRefusals:
    """Client-caused refusals past ``rate``'s budget: to ``metrics`` only, and summarized."""

    def __init__(self, rate: RefusedRecord, metrics: Export, summaries: Export) -> None:
        self.rate = rate
        self._metrics = metrics
        self._summaries = summaries

    def __call__(self, finished: Finished) -> Finished | None:
        if self.rate.keep(finished.event):
            return finished
        self._metrics(finished)
        self.write_due()
        return None

    def write_due(self) -> None:
        """The summary records, once a second has passed since the first one pending."""
        if self.rate.due():
            self.write()

    def write(self) -> None:
        """Every pending summary record, now (each second, and at shutdown)."""
        for ev in self.rate.flush():
            self._summaries(Finished(ev, Clock(received=0), 0, new_ids(None)))


class JoinEngineSpan:
    """Hold the record of a pool that sends engine spans until its span arrives."""

    def __init__(
        self, join: EngineJoin, traced: set[str], engine: Callable[[str, str], str | None]
    ) -> None:
        self.join = join
        self.traced = traced  # the pools whose engines send spans (engine_traces)
        self._engine = engine  # the engine kind of (pool, replica)

    def dispatched(self, pool: str, trace_id: str, span_id: str) -> None:
        """The relay sent these ids to ``pool``: its engine's span may name them."""
        if pool in self.traced:
            self.join.issue(trace_id, span_id)

    def __call__(self, finished: Finished) -> Finished | None:
        ev = finished.event
        if ev.pool not in self.traced or self._engine(ev.pool or "", ev.replica or "") in SPANLESS:
            return finished  # no span will come (an ``auto`` llama.cpp replica sends none)
        self.join.submit(finished, True)
        return None


def sidecar_pipeline(
    slow: SlowReaders,
    config_fingerprint: str,
    refusals: SampleRefusals,
    engine_spans: JoinEngineSpan,
) -> list[Processor]:
    """The sidecar's processors, in the order the module's doc gives."""
    return [
        timings,
        LearnSlowReaders(slow),
        stamp_config(config_fingerprint),
        refusals,
        engine_spans,
    ]
