"""The deadline watchdog alone against a fake pool response, on a real event loop with short
deadlines: which outcome each silence becomes, and that the response is closed."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

from obs.sidecar import outcomes as e
from obs.sidecar.relay.deadline import Deadline

SHORT_S = 0.05


class FakeResponse:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _watch(**kw: float) -> tuple[Deadline, FakeResponse]:
    resp = FakeResponse()
    first, idle = kw.get("first_token_s", SHORT_S), kw.get("idle_s", SHORT_S)
    deadline = Deadline(cast(Any, resp), time.perf_counter_ns(), first, idle, kw.get("blocked", 9))
    return deadline, resp


def test_no_first_token_is_a_first_token_timeout() -> None:
    """Silence from dispatch past first_token_s: a 504 naming the first token, response closed."""

    async def main() -> tuple[Deadline, FakeResponse]:
        deadline, resp = _watch()
        await asyncio.sleep(SHORT_S * 3)
        return deadline, resp

    deadline, resp = asyncio.run(main())
    assert isinstance(deadline.expired, e.UpstreamTimeout) and resp.closed
    assert "first token" in deadline.expired.message


def test_silence_after_output_is_an_idle_timeout_and_output_rearms_it() -> None:
    """Reads that keep coming hold the idle deadline off; a silence past idle_s after output
    is the idle timeout (the 504 frame a stream ends with)."""

    async def main() -> tuple[Deadline, FakeResponse, bool]:
        idle = 0.2  # ten times the reads' spacing: a loaded machine's late wake-up is no silence
        deadline, resp = _watch(first_token_s=1.0, idle_s=idle)
        deadline.first_output(time.perf_counter_ns())
        for _ in range(15):  # reads for longer than idle_s, each well within it
            await asyncio.sleep(idle / 10)
            deadline.last_ns = time.perf_counter_ns()
        alive = not resp.closed
        await asyncio.sleep(idle * 3)
        return deadline, resp, alive

    deadline, resp, alive = asyncio.run(main())
    assert alive
    assert isinstance(deadline.expired, e.UpstreamTimeout) and resp.closed
    assert "idle timeout" in deadline.expired.message


def test_a_client_that_reads_nothing_is_stalled_not_timed_out() -> None:
    """While the relay waits on the client, the pool's silence is not the pool's: past
    max_blocked_s the stream ends as the slow client's (408)."""

    async def main() -> Deadline:
        deadline, _ = _watch(first_token_s=1.0, blocked=SHORT_S)
        deadline.first_output(time.perf_counter_ns())
        deadline.sending = True
        await asyncio.sleep(SHORT_S * 3)
        deadline.cancel()
        return deadline

    assert isinstance(asyncio.run(main()).expired, e.SlowClientStalled)
