"""A clock a test moves: the time the sidecar's injected timers read (``create_app(clock=)``).

``ManualClock()`` stands still until the test calls ``advance``; a timer that reads it fires
exactly when the test has moved it past the timer's deadline, however fast or slow the
machine runs the test ("at 5.000 s it fires, at 4.999 s not").
"""

from __future__ import annotations

import threading


class ManualClock:
    """A monotonic clock in seconds that moves only by ``advance`` (thread-safe: the in-process
    sidecar reads it on its own thread)."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move the clock ``seconds`` on (never back); the new time."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds} s)")
        with self._lock:
            self._now += seconds
            return self._now
