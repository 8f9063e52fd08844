"""A finished request, as handed to every exporter.

``Finished`` carries the event (what is written) plus what only the exporters
need: the monotonic phase boundaries (for spans) and the raw inter-token gaps
(for the ITL histogram). Exporters receive it once, after the response ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from obs.events import Event
from obs.phases import Clock
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
