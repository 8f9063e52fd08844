"""``Kept``: an answer worth computing once per ``ttl_s`` however many ask for it.

For the routes a flood could make expensive (``/v1/models``: a fan-out to every pool;
``/metrics``: every series rendered): the last answer per key is kept ``ttl_s``, and
requests that arrive while it is being computed wait for that one computation. An empty or
failed answer is not kept (the next request asks again). At most ``max_keys`` keys, the
least recently computed forgotten first.

``rest``: after a computation that took ``d`` seconds, the next one for its key starts no
sooner than ``rest * d`` after it ended; requests that arrive meanwhile wait and share it, so
an answer is never older than the request, yet back-to-back requests (a ``/metrics`` flood)
spend at most ``1 / (1 + rest)`` of the time computing.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Kept(Generic[T]):
    """The last answer per key for ``ttl_s``; one computation at a time per key."""

    def __init__(
        self,
        ttl_s: float,
        max_keys: int = 64,
        clock: Callable[[], float] = time.monotonic,
        rest: float = 0.0,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self.clock = clock
        self.rest = rest
        self._kept: OrderedDict[str, tuple[float, T]] = OrderedDict()
        self._computing: dict[str, asyncio.Future[T]] = {}
        self._rested: OrderedDict[str, float] = OrderedDict()  # key: when its next may start

    async def get(self, key: str, compute: Callable[[], Awaitable[T]]) -> T:
        kept = self._kept.get(key)
        if kept is not None and kept[0] > self.clock():
            return kept[1]
        task = self._computing.get(key)
        if task is None:
            task = asyncio.ensure_future(self._compute(key, compute))
            self._computing[key] = task
            task.add_done_callback(lambda t: self._computed(key, t))
        return await asyncio.shield(task)

    async def _compute(self, key: str, compute: Callable[[], Awaitable[T]]) -> T:
        wait = self._rested.get(key, 0.0) - self.clock()
        if wait > 0:
            await asyncio.sleep(wait)
        started = self.clock()
        try:
            return await compute()
        finally:
            if self.rest > 0:
                ended = self.clock()
                self._rested[key] = ended + self.rest * (ended - started)
                self._rested.move_to_end(key)
                while len(self._rested) > self.max_keys:
                    self._rested.popitem(last=False)

    def _computed(self, key: str, task: asyncio.Future[T]) -> None:
        self._computing.pop(key, None)
        if task.cancelled() or task.exception() is not None or not task.result():
            return
        self._kept[key] = (self.clock() + self.ttl_s, task.result())
        self._kept.move_to_end(key)
        while len(self._kept) > self.max_keys:
            self._kept.popitem(last=False)
