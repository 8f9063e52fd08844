"""How late the event loop runs: the sidecar's own queue, as a histogram.

A request whose bytes arrive while the loop is busy (other requests' callbacks,
a large body being parsed) waits before anything in the process sees it. That
wait cannot be timed per request from inside, but it is the same wait a timer
sees: every ``period_s`` the monitor sleeps and records how much later than
asked it woke. A lagging relay then shows on the pool dashboard and in
``VllmObsEventLoopLagHigh`` instead of being charged to the pool's prefill.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol


class Observer(Protocol):
    def observe(self, amount: float) -> None: ...


class LoopLagMonitor:
    """Samples the running loop's lag into ``histogram`` until stopped."""

    def __init__(self, histogram: Observer, period_s: float) -> None:
        self.histogram = histogram
        self.period_s = period_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        period, perf = self.period_s, time.perf_counter
        while True:
            t0 = perf()
            await asyncio.sleep(period)
            self.histogram.observe(max(0.0, perf() - t0 - period))
