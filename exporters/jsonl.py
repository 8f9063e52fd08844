"""JSONL event log: one line per request, written by a thread off the event loop.

``export`` serialises the event and appends the line to a bounded deque (never
blocks, takes no lock and wakes no thread; a full deque drops the event and
counts it). A writer thread wakes every ``flush_interval_s`` (0.2 s), or at
once when ``WAKE_LINES`` lines are waiting or on ``force_flush``, and writes
what is waiting with one ``write(2)`` per batch. After a crash, at most the
events of the last flush interval are missing. Files are created owner-only
(0600). Before a line would take the file past ``max_bytes`` it is rotated to
``NAME.1`` (older ones shift to ``.2`` ...; ``backups`` are kept), so no file is
larger (but a single longer line, alone). A write the disk cuts short is
truncated back to the last whole line: the file never holds a torn line. An
unwritable directory or a full disk never stops the sidecar: the events are
counted as dropped (reason ``io_error``) and logged once per error streak.

Why a deque and a timer rather than a ``queue.Queue``: ``Queue.put`` takes a
lock and notifies the writer for every event, and each wake-up hands the GIL
to the writer thread in the middle of the relay's work.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Protocol

import structlog

from obs.record import Finished

log = structlog.get_logger("vllm_obs.jsonl")

WAKE_LINES = 1024  # this many lines waiting wake the writer before its interval ends
BATCH_LINES = 4096  # most lines per write(2)


class EventCounters(Protocol):
    def event_written(self, exporter: str, n: int) -> None: ...

    def event_dropped(self, exporter: str, reason: str, n: int) -> None: ...


class JsonlExporter:
    name = "jsonl"

    def __init__(
        self,
        path: str | Path,
        *,
        counters: EventCounters | None = None,
        max_bytes: int = 256 << 20,
        backups: int = 10,
        queue_size: int = 65536,
        flush_interval_s: float = 0.2,
    ) -> None:
        self.path = Path(path)
        self._counters = counters
        self._max_bytes = max_bytes
        self._backups = backups
        self._flush_interval_s = flush_interval_s
        self._max_pending = queue_size
        self._pending: deque[bytes] = deque()
        self._accepted = 0  # lines appended (by the event loop)
        self._handled = 0  # lines written or dropped (by the writer)
        self._wake = threading.Event()
        self._stopping = False
        self._fh: int | None = None
        self._size = 0
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="vllm-obs-jsonl", daemon=True)
        self._thread.start()

    # Called on the event loop: cheap and non-blocking.
    def export(self, finished: Finished) -> None:
        pending = self._pending
        if len(pending) >= self._max_pending:
            self._count_dropped("queue_full", 1)
            return
        pending.append(finished.event.to_json())
        self._accepted += 1
        if len(pending) >= WAKE_LINES:
            self._wake.set()

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every event accepted so far has been written (or ``timeout_s`` passes)."""
        target = self._accepted
        deadline = time.monotonic() + timeout_s
        self._wake.set()
        while self._handled < target:
            if time.monotonic() > deadline or not self._thread.is_alive():
                return False
            time.sleep(0.005)
        return True

    def shutdown(self, timeout_s: float = 10.0) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_s)

    # Writer thread.
    def _run(self) -> None:
        pending = self._pending
        while True:
            self._wake.wait(self._flush_interval_s)
            self._wake.clear()
            stopping = self._stopping
            while pending:
                n = min(len(pending), BATCH_LINES)
                self._write([pending.popleft() for _ in range(n)])
                self._handled += n
            if stopping:
                self._close()
                return

    def _write(self, lines: list[bytes]) -> None:
        written = 0
        try:
            if self._fh is None:
                self._open()
            while written < len(lines):
                end, size = written, 0
                room = self._max_bytes - self._size
                # As many lines as fit; a line longer than the limit goes alone into a new file.
                while end < len(lines):
                    n = len(lines[end])
                    if size + n > room and (end > written or self._size):
                        break
                    size += n
                    end += 1
                if end == written:
                    self._rotate()
                    continue
                self._append(b"".join(lines[written:end]))
                written = end
        except OSError as e:
            self._close()
            self._count_dropped("io_error", len(lines) - written)
            if not self._failing:
                log.error("event_write_failed", path=str(self.path), error=str(e))
            self._failing = True
            if self._counters is not None and written:
                self._counters.event_written(self.name, written)
            return
        if self._failing:
            log.info("event_write_recovered", path=str(self.path))
            self._failing = False
        if self._counters is not None:
            self._counters.event_written(self.name, len(lines))

    def _append(self, data: bytes) -> None:
        """Write whole lines, or none: a short write (a full disk) is cut back off."""
        assert self._fh is not None
        before = self._size
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._fh, view)
                view = view[n:]
                self._size += n
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fh, before)
            self._size = before
            raise

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._size = os.fstat(self._fh).st_size

    def _rotate(self) -> None:
        self._close()
        for i in range(self._backups - 1, 0, -1):
            src = self.path.with_name(f"{self.path.name}.{i}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i + 1}"))
        if self._backups > 0:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            os.unlink(self.path)
        self._open()

    def _close(self) -> None:
        if self._fh is not None:
            try:
                os.close(self._fh)
            finally:
                self._fh = None

    def _count_dropped(self, reason: str, n: int) -> None:
        if self._counters is not None:
            self._counters.event_dropped(self.name, reason, n)
