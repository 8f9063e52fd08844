"""A finished request, as handed to every exporter.

``Finished`` carries the event (what is written) plus what only the exporters
need: the monotonic phase boundaries (for spans) and the raw inter-token gaps
(for the ITL histogram). Exporters receive it once, after the response ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    first_read_chunks: int = 1  # tokens that arrived with the first one (in the same read)
    # Gates of the lane's SLO it missed, as (slo, phase, cause): set by obs.attribution.
    misses: tuple[tuple[str, str, str], ...] = ()
    client_id: str | None = None  # who sent it, as the sidecar recognizes clients (slow readers)
    # With --capture-text: what the relay kept of the request body, the output frames and a
    # whole answer, for the capture step to redact into the event (then dropped).
    captured: tuple[dict[str, Any] | None, list[bytes] | None, bytes | None] | None = None
    # The client's next request on the same connection is already being relayed: the steps
    # after what that request may read go on an event-loop turn later (its dispatch first).
    next_waiting: bool = False
    # The clock's phases in ns (``PHASES`` order) as ``fill_timings`` last set them from it
    # (every change to the clock is followed by ``fill_timings``); empty before: ``phases``.
    phases_ns: tuple[int, ...] = ()

    def phases(self) -> tuple[int, ...]:
        """The clock's phases in ns, in ``PHASES`` order (``Clock.phase_times_ns``)."""
        return self.phases_ns or self.clock.phase_times_ns()

    def wall_ns(self, perf_ns: int) -> int:
        """A ``perf_counter_ns`` reading of this request converted to wall-clock ns."""
        return self.wall_start_ns + (perf_ns - self.clock.received)


def fill_timings(f: Finished) -> None:
    """Set the event's phase and derived timing fields from the clock (idempotent)."""
    ev, clock = f.event, f.clock
    f.phases_ns = clock.phase_times_ns()
    queue, prefill, first_token, decode, stream = f.phases_ns  # PHASES order
    ev.queue_ms = ms(queue)
    ev.prefill_ms = ms(prefill)
    ev.first_token_ms = ms(first_token)
    ev.decode_ms = ms(decode)
    ev.stream_ms = ms(stream)
    ev.e2e_ms = ms(clock.end - clock.received)
    # A whole answer has a TTFT only where the engine's decode time placed its first token
    # (TGI's span has none: its answer's arrival is no first token).
    timed = ev.stream or (ev.engine_view == "joined" and ev.engine_decode_ms is not None)
    if timed and clock.first_up and clock.first_sent:
        ev.ttft_ms = ms(clock.first_sent - clock.received)
    tpot = tpot_ns(f)
    ev.tpot_ms = None if tpot is None else ms(tpot)
    if not ev.stream:
        ev.output_chunks = 1 if clock.first_up else 0
    gaps = f.itl_ns
    if len(gaps) == 1:  # (two tokens: the one gap is every percentile)
        ev.itl_p50_ms = ev.itl_p95_ms = ev.itl_max_ms = ms(gaps[0])
    elif gaps:
        gaps = sorted(gaps)
        ev.itl_p50_ms = ms(percentile(gaps, 0.5))
        ev.itl_p95_ms = ms(percentile(gaps, 0.95))
        ev.itl_max_ms = ms(gaps[-1])
    if ev.cached_tokens is not None:
        ev.cache_hit = ev.cached_tokens > 0


def tpot_ns(f: Finished) -> int | None:
    """Time per output token after the first, as the pool produced it; None where unknown.

    With the engine's span joined, the engine's own: its decode time over the tokens after
    the first (on the engine's clock, which no scheduling of the sidecar can stretch).
    Otherwise on the sidecar's clock, from streamed output that arrived over several reads:
    the time from the first output read to the last, over the tokens that came after the
    first read (the chunks of the first read were made before it arrived: counting them
    would shrink TPOT). When more than half the tokens came with the first read (a burst,
    or a sidecar that was not scheduled while the pool streamed), the cadence was not seen:
    a span over a few late tokens would stretch TPOT by up to the whole delay.
    """
    ev, clock = f.event, f.clock
    n = ev.completion_tokens
    if not n or n < 2:
        return None
    if ev.engine_decode_ms is not None and ev.engine_view == "joined":
        return int(ev.engine_decode_ms * 1_000_000) // (n - 1)
    after = n - max(1, f.first_read_chunks)
    if f.itl_ns and clock.last_up > clock.first_up > 0 and 2 * after >= n - 1:
        return (clock.last_up - clock.first_up) // max(1, after)
    return None
