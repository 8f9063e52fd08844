"""A one-line progress bar on a terminal (stderr); silent when not a terminal."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from obs.progress import ProgressLine

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
    """The bar on ``stream`` (``obs.progress.ProgressLine``, in place), redrawn at most every
    ``interval_s``; ``enabled=False`` makes it a no-op."""

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
        self._total = total
        self._duration_s = duration_s
        self._clock = clock
        self._start = clock()
        self._line = ProgressLine(stream, in_place=enabled, interval_s=interval_s, clock=clock)

    @property
    def enabled(self) -> bool:
        return self._line.enabled

    def update(self, done: int, errors: int, inflight: int, *, force: bool = False) -> None:
        if not self._line.enabled:
            return
        elapsed = self._clock() - self._start
        line = render(
            done, errors, inflight, elapsed, total=self._total, duration_s=self._duration_s
        )
        self._line.draw(line, force=force)

    def close(self) -> None:
        self._line.end()
