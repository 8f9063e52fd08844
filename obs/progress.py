"""One progress line: how every long-running command shows where it is.

A command that works for a while (the load generator, the demo's and the sweep's load
phase, a query's scan) draws one status line on a stream, usually stderr. On a terminal
the line is redrawn in place (carriage return, erase to the end of the line) at most
every ``interval_s``; elsewhere (a pipe, a CI log) it is either written as a new line every
``every_s`` seconds or not at all (``every_s=None``). The caller composes the text; the
stream and the clock are injected, so a test reads what a terminal would have shown.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

REDRAW = "\r\x1b[K"  # back to the start of the line, erase it


class ProgressLine:
    """A status line on ``stream``: redrawn in place, or a line every ``every_s``, or nothing."""

    def __init__(
        self,
        stream: TextIO,
        *,
        in_place: bool,
        interval_s: float = 0.0,
        every_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._in_place = in_place
        self._interval_s = interval_s
        self._every_s = every_s
        self._clock = clock
        self._last = float("-inf") if in_place else clock()
        self._drawn = False  # an in-place line is on screen

    @property
    def enabled(self) -> bool:
        """Whether anything is ever written (in place, or a line every so often)."""
        return self._in_place or self._every_s is not None

    def draw(self, text: str, *, force: bool = False, final: bool = False) -> None:
        """Show ``text``: in place unless drawn less than ``interval_s`` ago (``force`` and
        ``final`` always draw; ``final`` also ends the line); off a terminal, a line once
        ``every_s`` has passed or when ``final``."""
        now = self._clock()
        if self._in_place:
            if force or final or now - self._last >= self._interval_s:
                self._stream.write(REDRAW + text + ("\n" if final else ""))
                self._drawn = not final
                self._last = now
        elif self._every_s is not None and (final or now - self._last >= self._every_s):
            self._stream.write(text + "\n")
            self._last = now
        else:
            return
        self._stream.flush()

    def end(self) -> None:
        """Leave an in-place line on screen and move below it."""
        if self._drawn:
            self._stream.write("\n")
            self._stream.flush()
            self._drawn = False

    def clear(self) -> None:
        """Erase an in-place line, leaving the cursor where it started."""
        if self._drawn:
            self._stream.write(REDRAW)
            self._stream.flush()
            self._drawn = False
