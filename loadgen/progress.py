"""A one-line progress bar on a terminal (stderr); silent when not a terminal."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

BAR_WIDTH = 24


def render(
    done: int,
    errors: int,
    inflight: int,
    elapsed_s: float,
    *,
    total: int | None,
    duration_s: float | None,
) -> str:
    """The progress line: a bar over the tighter bound (request count or duration)."""
    fractions = []
    if total:
        fractions.append(done / total)
    if duration_s:
        fractions.append(elapsed_s / duration_s)
    frac = min(1.0, max(fractions, default=0.0))
    filled = round(frac * BAR_WIDTH)
    bar = "#" * filled + "." * (BAR_WIDTH - filled)
    count = f"{done}/{total}" if total else str(done)
    clock = f"{elapsed_s:.0f}/{duration_s:.0f}s" if duration_s else f"{elapsed_s:.0f}s"
    return f"[{bar}] {count} req  {errors} err  {inflight} in flight  {clock}"


class Progress:
    """Redraws the line at most every ``interval_s``; ``enabled=False`` makes it a no-op."""

    def __init__(
        self,
        stream: TextIO,
        *,
        total: int | None,
        duration_s: float | None,
        enabled: bool,
        interval_s: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._total = total
        self._duration_s = duration_s
        self._enabled = enabled
        self._interval_s = interval_s
        self._clock = clock
        self._start = clock()
        self._last = float("-inf")
        self._width = 0

    @property
    def enabled(self) -> bool:
        return self._enabled

    def update(self, done: int, errors: int, inflight: int, *, force: bool = False) -> None:
        if not self._enabled:
            return
        now = self._clock()
        if not force and now - self._last < self._interval_s:
            return
        self._last = now
        line = render(
            done,
            errors,
            inflight,
            now - self._start,
            total=self._total,
            duration_s=self._duration_s,
        )
        self._stream.write("\r" + line.ljust(self._width))
        self._stream.flush()
        self._width = len(line)

    def close(self) -> None:
        if self._enabled and self._width:
            self._stream.write("\n")
            self._stream.flush()
