"""The deadline watchdog alone against a fake pool response, in virtual time: which verdict
each silence becomes (and, through the table, which outcome), exactly when, and that the
response is closed with the verdict as its failure.

The watchdog runs on ``obs.sweep.virtual.VirtualLoop`` (the clock jumps to the next timer
instead of waiting) and reads that loop's time (``Deadline(now_ns=...)``), so each deadline
is judged to the tick: not expired a tick before it, expired at it, on any machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, cast

from obs.sidecar import outcomes as e
from obs.sidecar.relay.deadline import NS, Deadline
from obs.sweep.virtual import VirtualLoop

T = TypeVar("T")
TICK = 2**-10  # about a millisecond, exact in binary: the virtual clock's sums are exact
FIRST_S, IDLE_S, BLOCKED_S = 0.5, 0.25, 2.0
START_S = 1.0  # the virtual clock's start (0 ns is the watchdog's "no read yet")


class FakeResponse:
    def __init__(self) -> None:
        self.closed = False
        self.why: e.UpstreamError | None = None

    def close(self, why: e.UpstreamError | None = None) -> None:
        self.closed, self.why = True, why


def _outcome(verdict: e.Expired | None) -> e.RelayError:
    """What the relay makes of a response failed with ``verdict`` (the table)."""
    assert verdict is not None
    return e.lower_outcome(verdict, "streaming")


def _virtual(main: Callable[[VirtualLoop], Coroutine[Any, Any, T]]) -> T:
    """``main(loop)`` run to its end on a virtual loop."""
    loop = VirtualLoop()
    loop.now = START_S
    try:
        return loop.run_until_complete(main(loop))
    finally:
        loop.close()


def _watch(loop: VirtualLoop) -> tuple[Deadline, FakeResponse, Callable[[], int]]:
    """A deadline watching a fake response from now, on ``loop``'s clock."""

    def now_ns() -> int:
        return round(loop.time() * NS)

    resp = FakeResponse()
    deadline = Deadline(cast(Any, resp), now_ns(), FIRST_S, IDLE_S, BLOCKED_S, now_ns=now_ns)
    return deadline, resp, now_ns


async def _until(loop: VirtualLoop, at_s: float) -> None:
    """Sleep to ``at_s`` of virtual time after the start, and let the timers due then run."""
    await asyncio.sleep(START_S + at_s - loop.time())
    await asyncio.sleep(0)


def test_no_first_token_is_a_first_token_timeout_at_first_token_s() -> None:
    """Silence from dispatch: a tick before first_token_s nothing; at it, a 504 naming the
    first token, the response closed."""

    async def main(
        loop: VirtualLoop,
    ) -> list[tuple[bool, e.Expired | None, e.UpstreamError | None]]:
        deadline, resp, _ = _watch(loop)
        seen = []
        for at in (FIRST_S - TICK, FIRST_S):
            await _until(loop, at)
            seen.append((resp.closed, deadline.expired, resp.why))
        return seen

    (before, at) = _virtual(main)
    assert before == (False, None, None)
    assert at[0] and at[1] is at[2] and at[1] is not None and at[1].kind == e.FIRST_TOKEN
    made = _outcome(at[1])
    assert isinstance(made, e.UpstreamTimeout) and "first token" in made.message


def test_silence_after_output_is_an_idle_timeout_and_output_rearms_it() -> None:
    """Reads every half idle_s hold the idle deadline off for longer than idle_s; after the
    last read, a tick before idle_s of silence nothing, at idle_s the idle timeout (the 504
    frame a stream ends with)."""

    async def main(loop: VirtualLoop) -> tuple[float, Deadline, FakeResponse, bool, bool]:
        deadline, resp, now_ns = _watch(loop)
        deadline.first_output(now_ns())
        for _ in range(8):  # 4 idle_s of reads, each half idle_s after the last
            await asyncio.sleep(IDLE_S / 2)
            deadline.last_ns = now_ns()
        last = loop.time() - START_S
        alive = not resp.closed and deadline.expired is None
        await _until(loop, last + IDLE_S - TICK)
        still = not resp.closed and deadline.expired is None
        await _until(loop, last + IDLE_S)
        return last, deadline, resp, alive, still

    last, deadline, resp, alive, still = _virtual(main)
    assert last == 8 * IDLE_S / 2 and alive and still
    assert resp.closed and resp.why is deadline.expired
    made = _outcome(deadline.expired)
    assert isinstance(made, e.UpstreamTimeout) and "idle timeout" in made.message


def test_a_client_that_reads_nothing_is_stalled_not_timed_out() -> None:
    """While the relay waits on the client, the pool's silence is not the pool's: no idle
    timeout; a tick before max_blocked_s of waiting nothing, at it the stream ends as the
    slow client's (408)."""

    async def main(loop: VirtualLoop) -> list[e.Expired | None]:
        deadline, _, now_ns = _watch(loop)
        deadline.first_output(now_ns())
        deadline.sending = True
        seen = []
        for at in (BLOCKED_S - TICK, BLOCKED_S):
            await _until(loop, at)
            seen.append(deadline.expired)
        deadline.cancel()
        return seen

    before, at = _virtual(main)
    assert before is None  # far past idle_s: the silence is the client's
    assert isinstance(_outcome(at), e.SlowClientStalled)
