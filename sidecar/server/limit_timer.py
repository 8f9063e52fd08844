"""One connection's timer for the limit it is under (header, body, idle, keep-alive).

A kept-alive request arms and disarms its connection's limits three or four times (the header
timeout as its first bytes arrive, the body timeout once its head is read, none while it is
answered, the keep-alive once it is): cancelling a timer and making another each time cost
about 2 µs apiece on the loop, on the way of every first token. ``LimitTimer`` moves a
deadline instead, and keeps one timer pending: a new one is made only when the deadline
comes before the pending timer's; a timer that fires before its limit's deadline (the
deadline moved later meanwhile) sets itself again for the rest, and one that finds no limit
armed does nothing. So a connection's limits expire when they did, and a steady keep-alive
connection makes about one timer per keep-alive period instead of three or four per request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

# The loop's timers keep milliseconds (libuv's): one may fire up to this much before the time
# it was set for, which is as good as on time for limits of seconds (and sets no second timer).
EARLY_S = 0.005


class LimitTimer:
    """The deadline of the limit a connection is under; ``on_expiry(limit)`` when it passes."""

    __slots__ = ("_at", "_handle", "_loop", "_on_expiry", "limit")

    def __init__(self, loop: asyncio.AbstractEventLoop, on_expiry: Callable[[str], None]) -> None:
        self._loop = loop
        self._on_expiry = on_expiry
        self._handle: asyncio.TimerHandle | None = None
        self._at = 0.0  # the armed limit's deadline, on the loop's clock
        self.limit = ""  # the limit armed; "": none

    def arm(self, delay_s: float, limit: str) -> None:
        """``limit`` expires ``delay_s`` from now (in place of any armed before)."""
        at = self._loop.time() + delay_s
        self.limit, self._at = limit, at
        handle = self._handle
        if handle is not None:
            if handle.when() <= at:
                return  # it fires first, and sets itself again for the rest (_fire)
            handle.cancel()
        self._handle = self._loop.call_at(at, self._fire)

    def disarm(self) -> None:
        """No limit: a pending timer finds none when it fires."""
        self.limit = ""

    def stop(self) -> None:
        """No limit, and no timer pending (the connection is gone)."""
        self.limit = ""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle, limit = None, self.limit
        if not limit:
            return
        if self._at - self._loop.time() > EARLY_S:  # the deadline moved after this was set
            self._handle = self._loop.call_at(self._at, self._fire)
            return
        self.limit = ""
        self._on_expiry(limit)
