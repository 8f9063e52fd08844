"""A progress line on stderr while DuckDB scans, when stderr is a terminal.

DuckDB reports the running query's progress through
``connection.query_progress()``, which may be called from another thread;
this polls it and redraws one line (``obs.progress.ProgressLine``). Nothing is
drawn for scans shorter than ``delay_s`` or when stderr is not a terminal (pipes,
CI, tests).
"""

from __future__ import annotations

import sys
import threading
from types import TracebackType
from typing import Any, TextIO

from obs.progress import ProgressLine


class Progress:
    """Context manager: ``with Progress(con, "reading 3 files"): con.execute(...)``."""

    def __init__(
        self,
        con: Any,
        label: str,
        enabled: bool | None = None,
        stream: TextIO | None = None,
        delay_s: float = 0.5,
        interval_s: float = 0.2,
    ) -> None:
        self._con = con
        self._label = label
        self._stream = stream or sys.stderr
        self._enabled = self._stream.isatty() if enabled is None else enabled
        self._delay = delay_s
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._line = ProgressLine(self._stream, in_place=True)

    def __enter__(self) -> Progress:
        if self._enabled:
            self._thread = threading.Thread(target=self._run, name="query-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._line.clear()

    def _run(self) -> None:
        if self._stop.wait(self._delay):
            return
        while not self._stop.is_set():
            try:
                pct = float(self._con.query_progress())
            except Exception:  # the connection may be mid-teardown; progress is best effort
                return
            if pct >= 0:
                self._line.draw(f"{self._label}: {pct:5.1f}%")
            self._stop.wait(self._interval)
