"""A request's record, from its start to its end: processors, then the exporters.

As OpenTelemetry's span processors, each processor sees the record begin and end: the
relay calls ``Recorder.start`` once the request is placed (its lane, pool and trace ids
known) and written to its pool, or as it ends never sent (``Relay._sent``), and
``Recorder.end`` with the finished record, and nothing else; it reads nothing back.
``on_start`` notes what the end will need (the engine join: the ids a traced pool's
span may name). ``on_end`` fills or stamps the record and returns it, or takes
it and returns ``None``: a refusal sampled out to the metrics alone, or a record held
until its engine span arrives, which the processor holding it hands back (``resume``,
bound by the recorder) to go on from the step after it. A processor that raises is
logged and passed over: a record is never lost over one step. Then the exporters
(``obs.exporters.base.Fanout``): they only export.

The sidecar's pipeline (``sidecar_pipeline``, built once by ``create_app``):

1. ``Timings``: the phases and the timings derived from the clock (``obs.record``);
2. ``LearnSlowReaders``: a client's finished stream teaches the recognizer whether
   it reads slowly (``obs.sidecar.policy.recognition``);
3. ``NextTurn``: a record whose client's next request (relayed) is already under way
   goes on at the loop's next turn, after that request's dispatch
   (``NextTurn``: what a client can observe keeps its order);
4. ``StampConfig``: the fingerprint of the lanes file the sidecar runs;
5. ``CaptureText`` (with ``--capture-text``): the prompt and output texts, redacted
   (``obs.sidecar.record.capture``);
6. ``SampleRefusals``: client-caused refusals past their budget go to the metrics
   alone, and once a second as summary records (``obs.sidecar.record.record_rate``);
7. ``JoinEngineSpan``: a record of a pool that sends engine spans is held until its
   span arrives (``obs.sidecar.record.engine_join``), then goes on;
8. ``MissStamp``: the SLO gates the request missed, and why (``obs.attribution``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import structlog

from obs.attribution import MissStamp
from obs.engines.spans import SPANLESS
from obs.events import Event
from obs.phases import Clock
from obs.record import Finished, fill_timings
from obs.sidecar.policy.recognition import SlowReaders
from obs.sidecar.record.capture import TextCapture
from obs.sidecar.record.engine_join import EngineJoin
from obs.sidecar.record.record_rate import RefusedRecord
from obs.tracecontext import TraceIds, new_ids

log = structlog.get_logger("vllm_obs.recorder")

Export = Callable[[Finished], None]


@dataclass(frozen=True, slots=True)
class Start:
    """A record begins: the request's event (lane and pool set), its trace ids, and the
    pools it may be sent to (its own, then its lane's fallback, if any)."""

    event: Event
    ids: TraceIds
    pools: tuple[str, ...] = ()


class Processor(Protocol):
    def on_start(self, start: Start) -> None: ...

    def on_end(self, finished: Finished) -> Finished | None: ...


class Step:
    """A processor that needs only the end (``on_start`` does nothing)."""

    def on_start(self, start: Start) -> None:
        return None

    def on_end(self, finished: Finished) -> Finished | None:
        return finished


class Recorder:
    """Run each record through ``processors`` in order, then hand it to ``export``."""

    __slots__ = ("_export", "_starts", "processors")

    def __init__(self, processors: Sequence[Processor], export: Export) -> None:
        self.processors = tuple(processors)
        self._export = export
        self._starts = tuple(
            p for p in self.processors if getattr(type(p), "on_start", None) is not Step.on_start
        )
        for at, step in enumerate(self.processors):
            bind = getattr(step, "bind", None)
            if bind is not None:  # it may hold a record: this goes on from the next step
                bind(partial(self._run, at + 1))

    def start(self, start: Start) -> None:
        for step in self._starts:
            try:
                step.on_start(start)
            except Exception:
                log.exception("record_start_failed", step=type(step).__name__)

    def end(self, finished: Finished) -> None:
        self._run(0, finished)

    def _run(self, at: int, finished: Finished) -> None:
        for step in self.processors[at:]:
            try:
                out = step.on_end(finished)
            except Exception:  # never lose the record over one step (what a pool sent, ...)
                log.exception(
                    "record_step_failed",
                    step=type(step).__name__,
                    request_id=finished.event.request_id,
                )
                continue
            if out is None:
                return
            finished = out
        self._export(finished)


class Timings(Step):
    """The event's phases and derived timings, from the request's clock."""

    def on_end(self, finished: Finished) -> Finished:
        fill_timings(finished)
        return finished


class NextTurn(Step):
    """A record whose client already sent its next request on the same connection goes on
    one event-loop turn later, so that that request reaches its pool first.

    At one stream (c1) a client's next request carries the acknowledgement the previous
    response's end waits for (``ClientConn.drained``): both wake in the same loop turn, the
    previous request first, and its record (the metrics, the event, the span queued: tens of
    µs on the loop) would run before the next request is read and dispatched, adding to its
    time to first token. The relay marks such a record (``Finished.next_waiting``: the next
    request is one of the relayed routes, whose handler has started); this step, after the steps
    whose state that request may read (``LearnSlowReaders``), holds it and hands it on at the
    loop's next turn. Nothing a client can observe changes order:

    - records go on in the order they ended: a record reaching this step hands on the held ones
      first (``flush``);
    - a request on that connection that is not relayed (a ``/metrics`` scrape) is not waited
      for: the record goes on at once, before it runs;
    - the next relayed request reads nothing the held steps write (they stamp and export).
    """

    def __init__(self) -> None:
        self._held: deque[Finished] = deque()
        self._resume: Export | None = None

    def bind(self, resume: Export) -> None:
        """Where a held record goes on: the pipeline's next step."""
        self._resume = resume

    def on_end(self, finished: Finished) -> Finished | None:
        self.flush()
        if not finished.next_waiting or self._resume is None:
            return finished
        self._held.append(finished)
        asyncio.get_running_loop().call_soon(self.flush)
        return None

    def flush(self) -> None:
        """Hand on every held record, in the order they came."""
        held, resume = self._held, self._resume
        while held and resume is not None:
            resume(held.popleft())


class StampConfig(Step):
    """Stamp each record with the fingerprint of the lanes file in force."""

    def __init__(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint

    def on_end(self, finished: Finished) -> Finished:
        finished.event.config_fingerprint = self.fingerprint
        return finished


class LearnSlowReaders(Step):
    """Each finished stream tells the recognizer whether its client reads slowly."""

    def __init__(self, slow: SlowReaders) -> None:
        self.slow = slow

    def on_end(self, finished: Finished) -> Finished:
        self.slow.observe(finished.client_id, finished.event)
        return finished


class CaptureText(Step):
    """The texts the relay kept (``Finished.captured``), redacted into the event."""

    def __init__(self, capture: TextCapture) -> None:
        self.capture = capture

    def on_end(self, finished: Finished) -> Finished:
        kept, finished.captured = finished.captured, None
        if kept is not None:
            self.capture.fill(finished.event, *kept)
        return finished


class SampleRefusals(Step):
    """Client-caused refusals past ``rate``'s budget: to ``metrics`` only, and summarized."""

    def __init__(self, rate: RefusedRecord, metrics: Export, summaries: Export) -> None:
        self.rate = rate
        self._metrics = metrics
        self._summaries = summaries

    def on_end(self, finished: Finished) -> Finished | None:
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

    def bind(self, resume: Export) -> None:
        """Where a held record goes on (the pipeline's next step), joined or not."""
        self.join.export = resume

    def on_start(self, start: Start) -> None:
        """The relay may send these ids to a traced pool (the request's, or its lane's
        fallback): that engine's span may name them."""
        if any(pool in self.traced for pool in start.pools):
            self.join.issue(start.ids.trace_id_hex, start.ids.span_id_hex)

    def on_end(self, finished: Finished) -> Finished | None:
        ev = finished.event
        if ev.pool not in self.traced or self._engine(ev.pool or "", ev.replica or "") in SPANLESS:
            return finished  # no span will come (an ``auto`` llama.cpp replica sends none)
        self.join.submit(finished, True)
        return None


def sidecar_pipeline(
    slow: SlowReaders,
    config_fingerprint: str,
    capture: TextCapture | None,
    refusals: SampleRefusals,
    engine_spans: JoinEngineSpan,
    misses: MissStamp,
) -> list[Processor]:
    """The sidecar's processors, in the order the module's doc gives."""
    steps: list[Processor] = [Timings(), LearnSlowReaders(slow), NextTurn()]
    steps.append(StampConfig(config_fingerprint))
    if capture is not None:
        steps.append(CaptureText(capture))
    return [*steps, refusals, engine_spans, misses]
