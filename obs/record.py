"""A finished request, as handed to every exporter.

``Finished`` carries the event (what is written) plus what only the exporters
need: the monotonic phase boundaries (for spans) and the raw inter-token gaps
(for the ITL histogram). Exporters receive it once, after the response ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from obs.events import Event
from obs.phases import Clock, ms, percentile
from obs.tracecontext import TraceIds


@dataclass(slots=True)
class Finished:
    event: Event
    clock: Clock
    wall_start_ns: int  # time.time_ns() when the request was received
    ids: TraceIds
    itl_ns: list[int] = field(default_factory=list)
    operation: str = "chat"  # gen_ai.operation.name: chat, text_completion, embeddings, ...

    def wall_ns(self, perf_ns: int) -> int:
        """A ``perf_counter_ns`` reading of this request converted to wall-clock ns."""
        return self.wall_start_ns + (perf_ns - self.clock.received)


def fill_timings(f: Finished) -> None:
    """Set the event's phase and derived timing fields from the clock (idempotent)."""
    ev, clock = f.event, f.clock
    phases = clock.phases_ns()
    ev.queue_ms = ms(phases["queue"])
    ev.prefill_ms = ms(phases["prefill"])
    ev.first_token_ms = ms(phases["first_token"])
    ev.decode_ms = ms(phases["decode"])
    ev.stream_ms = ms(phases["stream"])
    ev.e2e_ms = ms(clock.end - clock.received)
    timed = ev.stream or ev.engine_view == "joined"
    if timed and clock.first_sent:
        ev.ttft_ms = ms(clock.first_sent - clock.received)
    n = ev.completion_tokens
    if timed and n and n > 1 and clock.last_up >= clock.first_up > 0:
        ev.tpot_ms = ms((clock.last_up - clock.first_up) // (n - 1))
    ev.output_chunks = len(f.itl_ns) + (1 if clock.first_up else 0)
    if f.itl_ns:
        gaps = sorted(f.itl_ns)
        ev.itl_p50_ms = ms(percentile(gaps, 0.5))
        ev.itl_p95_ms = ms(percentile(gaps, 0.95))
        ev.itl_max_ms = ms(gaps[-1])
    if ev.cached_tokens is not None:
        ev.cache_hit = ev.cached_tokens > 0
