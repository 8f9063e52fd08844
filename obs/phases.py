"""The five request phases, computed from monotonic timestamps.

A relayed request passes six boundaries, each a ``time.perf_counter_ns``
reading taken by the sidecar's process (at the socket event that marks it; the
engine's own times are vLLM's clock, in the event's ``engine_*`` fields):

=============  =====================================================
boundary       when
=============  =====================================================
received       the sidecar received the request: the read that completed its body
               (the upload before it is the client's, ``upload_ms``)
dispatched     the request was sent to the pool (after admission, routing, connect)
first_up       the first upstream chunk carrying a generated token arrived (whatever
               its text: ``obs.openai_api.choice_tokens``)
first_sent     that chunk's bytes were handed to the client
last_up        the last upstream chunk carrying a token arrived
end            the client's side acknowledged the last byte of a stream (or the record
               stopped waiting: ``client_unread_bytes``), a whole body's last byte was
               handed to it, or the request ended
=============  =====================================================

Phases are the gaps between consecutive boundaries. A boundary that was never
reached (an error before the first token, say) collapses onto the next one
reached, so the time is charged to the phase the request was in when it
ended. Every phase is non-negative and the five always sum to ``end -
received`` exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from obs.conventions import PHASES

NS_PER_MS = 1_000_000


@dataclass(slots=True)
class Clock:
    """Boundary timestamps of one request (``perf_counter_ns``; 0 = not reached)."""

    received: int
    dispatched: int = 0
    first_up: int = 0
    first_sent: int = 0
    last_up: int = 0
    end: int = 0

    def phases_ns(self) -> dict[str, int]:
        """Non-negative phase durations in ns, summing to ``end - received``."""
        return dict(zip(PHASES, self.phase_times_ns(), strict=True))

    def phase_times_ns(self) -> tuple[int, int, int, int, int]:
        """``phases_ns``' values, in ``PHASES`` order (what the record reads: no dict)."""
        received = self.received
        end = self.end or max(
            received, self.dispatched, self.first_up, self.first_sent, self.last_up
        )
        # Each boundary at or after the one before it, at most the end; an unreached one
        # collapses forward (the time is charged to the phase the request was in).
        t = self.dispatched
        b1 = end if t == 0 else min(max(t, received), end)
        t = self.first_up
        b2 = end if t == 0 else min(max(t, b1), end)
        t = self.first_sent
        b3 = end if t == 0 else min(max(t, b2), end)
        t = self.last_up
        b4 = end if t == 0 else min(max(t, b3), end)
        return (b1 - received, b2 - b1, b3 - b2, b4 - b3, end - b4)

    def current_phase(self, upstream_done: bool = False) -> str:
        """The phase the request is in now: where a failure is charged."""
        if not self.dispatched:
            return "queue"
        if not self.first_up:
            return "prefill"
        if not self.first_sent:
            return "first_token"
        return "stream" if upstream_done else "decode"


# Below 2**52 ns (52 days) the float ``ns / NS_PER_MS`` is within 5e-7 µs of the exact
# quotient: it rounds to the microsecond as the exact one does unless that is a tie.
_EXACT_NS = 1 << 52


def ms(ns: int) -> float:
    """Nanoseconds to milliseconds, rounded to the microsecond: ``round(ns / NS_PER_MS, 3)``,
    in integers (``round`` with digits converts to decimal: 0.28 against 0.11 µs a call)."""
    if 0 <= ns < _EXACT_NS:  # (below 0, ``round`` gives -0.0 where this would give 0.0)
        r = ns % 1000
        if r != 500:  # a tie goes to ``round``: the float quotient decides it
            return ((ns - r) // 1000 + (r > 500)) / 1000
    return round(ns / NS_PER_MS, 3)


def percentile(sorted_values: list[int], q: float) -> int:
    """Nearest-rank percentile of an ascending list (``q`` in 0..1)."""
    if not sorted_values:
        return 0
    rank = max(0, min(len(sorted_values) - 1, int(q * len(sorted_values) + 0.999999) - 1))
    return sorted_values[rank]
